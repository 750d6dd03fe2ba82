"""What the lifecycle remembers: jobs, versions, models (SQLite) and the repository's edits."""
