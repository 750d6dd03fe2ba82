"""Model residency, carried out (issue 29): which models each member of a pool with a
memory budget holds, loads on demand and on a miss, evictions that lose nothing,
preloading by recorded use. The decisions are :mod:`gateway.policy.residency`'s (pure);
here they are executed against the members (:mod:`.manager`), with the demand measured
(:mod:`.demand`), the footprints measured (:mod:`.memory`, :mod:`.footprints`) and the
misses held (:mod:`.waiting`).
"""
