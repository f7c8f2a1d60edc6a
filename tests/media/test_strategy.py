"""A kind of family is its modules (`mmpipe.media.KINDS`) over one set of shared answers
(`mmpipe.media.defaults`): each name resolves to the first module that defines it, a module's
imports are not its answers, and a kind defines only where it differs."""

from __future__ import annotations

import inspect

import pytest

import mmpipe.media.defaults as defaults
from mmpipe.errors import ArgumentError
from mmpipe.media import KINDS, strategy

SHARED = [n for n, v in vars(defaults).items() if not n.startswith("_") and (n.isupper() or inspect.isfunction(v))
          and getattr(v, "__module__", defaults.__name__) == defaults.__name__]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_shared_name_resolves_with_the_defaults_signature(kind):
    media = strategy(kind)
    assert media is strategy(kind)  # one object per kind: stages compare them
    for name in SHARED:
        got, default = getattr(media, name), getattr(defaults, name)
        if inspect.isfunction(default):
            assert list(inspect.signature(got).parameters) == list(inspect.signature(default).parameters), name


def test_a_kind_answers_its_own_definitions_first_and_never_a_module_import():
    patches, tiles = strategy("patches"), strategy("tiles")
    assert patches.POSITION_ROWS == (3,) and tiles.POSITION_ROWS == defaults.POSITION_ROWS == ()
    assert patches.position_inputs.__module__ == "mmpipe.media.patches"
    assert tiles.position_inputs is defaults.position_inputs
    # mmpipe.media.processor imports as_array from the records: not one of the kind's answers
    with pytest.raises(AttributeError, match="no 'as_array'"):
        strategy("processor").as_array  # noqa: B018
    with pytest.raises(ArgumentError, match="unknown family kind"):
        strategy("voxels")
