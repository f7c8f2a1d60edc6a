"""``python -m mmpipe ...``: the same as the ``mmpipe`` command, without activating a venv."""

import sys

from mmpipe.cli.main import main

sys.exit(main())
