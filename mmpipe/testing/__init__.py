"""Test support: the offline fixtures (`mmpipe.offline`, re-exported here) and the ONE invariant
harness every stage is tested through (`mmpipe.testing.invariants`).

    >>> from mmpipe.testing import build_processor, build_model, tiny_image   # doctest: +SKIP

``build_processor`` / ``build_model`` here take every name the offline builders know
(`mmpipe.offline.builders`: the native families, the Qwen3.5 model lines, and the generic
path's Idefics3, LLaVA, Mllama, PaliGemma, MiniCPM-V, Ovis2); ``mmpipe.offline``'s own take the
families with a family-table row.

Library code never imports this package; it imports `mmpipe.offline` where it needs an
offline processor or model (the demo, ``load_processor("testing:FAMILY")``).
"""

from mmpipe.offline import *  # noqa: F401,F403  (the fixtures' __all__)
from mmpipe.offline import __all__ as _FIXTURES
from mmpipe.offline.builders import MODEL_NAMES, PROCESSOR_NAMES, build_model, build_processor  # noqa: E402,F401
from mmpipe.testing import invariants  # noqa: E402  (the harness: mmpipe.testing.invariants)

__all__ = list(_FIXTURES) + ["MODEL_NAMES", "PROCESSOR_NAMES", "invariants"]
