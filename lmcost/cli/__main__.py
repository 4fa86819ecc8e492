"""``python -m lmcost.cli``: the command line."""

from lmcost.cli import main

main()
