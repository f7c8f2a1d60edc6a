"""The tiled families tokenize each image's text with its runs of feature tokens written once
and repeat the feature id (issue 20, `mmpipe.media.tiles_encode`): every column of every row is
bit-identical to tokenizing the fully written-out text (the path before; ``collapse=False``),
and the ids equal the tokenizer's own ids of that text - Gemma 3 (with and without
pan-and-scan), InternVL and LLaVA-OneVision with their real offline tokenizers; labels on/off,
pixels none/uint8/source, truncation raise/drop, multi-turn rows with images in several turns,
system prompts, tools, generation prompts, literal placeholder text, random text next to the
images (hypothesis), and the batched `mmpipe.encode` path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mmpipe
from mmpipe.offline import build_processor
from mmpipe import testing
from mmpipe.encoding.mapping import RowDropped
from mmpipe.encoding.encoder import Encoder
from mmpipe.errors import PlaceholderError, TruncationError
from mmpipe.offline.gemma3 import build_gemma3_processor

from helpers import photo_paths

PAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}
CASES = {"gemma3": ("gemma3", {}), "gemma3_pan_and_scan": ("gemma3", PAN),
         "internvl": ("internvl", {}), "llava_onevision": ("llava_onevision", {})}
SIZES = [(40, 70), (1, 1), (33, 97), (130, 33), (64, 64), (20, 90), (90, 20)]  # wide/tall ones pan and scan
TOOLS = [{"type": "function", "function": {"name": "zoom", "description": "zoom into the image",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}}]
_PROCESSORS: dict = {}


def _processor(family: str):
    if family not in _PROCESSORS:
        _PROCESSORS[family] = build_processor(family)
    return _PROCESSORS[family]


@pytest.fixture(params=list(CASES))
def case(request):
    family, kwargs = CASES[request.param]
    return _processor(family), kwargs


def _images(n: int, seed: int) -> list:
    return [testing.tiny_image(*SIZES[(seed + i) % len(SIZES)], seed=seed + i) for i in range(n)]


def _turn(role: str, n_images: int, text: str, before: str = "") -> dict:
    content = ([{"type": "text", "text": before}] if before else []) + [{"type": "image"}] * n_images
    return {"role": role, "content": content + ([{"type": "text", "text": text}] if text else [])}


def _rows() -> list[dict]:
    """Varied rows: 0..3 images, neighbours of every kind, several turns with images, system
    prompts, an open generation prompt, per-row tools."""
    say = lambda t: {"role": "assistant", "content": [{"type": "text", "text": t}]}  # noqa: E731
    system = {"role": "system", "content": [{"type": "text", "text": "You are terse.\n\n"}]}
    shapes = [
        [_turn("user", 0, "no image here"), say("fine")],
        [_turn("user", 1, "what is it?"), say("a cat")],
        [_turn("user", 2, "\n\ncompare", before="look:\n\n"), say("the left one  \n")],
        [system, _turn("user", 1, " x", before="a"), say("b"), _turn("user", 2, "and these?"), say("dogs")],
        [_turn("user", 3, ""), say(" "), _turn("user", 0, "again?"), say("yes\n\n")],
        [system, _turn("user", 1, "describe"), say("a photo"), _turn("user", 1, "\n")],  # generation prompt
        [_turn("user", 1, "call a tool"), say("zooming")],
    ]
    rows = []
    for k, msgs in enumerate(shapes):
        n = sum(item.get("type") == "image" for m in msgs for item in m["content"])
        row = {"messages": msgs, "images": _images(n, seed=3 * k)}
        if k == len(shapes) - 1:
            row["tools"] = TOOLS
        rows.append(row)
    return rows


def _encoders(proc, kwargs, **options) -> tuple[Encoder, Encoder]:
    new = Encoder(proc, images_kwargs=kwargs, **options)
    old = Encoder(proc, images_kwargs=kwargs, **options)
    old.collapse = False  # the fully written-out text, as before
    assert new.collapse, "the short-text path is off for this tokenizer: the test would compare the old path to itself"
    return new, old


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray), key
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), key
        elif isinstance(x, list) and x and isinstance(x[0], np.ndarray):
            assert len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y)), key
        else:
            assert x == y, key


def _outcome(enc: Encoder, row: dict, idx: int):
    try:
        return enc.encode_row(row, idx).to_dict()
    except (PlaceholderError, TruncationError, RowDropped) as e:
        return (type(e).__name__, str(e))


def _row_ip(enc: Encoder, n_images: int):
    """The image processor as the processor's call for a row of ``n_images`` uses it: LLaVA-OneVision's
    default per-conversation mode gives each image of a row of several one tile (issue 28.4)."""
    hook = getattr(enc.module, "conversation_image_processor", None)
    return enc.image_processor if hook is None else hook(enc.image_processor, n_images)


def _written_out_ids(enc: Encoder, row: dict) -> np.ndarray:
    """The tokenizer's ids of the rendered text with every placeholder written out in full."""
    proc, fam = enc.processor, enc.family
    msgs = row["messages"]
    agp = msgs[-1]["role"] != "assistant"
    extra = {"tools": row["tools"]} if "tools" in row else {}
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, **extra)
    parts = text.split(fam.image_token)
    out, ip = parts[0], _row_ip(enc, len(row["images"]))
    for img, rest in zip(row["images"], parts[1:]):
        out += enc.module.expand_placeholder(img.height, img.width, proc, ip) + rest
    return np.asarray(proc.tokenizer(out)["input_ids"], np.int64)


def test_placeholder_runs_write_out_to_the_placeholder_text(case):
    """Each family's short text with run ``i`` written ``runs[i]`` times is its full image text."""
    proc, kwargs = case
    enc = Encoder(proc, images_kwargs=kwargs, pixels="none")
    tok = enc.family.feature_token
    for h, w in SIZES + [(600, 800), (1080, 1920), (2000, 300)]:
        text, runs = enc.module.placeholder_runs(h, w, proc, enc.image_processor)
        pieces = text.split(tok)
        assert len(pieces) == len(runs) + 1 and all(k > 0 for k in runs)
        full = pieces[0] + "".join(tok * k + rest for k, rest in zip(runs, pieces[1:]))
        assert full == enc.module.expand_placeholder(h, w, proc, enc.image_processor)
        assert sum(runs) == enc.module.image_tokens(h, w, enc.image_processor, proc)


@pytest.mark.parametrize("labels", [True, False])
def test_rows_equal_the_written_out_path(case, labels):
    proc, kwargs = case
    new, old = _encoders(proc, kwargs, pixels="none", labels=labels)
    for i, row in enumerate(_rows()):
        a, b = new.encode_row(row, i).to_dict(), old.encode_row(row, i).to_dict()
        _assert_same(a, b)
        assert np.array_equal(a["input_ids"], _written_out_ids(new, row))
        ip = _row_ip(new, len(row["images"]))
        assert int(a["mm_token_type_ids"].sum()) == sum(
            new.module.image_tokens(im.height, im.width, ip, proc) for im in row["images"])
        if labels:
            assert (a["labels"][a["mm_token_type_ids"] == 1] == -100).all() and (a["labels"] != -100).any()


@pytest.mark.parametrize("pixels", ["uint8", "source"])
def test_pixel_modes_are_identical(case, pixels):
    proc, kwargs = case
    new, old = _encoders(proc, kwargs, pixels=pixels)
    paths = photo_paths()
    for i, row in enumerate(_rows()[1:4]):
        row = dict(row, images=[paths[(i + j) % len(paths)] for j in range(len(row["images"]))])
        _assert_same(new.encode_row(row, i).to_dict(), old.encode_row(row, i).to_dict())


@pytest.mark.parametrize("truncation", ["raise", "drop"])
def test_truncation_is_identical(case, truncation):
    proc, kwargs = case
    rows = _rows()
    full, _ = _encoders(proc, kwargs, pixels="none")
    lengths = [len(full.encode_row(r).input_ids) for r in rows]
    for limit in (min(lengths), int(np.median(lengths)), max(lengths) - 1, max(lengths)):
        new, old = _encoders(proc, kwargs, pixels="none", max_length=limit, truncation=truncation)
        for i, row in enumerate(rows):
            a, b = _outcome(new, row, i), _outcome(old, row, i)
            if isinstance(a, tuple):
                assert a == b and lengths[i] > limit
                assert a[0] == ("TruncationError" if truncation == "raise" else "RowDropped")
            else:
                _assert_same(a, b)


def test_literal_placeholder_text_fails_alike(case):
    proc, kwargs = case
    new, old = _encoders(proc, kwargs, pixels="none")
    fam = new.family
    for token in {fam.feature_token, fam.image_token}:
        for n_images in (0, 1, 2):
            row = {"messages": [_turn("user", n_images, f"what does {token} mean? {token}{token}"),
                                {"role": "assistant", "content": [{"type": "text", "text": "no idea"}]}],
                   "images": _images(n_images, seed=n_images)}
            a, b = _outcome(new, row, 5), _outcome(old, row, 5)
            assert isinstance(a, tuple) and a == b and a[0] == "PlaceholderError"


_TEXT = st.lists(st.sampled_from(list("ab .,!?\n\t") + ["\n\n", "  ", "é", "猫", "<", ">", "image", "img", "/"]),
                max_size=8).map("".join)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=_TEXT, after=_TEXT, reply=_TEXT, n=st.integers(0, 3), seed=st.integers(0, 50))
def test_random_neighbours_of_the_images(case, before, after, reply, n, seed):
    proc, kwargs = case
    new, old = _encoders(proc, kwargs, pixels="none")
    content = [{"type": "text", "text": before}] if before else []
    for j in range(n):
        content += [{"type": "image"}] + ([{"type": "text", "text": after * (j + 1)}] if after else [])
    if not content:
        content = [{"type": "text", "text": "hi"}]
    row = {"messages": [{"role": "user", "content": content},
                        {"role": "assistant", "content": [{"type": "text", "text": reply or "ok"}]}],
           "images": _images(n, seed)}
    a = new.encode_row(row).to_dict()
    _assert_same(a, old.encode_row(row).to_dict())
    assert np.array_equal(a["input_ids"], _written_out_ids(new, row))


def test_batched_encode_is_identical(case):
    """`mmpipe.encode` (a batched map call, its cached encoder) == the written-out path row by row."""
    proc, kwargs = case
    rows = _rows()
    batch = {key: [r.get(key) for r in rows] for key in ("messages", "images", "tools")}
    for labels in (True, False):
        out = mmpipe.encode(batch, processor=proc, pixels="none", images_kwargs=kwargs, labels=labels)
        _, old = _encoders(proc, kwargs, pixels="none", labels=labels)
        for i, row in enumerate(rows):
            _assert_same({key: out[key][i] for key in out}, old.encode_row(row, i).to_dict())


def test_real_size_gemma3_rows_equal_the_written_out_path():
    """The released checkpoint's settings (896x896 tiles, 256 soft tokens a tile), pan-and-scan on and off."""
    proc = build_gemma3_processor(real=True)
    for kwargs in ({}, {"do_pan_and_scan": True}):
        new, old = _encoders(proc, kwargs, pixels="none")
        for i, row in enumerate(_rows()):
            row = dict(row, images=[testing.tiny_image(h * 9, w * 9, seed=j) for j, (h, w) in
                                    enumerate(SIZES[i % 3:i % 3 + len(row["images"])])])
            a = new.encode_row(row, i).to_dict()
            _assert_same(a, old.encode_row(row, i).to_dict())
            assert np.array_equal(a["input_ids"], _written_out_ids(new, row))
