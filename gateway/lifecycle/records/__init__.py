"""What the lifecycle remembers: jobs, versions, models, rollouts, the residency's
measured demand and the tenancy changed live (:mod:`.store`, kept in SQLite by
:mod:`.jobs` or PostgreSQL by :mod:`.postgres`; :mod:`.backend` chooses; the tenancy's
restore at start: :mod:`.tenancy`), one leader among replicas (:mod:`.leader`), and the
repository's edits."""
