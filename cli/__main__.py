"""``python -m envhub.cli`` runs the ``envhub`` command."""

from envhub.cli.app import main

main()
