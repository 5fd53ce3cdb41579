"""``python -m zoo``: the same command line as the ``lightning`` and ``zoo`` scripts."""
from zoo.cli import main

main()
