from scheduler.cli import app

app(prog_name="python -m scheduler")
