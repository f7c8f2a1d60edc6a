"""Test support: the offline fixtures (`mmpipe.offline`, re-exported here) and the ONE invariant
harness every stage is tested through (`mmpipe.testing.invariants`).

    >>> from mmpipe.testing import build_processor, build_model, tiny_image   # doctest: +SKIP

Library code never imports this package; it imports `mmpipe.offline` where it needs an
offline processor or model (the demo, ``load_processor("testing:FAMILY")``).
"""

from mmpipe.offline import *  # noqa: F401,F403  (the fixtures' __all__)
from mmpipe.offline import __all__ as _FIXTURES
from mmpipe.testing import invariants  # noqa: E402  (the harness: mmpipe.testing.invariants)

__all__ = list(_FIXTURES) + ["invariants"]
