"""What the lifecycle remembers: jobs, versions, models, rollouts (:mod:`.store`, kept in
SQLite by :mod:`.jobs` or PostgreSQL by :mod:`.postgres`; :mod:`.backend` chooses), one
leader among replicas (:mod:`.leader`), and the repository's edits."""
