"""Per-family figures (issue 20's closing note): for every native family, on real-size photos,
full encode and layout-only encode vs the family's own transformers processor, and the compact
pixel bytes per image vs the processor's float32.

Per family (12 rows of 1-2 photos from `bench.data`; the same rows for every family):
- full encode: ``mmpipe.encode(batch, processor=p, threads=1)`` (one call, one image thread)
  vs the processor as a user runs it on the same rows: the images decoded from their bytes
  (what a ``datasets.Image()`` column hands over), each row's chat template rendered and one
  ``processor(text=texts, images=flat_images)`` call over the batch (every processor here takes
  a batch; Gemma 3's one image list per prompt; LLaVA-OneVision's batched call pads every image's
  tiles to the batch's widest, which measured slower than calling it per row, so it runs per row);
- layout-only: ``mmpipe.encode(batch, processor=p, pixels="none")`` vs the same processor call,
  and with ``labels=False`` (the same outputs) vs transformers' header-only path (what vLLM does: image headers -> the family's token
  count -> placeholders expanded in the rendered texts -> one batched tokenizer call, plus the
  model's ``get_rope_index`` for the 3-D rope families);
- bytes per image: the compact uint8 column's bytes vs the processor's float32 ``pixel_values``
  (LLaVA-OneVision: without the padding tiles).

The full encode and the processor are timed side by side (rotated, no warm-up: the checks ran
each once); the layout contenders and the layout floor's tokenizer calls in a second rotation,
timeit-style. Outputs are checked equal before timing: ids and pixel values (mmpipe's rows
through ``mmpipe.collate`` vs the processor's batch), token types (Qwen-like, Gemma 3), grids
(Qwen-like) or ``image_sizes`` (LLaVA-OneVision); the layout-only rows equal the full rows'
layout columns, and with ``labels=False`` the header-only path's ids (and 3-D positions).
Processors use the released checkpoints' image settings (Qwen bounds, GLM-4.1V's bounds, Gemma 3
896x896 tiles / 256 tokens, InternVL 448 tiles up to 12 + thumbnail / 256 tokens, LLaVA-OneVision
384 tiles with its grid pinpoints / 729 tokens) and the offline tokenizers; ``--quick`` uses the
test processors (small bounds, 32x32 tiles) on small images.
"""

from __future__ import annotations

import io

import numpy as np

from . import data
from .report import Result, fmt_time, speed
from .timing import side_by_side

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "gemma3", "internvl", "llava_onevision")
QWEN_LIKE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")  # [N, patch] pixels, image_grid_thw, 3-D rope
# the released checkpoints' preprocessor_config.json pixel bounds (min_pixels, max_pixels)
REAL_BOUNDS = {"qwen2_vl": (3136, 12845056), "qwen2_5_vl": (3136, 12845056), "qwen3_vl": (65536, 16777216),
               "glm4v": (112 * 112, 28 * 28 * 15000)}
# its batched call pads every image's tiles to the batch's widest image (more float32 written; measured
# slower than per row, same values): per row is its faster use
PER_ROW = ("llava_onevision",)
NESTED = ("gemma3",)  # the processor wants one image list per prompt
# LLaVA-OneVision in its flat multi-image mode (every image tiled, as the flat processor call here, vLLM and
# the header-only path's _get_num_multimodal_tokens count them); mmpipe's default is the chat path's
# per-conversation mode (one tile per image of a multi-image row, issue 28.4)
ENCODE_OPTIONS = {"llava_onevision": {"images_kwargs": {"multi_image": "flat"}}}


def family_processor(name: str, quick: bool):
    """The family's real transformers processor, offline: the released checkpoints' image
    settings (module doc), or the small test settings with ``quick``."""
    from mmpipe import testing

    if name in QWEN_LIKE:
        if quick:
            return testing.build_processor(name)
        lo, hi = REAL_BOUNDS[name]
        return testing.build_processor(name, min_pixels=lo, max_pixels=hi)
    if name == "gemma3":
        from mmpipe.offline.gemma3 import build_gemma3_processor

        return build_gemma3_processor(real=not quick)
    import transformers

    from mmpipe.offline.tile_builders import build_tiled2_processor

    if quick:
        return build_tiled2_processor(name)
    if name == "internvl":  # InternVL3 / 3.5 (transformers format): 448 px tiles, 1..12 + thumbnail, 256 tokens
        proc = build_tiled2_processor(name, size={"height": 448, "width": 448}, max_patches=12)
        proc.image_seq_length = 256
        return proc
    # LLaVA-OneVision (SigLIP 384, patch 14: 27x27 = 729 tokens a tile), the checkpoints' pinpoints
    pins = transformers.LlavaOnevisionImageProcessorPil.image_grid_pinpoints
    proc = build_tiled2_processor(name, size={"height": 384, "width": 384}, image_grid_pinpoints=pins)
    proc.num_image_tokens = 729
    return proc


def family_rows(ctx) -> list[dict]:
    """12 chat rows of 1-2 photos (18 images): the pool's photos at their own sizes and
    photo-like JPEGs 640x480..1920x1080 (quick: 5 rows of small images)."""
    return data.chat_rows(ctx.pool, {1: 3, 2: 2} if ctx.quick else {1: 6, 2: 6}, start=0)


def _texts(proc, rows: list[dict]) -> list[str]:
    return [proc.apply_chat_template(r["messages"], tokenize=False,
                                     add_generation_prompt=r["messages"][-1]["role"] != "assistant") for r in rows]


def processor_call(proc, name: str, rows: list[dict]):
    """The baseline: decode the images, render the templates, call the processor (module doc).
    Returns a list of the processor's outputs (one per call, ``return_tensors="np"``)."""
    chunks = [[r] for r in rows] if name in PER_ROW else [rows]

    def run():
        outs = []
        for chunk in chunks:
            images = [data.decode_images(r) for r in chunk]  # Gemma 3 takes one list per prompt
            images = images if name in NESTED else [im for ims in images for im in ims]
            outs.append(proc(text=_texts(proc, chunk), images=images or None, padding=True, return_tensors="np"))
        return outs
    return run


def _unpadded_ids(out) -> list[np.ndarray]:
    return [ids[m.astype(bool)] for ids, m in zip(out["input_ids"], out["attention_mask"])]


def _same_as_processor(enc: dict, outs: list, proc, name: str) -> bool:
    """mmpipe's rows (ids, token types, and pixels through collate) == the processor's outputs."""
    import mmpipe

    n = len(enc["input_ids"])
    ids = [x for o in outs for x in _unpadded_ids(o)]
    types_key = "token_type_ids" if name == "gemma3" else "mm_token_type_ids" if name in QWEN_LIKE else None
    types = [t[m.astype(bool)] for o in outs for t, m in zip(o[types_key], o["attention_mask"])] if types_key else None
    same = len(ids) == n and all(np.array_equal(np.asarray(enc["input_ids"][i]), ids[i]) for i in range(n))
    if types is not None:
        same &= all(np.array_equal(np.asarray(enc["mm_token_type_ids"][i]), types[i]) for i in range(n))
    rows = [{k: enc[k][i] for k in enc} for i in range(n)]
    start = 0
    for o in outs:  # one collate per processor call: the same rows, so the same padding of tiles
        k = len(o["input_ids"])
        b = mmpipe.collate(rows[start:start + k], processor=proc)
        start += k
        same &= bool(np.array_equal(np.asarray(b.pixel_values), o["pixel_values"]))
        if name in QWEN_LIKE:
            same &= bool(np.array_equal(np.asarray(b.image_grid_thw), o["image_grid_thw"]))
        if name == "llava_onevision":
            same &= bool(np.array_equal(np.asarray(b.extras["image_sizes"]), o["image_sizes"]))
    return bool(same)


def _same_layout(lay: dict, enc: dict, skip: tuple = ()) -> bool:
    """The layout-only rows hold the full rows' layout: every column both have, except pixels
    (and ``skip``)."""
    keys = [k for k in lay if k in enc and "pixel" not in k and k not in ("family", *skip)]
    return all(np.array_equal(np.asarray(lay[k][i]), np.asarray(enc[k][i]))
               for k in keys for i in range(len(enc["input_ids"])))


# ---- transformers' header-only path (what vLLM does) ------------------------------------------
def _header_sizes(rows: list[dict]) -> list[list[tuple[int, int]]]:
    from PIL import Image

    out = []
    for r in rows:
        sizes = []
        for v in r["images"]:
            w, h = Image.open(io.BytesIO(v["bytes"])).size  # the header only
            sizes.append((h, w))
        out.append(sizes)
    return out


def _qwen_grid(name: str, ip, h: int, w: int) -> tuple[int, int, int]:
    p, m = ip.patch_size, ip.merge_size
    lo, hi = ip.size["shortest_edge"], ip.size["longest_edge"]
    if name == "glm4v":  # GLM's rule bounds two frames of an image
        from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize as glm_resize

        rh, rw = glm_resize(num_frames=ip.temporal_patch_size, height=h, width=w,
                            temporal_factor=ip.temporal_patch_size, factor=p * m, min_pixels=lo, max_pixels=hi)
    else:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        rh, rw = smart_resize(h, w, p * m, min_pixels=lo, max_pixels=hi)
    return 1, rh // p, rw // p


def expanded_texts(proc, name: str, rows: list[dict]):
    """The header-only path up to its tokenizer call: (the rendered texts with every
    placeholder expanded, the Qwen-like grids per row)."""
    texts, grids = _texts(proc, rows), []
    for i, (text, hw) in enumerate(zip(texts, _header_sizes(rows))):
        if name in QWEN_LIKE:
            g = [_qwen_grid(name, proc.image_processor, h, w) for h, w in hw]
            counts = [t * gh * gw // proc.image_processor.merge_size ** 2 for t, gh, gw in g]
            grids.append(g)
        else:
            counts = _feature_counts(proc, name, hw) if hw else []
        texts[i] = _expand(proc, name, text, counts)
    return texts, grids


def _feature_counts(proc, name: str, hw: list) -> list[int]:
    """Each image's feature tokens from ``processor._get_num_multimodal_tokens`` (vLLM's call).
    InternVL's count held <img> and </img> up to transformers 5.24 and not from 5.25: its
    ``num_image_patches`` (tiles) x ``image_seq_length`` is the feature count on both lines."""
    data = proc._get_num_multimodal_tokens(image_sizes=hw)
    if name == "internvl":
        return [int(n) * proc.image_seq_length for n in data.num_image_patches]
    return list(data.num_image_tokens)


def header_only(proc, name: str, rows: list[dict], model=None):
    """transformers' header-only layout of the rows: no pixel decoded. Qwen-like: grids from
    the resize rule, the pads expanded, one tokenizer call, then ``model.model.get_rope_index``
    per row; tiled: ``processor._get_num_multimodal_tokens`` per image (vLLM's call), the
    family's text written in place of each placeholder, one tokenizer call."""
    import torch

    tok = proc.tokenizer
    texts, grids = expanded_texts(proc, name, rows)
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    if name not in QWEN_LIKE:
        return ids
    pad_id = tok.convert_tokens_to_ids(proc.image_token)
    out = []
    with torch.no_grad():
        for row_ids, g in zip(ids, grids):
            t_ids = torch.tensor([row_ids])
            tt = (t_ids == pad_id).long()
            pos, _ = model.model.get_rope_index(t_ids, tt, image_grid_thw=torch.tensor(g, dtype=torch.long),
                                                attention_mask=torch.ones_like(t_ids))
            out.append((row_ids, pos[:, 0]))
    return out


def _expand(proc, name: str, text: str, counts: list[int]) -> str:
    """Each image's placeholder in the rendered text replaced by the family's text for
    ``counts[k]`` feature tokens (vLLM's prompt update)."""
    tok = proc.tokenizer
    if name == "gemma3":
        ph = tok.boi_token
        text_of = lambda c: f"\n\n{tok.boi_token}{tok.image_token * c}{tok.eoi_token}\n\n"  # noqa: E731
    elif name == "internvl":
        ph = proc.image_token
        text_of = lambda c: f"{proc.start_image_token}{proc.image_token * c}{proc.end_image_token}"  # noqa: E731
    else:  # Qwen-like pads, LLaVA-OneVision's <image>
        ph = proc.image_token
        text_of = lambda c: ph * c  # noqa: E731
    parts = text.split(ph)
    if len(parts) != len(counts) + 1:
        raise RuntimeError(f"{name}: {len(parts) - 1} placeholders in the rendered text, {len(counts)} images")
    return parts[0] + "".join(text_of(c) + rest for c, rest in zip(counts, parts[1:]))


def _same_header(head, lay: dict, name: str) -> bool:
    n = len(lay["input_ids"])
    if name not in QWEN_LIKE:
        return len(head) == n and all(np.array_equal(np.asarray(lay["input_ids"][i]), head[i]) for i in range(n))
    return len(head) == n and all(
        np.array_equal(np.asarray(lay["input_ids"][i]), head[i][0])
        and np.array_equal(np.asarray(lay["position_ids"][i]).reshape(3, -1), head[i][1].numpy()) for i in range(n))


def _layout_floor(name: str, t: dict, n_tokens: int) -> str:
    """Where the layout time goes: the tokenizer over the expanded vs the rendered texts."""
    te, tr, mm = t["tokenize_expanded"].best, t["tokenize_rendered"].best, t["mmpipe_layout_no_labels"].median
    how = ("mmpipe expands the pads on ids (tokenizes the rendered texts)" if name in QWEN_LIKE else
           "mmpipe's tiled encoder tokenizes each row's text with every feature-token run written once, then "
           "repeats the run's id (one tokenizer call per row, not per batch)")
    return (f"one batched tokenizer call over the expanded texts ({n_tokens:,} tokens; the header-only path's own) "
            f"takes {fmt_time(te)}, over the rendered texts before expansion {fmt_time(tr)} (fastest samples); "
            f"{how}; mmpipe's layout call (labels=False) {fmt_time(mm)}")


# ---- bytes per image ----------------------------------------------------------------------------
def _bytes(enc: dict, outs: list, name: str) -> tuple[int, int]:
    """(compact uint8 column bytes, the processor's float32 pixel_values bytes without padding)."""
    u8 = sum(np.asarray(x).nbytes for x in enc["pixel_values_u8"])
    if name == "llava_onevision":  # [images, most tiles, 3, S, S]: count each image's own tiles
        tiles = [int(t) for x in enc["tiles_per_image"] for t in np.asarray(x).reshape(-1)]
        per_tile = outs[0]["pixel_values"][0, 0].nbytes
        return u8, sum(tiles) * per_tile
    return u8, sum(o["pixel_values"].nbytes for o in outs)


# ---- the case -----------------------------------------------------------------------------------
def case_families(ctx) -> list[Result]:
    import torch

    rows = family_rows(ctx)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the baselines' torch ops (rope) on one thread, as mmpipe's call (threads=1)
    out = []
    try:
        for name in FAMILIES:
            try:
                out += family_lines(ctx, name, rows)
            except Exception as e:  # one broken family shows as its own failed line, the others still run
                import traceback

                traceback.print_exc()
                out.append(Result(f"{name}: error", "error", "-", None, "-", "(info)", None, False,
                                  {"error": repr(e)}, "-", repr(e)[:160]))
    finally:
        torch.set_num_threads(threads)
    return out


def family_lines(ctx, name: str, rows: list[dict]) -> list[Result]:
    import mmpipe

    proc = family_processor(name, ctx.quick)
    n, n_img = len(rows), sum(len(r["images"]) for r in rows)
    batch = {k: [r[k] for r in rows] for k in rows[0]}  # what dataset.map(batched=True) passes
    model = None
    if name in QWEN_LIKE:
        from mmpipe import testing

        model = testing.build_model(name)

    def ours():
        return mmpipe.encode(batch, processor=proc, threads=1, **ENCODE_OPTIONS.get(name, {}))

    def ours_layout():
        return mmpipe.encode(batch, processor=proc, pixels="none", threads=1, **ENCODE_OPTIONS.get(name, {}))

    def ours_layout_bare():  # the header-only path's outputs: no labels
        return mmpipe.encode(batch, processor=proc, pixels="none", threads=1, labels=False,
                             **ENCODE_OPTIONS.get(name, {}))

    theirs = processor_call(proc, name, rows)

    def headers():
        return header_only(proc, name, rows, model)

    expanded, tok = expanded_texts(proc, name, rows)[0], proc.tokenizer
    rendered = _texts(proc, rows)

    enc, outs, lay = ours(), theirs(), ours_layout()  # outputs checked equal before timing
    same = _same_as_processor(enc, outs, proc, name)
    same_lay = same and _same_layout(lay, enc)
    same_head = _same_header(headers(), lay, name) and _same_layout(ours_layout_bare(), lay, skip=("labels",))
    u8, f32 = _bytes(enc, outs, name)
    del enc, outs, lay
    # the slow pair: no warm-up (the checks above ran each once); the fast ones: timeit-style samples
    t = side_by_side({"mmpipe": ours, "processor": theirs}, repeat=ctx.repeat, warmup=0)
    t.update(side_by_side({"mmpipe_layout": ours_layout, "mmpipe_layout_no_labels": ours_layout_bare,
                           "header_only": headers,
                           "tokenize_expanded": lambda: tok(expanded, add_special_tokens=False)["input_ids"],
                           "tokenize_rendered": lambda: tok(rendered, add_special_tokens=False)["input_ids"]},
                          repeat=ctx.repeat, warmup=1, min_time=0.05 if ctx.quick else 0.1))
    call = "per row" if name in PER_ROW else "one call over the batch"
    base = f"{type(proc).__name__}: decode + chat template + processor ({call}), float32"
    head = ("transformers header-only path: image headers -> resize rule -> pads expanded -> batched tokenizer "
            "-> model.model.get_rope_index" if name in QWEN_LIKE else
            "transformers header-only path: image headers -> processor._get_num_multimodal_tokens -> the "
            "family's text expanded -> batched tokenizer")
    info = {"rows": n, "images": n_img, "processor": type(proc).__name__, "family": name,
            "timing": {k: v.to_json() for k, v in t.items()}}
    kib = lambda b: f"{b / n_img / 1024:,.1f} KiB/img"  # noqa: E731
    return [
        speed(f"{name}: full encode, {n} rows/{n_img} photos, 1 thread", t["mmpipe"], t["processor"], base,
              target=None, identical=same, per=n, detail=info),
        speed(f"  {name}: layout only (pixels='none') vs the processor", t["mmpipe_layout"], t["processor"], base,
              target=None, identical=same_lay, per=n),
        speed(f"  {name}: layout only, labels=False, vs the header-only path", t["mmpipe_layout_no_labels"],
              t["header_only"], head, target=None, identical=bool(same_lay and same_head), per=n,
              floor=_layout_floor(name, t, sum(len(x) for x in tok(expanded, add_special_tokens=False)["input_ids"]))),
        Result(f"  {name}: bytes/image, uint8 column vs float32", kib(u8), kib(f32), f32 / u8, f"1/{f32 / u8:.2f}",
               "(info)", None, same, {"uint8_bytes": u8, "float32_bytes": f32, "images": n_img},
               "the processor's float32 pixel_values (in memory; LLaVA-OneVision without padding tiles)",
               "uint8 (1/4) and each image's pixels once where the processor repeats them as the two frames of a "
               "temporal patch (1/2)" if name in QWEN_LIKE else "the same tiles as uint8 (1/4)"),
    ]
