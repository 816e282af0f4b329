from rpg_cli.cli import app

app(prog_name="rpg")
