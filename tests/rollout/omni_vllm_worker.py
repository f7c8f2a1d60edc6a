"""Real vLLM on a tiny Omni thinker (Qwen2.5-Omni, Qwen3-Omni), as its own process (``vllm.LLM``
spawns its engine); used by tests/rollout/test_omni_vllm.py.

    python tests/rollout/omni_vllm_worker.py FAMILY WORK_DIR OUT_JSON     # FAMILY: qwen2_5_omni | qwen3_omni

Saves the checkpoint (`mmpipe.offline.qwen_omni` / `qwen3_omni` ``save_checkpoint``, its processor with the video
processor: torchvision's Python part on PYTHONPATH), encodes rows of 0-2 clips and 0-1 image with
``mmpipe.encode`` (the generic path: the processor's own call), builds each row's vLLM prompt
(`mmpipe.rollout.processor_prompts.vllm_prompt`: collapsed placeholders, clips and images as
media) and asks vLLM for 4 greedy tokens; records vLLM's expanded ``prompt_token_ids`` against the
training ids, and the thinker's (transformers, on the collated training row) greedy tokens and
first-token logprob against vLLM's; then one video with its sound (`video_sound_check`), and rows with videos
encoded by mmpipe and prompted by ``to_vllm_prompts(..., videos=)`` (`encoded_video_check`). Writes OUT_JSON.
"""

from __future__ import annotations

import gc
import json
import sys
import time

import numpy as np

RATE = 16000


def rows():
    from mmpipe import testing
    from mmpipe.audio.samples import tone

    def clip(seconds, seed):
        return {"array": tone(int(seconds * RATE), RATE, seed=seed)[0], "sampling_rate": RATE}

    photo = testing.tiny_image(90, 120, seed=3)
    specs = [(["audio"], [clip(1.0, 1)], []), (["audio", "audio"], [clip(0.7, 2), clip(2.3, 3)], []),
             (["image", "audio"], [clip(1.6, 4)], [photo]), (["image"], [], [photo]),
             ([], [], []), (["audio"], [{"array": tone(22050, 22050, seed=5)[0], "sampling_rate": 22050}], [])]
    out = []
    for i, (order, audios, images) in enumerate(specs):
        content = [{"type": k} for k in order] + [{"type": "text", "text": f"Row {i}: what is there?"}]
        out.append({"messages": [{"role": "user", "content": content}], "audios": audios, "images": images})
    return out


def video_sound_check(llm, proc, model) -> dict:
    """A video with its sound (``use_audio_in_video``): the processor's ids -> `video_sound_prompt` -> vLLM's
    expanded ids and greedy tokens, against the ids and the thinker's greedy tokens (``use_audio_in_video=True``)."""
    import io

    import av
    import torch
    from vllm import SamplingParams

    from mmpipe.audio import load_video_audio
    from mmpipe.audio.samples import video_with_sound
    from mmpipe.rollout.processor_prompts import video_sound_prompt

    data, _ = video_with_sound(3.0, fps=4, fmt="mkv", rate=RATE, channels=2)
    with av.open(io.BytesIO(data)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    wave = load_video_audio(data, RATE)
    block = proc.vision_bos_token + proc.video_token + proc.vision_eos_token
    text = f"<|im_start|>user\n{block}What happens?<|im_end|>\n<|im_start|>assistant\n"
    out = proc(text=[text], videos=[frames], audio=[wave], use_audio_in_video=True, return_tensors="pt")
    train = out["input_ids"][0].tolist()
    prompt = video_sound_prompt(train, proc, [frames], [wave])
    # the vLLM environment's processor (transformers 5.19) follows the same placeholder rule as 5.24's
    # (tests/audio/test_omni_video_sound.py): `interleaved_placeholder`
    from mmpipe.audio.omni_video import interleaved_placeholder

    layout, per_second = ("time", 13) if "Qwen3" in type(proc).__name__ else ("chunks", 25)
    run = interleaved_placeholder(out["video_grid_thw"][0].tolist(), float(out["video_second_per_grid"][0]),
                                  train.count(proc.tokenizer.convert_tokens_to_ids(proc.audio_token)),  # its only clip
                                  merge_size=proc.video_processor.merge_size,
                                  video_token=proc.video_token, audio_token=proc.audio_token,
                                  audio_bos=proc.audio_bos_token, audio_eos=proc.audio_eos_token,
                                  position_id_per_seconds=per_second, layout=layout)
    rule = proc.tokenizer.decode(train) == text.replace(proc.video_token, run)
    o = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0))[0]
    with torch.no_grad():
        hf = model.generate(**out, use_audio_in_video=True, max_new_tokens=4, do_sample=False)[0, len(train):]
    return {"train_len": len(train), "prompt_len": len(prompt["prompt_token_ids"]),
            "ids_equal": list(o.prompt_token_ids) == train, "placeholder_rule": rule, "vllm_tokens": list(o.outputs[0].token_ids),
            "hf_tokens": hf.tolist()}


def encoded_video_check(llm, proc, model, work: str) -> list:
    """Rows encoded by ``mmpipe.Encoder(use_audio_in_video=True)`` (frames sampled at 2 and at 4 a second)
    -> ``to_vllm_prompts(rows, proc, videos=...)`` -> vLLM's expanded ids and greedy tokens, against the
    training ids and the thinker's greedy tokens on the collated row."""
    import torch
    from vllm import SamplingParams

    import mmpipe
    from mmpipe.audio.samples import video_with_sound
    from mmpipe.rollout import to_vllm_prompts
    from mmpipe.rollout.support import RolloutRefusal

    out = []
    for k, (fps, seconds) in enumerate([(None, 3.0), (4.0, 2.0)]):
        data, _ = video_with_sound(seconds, fps=4, fmt="mp4", rate=44100, channels=2, seed=10 + k)
        path = f"{work}/video{k}.mp4"
        with open(path, "wb") as f:
            f.write(data)
        raw = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}],
               "videos": [path]}
        enc = mmpipe.Encoder(proc, use_audio_in_video=True, video_options=None if fps is None else {"fps": fps})
        row = enc.encode_row(raw, 0)
        try:
            prompt = to_vllm_prompts([row], proc, videos=[[path]])[0]
        except RolloutRefusal as e:  # Qwen3-Omni at 4 fps: vLLM's positions would differ (measured below)
            out.append({"fps": fps, "refused": str(e), **vllm_anyway(llm, proc, model, row, path)})
            continue
        # this environment's processor (transformers 5.19) expanding the collapsed prompt's text itself
        media = prompt["multi_modal_data"]
        text = proc.tokenizer.decode(prompt["prompt_token_ids"])
        flat = proc(text=[text], videos=media["video"], audio=[w for w, _ in media["audio"]], use_audio_in_video=True,
                    fps=prompt["mm_processor_kwargs"]["fps"], return_tensors="np")
        o = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, logprobs=0, prompt_logprobs=0))[0]
        inputs = mmpipe.collate([row]).model_inputs(labels=False)
        with torch.no_grad():
            hf = model.generate(**inputs, max_new_tokens=4, do_sample=False)[0, len(row.input_ids):]
            every = model(**inputs).logits[0].log_softmax(-1)
            logits = every[-1]
        first = int(o.outputs[0].token_ids[0])
        train = [int(t) for t in row.input_ids]
        got = [int(t) for t in o.prompt_token_ids]
        out.append({"fps": fps or 2.0, "train_len": len(train), "prompt_len": len(prompt["prompt_token_ids"]),
                    "ids_equal": got == train, "flat_call_equal": flat["input_ids"][0].tolist() == train,
                    "first_diff": next((i for i, (a, b) in enumerate(zip(got, train)) if a != b), None),
                    "mm_processor_kwargs": prompt["mm_processor_kwargs"],
                    "vllm_tokens": list(o.outputs[0].token_ids), "hf_tokens": hf.tolist(),
                    "first_logprob_gap": abs(float(logits[first]) - float(o.outputs[0].logprobs[0][first].logprob)),
                    "prompt_logprob_gap": prompt_logprob_gap(every, train, o)})
    return out


def prompt_logprob_gap(every, train: list, o) -> float:
    """The largest gap over the prompt's tokens between the thinker's log-probabilities (``every``:
    [L, vocab] log-softmax on the training row) and vLLM's ``prompt_logprobs`` of output ``o``."""
    return max(abs(float(every[i - 1, train[i]]) - o.prompt_logprobs[i][train[i]].logprob) for i in range(1, len(train)))


def vllm_anyway(llm, proc, model, row, path) -> dict:
    """What the refusal guards against: the refused row's prompt built without the check, vLLM's prompt
    logprobs against the thinker's on the training row (the ids still agree)."""
    import torch
    from vllm import SamplingParams

    import mmpipe
    from mmpipe.rollout import processor_prompts

    check, processor_prompts.check_whole_time_positions = processor_prompts.check_whole_time_positions, lambda *a: None
    try:
        prompt = processor_prompts.vllm_prompt(row, proc, videos=[path])
    finally:
        processor_prompts.check_whole_time_positions = check
    o = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    train = [int(t) for t in row.input_ids]
    with torch.no_grad():
        every = model(**mmpipe.collate([row]).model_inputs(labels=False)).logits[0].log_softmax(-1)
    return {"ids_equal": list(o.prompt_token_ids) == train, "prompt_logprob_gap": prompt_logprob_gap(every, train, o)}


MODULES = {"qwen2_5_omni": "mmpipe.offline.qwen_omni", "qwen3_omni": "mmpipe.offline.qwen3_omni"}


def main(family: str, work: str, out_json: str) -> None:
    import importlib

    import torch
    import transformers
    import vllm
    from vllm import LLM, SamplingParams

    import mmpipe
    from mmpipe.records.row import MultiModalInputs
    from mmpipe.rollout.processor_prompts import vllm_prompt

    qwen_omni = importlib.import_module(MODULES[family])
    t0 = time.perf_counter()
    path = qwen_omni.save_checkpoint(f"{work}/checkpoint")
    proc = qwen_omni.build_processor(videos=True)
    raw = rows()
    encoded = [mmpipe.encode(r, processor=proc) for r in raw]
    enc = [MultiModalInputs.from_dict(e, row=i) for i, e in enumerate(encoded)]
    prompts = [vllm_prompt(r, proc, images=x["images"], audios=x["audios"], index=i)
               for i, (r, x) in enumerate(zip(enc, raw))]
    t1 = time.perf_counter()
    llm = LLM(model=str(path), dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
              limit_mm_per_prompt={"image": 1, "audio": 2, "video": 1}, gpu_memory_utilization=0.1)
    t2 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, logprobs=0))
    model = qwen_omni.checkpoint_model()  # the saved weights, as built
    collate = mmpipe.Collator(proc)
    results = []
    for i, (r, p, o) in enumerate(zip(enc, prompts, outs)):
        train = [int(t) for t in r.input_ids]
        got = [int(t) for t in o.prompt_token_ids]
        inputs = collate([encoded[i]]).model_inputs(labels=False)  # the training forward's inputs
        with torch.no_grad():
            hf = model.generate(**inputs, max_new_tokens=4, do_sample=False)[0, len(train):]
            logits = model(**inputs).logits[0, -1].log_softmax(-1)
        first = int(o.outputs[0].token_ids[0])
        vllm_lp = o.outputs[0].logprobs[0][first].logprob
        results.append({"row": i, "train_len": len(train), "prompt_len": len(p["prompt_token_ids"]),
                        "vllm_len": len(got), "ids_equal": got == train,
                        "first_diff": next((k for k, (a, b) in enumerate(zip(got, train)) if a != b), None),
                        "media": {k: len(v) for k, v in p.get("multi_modal_data", {}).items()},
                        "vllm_tokens": list(o.outputs[0].token_ids), "hf_tokens": hf.tolist(),
                        "first_logprob_gap": abs(float(logits[first]) - float(vllm_lp))})
    try:
        video = video_sound_check(llm, proc, model)
    except Exception as e:  # recorded: the test says what failed
        video = {"error": f"{type(e).__name__}: {e}"[:800]}
    try:
        encoded_videos = encoded_video_check(llm, proc, model, work)
    except Exception as e:  # recorded: the test says what failed
        import traceback

        encoded_videos = [{"error": f"{type(e).__name__}: {e}"[:800], "trace": traceback.format_exc()[-3000:]}]
    with open(out_json, "w") as f:
        json.dump({"family": family, "vllm": vllm.__version__, "transformers": transformers.__version__, "prepare_s": t1 - t0,
                   "llm_start_s": t2 - t1, "rows": results,
                   "video_sound": video, "encoded_videos": encoded_videos}, f)
    # Stop the engine core and free the engine before the interpreter exits: left to interpreter
    # finalisation, vLLM's CPU engine aborted the process now and then ("terminate called without an
    # active exception", exit -6) after the results were written.
    llm.llm_engine.engine_core.shutdown()
    del llm, outs
    gc.collect()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
