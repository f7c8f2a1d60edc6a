"""GLM-4.1V as a native family: encode == the real Glm4vProcessor (ids, pixels, grids, token
types), positions == Glm4vModel.get_rope_index, batched / packed logits == per-row logits,
collate / unbatch round trips (the invariant harness), layout-only == full path; videos encode
(checked in test_glm4v_video.py)."""

from __future__ import annotations

import itertools

import datasets
import numpy as np
import pytest
import torch
import transformers

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError
from mmpipe.families import GLM4V, family_of, takes_generic_path
from mmpipe.images.spec import VisionSpec, glm4v_smart_resize
from mmpipe.testing import invariants

from helpers import processor_reference, image_chat as _chat

FAM = GLM4V.name


@pytest.fixture(scope="module")
def proc():
    return testing.build_processor(FAM)


@pytest.fixture(scope="module")
def model():
    return testing.build_model(FAM)


@pytest.fixture(scope="module")
def photos():
    return [im.convert("RGB") for _, im in testing.sample_photos()][:3]


def _assert_matches_processor(row, proc, msgs, images, model=None):
    ref = processor_reference(proc, msgs, images)
    np.testing.assert_array_equal(row.input_ids, ref["input_ids"][0])
    np.testing.assert_array_equal(row.mm_token_type_ids, ref["mm_token_type_ids"][0])
    np.testing.assert_array_equal(row.image_grid_thw, ref["image_grid_thw"].reshape(-1, 3))
    if images:  # compact uint8 storage expanded at collate == the processor's float32, bit for bit
        batch = mmpipe.collate([row], processor=proc)
        assert batch.pixel_values.dtype == torch.float32
        np.testing.assert_array_equal(batch.pixel_values.numpy(), ref["pixel_values"])
    invariants.assert_row_positions(row, model=model)  # == mmpipe's rule and Glm4vModel.get_rope_index


def test_family_comes_from_the_classes(proc, model):
    assert family_of(proc) is GLM4V and not takes_generic_path(proc)
    assert family_of(model) is GLM4V and family_of(model.config) is GLM4V
    assert family_of(transformers.Glm4vMoeConfig()) is GLM4V  # GLM-4.5V: same processor, MoE text model
    assert VisionSpec.from_processor(proc).resize_rule == "glm4v"
    # the family's tokens are the processor's own
    assert proc.image_token == GLM4V.image_token and proc.video_token == GLM4V.video_token
    assert GLM4V.factor == 28 and GLM4V.patch_dim == 1176 and GLM4V.patch_dim_u8 == 588


def test_encode_equals_processor_on_real_photos(proc, model, photos):
    msgs = _chat(len(photos), answer="Three pictures.")
    row = mmpipe.encode_row({"messages": msgs, "images": photos}, proc)
    assert row.family == FAM and row.pixel_format == "uint8"
    _assert_matches_processor(row, proc, msgs, photos, model)
    # float32 storage equals the processor too, and the labels cover exactly the answer
    one = _chat(1, answer="Three pictures.")
    f32 = mmpipe.encode_row({"messages": one, "images": photos[:1]}, proc, pixels="float32")
    ref = processor_reference(proc, one, photos[:1])
    np.testing.assert_array_equal(f32.pixel_values, ref["pixel_values"])
    labelled = row.input_ids[row.labels != -100]
    assert proc.tokenizer.decode(labelled) == "Three pictures."


# odd sizes: sides below 28 (GLM scales those up first), elongated, prime, and near the bounds
ODD_SIZES = [(13, 200), (27, 27), (1, 150), (97, 211), (211, 97), (512, 128), (29, 1500), (300, 31), (600, 600)]


@pytest.mark.parametrize("h,w", ODD_SIZES)
def test_encode_equals_processor_on_odd_sizes(proc, h, w):
    img = testing.tiny_image(h, w, seed=h * 7 + w)
    msgs = _chat(1)
    row = mmpipe.encode_row({"messages": msgs, "images": [img]}, proc)
    _assert_matches_processor(row, proc, msgs, [img])


def test_resize_rule_equals_transformers():
    from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize as hf_resize

    lo, hi = 112 * 112, 28 * 28 * 15000
    sizes = list(itertools.product([1, 5, 14, 27, 28, 29, 55, 97, 224, 333, 1000, 2999], repeat=2))
    sizes += [(4000, 6000), (20, 3999), (17, 3000)]
    for (h, w), (mn, mx) in itertools.product(sizes, [(lo, hi), (4 * 1568, 64 * 1568), (1568, 1568 * 3)]):
        try:
            want = hf_resize(num_frames=2, height=h, width=w, temporal_factor=2, factor=28, min_pixels=mn, max_pixels=mx)
        except ValueError:
            with pytest.raises(ImageError):
                glm4v_smart_resize(h, w, 28, mn, mx)
            continue
        assert glm4v_smart_resize(h, w, 28, mn, mx) == want, (h, w, mn, mx)


def _rows(proc, counts, *, answer=True, seed=0):
    rows = []
    for i, k in enumerate(counts):
        imgs = [testing.tiny_image(40 + 16 * j + 8 * i, 56 + 24 * i, seed=seed + 5 * i + j) for j in range(k)]
        msgs = _chat(k, answer=f"Answer {i}." if answer else None)
        if i % 2:
            msgs[0]["content"].insert(0, {"type": "text", "text": "Please look carefully. "})
        rows.append(mmpipe.encode_row({"messages": msgs, "images": imgs}, proc))
    return rows


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batched_logits_equal_per_row_logits(proc, model, padding_side):
    rows = _rows(proc, [0, 1, 2, 3])
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=padding_side)
    invariants.assert_positions_match_rows(batch, rows, model=model)
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, padding_side=padding_side)


def test_row_alone_equals_the_processor_forward(proc, model, photos):
    msgs = _chat(2, answer="Two.")
    row = mmpipe.encode_row({"messages": msgs, "images": photos[:2]}, proc)
    ref = processor_reference(proc, msgs, photos[:2])
    invariants.assert_batched_logits_match(model, [row], proc, references=[ref], atol=1e-6, rtol=1e-6)


def test_packing_restarts_positions_per_segment(proc, model):
    rows = _rows(proc, [2, 0, 1, 3], seed=11)
    packed = invariants.assert_pack_roundtrip(rows, processor=proc)
    invariants.assert_packed_logits_match(model, rows, proc, packed=packed, atol=2e-5)


def test_stored_rows_come_back_through_arrow_and_the_collator(proc, tmp_path):
    raw = []
    for i, k in enumerate([1, 0, 2]):
        paths = []
        for j in range(k):
            p = tmp_path / f"{i}-{j}.png"
            testing.tiny_image(50 + 10 * j, 70 + 9 * i, seed=i + j).save(p)
            paths.append(str(p))
        raw.append({"messages": _chat(k, answer=f"Answer {i}."), "images": paths})
    ds = datasets.Dataset.from_list(raw)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    want = [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raw)]
    batch = mmpipe.Collator(proc, padding_side="right")(mmpipe.ArrowRows(enc).__getitems__([0, 1, 2]))
    invariants.assert_roundtrip(want, batch)
    invariants.assert_positions_match_rows(batch, want)


def test_layout_only_equals_full_path(proc, photos, tmp_path):
    paths = []
    for i, im in enumerate(photos + [testing.tiny_image(13, 200)]):
        p = tmp_path / f"{i}.png"
        im.save(p)
        paths.append(str(p))
    msgs = _chat(len(paths), answer="ok")
    full = mmpipe.encode_row({"messages": msgs, "images": paths}, proc)
    lay = mmpipe.encode_row({"messages": msgs, "images": paths}, proc, pixels="none")
    assert lay.pixel_format == "none" and lay.pixel_values_u8 is None
    for f in ("input_ids", "image_grid_thw", "position_ids", "mm_token_type_ids", "labels"):
        np.testing.assert_array_equal(getattr(lay, f), getattr(full, f))
    assert lay.rope_delta == full.rope_delta


def test_compact_bytes_vs_float32(proc, photos, capsys):
    msgs = _chat(len(photos))
    u8 = mmpipe.encode_row({"messages": msgs, "images": photos}, proc)
    f32 = mmpipe.encode_row({"messages": msgs, "images": photos}, proc, pixels="float32")
    assert u8.pixel_values_u8.dtype == np.uint8 and u8.pixel_values_u8.shape[1] == GLM4V.patch_dim_u8
    assert u8.pixel_values_u8.nbytes * 8 == f32.pixel_values.nbytes  # one temporal copy, 1 byte vs 4
    n = len(photos)
    with capsys.disabled():
        print(f"\nglm4v storage: {u8.pixel_values_u8.nbytes / n:.0f} B/image uint8 vs "
              f"{f32.pixel_values.nbytes / n:.0f} B/image float32 ({f32.pixel_values.nbytes / u8.pixel_values_u8.nbytes:.0f}x)")


def test_videos_encode_as_frame_blocks(proc):
    """GLM-4.1V videos encode (tests/encoding/test_glm4v_video.py checks them against the processor):
    per frame group an <|image|> block with token type 2, inside <|begin_of_video|>...<|end_of_video|>."""
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    frames = [np.zeros((56, 56, 3), np.uint8)] * 4
    row = mmpipe.encode_row({"messages": msgs, "videos": [frames]}, proc, video_options={"max_pixels": 28 * 28 * 16})
    assert row.video_grid_thw.tolist() == [[2, 4, 4]] and (row.mm_token_type_ids == 2).sum() == 2 * 4


def test_load_processor_testing_glm4v():
    """The CLI's ``--processor testing:glm4v`` (`mmpipe.processors.load_processor`) builds the
    offline GLM-4.1V processor, which encodes as the glm4v family."""
    from mmpipe.processors import load_processor

    proc = load_processor("testing:glm4v")
    assert family_of(proc) is GLM4V and not takes_generic_path(proc)


def test_source_rows_collate_to_the_uint8_rows(proc, photos):
    """pixels="source" (the files, decoded and resized at collate) gives GLM-4.1V rows the same
    batch as the uint8 rows, as for the Qwen families."""
    import io

    def jpeg(img):
        buf = io.BytesIO()
        img.convert("RGB").save(buf, format="JPEG", quality=90)
        return {"bytes": buf.getvalue()}

    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "hi"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "two photos"}]}],
           "images": [jpeg(p) for p in photos[:2]]}
    u8, src = mmpipe.encode_row(raw, proc), mmpipe.encode_row(raw, proc, pixels="source")
    a, b = mmpipe.collate([u8.to_dict()], processor=proc), mmpipe.collate([src.to_dict()], processor=proc)
    for k in ("input_ids", "image_grid_thw", "pixel_values", "position_ids"):
        np.testing.assert_array_equal(getattr(a, k).numpy(), getattr(b, k).numpy())
