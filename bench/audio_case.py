"""Audio rows (issue 31): ``mmpipe.encode`` on Qwen2.5-Omni thinker rows with one clip each (WAV
files of 1-10 s at 22.05 kHz, some stereo) against what a peer user runs on the same rows: the
processor's own chat path, ``apply_chat_template(tokenize=False)`` for the text, transformers'
``load_audio(path, sampling_rate=16000, backend="soundfile")`` for each clip, then the processor's
flat call. The encode IS the processor's call plus the clip load and the labels, so the ratio
says what mmpipe's bookkeeping costs. Outputs are checked equal first (input_ids,
``input_features``, ``feature_attention_mask``).

Registered by bench/run.py as ``audio`` (``case_audio``).
"""

from __future__ import annotations

import os

import numpy as np

from .report import speed
from .timing import side_by_side

SECONDS = (1.0, 2.5, 4.0, 6.0, 8.0, 10.0)
QUICK_SECONDS = (1.0, 3.0, 10.0)
RATE = 22050  # the files' rate: the load resamples to the extractor's 16 kHz


def _rows(workdir: str, seconds) -> list[dict]:
    import soundfile

    from mmpipe.audio.samples import tone

    rows = []
    for i, s in enumerate(seconds):
        path = os.path.join(workdir, f"clip{i}.wav")
        wave = tone(int(s * RATE), RATE, channels=1 + i % 2, seed=i)
        soundfile.write(path, wave.T, RATE, subtype="PCM_16")
        content = [{"type": "audio"}, {"type": "text", "text": f"Clip {i}: what do you hear?"}]
        rows.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": "A tone."}]}],
                     "audios": [path]})
    return rows


def case_audio(ctx) -> list:
    from transformers.audio_utils import load_audio as hf_load_audio

    import mmpipe
    from mmpipe.offline import qwen_omni

    seconds = QUICK_SECONDS if ctx.quick else SECONDS
    proc = qwen_omni.build_processor()
    rows = _rows(ctx.workdir, seconds)
    rate = int(proc.feature_extractor.sampling_rate)

    def ours():
        return [mmpipe.encode(r, processor=proc) for r in rows]

    def peer():
        out = []
        for r in rows:
            text = proc.apply_chat_template(r["messages"], tokenize=False)
            waves = [hf_load_audio(p, sampling_rate=rate, backend="soundfile") for p in r["audios"]]
            out.append(proc(text=[text], audio=waves, return_tensors="np"))
        return out

    got, ref = ours(), peer()
    same = all(np.array_equal(np.asarray(g["input_ids"]).reshape(-1), np.asarray(p["input_ids"]).reshape(-1))
               and np.array_equal(np.asarray(g["input_features"]).reshape(np.shape(p["input_features"])),
                                  p["input_features"])
               and np.array_equal(np.asarray(g["feature_attention_mask"]).reshape(
                   np.shape(p["feature_attention_mask"])), p["feature_attention_mask"])
               for g, p in zip(got, ref))
    t = side_by_side({"mmpipe": ours, "peer": peer}, repeat=ctx.repeat, warmup=1)
    clips = f"{len(rows)} rows of one clip ({', '.join(f'{s:g}' for s in seconds)} s, 22.05 kHz WAV)"
    detail = {"clips_s": list(seconds), "timing": {k: v.to_json() for k, v in t.items()},
              "ratio_peer_over_mmpipe": t["peer"].median / t["mmpipe"].median}
    base = "apply_chat_template + transformers load_audio(soundfile) + the processor's call"
    return [speed(f"audio encode, Qwen2.5-Omni thinker ({clips})", t["mmpipe"], t["peer"], base, target=None,
                  identical=same, per=len(rows), unit="rows", detail=detail)]


if __name__ == "__main__":  # python -m bench.audio_case [--quick]: the case alone
    import sys
    import tempfile
    from types import SimpleNamespace

    from .report import format_table

    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory() as d:
        res = case_audio(SimpleNamespace(quick=quick, repeat=1 if quick else 5, workdir=d))
    print(format_table(res))
    for r in res:
        print("identical:", r.identical, "ratio (peer time / mmpipe time):", r.ratio_text)
