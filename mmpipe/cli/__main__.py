"""``python -m mmpipe.cli ...``: the same as the ``mmpipe`` command."""

import sys

from mmpipe.cli.main import main

sys.exit(main())
