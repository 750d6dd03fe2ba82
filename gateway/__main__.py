from gateway.cli import app

app(prog_name="python -m gateway")
