"""Reference computations with transformers itself, used by several test modules."""

from __future__ import annotations

import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Optional
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.compat import mm_token_type_ids_kwargs
from mmpipe.images import VisionSpec
from mmpipe.records.generation import SamplingParams

from conftest import processor_for


TOOL_CALL = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}


def user_turn(*parts) -> dict:
    """A user message of image items (None) and text parts (str), in order."""
    return {"role": "user", "content": [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]}


def reply(content, **kw) -> dict:
    """An assistant message with ``content`` and any other keys (``tool_calls``, ``reasoning_content``...)."""
    return {"role": "assistant", "content": content, **kw}


def one_image_row(image, answer=None) -> dict:
    """A raw row: a user turn of ``image`` then "What?", with ``answer`` an assistant reply too."""
    messages = [user_turn(None, "What?")] + ([reply([{"type": "text", "text": answer}])] if answer is not None else [])
    return {"messages": messages, "images": [image]}


def edited_processor(family: str = "qwen2_vl", **image_settings):
    """A freshly built processor of ``family`` with ``image_settings`` set on its image processor:
    a checkpoint of the family with other image settings (the shared `processor_for` one stays
    as built)."""
    p = testing.build_processor(family)
    for k, v in image_settings.items():
        setattr(p.image_processor, k, v)
    return p


def counted_renders(monkeypatch) -> list:
    """The number of conversations each ``Encoder.render_many`` call renders, appended to the
    returned list as calls happen (render counts, not times, bound the cost of locating replies)."""
    calls = []
    real = mmpipe.Encoder.render_many

    def counting(self, conversations, *args, **kw):
        calls.append(len(conversations))
        return real(self, conversations, *args, **kw)

    monkeypatch.setattr(mmpipe.Encoder, "render_many", counting)
    return calls


def processor_reference(processor, messages, images, add_generation_prompt=None):
    """What the transformers processor returns for a chat row (numpy)."""
    if add_generation_prompt is None:
        add_generation_prompt = messages[-1]["role"] != "assistant"
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    out = processor(text=[text], images=list(images) or None, return_tensors="np", **mm_token_type_ids_kwargs())
    return {k: np.asarray(v) for k, v in out.items()}


def image_chat(n_images, answer=None):
    """A user turn of ``n_images`` images, each followed by " picture i.", then "Describe them.";
    with ``answer`` an assistant reply too (the chat the encode tests compare with the processor)."""
    content = []
    for i in range(n_images):
        content += [{"type": "image"}, {"type": "text", "text": f" picture {i}."}]
    content.append({"type": "text", "text": "Describe them."})
    msgs = [{"role": "user", "content": content}]
    if answer is not None:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return msgs


def assistant_texts(messages):
    out = []
    for m in messages:
        if m["role"] == "assistant":
            c = m["content"]
            out.append(c if isinstance(c, str) else "".join(i["text"] for i in c if i.get("type") == "text"))
    return out


def raw_dataset(tmp_path):
    photos = [im for _, im in testing.sample_photos()]
    gen = [im for _, im in testing.generated_images()]
    pool = photos + gen
    rows = []
    for i in range(14):
        k = i % 4  # 0..3 images, rows with zero images first so type inference sees them first
        content = [{"type": "image", "text": None}] * k + [{"type": "text", "text": f"Question {i}?", "image": None}]
        msgs = [{"role": "user", "content": content}]
        if i % 3 == 0:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}.", "image": None}]})
        rows.append({"messages": msgs, "images": [pool[(i + j) % len(pool)] for j in range(k)]})
    feats = datasets.Features({
        "messages": [{"role": datasets.Value("string"),
                      "content": [{"type": datasets.Value("string"), "text": datasets.Value("string"),
                                   "image": datasets.Value("string")}]}],
        "images": datasets.Sequence(datasets.Image()),
    })
    ds = datasets.Dataset.from_list(rows, features=feats)
    ds.save_to_disk(str(tmp_path / "raw"))
    return datasets.load_from_disk(str(tmp_path / "raw"))


def tiny_text_model(vocab_size):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    cfg._attn_implementation = "eager"
    return Qwen2ForCausalLM(cfg).eval()


def video_row(family, grid, seed=0, sec=1.0):
    """A row holding one video, built the way the processor lays it out."""
    proc = processor_for(family)
    tok = proc.tokenizer
    fam = mmpipe.family_of(proc)
    spec = VisionSpec.from_processor(proc)
    t, h, w = grid
    per_frame = int(fam.tokens_per_grid([[1, h, w]])[0])
    ids = tok("<|im_start|>user\nWatch: ", add_special_tokens=False)["input_ids"]
    vs, ve, vp = (tok.convert_tokens_to_ids(x) for x in ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>"))
    if fam.video_frames_are_blocks:  # Qwen3-VL: a timestamp before each frame group
        for i in range(t):
            ids += tok(f"<{i * 0.5:.1f} seconds>", add_special_tokens=False)["input_ids"] + [vs] + [vp] * per_frame + [ve]
    else:
        ids += [vs] + [vp] * (t * per_frame) + [ve]
    ids += tok(" what happens?<|im_end|>\n", add_special_tokens=False)["input_ids"]
    ids = np.asarray(ids)
    rng = np.random.default_rng(seed)
    u8 = rng.integers(0, 256, size=(t * h * w, fam.patch_dim), dtype=np.uint8)
    pv = mmpipe.images.u8_video_to_pixel_values(u8, spec.for_videos().lut())  # the video processor's table
    out = {"input_ids": ids[None], "attention_mask": np.ones((1, len(ids)), np.int64),
           "mm_token_type_ids": 2 * (ids == vp).astype(np.int64)[None], "video_grid_thw": np.asarray([grid]),
           "pixel_values_videos": pv, "second_per_grid_ts": np.asarray([sec], np.float32)}
    return out, u8


README = Path(__file__).resolve().parents[1] / "README.md"
DOC_PAGES = [README] + sorted((README.parent / "docs").rglob("*.md"))


# section titles the README had before its sections moved to docs pages under other titles
MOVED_TITLES = {"Rollouts (RL)": "RL rollouts and TRL GRPO", "transformers Trainer and TRL": "SFT with transformers Trainer and TRL",
                "verl": "RL with verl", "**Packing tiled rows**": "Packing tiled rows",
                "**Packing that knows the model.**": "Packing that knows the model"}


def readme_block(heading: str) -> str:
    """The first python block after ``heading`` in the README or a docs page (docs/**/*.md), as
    written: a heading's title at any level (``"## vLLM"`` finds ``# vLLM``), else the first
    page holding the text itself (``"**The generic path.**"``)."""
    title = heading.lstrip("#").strip()
    title = MOVED_TITLES.get(title, title)
    texts = [page.read_text() for page in DOC_PAGES]
    for text in texts:
        m = re.search(rf"^#+ {re.escape(title)}[ \t]*$", text, flags=re.M)
        if m:
            return re.search(r"```python\n(.*?)```", text[m.end():], flags=re.S).group(1)
    for text in texts:
        if title in text:
            return re.search(r"```python\n(.*?)```", text[text.index(title):], flags=re.S).group(1)
    raise LookupError(f"no heading or text {title!r} in README.md or docs/")


def prompt_rows(proc, counts=(0, 1, 2), *, vary_length: bool = False, size=(40, 56), step=(16, 8), seed_step: int = 5):
    """Encoded generation prompts (no labels) with the given image counts, one question each.
    Image j of row i is ``size + step * (j, i)`` pixels (w, h), seed ``seed_step * i + j``;
    ``vary_length``: even rows ask twice, so prompt lengths differ (padding is exercised)."""
    rows = []
    for i, k in enumerate(counts):
        question = "what is shown? " * (2 - i % 2) if vary_length else "what is shown?"
        content = [{"type": "text", "text": f"Question {i}: {question}"}]
        for j in range(k):
            content += [{"type": "image"}, {"type": "text", "text": f" (image {j})"}]
        raw = {"messages": [{"role": "user", "content": content}],
               "images": [testing.tiny_image(size[0] + step[0] * j, size[1] + step[1] * i, seed=seed_step * i + j)
                          for j in range(k)]}
        rows.append(mmpipe.encode_row(raw, proc, labels=False))
    return rows


# greedy and sampled (n=2, temperature 1.0) generation, as the engine-equivalence tests run them
def multiturn_logprobs(mt, engine, turns: int, max_new_tokens: int, observation) -> dict:
    """A VRAG-style loop over a `MultiTurnBatch` ``mt``: ``turns`` rounds of ``engine.generate`` at
    temperature 1.0 (seed = the turn), each reply appended, then ``observation(turn, row)`` (``None``:
    none; else ``(content, images)``) as the tool turn. Returns ``{row: [float32 logprobs per turn]}``."""
    lps = {i: [] for i in range(len(mt.active_indices))}
    for turn in range(turns):
        idx = mt.active_indices
        gens = engine.generate(mt.active_rows(), SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0,
                                                                seed=turn))
        for i, g in zip(idx, gens):
            c = g.completions[0]
            lps[i].append(np.asarray(c.logprobs, np.float32))
            mt.append_response(i, c)
            seen = observation(turn, i)
            if seen is not None:
                mt.append_observation(i, seen[0], images=seen[1])
    return lps


GREEDY_AND_SAMPLED = pytest.mark.parametrize(
    "params", [SamplingParams(max_new_tokens=6), SamplingParams(max_new_tokens=6, n=2, temperature=1.0, seed=3)],
    ids=["greedy", "sampled-n2"])


# A hang guard for a subprocess that starts vLLM (scripts/envs/vllm.sh): one engine start and its
# checks took 104 s (vllm_worker.py, qwen2_vl) with 3 CPU spinners beside it on 2 cores, five in a
# row 136 s (vllm_2026_worker.py); the 420-540 s guards before were ~4x that.
VLLM_WORKER_S = 1200
HANG_S = 60  # a call still running after this long is a hang: the test fails instead of waiting (a bound
# for hangs, not a timing check: generous so that a loaded machine never reaches it)
FIFOS: list = []  # FIFOs the tests made: a reader blocked on one is released by opening its write end


def bounded(fn, *args, timeout: float = HANG_S, **kwargs):
    """``fn(*args, **kwargs)`` on a daemon thread; an AssertionError (never a hang) past
    ``timeout``. A reader blocked on one of `FIFOS` is released by opening its write end."""
    import os
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for fifo in FIFOS:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        raise AssertionError(f"{getattr(fn, '__name__', fn)} still running after {timeout} s: it hangs")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@dataclass
class FakeSamplingParams:
    """vllm.SamplingParams' keyword names for what the engine sets."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: Optional[int] = 16
    seed: Optional[int] = None
    stop_token_ids: list = field(default_factory=list)
    logprobs: Optional[int] = None


# ---- videos (tests/images/test_video.py, tests/encoding/test_video_encode.py) -------------------
def make_video(n: int, fps: float, h: int, w: int, *, seed: int = 0, fmt: str = "mp4", codec: Optional[str] = None,
               pix: str = "yuv420p", frame=None, rotation=None, pts=None, audio: bool = False, movflags=None,
               gop=None) -> bytes:
    """n frames of moving shapes and noise (``frame(i)``: uint8 [h, w, 3] frame i instead), h264 in mp4
    (mpeg4 where libx264 is missing; ``codec``, ``fmt``, ``pix``: others), made with PyAV. ``pts``:
    per-frame times in 1/1000 s (variable frame rate); ``rotation``: the display matrix (degrees
    counter-clockwise); ``audio``: a silent AAC track first; ``movflags``: the mp4 muxer's
    (``frag_keyframe``: fragmented); ``gop``: frames per keyframe."""
    import io
    from fractions import Fraction

    import av

    codec = codec or ("libx264" if "libx264" in av.codecs_available else "mpeg4")
    if frame is None:
        base = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)

        def frame(i):
            a = np.roll(base, i * 3, axis=1)
            a[(i * 2) % h: (i * 2) % h + 4, :, 1] = 255
            return a

    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt, **({"options": {"movflags": movflags}} if movflags else {})) as c:
        opts = {"options": {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"}} if gop else {}
        s = c.add_stream(codec, rate=Fraction(fps).limit_denominator(1001), **opts)
        s.height, s.width, s.pix_fmt = h, w, pix
        if pts is not None:
            s.codec_context.time_base = s.time_base = Fraction(1, 1000)
        if rotation is not None:
            s.set_display_rotation(rotation)
        if audio:
            a = c.add_stream("aac", rate=16000)
            a.layout = "mono"
            af = av.AudioFrame.from_ndarray(np.zeros((1, 16000 * n // int(fps)), np.float32), format="fltp",
                                            layout="mono")
            af.sample_rate, af.pts = 16000, 0
            for p in [*a.encode(af), *a.encode()]:
                c.mux(p)
        for i in range(n):
            f = av.VideoFrame.from_ndarray(frame(i), format="rgb24")
            if pts is not None:
                f.pts, f.time_base = pts[i], Fraction(1, 1000)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def chat_images(conv) -> list:
    """One small distinct RGB image per image part of the chat ``conv`` (its messages), in order."""
    from PIL import Image

    n = sum(1 for m in conv if isinstance(m["content"], list) for p in m["content"] if p.get("type") == "image")
    return [Image.new("RGB", (40 + 12 * i, 30 + 5 * i), (30 * i, 120, 60)) for i in range(n)]


def with_chat_images(conv, images) -> list:
    """``conv`` with ``images`` put into its image parts in order (what ``apply_chat_template(tokenize=True)`` reads)."""
    it = iter(images)
    return [{**m, "content": [dict(p, image=next(it)) if p.get("type") == "image" else p for p in m["content"]]}
            if isinstance(m["content"], list) else m for m in conv]


def labelled_texts(proc, row) -> list:
    """The decoded runs of ``row``'s labelled tokens (each label equal to its id), in order."""
    ids, labels, out, run = np.asarray(row.input_ids), np.asarray(row.labels), [], []
    for t, lab in zip(ids.tolist(), labels.tolist()):
        if lab != -100:
            assert lab == t
            run.append(t)
        elif run:
            out, run = out + [proc.tokenizer.decode(run)], []
    return out + ([proc.tokenizer.decode(run)] if run else [])


def template_reply(proc, conv, k, kw, **call) -> str:
    """Reply ``k`` of ``conv`` as the chat template writes it after its generation prompt (transformers'
    renders of the conversation before it and up to it; trailing newlines and spaces dropped)."""
    before = proc.apply_chat_template(conv[:k], tokenize=False, add_generation_prompt=True, **kw, **call)
    upto = proc.apply_chat_template(conv[:k + 1], tokenize=False, **kw, **call)
    assert upto.startswith(before)
    return upto[len(before):].rstrip("\n ")


def template_replies(proc, conv, kw, **call) -> list:
    """Every assistant reply of ``conv`` as `template_reply` gives it."""
    return [template_reply(proc, conv, k, kw, **call) for k, m in enumerate(conv) if m["role"] == "assistant"]


def pyav_chat_path(monkeypatch) -> list:
    """Make the processors' chat path (``apply_chat_template`` with a video file) decode with
    transformers' own PyAV reader (torchcodec, its default, does not load here); returns the list
    each decoded video's sampled source frame indices are appended to."""
    from transformers import video_processing_utils as vpu
    from transformers.video_utils import load_video

    seen = []

    def fetch(self, v, sample_indices_fn=None):
        if isinstance(v, list):
            return list(zip(*[fetch(self, x, sample_indices_fn) for x in v]))
        video, meta = load_video(v, backend="pyav", sample_indices_fn=sample_indices_fn)
        seen.append(list(range(meta.total_num_frames)) if meta.frames_indices is None else list(meta.frames_indices))
        return video, meta

    monkeypatch.setattr(vpu.BaseVideoProcessor, "fetch_videos", fetch)
    return seen


def video_file(n: int, h: int, w: int, fmt: str, *, codec: Optional[str] = None, pix: str = "yuv420p",
               movflags=None, audio_only: bool = False, seed: int = 0) -> bytes:
    """n random frames at 10 fps written to a real file (the mp4 muxer's ``faststart`` rewrites it),
    its bytes (``codec``: libx264, mpeg4 where it is missing); ``audio_only``: one second of silent AAC
    and no video stream. For containers made only on a file (mpegts, ``faststart``); `make_video` otherwise."""
    import os
    import tempfile
    from fractions import Fraction

    import av

    codec = codec or ("libx264" if "libx264" in av.codecs_available else "mpeg4")
    fd, path = tempfile.mkstemp(suffix=".vid")
    os.close(fd)
    try:
        with av.open(path, "w", format=fmt, **({"options": {"movflags": movflags}} if movflags else {})) as c:
            if audio_only:
                a = c.add_stream("aac", rate=16000)
                a.layout = "mono"
                af = av.AudioFrame.from_ndarray(np.zeros((1, 16000), np.float32), format="fltp", layout="mono")
                af.sample_rate, af.pts = 16000, 0
                for p in [*a.encode(af), *a.encode()]:
                    c.mux(p)
            else:
                s = c.add_stream(codec, rate=Fraction(10))
                s.height, s.width, s.pix_fmt = h, w, pix
                rng = np.random.default_rng(seed)
                for _ in range(n):
                    f = av.VideoFrame.from_ndarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), format="rgb24")
                    for p in s.encode(f):
                        c.mux(p)
                for p in s.encode():
                    c.mux(p)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def all_frames(data: bytes) -> list:
    """Every frame of an encoded video, uint8 [H, W, 3] RGB (PyAV)."""
    import io

    import av

    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def image_processor_video(family: str, frames: list, min_px: int, max_px: int) -> tuple:
    """The main-env video pixel oracle: the torchvision rule of the stock video processors
    (transformers has only torchvision ones: ``Qwen2VLVideoProcessor`` / ``Qwen3VLVideoProcessor``)
    run here as mmpipe's torchvision-backend IMAGE path (`encode_image` with
    ``image_backend="torchvision"``: torch's uint8 antialiased bicubic resize, fused float32
    table) on each frame with the video's bounds, frames paired into temporal patches as the
    video processor lays them out. That path equals transformers' torchvision image processor
    bit for bit (tests/images/test_backends.py in the vLLM env), and mmpipe's videos equal the
    stock video processors (tests/rollout/test_video_pixel_oracle.py, vLLM env): torchvision
    cannot be installed in the main env. Returns (float32 [Nv, 3*T*p*p], [grid_t, gh, gw])."""
    from PIL import Image

    from mmpipe.images.pixels import encode_image, u8_to_pixel_values

    spec = VisionSpec.from_processor(processor_for(family), min_pixels=min_px, max_pixels=max_px,
                                     backend="torchvision")
    T = spec.temporal_patch_size
    outs = [encode_image(Image.fromarray(np.asarray(f)), spec) for f in frames]
    grid = list(outs[0][1])
    pvs = [u8_to_pixel_values(u8, spec.lut(), T) for u8, _ in outs]
    n, d = pvs[0].shape
    per = [pv.reshape(n, 3, T, d // (3 * T))[:, :, 0] for pv in pvs]  # [n, 3, pp] per frame
    groups = [np.stack(per[g * T:(g + 1) * T], axis=2).reshape(n, d) for g in range(len(frames) // T)]
    return np.concatenate(groups), [len(frames) // T] + grid[1:]


GENERIC_SIZES = [(40, 56), (70, 30), (33, 33), (64, 100)]


def generic_chat_rows(counts, sizes=GENERIC_SIZES):
    """Chat rows for the generic path (tests/encoding/test_generic_*.py): row i holds
    ``counts[i]`` images of varied sizes (varied tile counts), a user turn, an assistant reply
    and an ``id``."""
    from mmpipe.offline import tiny_image

    out, k = [], 0
    for i, n in enumerate(counts):
        images = [tiny_image(*sizes[(k + j) % len(sizes)]) for j in range(n)]
        k += n
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"what is in row {i}?" + " so" * i}]
        reply = [{"type": "text", "text": f"a cat {i}" * (i + 1)}]
        out.append({"id": f"r{i}", "messages": [{"role": "user", "content": content},
                                                {"role": "assistant", "content": reply}], "images": images})
    return out


# ---- mixed image + video rows (tests/rollout/test_video_*.py, tests/batching/test_video_batching.py) ----
VIDEO_BOUNDS = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}  # small frames: few tokens per group


def processor_call(proc, raws, *, nested: bool = False, **kw):
    """The processor's own call on rows ``raws`` (their whole conversations rendered by its chat
    template, their images: one flat list, or one list per row with ``nested``, as Gemma 4's batch
    call takes them), as torch tensors: what the generic path must equal."""
    texts = [proc.apply_chat_template(r["messages"], tokenize=False) for r in raws]
    images = [im for r in raws for im in r["images"]]
    if nested and images:
        images = [list(r["images"]) for r in raws]
    return proc(text=texts, images=images or None, return_tensors="pt", **kw)


def chat_path(proc, raw, **kw):
    """The processor's chat path on one row: the images inside the messages, tokenized by
    ``apply_chat_template`` (what TRL and the model cards call); ``kw``: its template keywords
    (``enable_thinking``...)."""
    images = iter(raw["images"])
    messages = [dict(m, content=[dict(c, image=next(images)) if c["type"] == "image" else c for c in m["content"]])
                for m in raw["messages"]]
    return proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt", **kw)


def video_frames_list(n: int, h: int, w: int, seed: int) -> list:
    """n random uint8 [h, w, 3] frames (a frame-list video, no decoder needed)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


def mixed_media_raws(layout, *, answer: bool = True, seed: int = 0) -> list[dict]:
    """Raw chat rows; ``layout[i]`` is row i's media in order, e.g. ``"vIv"`` (video, image,
    video), ``""`` for none. Video k of a row: 3 + k frames of (40 + 40k)x56 pixels at 2 fps
    (odd counts: the last frame repeats); images `testing.tiny_image` of varied sizes."""
    raws = []
    for i, kinds in enumerate(layout):
        content, videos, images = [{"type": "text", "text": f"Row {i}."}], [], []
        for j, kind in enumerate(kinds):
            if kind == "v":
                videos.append({"frames": video_frames_list(3 + len(videos), 40 + 40 * len(videos), 56,
                                                           seed=seed + 10 * i + j), "fps": 2.0})
                content += [{"type": "video"}, {"type": "text", "text": f" clip {len(videos) - 1}."}]
            else:
                images.append(testing.tiny_image(36 + 6 * j, 44 + 4 * i, seed=seed + 10 * i + j))
                content += [{"type": "image"}, {"type": "text", "text": f" picture {len(images) - 1}."}]
        messages = [{"role": "user", "content": content}]
        if answer:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "seen " * (i + 1)}]})
        raws.append({"messages": messages, "images": images, "videos": videos})
    return raws


def encode_mixed(layout, proc, **kw) -> list:
    """`mixed_media_raws` encoded with `VIDEO_BOUNDS` (``kw`` go to ``mmpipe.encode_row``)."""
    answer = kw.pop("answer", True)
    return [mmpipe.encode_row(r, proc, idx=i, video_options=VIDEO_BOUNDS, **kw)
            for i, r in enumerate(mixed_media_raws(layout, answer=answer))]


def photo_paths() -> list[str]:
    """The sample photos (`testing.sample_photos`) as their files (JPEG and PNG), sorted by name."""
    import matplotlib

    root = Path(matplotlib.get_data_path()) / "sample_data"
    return sorted(str(p) for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def exif_rotated_jpeg(h: int = 40, w: int = 90, orientation: int = 6) -> bytes:
    """A JPEG stored ``w`` x ``h`` whose EXIF orientation turns it upright (6: 90 degrees)."""
    import io

    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    testing.tiny_image(h, w, seed=5).save(out, "JPEG", exif=exif, quality=90)
    return out.getvalue()


def odd_images() -> list:
    """Odd sizes and modes, each in a form rows take: 1x1 PNG as ``{"bytes"}``, 1x300 PNG bytes,
    RGBA PIL, P PIL with a transparent index, L PIL, EXIF-rotated JPEGs (``{"bytes"}``, bytes)."""
    import io

    from PIL import Image

    def png(img):
        out = io.BytesIO()
        img.save(out, "PNG")
        return out.getvalue()

    pal = testing.tiny_image(50, 31, seed=2).convert("P", palette=Image.ADAPTIVE, colors=16)
    pal.info["transparency"] = 3
    return [{"bytes": png(testing.tiny_image(1, 1, seed=1)), "path": None}, png(testing.tiny_image(1, 300, seed=2)),
            testing.tiny_image(90, 70, seed=3, mode="RGBA"), pal, testing.tiny_image(64, 130, seed=4, mode="L"),
            {"bytes": exif_rotated_jpeg(), "path": None}, exif_rotated_jpeg(33, 97, orientation=8)]


def mapped_with_a_failed_row():
    """A plain ``ds.map(mmpipe.encode, on_error="skip")``: row 1 (two placeholders, one image)
    is kept as an empty placeholder whose ``mmpipe_error`` holds its failure."""
    def raw(placeholders):
        return {"messages": [{"role": "user", "content": [{"type": "image"}] * placeholders
                              + [{"type": "text", "text": "What is shown?"}]}],
                "images": [testing.tiny_image(28, 28)]}

    ds = datasets.Dataset.from_list([raw(1), raw(2), raw(1)])
    proc = processor_for("qwen2_vl")
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "on_error": "skip", "labels": False},
                 with_indices=True, remove_columns=ds.column_names)
    assert enc[1]["mmpipe_error"] and len(enc[1]["input_ids"]) == 0
    return enc, proc


def run_threads(work, threads: int) -> None:
    """``work(t)`` for ``t`` in ``range(threads)``, each on its own thread, released together by a
    barrier, with the interpreter's switch interval shortened to 1 µs while they run (races widened:
    counted in the thread tests, never timed); returns when all have finished."""
    barrier = threading.Barrier(threads)

    def start(t: int) -> None:
        barrier.wait()
        work(t)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=start, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)


def run_child_group(script: str, timeout: float, hang: str) -> str:
    """Run ``script`` (``python -c``) in a child process group of its own and return its stdout; past
    ``timeout`` seconds the group is killed (the child's workers too: they hold the pipes) and the
    test fails with ``hang``; a non-zero exit fails it with the child's stderr."""
    import os
    import signal
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        pytest.fail(hang)
    assert child.returncode == 0, err[-2000:]
    return out


def published_pair(processor, family: str) -> tuple:
    """Two copies of ``processor``: one with ``family``'s chat template as published with its
    checkpoint, one with that template's ``{% generation %}`` copy (transformers' assistant mask:
    the labels' reference)."""
    import copy

    from mmpipe.offline.published_templates import generation_template, published_template

    proc = copy.deepcopy(processor)
    proc.chat_template = proc.tokenizer.chat_template = published_template(family)
    ref = copy.deepcopy(proc)
    ref.chat_template = ref.tokenizer.chat_template = generation_template(family)
    return proc, ref


def count_renders(monkeypatch) -> list:
    """A list that grows by one for every conversation `mmpipe.Encoder.render_many` renders from now
    on (the chat-template renders of an encode or a multi-turn append: counted, not timed)."""
    import mmpipe

    counted, real = [], mmpipe.Encoder.render_many

    def counting(self, conversations, *args, **kw):
        counted.extend([1] * len(conversations))
        return real(self, conversations, *args, **kw)

    monkeypatch.setattr(mmpipe.Encoder, "render_many", counting)
    return counted
