"""The model lifecycle: upload -> convert -> load -> warm -> serve, for model owners.

- :mod:`.service`: :class:`~.service.ModelLifecycle`, the transport-free whole the HTTP
  view (:mod:`gateway.control.lifecycle_http`) calls; :mod:`.assembly` builds it (the one
  assembler) and the warm-up (preloading, keep-warm, member restores);
- :mod:`.client`: the lifecycle's HTTP API from the other side (the models CLI, tests
  and benchmarks call it); the ``lifecycle:``, ``auth:`` and keep-warm sections of the
  YAML are :mod:`gateway.config`;
- :mod:`.intake`: what comes in: the upload spec (:mod:`.intake.spec`), multipart
  streamed to disk under limits and safe extraction (:mod:`.intake.uploads`), uploads as
  jobs and their start-up recovery (:mod:`.intake.runner`);
- :mod:`.conversion`: the sandboxed worker processes: parent side
  (:mod:`.conversion.workers`), the child (:mod:`.conversion.worker_main`,
  :mod:`.conversion.convert`), what both import (:mod:`.conversion.worker_protocol`),
  what a worker may do (:mod:`.conversion.sandbox`, :mod:`.conversion.pickles`);
- :mod:`.records`: the records of jobs, versions, models and rollouts behind one
  interface (:mod:`.records.store`), in SQLite (:mod:`.records.jobs`) or PostgreSQL
  (:mod:`.records.postgres`), one leader among replicas (:mod:`.records.leader`), the
  managed models (:mod:`.records.catalog`), repository edits beyond publishing
  (:mod:`.records.versions`);
- :mod:`.warmup`: load -> warm -> route on every member, rollback, retention
  (:mod:`.warmup.deploy`), what is preloaded and kept warm (:mod:`.warmup.plan`),
  start-up preloading, the readiness gate (:mod:`.warmup.preload`), synthetic requests
  to idle models (:mod:`.warmup.keepwarm`), progressive delivery's driver
  (:mod:`.warmup.rollout`), the stages that judge its candidate
  (:mod:`.warmup.rollout_stages`) and the sample they replay (:mod:`.warmup.rollout_replay`).

API tokens are :mod:`gateway.auth`; the Triton calls all of the above make on one member
are :mod:`gateway.upstream.triton`.
"""
