"""The generic path (issue 20.1, standalone): a processor mmpipe has no family table for ->
its own chat template and call -> GenericInputs -> collate_generic -> a real tiny model, with
batched logits equal to per-row logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmpipe.batching.collate import collate
from mmpipe.batching.unbatch import unbatch as unbatch_generic
from mmpipe.encoding.encoder import Encoder
from mmpipe.errors import ArgumentError
from mmpipe.offline import build_processor, tiny_image
from mmpipe.offline.other_vlms import FOREIGN_PROCESSORS, build_foreign_model, build_foreign_processor


def collate_generic(rows, **kw):  # the one collate; the generic path's old default: right padding
    return collate(rows, **{"padding_side": "right", **kw})


SIZES = [(40, 56), (70, 30), (33, 33), (64, 100)]


def _rows(n_images_per_row, sizes=SIZES):
    """Chat rows with the given image counts; images of different sizes (different tile counts)."""
    out, k = [], 0
    for i, n in enumerate(n_images_per_row):
        images = [tiny_image(*sizes[(k + j) % len(sizes)]) for j in range(n)]
        k += n
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"describe row {i}" + " so" * i}]
        out.append({"messages": [{"role": "user", "content": content},
                                 {"role": "assistant", "content": [{"type": "text", "text": "a cat" * (i + 1)}]}],
                    "images": images})
    return out


@pytest.fixture(scope="module")
def idefics3():
    proc = build_foreign_processor("idefics3")
    return Encoder(proc, family="generic", log=lambda _: None), build_foreign_model("idefics3")


def test_one_log_line_names_the_class_and_path():
    lines = []
    Encoder(build_foreign_processor("gemma3"), family="generic", log=lines.append)
    assert len(lines) == 1 and "Gemma3Processor" in lines[0] and "generic path" in lines[0]


def test_native_family_is_refused():
    with pytest.raises(ArgumentError, match="native family 'qwen2_vl'"):
        Encoder(build_processor("qwen2_vl"), family="generic", log=lambda _: None)


@pytest.mark.parametrize("image_text", ["[an image is attached]", ""])
def test_a_template_without_image_placeholders_is_refused(image_text):
    """A chat template that renders image items as other text (a checkpoint template that writes a
    media reminder) or as nothing: the images would never reach the model. The encoder refuses at its
    first row with a typed error naming the processor, the placeholder count and the fix (it raised the
    processor's raw ValueError from the layout probe, or, where the call takes such text, stored pixels
    no token refers to); on_error="skip" does not skip it row by row."""
    import mmpipe

    proc = build_foreign_processor("llava")
    proc.chat_template = proc.chat_template.replace("<image>", image_text)
    raws = _rows([1, 0])
    for kw in ({}, {"on_error": "skip"}):
        with pytest.raises(ArgumentError, match=r"LlavaProcessor: its chat template does not write an image "
                                                r"placeholder.*expected 2 placeholders \('<image>'\).*found 0 x"):
            mmpipe.encode_row(raws[0], proc, **kw)
    with pytest.raises(ArgumentError, match="chat_template_kwargs=\\{'chat_template': TEMPLATE\\}"):
        mmpipe.encode({k: [raws[1][k]] for k in raws[1]}, processor=proc)  # a batch, a text-only row
    fixed = mmpipe.encode_row(raws[0], proc, chat_template_kwargs={"chat_template": build_foreign_processor("llava").chat_template})
    assert len(fixed.image_hw) == 1


@pytest.mark.parametrize("name", FOREIGN_PROCESSORS)
def test_rows_equal_the_processor_and_round_trip(name):
    """Row == the processor's own call on the same text; unbatch(collate(rows)) == rows,
    both padding sides; float pixels keep the processor's dtype."""
    proc = build_foreign_processor(name)
    enc = Encoder(proc, family="generic", log=lambda _: None)
    raw = _rows([1, 0, 2])
    rows = [enc.encode_row(r, i) for i, r in enumerate(raw)]
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
                                    tokenize=False, add_generation_prompt=True)
    direct = proc(text=[text], images=[tiny_image(40, 56)], return_tensors="np")
    one = enc.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
               "images": [tiny_image(40, 56)]})
    assert np.array_equal(one.input_ids, direct["input_ids"][0])
    assert one.vision["pixel_values"].dtype == np.asarray(direct["pixel_values"]).dtype == np.float32
    assert np.array_equal(one.vision["pixel_values"], direct["pixel_values"])
    for side in ("left", "right"):
        back = unbatch_generic(collate_generic(rows, pad_token_id=enc.pad_token_id, padding_side=side))
        assert all(a.equals(b) for a, b in zip(back, rows))


def test_idefics3_row_keys_and_ragged_tiles(idefics3):
    enc, _ = idefics3
    assert enc.row_keys() == ("pixel_attention_mask", "pixel_values")
    rows = [enc.encode_row(r) for r in _rows([1, 0, 3])]
    batch = collate_generic(rows, pad_token_id=enc.pad_token_id)
    tiles = [r.vision["pixel_values"].shape[1] if "pixel_values" in r.vision else 0 for r in rows]
    assert len(set(tiles)) > 1 and batch.vision["pixel_values"].shape[:2] == (3, max(tiles))
    assert batch.vision["pixel_attention_mask"].dtype == rows[0].vision["pixel_attention_mask"].dtype  # the processor's
    assert np.array_equal(batch.position_ids[0, : batch.lengths[0]], np.arange(batch.lengths[0]))


@pytest.mark.parametrize("side", ["right", "left"])
def test_idefics3_batched_logits_equal_per_row(idefics3, side):
    enc, model = idefics3
    rows = [enc.encode_row(r) for r in _rows([2, 0, 1, 3])]
    batch = collate_generic(rows, pad_token_id=enc.pad_token_id, padding_side=side)
    with torch.no_grad():
        batched = model(**batch.model_inputs()).logits
        L = batch.input_ids.shape[1]
        worst = 0.0
        for b, row in enumerate(rows):
            alone = model(**collate_generic([row], pad_token_id=enc.pad_token_id).model_inputs()).logits[0]
            n = len(row)
            cols = slice(0, n) if side == "right" else slice(L - n, L)
            worst = max(worst, float((batched[b, cols] - alone).abs().max()))
    assert worst < 1e-5, worst


def test_idefics3_collate_equals_the_processors_own_batch(idefics3):
    """collate_generic(per-row encodes) == one processor call on the whole batch (right padding)."""
    from mmpipe.offline.other_vlms import build_foreign_processor as build

    enc, _ = idefics3
    proc = build("idefics3")
    proc.tokenizer.padding_side = "right"
    raw = _rows([2, 0, 1, 3])
    batch = collate_generic([enc.encode_row(r) for r in raw], pad_token_id=enc.pad_token_id)
    texts = [proc.apply_chat_template(r["messages"], tokenize=False) for r in raw]
    out = proc(text=texts, images=[r["images"] for r in raw], return_tensors="np", padding=True)
    assert np.array_equal(out["input_ids"], batch.input_ids) and np.array_equal(out["attention_mask"], batch.attention_mask)
    for key in ("pixel_values", "pixel_attention_mask"):
        assert np.array_equal(out[key], batch.vision[key])
