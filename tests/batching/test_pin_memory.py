"""``DataLoader(pin_memory=True)`` pins a batch's and a pack's tensors: torch's pin step pins a
tensor, a mapping, a sequence or an object with a ``pin_memory()`` method and hands anything else
over as it is, so a `BatchedMultiModalInputs` / `PackedMultiModalInputs` without the method reached
the trainer unpinned, silently (async host-to-device copies then wait). This machine has no
accelerator to pin for: ``Tensor.pin_memory`` is replaced by a marking copy, which shows what the
pin step touches."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

import mmpipe
from mmpipe.batching.packing import pack
from mmpipe.testing import invariants

from helpers import prompt_rows


def test_the_pin_step_pins_every_tensor_of_a_batch_and_a_pack(monkeypatch):
    from mmpipe import testing

    proc = testing.build_processor("qwen2_vl")
    rows = prompt_rows(proc, (1, 0, 2))
    pinned = set()

    def marked(self, *a, **k):
        out = self.clone()
        pinned.add(id(out))
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", marked)
    batch, packed = mmpipe.Collator(proc)(rows), pack(rows, processor=proc)
    got = torch_pin(batch)
    tensors = {k: v for k, v in vars(got).items() if isinstance(v, torch.Tensor)}
    assert tensors and all(id(v) in pinned for v in tensors.values()), sorted(k for k, v in tensors.items()
                                                                             if id(v) not in pinned)
    invariants.assert_roundtrip(rows, got)  # the same batch, pinned
    got_pack = torch_pin(packed)
    assert id(got_pack.input_ids) in pinned and id(got_pack.meta.pixel_values) in pinned
    np.testing.assert_array_equal(got_pack.input_ids.numpy(), packed.input_ids.numpy())
