"""Memory over a long cosmos-rl run (hunt): the packers' prompt cache is bounded by bytes.
cosmos-rl's policy side hands `get_policy_input` each rollout's item deserialized anew (a new
object every call), so the identity cache never hits there; it kept up to 4,096 items (their
decoded images) and encoded rows alive: GBs with real photos. Counted, not timed: the items
still alive (weak references) and the bytes the cache says it holds."""

from __future__ import annotations

import gc
import weakref

from mmpipe.rollout import cosmos_side
from mmpipe.rollout.packers import QwenVLDataPacker
from mmpipe.testing import tiny_image

from conftest import processor_for


class Item(dict):
    """A dataset item as cosmos-rl deserializes it (a dict; a subclass only to take weak references)."""


def item(k: int) -> Item:
    return Item(messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{k}"}]}],
                images=[tiny_image(112, 112, seed=k)])


def test_policy_inputs_of_fresh_items_do_not_pile_up(monkeypatch):
    cache = getattr(cosmos_side, "PromptCache", None)  # (before the fix there was none: the assertion fails)
    if cache is not None:
        monkeypatch.setattr(cache, "MAX_BYTES", 1 << 20)  # 1 MiB instead of 256: a dozen of these items
    packer = QwenVLDataPacker(processor_for("qwen2_vl"))
    alive = []
    for k in range(60):  # each ~80 KB: its 112x112 image and its encoded row (36 KB of uint8 patches)
        it = item(k)
        alive.append(weakref.ref(it))
        row = packer.get_policy_input(it, [11, 12, 13])
        assert row.num_images == 1
        del it, row
    gc.collect()
    kept = sum(r() is not None for r in alive)
    assert 1 <= kept <= 20  # was 60: every item and its row kept (up to 4,096 of them)


def test_repeated_item_still_hits():
    """The point of the cache stays: the same unchanged item is encoded once; an in-place edit
    of its messages is encoded again."""
    packer = QwenVLDataPacker(processor_for("qwen2_vl"))
    it = item(0)
    first = packer.encode_prompt(it)
    assert packer.encode_prompt(it) is first and packer.get_policy_input(it, [11]).num_images == 1
    it["messages"] = it["messages"] + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    assert packer.encode_prompt(it) is not first
