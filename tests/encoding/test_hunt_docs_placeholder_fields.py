"""A placeholder count that disagrees with the row's images or videos fills the error's
``expected`` and ``found`` (docs hunt): docs/reference/errors.md's first example catches this very
`PlaceholderError` and prints ``e.expected, e.found``, and the page says every `InputError` names
what was expected and what was found; both were None (the counts only in the free text)."""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import PlaceholderError


@pytest.fixture(scope="module")
def processor():
    return testing.build_processor("qwen2_vl")


def _user(*items):
    return [{"role": "user", "content": [*items, {"type": "text", "text": "What is it?"}]}]


@pytest.mark.parametrize("placeholders, images, expected, found", [
    (1, 2, "2 image placeholder(s)", "1 placeholder(s)"),     # the errors page's example
    (0, 1, "1 image placeholder(s)", "0 placeholder(s)"),
    (3, 1, "1 image placeholder(s)", "more than 1"),          # more placeholders than images
])
def test_image_count_mismatch_names_expected_and_found(processor, placeholders, images, expected, found):
    row = {"messages": _user(*[{"type": "image"}] * placeholders),
           "images": [testing.tiny_image(32, 32, seed=i) for i in range(images)]}
    with pytest.raises(PlaceholderError) as info:
        mmpipe.encode_row(row, processor, idx=7)
    e = info.value
    assert (e.row, e.column, e.stage) == (7, "images", "template")
    assert e.expected is not None and e.expected.startswith(expected), e.expected
    assert e.found == found
    assert f"expected {e.expected}" in str(e) and f"found {e.found}" in str(e)


def test_verl_prompt_mismatch_names_expected_and_found(processor):
    row = {"prompt": "<image><image>Two?", "images": [testing.tiny_image(32, 32)]}
    with pytest.raises(PlaceholderError) as info:
        mmpipe.encode_row(row, processor)
    assert info.value.expected is not None and info.value.found is not None, str(info.value)
