"""``python -m lmcost``: the command line, where the ``lmcost`` script is not installed."""

from lmcost.cli import main

main()
