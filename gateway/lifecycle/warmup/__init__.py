"""Making a version serve: load, warm, route; start-up preloading; keep-warm."""
