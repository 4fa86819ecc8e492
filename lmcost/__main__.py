"""``python -m lmcost``: the command line, where the ``lmcost`` script is not installed."""

from .cli import main

main()
