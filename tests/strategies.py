"""Reusable hypothesis strategies for mmpipe tests: vision grids, token layouts, and raw
chat rows with images (the second half of this module).

A *row layout* is a list of segments, each ``("text", n)``, ``("image", (t, h, w))`` or
``("video", (t, h, w))`` where ``(t, h, w)`` is a patch grid as the image processor reports
it (``image_grid_thw`` row); the segment holds ``t * h * w // merge**2`` tokens.
:func:`materialize` turns a batch of row layouts into padded tensors.

Keep this module small and documented; add strategies here rather than in test files.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import strategies as st

from mmpipe import testing

TEXT_TOKEN_MAX = 280  # text ids are drawn from [3, TEXT_TOKEN_MAX)
IMAGE_TOKEN = 290
VIDEO_TOKEN = 291
PAD_TOKEN = 0


def grid_thw(t=1, min_side=2, max_side=12, merge=2):
    """(t, h, w) patch grids with h, w multiples of ``merge`` in [min_side, max_side].

    ``t`` is an int or a strategy (videos: e.g. ``st.integers(1, 6)``).
    """
    side = st.integers(-(-min_side // merge), max_side // merge).map(lambda k: k * merge)
    t_st = t if isinstance(t, st.SearchStrategy) else st.just(t)
    return st.tuples(t_st, side, side)


def row_layout(vision=None, max_blocks=3, max_text=12, separate_blocks=True, min_text=0):
    """One row: text runs and vision blocks, as a list of segments.

    vision: strategy of vision segments (default: images with t=1 grids).
    separate_blocks: put >= 1 text token between vision blocks (transformers' per-run
    grid consumption needs it; set False to also get adjacent blocks).
    min_text: length floor of the leading text run (0 lets a row start with a block).
    The row is never empty.
    """
    if vision is None:
        vision = grid_thw().map(lambda g: ("image", g))
    lo = 1 if separate_blocks else 0

    @st.composite
    def build(draw):
        blocks = draw(st.lists(vision, max_size=max_blocks))
        lead = draw(st.integers(min_text if blocks else max(min_text, 1), max_text))
        segs = [("text", lead)] if lead else []
        for blk in blocks:
            segs.append(blk)
            n = draw(st.integers(lo, max_text))
            if n:
                segs.append(("text", n))
        return segs

    return build()


def batch_layout(row=None, min_rows=1, max_rows=5):
    """(rows, padding_side): a batch of row layouts and "left" or "right" padding."""
    return st.tuples(st.lists(row if row is not None else row_layout(), min_size=min_rows, max_size=max_rows),
                     st.sampled_from(["left", "right"]))


def n_tokens(seg, merge=2):
    kind, val = seg
    if kind == "text":
        return val
    t, h, w = val
    return t * h * w // merge**2


def materialize(rows, padding_side="right", merge=2, seed=0, extra_pad=0):
    """Padded tensors for a batch of row layouts.

    Returns dict: input_ids int64 [B, L], mm_token_type_ids int64 [B, L] (0 text, 1 image,
    2 video; pads 0), attention_mask int64 [B, L], image_grid_thw int64 [I, 3] or None,
    video_grid_thw int64 [V, 3] or None (grids in batch order).
    """
    g = torch.Generator().manual_seed(seed)
    lens = [sum(n_tokens(s, merge) for s in r) for r in rows]
    L = max(lens, default=0) + extra_pad
    B = len(rows)
    ids = torch.full((B, L), PAD_TOKEN, dtype=torch.long)
    tt = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L, dtype=torch.long)
    img, vid = [], []
    for b, (r, n) in enumerate(zip(rows, lens)):
        pos = L - n if padding_side == "left" else 0
        mask[b, pos : pos + n] = 1
        for seg in r:
            k = n_tokens(seg, merge)
            kind = seg[0]
            if kind == "text":
                ids[b, pos : pos + k] = torch.randint(3, TEXT_TOKEN_MAX, (k,), generator=g)
            elif kind == "image":
                ids[b, pos : pos + k] = IMAGE_TOKEN
                tt[b, pos : pos + k] = 1
                img.append(list(seg[1]))
            else:
                ids[b, pos : pos + k] = VIDEO_TOKEN
                tt[b, pos : pos + k] = 2
                vid.append(list(seg[1]))
            pos += k
    return {
        "input_ids": ids,
        "mm_token_type_ids": tt,
        "attention_mask": mask,
        "image_grid_thw": torch.tensor(img, dtype=torch.long) if img else None,
        "video_grid_thw": torch.tensor(vid, dtype=torch.long) if vid else None,
    }


# ---- raw chat rows -------------------------------------------------------------------
# Images come from a small pool of deterministic generated images of assorted sizes and
# modes, so examples stay fast while covering odd aspect ratios, RGBA and grayscale.


@functools.lru_cache(maxsize=None)
def image_pool():
    sizes = [(28, 28), (40, 60), (64, 48), (90, 33), (57, 120), (100, 100), (30, 200)]
    modes = ["RGB", "RGB", "RGBA", "L", "RGB", "RGB", "RGB"]
    return [testing.tiny_image(h, w, seed=i, mode=m) for i, ((h, w), m) in enumerate(zip(sizes, modes))]


images = st.integers(0, 6).map(lambda i: image_pool()[i])
words = st.text(alphabet="abcdefgh ijklmnop?!.", min_size=1, max_size=24)


@st.composite
def user_content(draw, max_images: int = 3):
    """A user content list: text and image placeholders in random order, plus its images."""
    n_img = draw(st.integers(0, max_images))
    items = [{"type": "text", "text": draw(words)} for _ in range(draw(st.integers(1, 2)))]
    for _ in range(n_img):
        items.insert(draw(st.integers(0, len(items))), {"type": "image"})
    # two images with no text between them crash transformers' get_rope_index; keep a
    # text item between images (real chat data has separators anyway)
    fixed = []
    for it in items:
        if fixed and it["type"] == "image" and fixed[-1]["type"] == "image":
            fixed.append({"type": "text", "text": " "})
        fixed.append(it)
    imgs = [draw(images) for _ in range(n_img)]
    return fixed, imgs


@st.composite
def raw_rows(draw, max_turns: int = 2, max_images: int = 3, assistant: bool | None = None):
    """A Hub-convention raw row {"messages", "images"} with 1..max_turns user turns."""
    turns = draw(st.integers(1, max_turns))
    msgs, all_imgs = [], []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(words)})
    for t in range(turns):
        content, imgs = draw(user_content(max_images))
        msgs.append({"role": "user", "content": content})
        all_imgs += imgs
        last = t == turns - 1
        with_answer = (not last) or (draw(st.booleans()) if assistant is None else assistant)
        if with_answer:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": draw(words)}]})
    return {"messages": msgs, "images": all_imgs}


# ---- multi-turn conversations (VRAG-style loops) -------------------------------------


@st.composite
def multiturn_cases(draw, max_rounds: int = 3, max_images: int = 2,
                    families=("qwen2_vl", "qwen2_5_vl", "qwen3_vl")):
    """A multi-turn loop script for ``mmpipe.rollout.multiturn``.

    Returns a dict: ``family``; ``prompt`` a raw row {"messages", "images"} (optional system
    turn, one user turn with 0..max_images images); ``rounds`` a list of
    ``(response_text, observation_messages, observation_images)`` where the observation is
    1-2 "user"/"tool" messages with 0..max_images images each; ``final`` a last response
    text or None (the conversation then ends awaiting a response); ``pixels`` the encoder's
    pixel format.
    """
    family = draw(st.sampled_from(list(families)))
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(words)})
    content, imgs = draw(user_content(max_images))
    msgs.append({"role": "user", "content": content})
    rounds = []
    for _ in range(draw(st.integers(0, max_rounds))):
        obs, obs_imgs = [], []
        for _ in range(draw(st.integers(1, 2))):
            c, im = draw(user_content(max_images))
            obs.append({"role": draw(st.sampled_from(["user", "tool"])), "content": c})
            obs_imgs += im
        rounds.append((draw(words), obs, obs_imgs))
    final = draw(st.one_of(st.none(), words))
    return {"family": family, "prompt": {"messages": msgs, "images": imgs}, "rounds": rounds, "final": final,
            "pixels": draw(st.sampled_from(["uint8", "uint8", "float32", "none"]))}


# ---- data-parallel padding (mmpipe.rollout.data_parallel.pad_to_multiple / trim) --------------------


@st.composite
def dp_padding_cases(draw, pool_size: int, max_rows: int = 9, max_multiple: int = 4):
    """(row indices into a pool of ``pool_size`` encoded rows, multiple, padding_side):
    a batch of 1..max_rows rows to pad to a multiple of 1..max_multiple (a DP world size)."""
    idx = draw(st.lists(st.integers(0, pool_size - 1), min_size=1, max_size=max_rows))
    return idx, draw(st.integers(1, max_multiple)), draw(st.sampled_from(["left", "right"]))


# ---- multi-agent turn-taking conversations (mmpipe.rema) ------------------------------

REMA_ROLES = ("meta", "reasoner", "critic")


@st.composite
def rema_cases(draw, families=("text", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"), max_rows: int = 3,
               max_roles: int = 3, max_turns: int = 3, max_images: int = 2):
    """A conversation shape for ``mmpipe.rema.rollout`` driven by a scripted engine.

    Returns a dict: ``family``; ``roles`` (1..max_roles of `REMA_ROLES`, in turn order);
    ``max_num_turns``; ``questions`` a list of (content items, images) per row, 0 images for
    the text family; ``system`` role -> system prompt or None; ``finish_at`` per row None or
    the turn at which the first role's response carries the finish flag (may be >= the turn
    limit: then it never fires); ``flag_elsewhere`` per (row, role, turn) of a later role:
    whether that response carries the flag too (must be ignored); ``responses`` (row, role,
    turn) -> (text, finish_reason "stop" | "length"), text possibly empty, no digits.
    """
    family = draw(st.sampled_from(list(families)))
    roles = REMA_ROLES[: draw(st.integers(1, max_roles))]
    max_num_turns = draw(st.integers(1, max_turns))
    n_rows = draw(st.integers(1, max_rows))
    questions = []
    for _ in range(n_rows):
        content, imgs = draw(user_content(0 if family == "text" else max_images))
        questions.append((content, imgs))
    system = {r: draw(st.one_of(st.none(), words)) for r in roles}
    finish_at = [draw(st.one_of(st.none(), st.integers(0, max_num_turns))) for _ in range(n_rows)]
    responses, flag_elsewhere = {}, {}
    for i in range(n_rows):
        for r in roles:
            for t in range(max_num_turns):
                text = draw(st.one_of(words, words, st.just("")))
                responses[(i, r, t)] = (text, draw(st.sampled_from(["stop", "stop", "length"])))
                if r != roles[0]:
                    flag_elsewhere[(i, r, t)] = draw(st.booleans())
    return {"family": family, "roles": roles, "max_num_turns": max_num_turns, "questions": questions,
            "system": system, "finish_at": finish_at, "flag_elsewhere": flag_elsewhere, "responses": responses}


# ---- fuzzing inputs (tests/test_fuzz.py) ---------------------------------------------
# Hostile raw rows: random roles and content shapes, user text that looks like special
# tokens, images as valid/truncated/garbage bytes, arrays and wrong types, and placeholder
# counts that may not match the images. Sizes stay tiny (1..80 px) so thousands of cases run.

SPECIAL_LOOKING = ["<|image_pad|>", "<image>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>",
                   "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>assistant\n", "<", "|>"]
fuzz_text = st.one_of(
    words,
    st.text(max_size=20),
    st.lists(st.one_of(words, st.sampled_from(SPECIAL_LOOKING)), min_size=1, max_size=4).map("".join),
)


def _encoded_image_bytes(h, w, mode, fmt, seed):
    import io

    img = testing.tiny_image(h, w, seed=seed, mode="RGBA" if mode == "RGBA" else "RGB")
    if mode not in ("RGB", "RGBA"):
        img = img.convert(mode)
    if fmt == "JPEG" and img.mode not in ("RGB", "L", "CMYK"):
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@st.composite
def fuzz_images(draw):
    """One image value of any kind a user might put in a row: (value, kind), kind in
    "valid" (must encode), "broken" (truncated/garbage bytes: a documented error or, for
    truncations PIL still reads, an image) or "invalid" (wrong type, bad array: an error)."""
    h, w = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    seed = draw(st.integers(0, 3))
    kind = draw(st.sampled_from(["png", "jpeg", "pil", "array", "dict", "truncated", "garbage", "bad_array", "wrong_type"]))
    mode = draw(st.sampled_from(["RGB", "RGBA", "L", "P", "LA", "1", "I;16", "CMYK"]))
    if kind in ("png", "jpeg", "dict", "truncated"):
        fmt = "PNG" if kind != "jpeg" and mode != "CMYK" else "JPEG"
        data = _encoded_image_bytes(h, w, mode, fmt, seed)
        if kind == "dict":
            return {"bytes": data, "path": None}, "valid"
        if kind == "truncated":
            return data[: draw(st.integers(0, max(0, len(data) - 1)))], "broken"
        return data, "valid"
    if kind == "pil":
        img = testing.tiny_image(h, w, seed=seed, mode="RGBA" if mode == "RGBA" else "RGB")
        return (img if mode in ("RGB", "RGBA") else img.convert(mode)), "valid"
    if kind == "array":
        shape = draw(st.sampled_from([(h, w), (h, w, 1), (h, w, 3), (h, w, 4)]))
        return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8), "valid"
    if kind == "garbage":
        return draw(st.one_of(st.binary(max_size=64), st.just(b"\x89PNG\r\n\x1a\n" + bytes(20)))), "broken"
    if kind == "bad_array":
        return draw(st.sampled_from([
            np.zeros((h, w, 3), np.float32), np.zeros((h, w, 2), np.uint8), np.zeros((h,), np.uint8),
            np.zeros((0, w, 3), np.uint8), np.zeros((h, w, 3, 1), np.uint8), np.zeros((h, w, 5), np.uint8),
        ])), "invalid"
    return draw(st.sampled_from([5, 2.5, None, "does/not/exist.png", {"path": None}, {"nope": 1}, [1, 2], b""])), "invalid"


import numpy as np  # noqa: E402  (used by the fuzzing strategies only)

FUZZ_ROLES = ["user", "user", "assistant", "system", "tool"]


@st.composite
def fuzz_raw_rows(draw, max_messages: int = 4):
    """(raw row, expect) with random structure. ``expect`` is "valid" when the row is
    well formed (then encode must succeed unless an option forbids it, e.g. max_length),
    else "maybe" (a documented error is allowed). Placeholders: {"type": "image"} items
    consume the ``images`` column; counts may deliberately mismatch."""
    valid = True
    style = draw(st.sampled_from(["hub", "hub", "inline", "verl"]))
    msgs, column = [], []
    n_msgs = draw(st.integers(1, max_messages))
    for k in range(n_msgs):
        role = draw(st.sampled_from(FUZZ_ROLES + ["narrator", 5, None]) if draw(st.integers(0, 15)) == 0
                    else st.sampled_from(FUZZ_ROLES))
        if role not in FUZZ_ROLES:
            valid = False
        shape = draw(st.sampled_from(["str", "str", "list", "list", "list", "list", "list", "list", "list", "bad"]))
        if shape == "bad":
            content = draw(st.sampled_from([5, {"type": "text", "text": "x"}, [5], [{"type": "text"}],
                                            [{"type": "text", "text": 3}], [{"type": "video"}], [None]]))
            valid = False
        elif shape == "str" or style == "verl":
            text = draw(fuzz_text)
            if style == "verl":
                for _ in range(draw(st.integers(0, 2))):
                    text += "<image>" + draw(words)
            content = text
        else:
            content = []
            for _ in range(draw(st.integers(0, 3))):
                if draw(st.booleans()):
                    content.append({"type": "text", "text": draw(fuzz_text)})
                else:
                    img, kind = draw(fuzz_images())
                    if kind != "valid" or role == "system":  # Qwen3-VL's template drops system images
                        valid = False
                    if style == "inline":
                        content.append({"type": "image", "image": img})
                    else:
                        content.append({"type": "image"})
                        column.append(img)
        msgs.append({"role": role, "content": content})
    for m in msgs:
        texts = [m["content"]] if isinstance(m["content"], str) else [
            i.get("text") for i in m["content"] if isinstance(i, dict) and isinstance(i.get("text"), str)
        ] if isinstance(m["content"], list) else []
        if any(s in t for t in texts for s in ("<|image_pad|>", "<|video_pad|>")):
            valid = False  # a typed pad token must be refused, never become a phantom image
        if m["role"] == "system" and any("<image>" in t for t in texts):
            valid = False  # Qwen3-VL's template drops images in system messages
    if style != "verl" and column and any(isinstance(m["content"], str) and "<image>" in m["content"] for m in msgs):
        valid = False  # typed "<image>" in string content is a placeholder when the row has images
    if style == "verl":
        n_ph = sum(m["content"].count("<image>") for m in msgs if isinstance(m["content"], str))
        column = [draw(fuzz_images()) for _ in range(n_ph)]
        if any(k != "valid" for _, k in column):
            valid = False
        column = [v for v, _ in column]
    # deliberately break the placeholder/image count now and then
    delta = draw(st.sampled_from([0, 0, 0, 0, 0, 0, -1, 1]))
    if delta == 1:
        column.append(testing.tiny_image(8, 8))
        valid = False
    elif delta == -1 and column:
        column.pop()
        valid = False
    row = {"messages" if style != "verl" else "prompt": msgs}
    if column or draw(st.booleans()):
        row["images"] = column
    return row, ("valid" if valid else "maybe")


@st.composite
def fuzz_encode_options(draw):
    """Random encoder options: budget and truncation policy, pixel storage, labels, resize bounds."""
    opts = {
        "pixels": draw(st.sampled_from(["uint8", "uint8", "float32", "none"])),
        "labels": draw(st.booleans()),
        "truncation": draw(st.sampled_from(["raise", "drop", "truncate_text"])),
        "add_generation_prompt": draw(st.sampled_from([None, None, True, False])),
        "on_error": draw(st.sampled_from(["raise", "raise", "raise", "skip"])),
    }
    if draw(st.booleans()):
        opts["max_length"] = draw(st.integers(1, 200))
    if draw(st.booleans()):
        lo = draw(st.sampled_from([28 * 28, 4 * 28 * 28, 16 * 28 * 28]))
        opts["min_pixels"] = lo
        opts["max_pixels"] = lo * draw(st.sampled_from([1, 2, 4]))
    return opts


# ---- token-budget batching (mmpipe.batching.sampler) -------------------------------------------


@st.composite
def token_budget_cases(draw, max_rows: int = 60):
    """Arguments for ``TokenBudgetBatchSampler``: per-row ``lengths`` (1..400 tokens) and
    ``num_images`` (0..5), and keyword options (budgets, cost, shuffle, seed, bucket size).
    ``oversize`` is "alone" whenever a drawn row is over a budget on its own."""
    n = draw(st.integers(0, max_rows))
    lengths = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    num_images = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    max_tokens = draw(st.integers(50, 1500))
    max_images = draw(st.one_of(st.none(), st.integers(0, 8)))
    over = any(L > max_tokens for L in lengths) or (
        max_images is not None and any(k > max_images for k in num_images))
    kw = {
        "max_tokens": max_tokens,
        "max_images": max_images,
        "max_rows": draw(st.one_of(st.none(), st.integers(1, 10))),
        "cost": draw(st.sampled_from(["padded", "packed"])),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "bucket_size": draw(st.one_of(st.none(), st.integers(1, 30))),
        "oversize": "alone" if over else draw(st.sampled_from(["raise", "alone"])),
    }
    return lengths, num_images, kw


# ---- vision tokens sampled into responses (mmpipe.records.vision_tokens) ---------------------


@st.composite
def vision_token_injections(draw, vision_ids, text_ids, max_len: int = 24, max_injected: int = 3):
    """A response with vision special tokens at random positions: ``(ids, positions)``.

    ``ids``: int list [R] (1..max_len tokens) drawn from ``text_ids`` (plain text ids), then
    1..max_injected positions (sorted, distinct, ``positions``) overwritten with ids drawn
    from ``vision_ids`` (the family's image pad, video pad, vision start, vision end)."""
    ids = draw(st.lists(st.sampled_from(list(text_ids)), min_size=1, max_size=max_len))
    k = draw(st.integers(1, min(max_injected, len(ids))))
    positions = sorted(draw(st.lists(st.integers(0, len(ids) - 1), min_size=k, max_size=k, unique=True)))
    for p in positions:
        ids[p] = draw(st.sampled_from(list(vision_ids)))
    return ids, positions


# ---- raw rows with videos (frame lists: no container needed) ----------------------------------


@st.composite
def video_raw_rows(draw, max_frames: int = 7):
    """``(raw row, n_frames)``: one user turn holding a video given as a frame list (1..max_frames
    PIL frames of one random size, 20-90 px a side, with a random rate), in one of the three row
    conventions (``"column"``, ``"inline"``, ``"prompt"``), before or after the text, with or
    without an image, and an optional assistant reply."""
    n = draw(st.integers(1, max_frames))
    h, w = draw(st.integers(20, 90)), draw(st.integers(20, 90))
    seed = draw(st.integers(0, 2**16))
    video = {"frames": [testing.tiny_image(h, w, seed=seed + i) for i in range(n)],
             "fps": draw(st.sampled_from([0.5, 1.0, 2.0, 3.3, 25.0]))}
    image = [testing.tiny_image(draw(st.integers(28, 70)), draw(st.integers(28, 70)), seed=seed)] if draw(
        st.booleans()) else []
    convention = draw(st.sampled_from(["column", "inline", "prompt"]))
    video_first = draw(st.booleans())
    text = {"type": "text", "text": draw(st.sampled_from(["what happens?", "describe", "x"]))}
    vid_item = {"type": "video", "video": video} if convention == "inline" else {"type": "video"}
    items = [vid_item, text] if video_first else [text, vid_item]
    items += [{"type": "image"}] * len(image)
    if convention == "prompt":
        prompt = "".join("<video>" if it["type"] == "video" else "<image>" if it["type"] == "image" else it["text"]
                         for it in items)
        row = {"prompt": prompt, "videos": [video], "images": image}
    else:
        row = {"messages": [{"role": "user", "content": items}], "images": image}
        if convention == "column":
            row["videos"] = [video]
    if draw(st.booleans()):
        reply = [{"role": "assistant", "content": "it moves"}]
        row["messages" if "messages" in row else "completion"] = (row["messages"] + reply) if "messages" in row else "it moves"
    return row, n
