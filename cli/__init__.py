"""The ``envhub`` command line, installed as ``envhub.cli``: the app in ``app.py`` and one
module per command, each importing what it needs inside the command."""
