"""Audio rows for the Omni tests (tests/encoding/test_omni_audio.py, test_qwen3_omni.py,
tests/audio/test_encode_video_sound.py): clips made here (a tone plus noise), written as WAV / FLAC /
OGG at other rates, the processor's own flat call on a raw row, its clips loaded as its chat path
loads them (transformers' ``load_audio``), the check that encoded rows equal such calls, and sampling
with the rollout/training logprob gap."""

from __future__ import annotations

import numpy as np

RATE = 16000  # the Omni feature extractors' rate
CLIP_FILES = (("a.wav", 1.6, 22050, 1), ("b.flac", 0.9, 16000, 2), ("c.ogg", 2.3, 44100, 1))


def clip(seconds: float, rate: int, seed: int, channels: int = 1) -> np.ndarray:
    """float32 [n] (or [n, 2]) samples: a tone whose pitch follows ``seed``, with mild noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    x = (0.2 * np.sin(2 * np.pi * (300 + 50 * seed) * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)
    return np.stack([x, 0.5 * x], 1) if channels == 2 else x


def write_clips(folder) -> dict:
    """`CLIP_FILES` written into ``folder``: file name -> path."""
    import soundfile

    paths = {}
    for name, sec, rate, ch in CLIP_FILES:
        path = folder / name
        soundfile.write(str(path), clip(sec, rate, len(paths), ch), rate)
        paths[name] = str(path)
    return paths


def write_videos(folder, specs: dict) -> dict:
    """Videos with a sound track (`mmpipe.audio.samples.video_with_sound`) written under ``folder``:
    ``{name: (seconds, fps, fmt, rate, channels, seed)}`` -> ``{name: path}``."""
    from mmpipe.audio.samples import video_with_sound

    out = {}
    for name, (seconds, fps, fmt, rate, channels, seed) in specs.items():
        data, _ = video_with_sound(seconds, fps=fps, fmt=fmt, rate=rate, channels=channels, seed=seed)
        (folder / name).write_bytes(data)
        out[name] = str(folder / name)
    return out


def loaded(value) -> np.ndarray:
    """A clip as the processor's own chat path loads it (transformers' ``load_audio`` of a file;
    samples are written to a file first: float as a float WAV, int16 as PCM)."""
    import soundfile
    from transformers.audio_utils import load_audio

    if isinstance(value, tuple):
        value = {"array": value[0], "sampling_rate": value[1]}
    if isinstance(value, dict) and value.get("array") is not None:
        import os
        import tempfile

        array = np.asarray(value["array"])
        fd, path = tempfile.mkstemp(prefix="mmpipe_audio_rows_", suffix=".wav")  # own file: runs may overlap
        os.close(fd)
        try:
            soundfile.write(path, array, value["sampling_rate"],
                            subtype="PCM_16" if array.dtype == np.int16 else "FLOAT")
            return load_audio(path, RATE, backend="soundfile")
        finally:
            os.unlink(path)
    return load_audio(value["path"] if isinstance(value, dict) else value, RATE, backend="soundfile")


def chat_text(proc, raw: dict) -> str:
    """The row's whole conversation rendered by the processor's template (string contents as text items)."""
    msgs = [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m["content"], str) else m
            for m in raw["messages"]]
    return proc.apply_chat_template(msgs, tokenize=False)


def own_call(proc, raw: dict) -> dict:
    """The processor's flat call on a raw row: its conversation rendered, its images, its clips."""
    from PIL import Image

    images = [Image.open(p) for p in raw.get("images", [])]
    audios = [loaded(a) for a in raw.get("audios", [])]
    return dict(proc(text=[chat_text(proc, raw)], images=images or None, audio=audios or None, return_tensors="pt"))


def assert_rows_equal_calls(rows: list, calls: list, *, dtypes: bool = False) -> None:
    """Each encoded generic-path row equals its processor call's outputs (``calls``, one dict of
    tensors per row): the ids, and every other output key, held in ``row.vision``, bit for bit (and of
    the same dtype with ``dtypes``)."""
    for i, (row, own) in enumerate(zip(rows, calls)):
        np.testing.assert_array_equal(row.input_ids, own["input_ids"][0].numpy(), err_msg=f"row {i}")
        keys = {k for k in own if k not in ("input_ids", "attention_mask")}
        assert set(row.vision) == keys, (i, sorted(row.vision), sorted(keys))
        for k in keys:
            if dtypes:
                assert row.vision[k].dtype == np.asarray(own[k]).dtype, (i, k)
            np.testing.assert_array_equal(row.vision[k], np.asarray(own[k]), err_msg=f"row {i}: {k}")


def sample_and_gaps(proc, model, raws: list, *, n: int = 4, max_new_tokens: int = 64, seed: int = 3,
                    encoder=None):
    """Prompts encoded from ``raws`` (by ``encoder``, an `mmpipe.Encoder` built with
    ``add_generation_prompt=True, labels=False``, when given), sampled by
    `mmpipe.rollout.TransformersEngine` at temperature 1.0
    -> (the engine, its generations, each completion's max |teacher-forced - sampled| logprob gap).
    The training row is the prompt with the completion appended (the generic path's rows take no
    `RolloutSample.to_row`); its logprobs come from `mmpipe.rollout.teacher_forced_logprobs`."""
    from dataclasses import replace

    import torch

    import mmpipe
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout import TransformersEngine, teacher_forced_logprobs

    if encoder is None:
        encoder = mmpipe.Encoder(proc, add_generation_prompt=True, labels=False)
    prompts = [encoder.encode_row(r, i) for i, r in enumerate(raws)]
    engine = TransformersEngine(model, proc)
    gens = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new_tokens,
                                                   logprobs=True, seed=seed))
    gaps = []
    for prompt, gen in zip(prompts, gens):
        for c in gen.completions:
            ids = np.asarray(c.token_ids, np.int64)
            total = len(prompt) + len(ids)
            row = replace(prompt, input_ids=np.concatenate([prompt.input_ids, ids]),
                          attention_mask=np.ones(total, np.int64), mm_token_type_ids=np.zeros(total, np.int64),
                          position_ids=np.arange(total), labels=None)
            lp = teacher_forced_logprobs(model, mmpipe.collate([row]))[0, len(prompt):]
            gaps.append(float((lp - torch.tensor(c.logprobs)).abs().max()))
    return engine, gens, gaps
