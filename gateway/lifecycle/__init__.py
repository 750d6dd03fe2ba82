"""The model lifecycle: upload -> convert -> load -> warm -> serve, for model owners.

- :mod:`.service`: the transport-free core (:class:`~.service.ModelLifecycle`) the HTTP
  router (:mod:`gateway.lifecycle_http`) calls;
- :mod:`.uploads`: multipart streamed to disk under limits; safe archive extraction;
- :mod:`.jobs`: SQLite records of jobs (per-step progress), versions and models;
- :mod:`.worker` / :mod:`.conversion`: conversions in worker processes, calling the
  converter pipeline (:mod:`converters.pipeline`);
- :mod:`.deploy`: load -> warm -> route on every member, rollback, retention;
- :mod:`.versions`: the repository edits beyond publishing (pinning, removal, restore);
- :mod:`.preload`: start-up preloading, the readiness gate;
- :mod:`.keepwarm`: synthetic requests to every member of an idle model;
- :mod:`.auth`: API tokens with scopes (predict, upload, admin), stored hashed;
- :mod:`gateway.upstream.triton`: the Triton calls all of the above make on one member;
- :mod:`.control_plane`: assembly for one gateway process.
"""
