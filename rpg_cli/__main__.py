from rpg_cli.cli import main

main()
