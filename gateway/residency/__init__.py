"""Model residency, carried out (issues 29 and 34): which models each member of a pool
with a memory budget holds, loads on demand and on a miss, evictions that lose nothing,
preloading by recorded use. The decisions are :mod:`gateway.policy.residency`'s (pure);
here one record per (member, model) moves through its states (:mod:`.holdings`), the
moves are carried out on the members (:mod:`.actuator`), the misses wait
(:mod:`.waiting`), and :mod:`.manager` assembles them round by round, with the demand
measured (:mod:`.demand`), the footprints measured (:mod:`.memory`, :mod:`.footprints`)
and what is held reported (:mod:`.report`).
"""
