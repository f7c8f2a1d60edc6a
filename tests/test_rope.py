"""mmpipe.rope against transformers' real get_rope_index and a plain reference.

Every family's real ``model.model.get_rope_index`` (transformers 5.23) runs on a tiny
randomly initialised model built from a local config (no download). The reference
implementation below is the original Qwen rule (transformers 4.x / vLLM) written as a plain
per-row loop; it is the oracle where transformers 5.23 diverges (long videos) or crashes
(adjacent blocks).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmpipe.errors import ArgumentError
from mmpipe.families import family_of
from mmpipe.compat import is_transformers_5
from mmpipe.rope import get_rope_index, text_positions, to_verl_positions

try:
    from tests.strategies import batch_layout, grid_thw, materialize, row_layout
except ImportError:  # tests/ not a package on this run
    from strategies import batch_layout, grid_thw, materialize, row_layout

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
# The comparisons with transformers' own get_rope_index call it the 5.x way (token types
# passed in; synthetic layouts whose blocks carry no <|vision_start|>). 4.x finds blocks from
# <|vision_start|> ids and keeps the original long-video rule, so those comparisons do not
# apply there; on 4.57 the positions of real encoded rows are checked against 4.57's
# get_rope_index by tests/batching/test_properties.py, tests/rollout/test_model_sees_images.py
# and tests/offline/test_fixtures.py (mmpipe.compat.hf_get_rope_index).
NEEDS_TF5_ROPE = pytest.mark.skipif(
    not is_transformers_5(), reason="compares with transformers 5.x's get_rope_index API and long-video rule"
)
MERGE = 2
PROP = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- tiny real models
@functools.lru_cache(maxsize=None)
def tiny_model(family: str):
    """Tiny randomly initialised transformers model; only its get_rope_index is used."""
    import transformers as tf

    ids = dict(image_token_id=290, video_token_id=291, vision_start_token_id=292, vision_end_token_id=293)
    text = dict(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
        # head_dim = 64 / 4 = 16; sum(mrope_section) == head_dim / 2
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
    )
    if family == "qwen2_vl":
        cfg = tf.Qwen2VLConfig(
            text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2), **ids
        )
        model = tf.Qwen2VLModel(cfg)
    elif family == "qwen2_5_vl":
        cfg = tf.Qwen2_5_VLConfig(
            text_config=text,
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, out_hidden_size=64, num_heads=2,
                               tokens_per_second=2, fullatt_block_indexes=[0]),
            **ids,
        )
        model = tf.Qwen2_5_VLModel(cfg)
    else:
        rope = dict(text["rope_parameters"], mrope_interleaved=True)
        cfg = tf.Qwen3VLConfig(
            text_config=dict(text, head_dim=16, rope_parameters=rope),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, out_hidden_size=64, num_heads=2,
                               deepstack_visual_indexes=[0], num_position_embeddings=64),
            **ids,
        )
        model = tf.Qwen3VLModel(cfg)
    assert cfg.vision_config.spatial_merge_size == MERGE
    return model.eval()


def hf_rope(family, b, second_per_grid_ts=None):
    kw = {}
    if family == "qwen2_5_vl":
        kw["second_per_grid_ts"] = second_per_grid_ts
    return tiny_model(family).get_rope_index(
        b["input_ids"], b["mm_token_type_ids"], image_grid_thw=b["image_grid_thw"],
        video_grid_thw=b["video_grid_thw"], attention_mask=b["attention_mask"], **kw,
    )


def ours(family, b, second_per_grid_ts=None):
    return get_rope_index(
        b["input_ids"], b["mm_token_type_ids"], b["image_grid_thw"], b["video_grid_thw"],
        second_per_grid_ts, b["attention_mask"], family=family,
    )


# ---------------------------------------------------------------- reference (original rule)
def reference_rope(tt, mask, image_grid_thw, video_grid_thw, second_per_grid_ts, family):
    """Original Qwen rule, one row and one block at a time (the oracle, deliberately naive).

    Runs of one vision type are split greedily by the grid sizes; text after a block starts
    at the block's max position + 1.
    """
    fam = family_of(family)
    m, tps = fam.merge_size, fam.tokens_per_second
    imgs = [list(map(int, g)) for g in image_grid_thw] if image_grid_thw is not None else []
    vids = [list(map(int, g)) for g in video_grid_thw] if video_grid_thw is not None else []
    secs = [float(s) for s in second_per_grid_ts] if second_per_grid_ts is not None else [1.0] * len(vids)
    if fam.rope == "mrope_frames":
        vids = [[1, h, w] for t, h, w in vids for _ in range(t)]
        secs = [1.0] * len(vids)
    queues = {1: [(g, 1.0) for g in imgs], 2: list(zip(vids, secs))}
    B, L = tt.shape
    pos = torch.zeros(3, B, L, dtype=torch.long)
    deltas = torch.zeros(B, 1, dtype=torch.long)
    for b in range(B):
        cols = [i for i in range(L) if mask is None or mask[b, i]]
        types = [int(tt[b, i]) for i in cols]
        out, cur = [], 0
        for key, grp in itertools.groupby(types):
            n = len(list(grp))
            if key == 0:
                out += [(cur + j,) * 3 for j in range(n)]
                cur += n
                continue
            while n > 0:
                (t, h, w), sec = queues[key].pop(0)
                h, w = h // m, w // m
                scale = np.float32(tps * sec) if (key == 2 and fam.rope == "mrope_tps") else 1
                blk = [(cur + int(np.float32(ti) * scale) if scale != 1 else cur + ti, cur + hi, cur + wi)
                       for ti in range(t) for hi in range(h) for wi in range(w)]
                out += blk
                cur = max(max(p) for p in blk) + 1
                n -= t * h * w
            assert n == 0
        for c, p in zip(cols, out):
            pos[:, b, c] = torch.tensor(p)
        deltas[b, 0] = (max(max(p) for p in out) + 1 - len(out)) if out else 0
    assert all(not q for q in queues.values())
    return pos, deltas


def assert_same(a, b):
    assert a[0].dtype == torch.long and a[1].dtype == torch.long
    assert a[0].shape == b[0].shape and a[1].shape == b[1].shape
    assert torch.equal(a[0], b[0]), (a[0], b[0])
    assert torch.equal(a[1].reshape(-1), b[1].reshape(-1)), (a[1], b[1])


# ---------------------------------------------------------------- images: == transformers
@NEEDS_TF5_ROPE
@pytest.mark.parametrize("family", FAMILIES)
@PROP
@given(layout=batch_layout(row_layout(min_text=1)))
def test_images_match_transformers(family, layout):
    rows, side = layout
    b = materialize(rows, side)
    got = ours(family, b)
    assert_same(got, hf_rope(family, b))
    # generated token k sits at n_valid + delta + k: recomputing the rule over prompt +
    # response (response as text) gives exactly that
    n_valid = b["attention_mask"].sum(1)
    resp = materialize([r + [("text", 3)] for r in rows], "right")
    full, _ = ours(family, resp)
    for i in range(len(rows)):
        n = int(n_valid[i])
        expect = n + got[1][i, 0] + torch.arange(3)
        assert torch.equal(full[:, i, n : n + 3], expect.expand(3, 3))


@NEEDS_TF5_ROPE
@pytest.mark.parametrize("family", FAMILIES)
@PROP
@given(layout=batch_layout(row_layout(min_text=0)), extra=st.integers(0, 3))
def test_rows_starting_with_blocks_and_extra_pads_match_transformers(family, layout, extra):
    rows, side = layout
    b = materialize(rows, side, extra_pad=extra)
    assert_same(ours(family, b), hf_rope(family, b))


# ---------------------------------------------------------------- videos
def video_seg():
    """Video segments: grids with t in 1..5 (t is in temporal patches, as the processor reports)."""
    return grid_thw(t=st.integers(1, 5)).map(lambda g: ("video", g))


def qwen3_frames(rows, ts_tokens=2):
    """Qwen3-VL layout: a video (t, h, w) is t frame blocks (1, h, w), each preceded by
    timestamp text tokens; video_grid_thw keeps the (t, h, w) rows."""
    out, vids = [], []
    for r in rows:
        new = []
        for seg in r:
            if seg[0] == "video":
                t, h, w = seg[1]
                vids.append([t, h, w])
                for _ in range(t):
                    new += [("text", ts_tokens), ("video", (1, h, w))]
            else:
                new.append(seg)
        out.append(new)
    return out, vids


def no_divergence(family, seg, sec):
    t, h, w = seg[1]
    tmax = t - 1 if family == "qwen2_vl" else int(np.float32(t - 1) * np.float32(2.0 * sec))
    return tmax + 1 <= max(h, w) // MERGE


@NEEDS_TF5_ROPE
@pytest.mark.parametrize("family", FAMILIES)
@PROP
@given(data=st.data())
def test_videos_match_transformers_when_t_fits(family, data):
    """Where the temporal extent fits in max(h, w)/merge, transformers 5.23 agrees with the
    original rule for videos too (Qwen3-VL: always, frames are t=1 blocks)."""
    vision = st.one_of(grid_thw().map(lambda g: ("image", g)), video_seg())
    rows, side = data.draw(batch_layout(row_layout(vision, min_text=1)))
    vids = [s for r in rows for s in r if s[0] == "video"]
    secs = data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=len(vids), max_size=len(vids)))
    if family == "qwen3_vl":
        rows, grids = qwen3_frames(rows)
        b = materialize(rows, side)
        b["video_grid_thw"] = torch.tensor(grids, dtype=torch.long) if grids else None
    else:
        b = materialize(rows, side)
    sec = torch.tensor(secs, dtype=torch.float32) if (vids and family == "qwen2_5_vl") else None
    got = ours(family, b, sec)
    assert_same(got, reference_rope(b["mm_token_type_ids"], b["attention_mask"], b["image_grid_thw"],
                                    b["video_grid_thw"], sec, family))
    if family == "qwen3_vl" or all(no_divergence(family, s, x) for s, x in zip(vids, secs)):
        assert_same(got, hf_rope(family, b, sec))


@NEEDS_TF5_ROPE
@pytest.mark.parametrize("sec", [0.5, 1.0, 2.0])
def test_qwen2_5_vl_video_seconds_match_transformers(sec):
    # merged grid (2, 6, 6): tmax = floor(1 * 2 * sec) <= 4 < 6, no divergence
    rows = [[("text", 3), ("video", (2, 12, 12)), ("text", 2), ("image", (1, 4, 6)), ("text", 1)],
            [("text", 1), ("video", (2, 12, 8)), ("text", 4)]]
    b = materialize(rows, "left")
    s = torch.tensor([sec, sec / 2], dtype=torch.float32)
    got = ours("qwen2_5_vl", b, s)
    assert_same(got, hf_rope("qwen2_5_vl", b, s))
    # the temporal index is really scaled: second frame group of the first video
    v = b["mm_token_type_ids"][0] == 2
    assert int(got[0][0, 0][v].max() - got[0][0, 0][v].min()) == int(2.0 * sec)


@NEEDS_TF5_ROPE
def test_qwen3_vl_frames_with_timestamps_match_transformers():
    rows, grids = qwen3_frames([[("text", 2), ("video", (3, 4, 6)), ("text", 3)],
                                [("text", 1), ("image", (1, 4, 4)), ("text", 1), ("video", (2, 2, 2))]])
    b = materialize(rows, "right")
    b["video_grid_thw"] = torch.tensor(grids)
    assert_same(ours("qwen3_vl", b), hf_rope("qwen3_vl", b))


@NEEDS_TF5_ROPE
def test_qwen2_vl_long_video_uses_block_max_plus_one():
    """A video whose temporal extent (t=4) exceeds max(h, w)/merge (2).

    The original Qwen rule (transformers 4.x, vLLM, the trained checkpoints) starts the text
    after a block at the block's max position + 1. transformers 5.23 advances by
    max(h, w) // merge instead, so its text positions after such a video overlap the
    video's temporal positions. We follow the original rule; the values are written out.
    """
    tt = torch.tensor([[0, 0] + [2] * 16 + [0, 0]])  # video grid (4, 4, 4) -> merged (4, 2, 2)
    grid = torch.tensor([[4, 4, 4]])
    pos, delta = get_rope_index(tt, tt, video_grid_thw=grid, family="qwen2_vl")
    t_axis = [0, 1] + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4 + [6, 7]
    h_axis = [0, 1] + [2, 2, 3, 3] * 4 + [6, 7]
    w_axis = [0, 1] + [2, 3, 2, 3] * 4 + [6, 7]
    assert pos.tolist() == [[t_axis], [h_axis], [w_axis]]
    assert delta.tolist() == [[8 - 20]]  # max 7 + 1 - 20 tokens
    # transformers 5.23: same block, but the text after it starts at 2 + 4 // 2 = 4
    hf_pos, hf_delta = tiny_model("qwen2_vl").get_rope_index(tt, tt, video_grid_thw=grid)
    assert torch.equal(hf_pos[:, :, :18], pos[:, :, :18])
    assert hf_pos[:, 0, 18:].tolist() == [[4, 5]] * 3
    assert hf_delta.tolist() == [[6 - 20]]


def test_qwen2_5_vl_long_video_scaled_follows_original_rule():
    # merged (3, 2, 2), tps 2 * sec 1.5 = 3 -> temporal 0, 3, 6; text after at start + 7
    tt = torch.tensor([[0] + [2] * 12 + [0]])
    pos, delta = get_rope_index(tt, tt, video_grid_thw=[[3, 4, 4]], second_per_grid_ts=[1.5], family="qwen2_5_vl")
    assert pos[0, 0].tolist() == [0] + [1] * 4 + [4] * 4 + [7] * 4 + [8]
    assert pos[1, 0].tolist() == [0] + [1, 1, 2, 2] * 3 + [8]
    assert delta.item() == 9 - 14


# ---------------------------------------------------------------- video time: float64 (vLLM) vs float32
def vllm_video_rope(grid_t, grid_h, grid_w, sec32, tps, text_before):
    """The temporal row of one text + video block as vLLM 0.32 computes it
    (``Qwen2_5_VLForConditionalGeneration.get_mrope_input_positions``): t_factor = the stored
    float32 seconds as a Python float times tokens_per_second; ``(np.indices(...)[0] *
    t_factor).astype(int64)`` in float64."""
    t_factor = float(np.float32(sec32)) * tps
    idx = np.indices((grid_t, grid_h // MERGE, grid_w // MERGE))
    t = (idx[0] * t_factor).astype(np.int64) if t_factor != 1.0 else idx[0]
    return np.concatenate([np.arange(text_before), t.reshape(-1) + text_before])


def one_video_batch(grid, text_before=2):
    n = grid[0] * grid[1] * grid[2] // MERGE**2
    tt = torch.tensor([[0] * text_before + [2] * n + [0]])
    return {"input_ids": tt, "mm_token_type_ids": tt, "image_grid_thw": None,
            "video_grid_thw": torch.tensor([grid]), "attention_mask": torch.ones_like(tt)}


def test_qwen2_5_vl_25fps_frame_group_25_float64_like_vllm():
    """25 fps: second_per_grid_ts = float32(2/25). Frame group 25: 25 * 2 * 0.07999999821 =
    3.9999999 -> 3 in float64 (vLLM), rounds to 4.0 -> 4 in float32 (transformers, verl)."""
    b = one_video_batch([26, 4, 4])  # merged (26, 2, 2): 4 tokens per frame group
    sec = torch.tensor([2 / 25], dtype=torch.float32)
    kw = dict(second_per_grid_ts=sec, attention_mask=b["attention_mask"], family="qwen2_5_vl")
    vllm_pos, _ = get_rope_index(b["input_ids"], b["mm_token_type_ids"], video_grid_thw=b["video_grid_thw"], **kw)
    tf_pos, _ = get_rope_index(b["input_ids"], b["mm_token_type_ids"], video_grid_thw=b["video_grid_thw"],
                               video_time="transformers", **kw)
    group_25 = slice(2 + 25 * 4, 2 + 26 * 4)
    assert vllm_pos[0, 0, group_25].tolist() == [2 + 3] * 4
    assert tf_pos[0, 0, group_25].tolist() == [2 + 4] * 4
    assert vllm_pos[0, 0, :-1].numpy().tolist() == vllm_video_rope(26, 4, 4, 2 / 25, 2.0, 2).tolist()


@pytest.mark.parametrize("fps", [1.0, 2.0, 23.976, 24.0, 25.0, 29.97, 30.0, 50.0, 59.94, 60.0, 1 / 3])
def test_qwen2_5_vl_video_time_matches_vllm_formula(fps):
    sec = np.float32(2 / fps)
    b = one_video_batch([40, 4, 4])
    pos, _ = get_rope_index(b["input_ids"], b["mm_token_type_ids"], video_grid_thw=b["video_grid_thw"],
                            second_per_grid_ts=torch.tensor([sec]), family="qwen2_5_vl")
    assert pos[0, 0, :-1].numpy().tolist() == vllm_video_rope(40, 4, 4, sec, 2.0, 2).tolist()
    assert pos[0, 0, -1].item() == pos[0, 0, :-1].max().item() + 1  # text after: block max + 1


@NEEDS_TF5_ROPE
@pytest.mark.parametrize("fps", [24.0, 25.0, 29.97, 30.0])
def test_qwen2_5_vl_video_time_transformers_rule_matches_transformers(fps):
    # merged grid (26, 5, 5): tmax <= 25 * 2 * 2/24 < 5, so transformers' block advance agrees
    b = one_video_batch([26, 10, 10])
    sec = torch.tensor([2 / fps], dtype=torch.float32)
    got = get_rope_index(b["input_ids"], b["mm_token_type_ids"], video_grid_thw=b["video_grid_thw"],
                         second_per_grid_ts=sec, attention_mask=b["attention_mask"], family="qwen2_5_vl",
                         video_time="transformers")
    assert_same(got, hf_rope("qwen2_5_vl", b, sec))


def test_video_time_rejects_unknown_rule():
    with pytest.raises(ArgumentError, match="video_time"):
        get_rope_index(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long),
                       family="qwen2_5_vl", video_time="float16")


# ---------------------------------------------------------------- adjacent blocks (split rule)
@NEEDS_TF5_ROPE
def test_adjacent_same_modality_blocks_are_split_by_grids():
    # text, image (1,4,4) -> 2x2 = 4 tokens, image (1,2,4) -> 1x2 = 2 tokens, no text between
    tt = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0]])
    grids = torch.tensor([[1, 4, 4], [1, 2, 4]])
    pos, delta = get_rope_index(tt, tt, image_grid_thw=grids, family="qwen2_vl")
    assert pos.tolist() == [
        [[0, 1, 1, 1, 1, 3, 3, 5]],
        [[0, 1, 1, 2, 2, 3, 3, 5]],
        [[0, 1, 2, 1, 2, 3, 4, 5]],
    ]
    assert delta.tolist() == [[5 + 1 - 8]]
    # transformers 5.23 takes one grid per run of equal type and fails here
    with pytest.raises(Exception):
        tiny_model("qwen2_vl").get_rope_index(tt, tt, image_grid_thw=grids)


@pytest.mark.parametrize("family", FAMILIES)
@PROP
@given(data=st.data())
def test_adjacent_blocks_match_reference(family, data):
    vision = st.one_of(grid_thw().map(lambda g: ("image", g)), video_seg())
    rows, side = data.draw(batch_layout(row_layout(vision, separate_blocks=False, min_text=0)))
    b = materialize(rows, side, extra_pad=data.draw(st.integers(0, 2)))
    n_vid = 0 if b["video_grid_thw"] is None else len(b["video_grid_thw"])
    sec = torch.tensor(data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=n_vid, max_size=n_vid)))
    sec = sec if (n_vid and family == "qwen2_5_vl") else None
    got = ours(family, b, sec)
    assert_same(got, reference_rope(b["mm_token_type_ids"], b["attention_mask"], b["image_grid_thw"],
                                    b["video_grid_thw"], sec, family))


# ---------------------------------------------------------------- padding edge cases
@NEEDS_TF5_ROPE
def test_pads_inside_a_block_and_cross_row_runs_match_transformers():
    # row 0: left pad, text, image (2x2 merged) with a pad hole inside, text
    # rows 1-2: unpadded, row 1 ends with an image and row 2 starts with one
    tt = torch.tensor([
        [0, 0, 0, 1, 1, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
    ])
    mask = torch.ones_like(tt)
    mask[0, 0] = 0
    mask[0, 5] = 0  # the hole: transformers drops pads, so the block is still whole
    grids = torch.tensor([[1, 4, 4]] * 3)
    b = dict(input_ids=tt, mm_token_type_ids=tt, attention_mask=mask, image_grid_thw=grids, video_grid_thw=None)
    for fam in FAMILIES:
        assert_same(ours(fam, b), hf_rope(fam, b))


def test_rows_without_valid_tokens():
    tt = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    pos, delta = get_rope_index(tt, tt, [[1, 4, 4]], attention_mask=mask)
    assert pos[:, 1].eq(0).all() and delta[1, 0] == 0
    assert pos[:, 0, -1].tolist() == [3, 3, 3] and delta[0, 0] == -2
    pos, delta = get_rope_index(tt[1:], tt[1:], attention_mask=mask[1:])
    assert pos.shape == (3, 1, 6) and pos.eq(0).all() and delta.tolist() == [[0]]
    pos, delta = get_rope_index(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long))
    assert pos.shape == (3, 2, 0) and delta.tolist() == [[0], [0]]


def test_numpy_and_1d_inputs_and_family_objects():
    tt = np.array([0, 0, 1, 1, 1, 1, 0, 0])
    pos, delta = get_rope_index(tt, tt, np.array([[1, 4, 4]]), family=family_of("qwen2_5_vl"))
    assert isinstance(pos, torch.Tensor) and pos.dtype == torch.long and pos.shape == (3, 1, 8)
    assert pos[:, 0].tolist() == [[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]]
    assert delta.shape == (1, 1) and delta.dtype == torch.long and delta.item() == -2
    # spatial_merge_size overrides the family's: (1, 4, 4) with merge 4 is a single token
    tt1 = torch.tensor([0, 1, 0])
    pos, _ = get_rope_index(tt1, tt1, [[1, 4, 4]], spatial_merge_size=4)
    assert pos[:, 0].tolist() == [[0, 1, 2]] * 3


def test_text_family_and_helpers():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0]])
    plain = [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0], [0, 0, 1, 2, 0]]
    assert text_positions(mask).tolist() == plain
    assert text_positions(mask.numpy()).dtype == torch.long
    pos, delta = get_rope_index(mask, None, attention_mask=mask, family="text")
    assert pos.shape == (3, 3, 5) and all(pos[i].tolist() == plain for i in range(3))
    assert delta.tolist() == [[0]] * 3
    pos, _ = get_rope_index(mask, None, family="text")
    assert pos[2].tolist() == [[0, 1, 2, 3, 4]] * 3
    tt = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    m3, _ = get_rope_index(tt, tt, [[1, 4, 4]], attention_mask=torch.ones_like(tt))
    v4 = to_verl_positions(m3, torch.ones_like(tt))
    assert v4.shape == (4, 1, 7) and v4[0, 0].tolist() == list(range(7)) and torch.equal(v4[1:], m3)
    assert to_verl_positions(m3[:, 0], torch.ones(7)).shape == (4, 7)


# ---------------------------------------------------------------- errors
def test_run_grid_mismatch_names_the_row():
    rows = [[("text", 2), ("image", (1, 4, 4)), ("text", 1)], [("text", 1), ("image", (1, 4, 6)), ("text", 2)]]
    b = materialize(rows, "right")
    b["image_grid_thw"] = torch.tensor([[1, 4, 4], [1, 4, 4]])  # row 1 holds 6 tokens, grid says 4
    with pytest.raises(ValueError, match=r"row 1: image block .* 6 <\|image_pad\|> tokens .* expect 4 tokens"):
        ours("qwen2_vl", b)
    # truncated image: the run is shorter than its grid
    tt = torch.tensor([[0, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"row 0: image block .* 3 .* expect 4"):
        get_rope_index(tt, tt, [[1, 4, 4]])


def test_fewer_grids_than_blocks_raises():
    rows = [[("text", 1), ("image", (1, 4, 4)), ("text", 1)], [("text", 1), ("image", (1, 4, 4)), ("text", 1)]]
    b = materialize(rows, "left")
    b["image_grid_thw"] = b["image_grid_thw"][:1]
    with pytest.raises(ValueError, match=r"row 1: image block .* no image_grid_thw row left"):
        ours("qwen2_5_vl", b)
    tt = torch.tensor([[0, 2, 2, 2, 2, 0]])
    with pytest.raises(ValueError, match="no video_grid_thw row left"):
        get_rope_index(tt, tt, family="qwen2_vl")


def test_grids_left_over_raise():
    tt = torch.tensor([[0, 1, 1, 1, 1, 0]])
    with pytest.raises(ValueError, match=r"image_grid_thw has 2 rows .* left over"):
        get_rope_index(tt, tt, [[1, 4, 4], [1, 4, 4]])


def test_bad_token_types_and_missing_types_raise():
    tt = torch.tensor([[0, 3, 0]])
    with pytest.raises(ValueError, match="0 \\(text\\), 1 \\(image\\) or 2 \\(video\\)"):
        get_rope_index(tt, tt)
    with pytest.raises(ValueError, match="mm_token_type_ids is required"):
        get_rope_index(tt, None, family="qwen3_vl")


@pytest.mark.parametrize("family", FAMILIES)
@PROP
@given(data=st.data())
def test_shifted_image_boundaries_always_raise(family, data):
    """Token counts still add up over the batch, but one image run is one token too long
    and another one token too short: the vectorised checks must catch it."""
    img = grid_thw(min_side=4).map(lambda g: ("image", g))
    rows, side = data.draw(batch_layout(row_layout(img, min_text=1), min_rows=1))
    b = materialize(rows, side)
    tt = b["mm_token_type_ids"].clone()
    # runs of image tokens, as (row, start, end) in batch order
    runs = []
    for r in range(tt.shape[0]):
        for key, grp in itertools.groupby(enumerate(tt[r].tolist()), lambda x: x[1]):
            grp = list(grp)
            if key == 1:
                runs.append((r, grp[0][0], grp[-1][0] + 1))
    if len(runs) < 2:
        return
    i, j = data.draw(st.lists(st.integers(0, len(runs) - 1), min_size=2, max_size=2, unique=True))
    r, _, end = runs[i]
    tt[r, end] = 1  # the text token after run i (there always is one) becomes an image token
    r2, start2, _ = runs[j]
    tt[r2, start2] = 0  # the first token of run j becomes text
    b["mm_token_type_ids"] = tt
    with pytest.raises(ValueError, match=r"row \d+: image block"):
        ours(family, b)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.bool, torch.float32])
def test_token_type_dtypes_give_the_int64_positions(dtype):
    """The one-reduction type check (negatives wrap when viewed unsigned) keeps every dtype's
    result equal to int64's; bool types are all images."""
    tt = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])
    want = get_rope_index(tt, tt, [[1, 4, 4], [1, 4, 4]], attention_mask=torch.ones_like(tt))
    got = get_rope_index(tt, tt.to(dtype), [[1, 4, 4], [1, 4, 4]], attention_mask=torch.ones_like(tt))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int64, torch.float32])
@pytest.mark.parametrize("bad", [-1, 3])
def test_negative_or_unknown_token_types_raise(dtype, bad):
    tt = torch.tensor([[0, 1, 1, 1, bad, 0]], dtype=dtype)
    with pytest.raises(ValueError, match="0 \\(text\\), 1 \\(image\\) or 2 \\(video\\)"):
        get_rope_index(tt, tt, [[1, 4, 4]])


def test_image_token_inside_a_video_block_raises():
    """Token totals match the grids but one video token is typed image: the video-token count
    check (images and videos in one batch) catches it."""
    tt = torch.tensor([[0, 1, 1, 1, 1, 0, 2, 2, 2, 2, 2, 2, 2, 2, 0]])
    grids = dict(image_grid_thw=[[1, 4, 4]], video_grid_thw=[[2, 4, 4]])
    pos, _ = get_rope_index(tt, tt, family="qwen2_vl", **grids)
    assert pos[:, 0, 6:14].tolist() == [[4, 4, 4, 4, 5, 5, 5, 5], [4, 4, 5, 5, 4, 4, 5, 5], [4, 5, 4, 5, 4, 5, 4, 5]]
    bad = tt.clone()
    bad[0, 9] = 1
    with pytest.raises(ValueError, match=r"row 0: "):
        get_rope_index(bad, bad, family="qwen2_vl", **grids)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "glm46v"])
@pytest.mark.parametrize("L", [0, 1, 300])
def test_a_text_rows_positions_take_the_short_way_to_the_same_answer(family, L):
    """`row_positions` (what validate_dataset recomputes for every row) answers a row without
    images or videos directly: the same [3, L] int64 positions and rope_delta as `get_rope_index`."""
    from mmpipe.families import get_family
    from mmpipe.media.patches_encode import row_positions

    fam, ids = get_family(family), np.random.default_rng(L).integers(0, 1000, L)
    mm, none3 = np.zeros(L, np.int64), np.zeros((0, 3), np.int64)
    pos, delta = row_positions(fam, ids, mm, none3, none3, np.zeros(0, np.float32))
    want, want_delta = get_rope_index(ids[None], mm[None], family=fam)
    assert pos.dtype == np.int64 and np.array_equal(pos, want[:, 0].numpy()) and delta == int(want_delta.reshape(-1)[0])
