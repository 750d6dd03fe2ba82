"""The model lifecycle: upload -> convert -> load -> warm -> serve, for model owners.

- :mod:`.service`: :class:`~.service.ModelLifecycle`, the transport-free whole the HTTP
  adapter (:mod:`gateway.lifecycle_http`) calls, and :func:`~.service.build_lifecycle`;
- :mod:`.catalog`: the managed models, their versions and policies (reads, adoption);
- :mod:`.runner`: uploads as jobs, start-up recovery of interrupted ones;
- :mod:`.spec`: the upload spec (the converter's own tensor and budget types);
- :mod:`.uploads`: multipart streamed to disk under limits; safe archive extraction;
- :mod:`.jobs`: SQLite records of jobs (per-step progress), versions and models;
- :mod:`.workers` (parent side), :mod:`.worker_main` (the child), :mod:`.worker_protocol`
  (what both import), :mod:`.conversion` (the child's call into
  :mod:`converters.pipeline`), :mod:`.sandbox` and :mod:`.pickles` (what a worker may do);
- :mod:`.deploy`: load -> warm -> route on every member, rollback, retention;
- :mod:`.versions`: the repository edits beyond publishing (pinning, removal, restore);
- :mod:`.preload`: start-up preloading, the readiness gate;
- :mod:`.keepwarm`: synthetic requests to every member of an idle model;
- :mod:`.control_plane`: assembly for one gateway process.

API tokens are :mod:`gateway.auth`; the Triton calls all of the above make on one member
are :mod:`gateway.upstream.triton`.
"""
