"""The ``mmpipe`` command: ``main.py`` (the parser and ``judge ping``), ``encode.py`` (local files ->
saved encoded dataset), ``inspect.py`` (counts, histograms), ``demo.py`` (``python -m mmpipe.cli.demo``)."""
