"""Offline builders: a real tokenizer, processor and tiny model per family, and sample images,
made locally with no download (what the demo, the CLI's ``testing:FAMILY`` processors, the
notebooks and the tests use)."""

from mmpipe.offline.fixtures import *  # noqa: F401,F403
from mmpipe.offline.fixtures import __all__  # noqa: F401
