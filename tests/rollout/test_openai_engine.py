"""OpenAIEngine against real HTTP servers on 127.0.0.1.

* ``transformers serve`` (a real third-party OpenAI-compatible server, started here as a
  subprocess on a saved tiny model): it returns text only, so ids are re-tokenized.
* vLLM cannot run on this CPU venv (its wheel pins a CUDA torch), so `VLLMWireServer` below
  speaks vLLM's chat-completions dialect (``chat_template``, ``return_token_ids``,
  ``return_tokens_as_token_ids``, ``logprobs``, ``mm_processor_kwargs``, ``logit_bias``) over
  real HTTP around the real tiny transformers model: images arrive as data URIs and are
  re-processed by the processor, exactly the path a server takes.

Greedy outputs (ids, and logprobs within 1e-5 where the server returns them) equal the sync
`TransformersEngine`'s on rows with 0, 1 and 2 images.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from mmpipe import testing
from mmpipe.errors import ArgumentError, PlaceholderError
from mmpipe.records.generation import AsyncRolloutEngine, SamplingParams
from mmpipe.rollout.async_engine import run_sync
from mmpipe.rollout.openai_engine import OpenAIEngine, generation_from_chat_response, request_body
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import model_for, processor_for
from helpers import prompt_rows

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
HANG_S = 60  # a wait still blocked after this long is a hang (bounds only; nothing is timed)


class VLLMWireServer:
    """``POST /v1/chat/completions`` in vLLM's dialect over the tiny model (one model call at a
    time; ``max_in_flight`` counts overlapping requests). ``overlap``: requests are held until
    that many have been in flight at once (a rendezvous, not a sleep: the overlap happens on a
    loaded machine too; bounded by HANG_S)."""

    def __init__(self, model, processor, overlap: int = 1):
        self.model, self.processor, self.lock = model, processor, threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.overlap, self.overlapped = overlap, threading.Event()
        self.bodies: list = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    code, payload = 200, outer.complete(body)
                except Exception as e:  # a 400 with the reason, like a real server
                    code, payload = 400, {"error": {"message": f"{type(e).__name__}: {e}"}}
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _inputs(self, body):
        from PIL import Image

        content = []
        for part in body["messages"][0]["content"]:
            if part["type"] == "image_url":
                raw = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                part = {"type": "image", "image": Image.open(io.BytesIO(raw)).convert("RGB")}
            content.append(part)
        mm = body.get("mm_processor_kwargs") or {}
        size = {"shortest_edge": mm["min_pixels"], "longest_edge": mm["max_pixels"]} if mm else None
        kw = {"processor_kwargs": {"images_kwargs": {"size": size}}} if size else {}
        return self.processor.apply_chat_template([{"role": "user", "content": content}],
                                                  chat_template=body["chat_template"], tokenize=True,
                                                  return_dict=True, return_tensors="pt", **kw)

    def complete(self, body):
        self.bodies.append(body)
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.max_in_flight >= self.overlap:
                self.overlapped.set()
        try:
            self.overlapped.wait(HANG_S)  # let concurrent requests overlap
            inputs = self._inputs(body)
            with self.lock:
                choices = [self._choice(inputs, body, k) for k in range(body.get("n", 1))]
        finally:
            with self.lock:
                self.in_flight -= 1
        ids = inputs["input_ids"][0].tolist()
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"], "choices": choices,
                "prompt_token_ids": ids, "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": 1}}

    def _choice(self, inputs, body, k):
        tok = self.processor.tokenizer
        stop = [tok.eos_token_id, *body.get("stop_token_ids", [])]
        banned = [int(t) for t, b in (body.get("logit_bias") or {}).items() if b <= -100]
        kw = dict(max_new_tokens=body["max_tokens"], eos_token_id=stop, pad_token_id=tok.pad_token_id,
                  return_dict_in_generate=True, output_logits=True, suppress_tokens=banned or None)
        if body["temperature"] > 0:
            kw.update(do_sample=True, temperature=body["temperature"], top_p=body["top_p"], top_k=body.get("top_k"))
            torch.manual_seed(body.get("seed", 0) + k)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            out = self.model.generate(**inputs, **kw)
        P = inputs["input_ids"].shape[1]
        new = out.sequences[0, P:].tolist()
        lp = torch.log_softmax(torch.stack(out.logits, 1)[0].float(), -1)
        end = next((j + 1 for j, t in enumerate(new) if t in stop), len(new))
        content = [{"token": f"token_id:{t}", "logprob": float(lp[j, t]), "bytes": None, "top_logprobs": []}
                   for j, t in enumerate(new[:end])]
        return {"index": k, "message": {"role": "assistant", "content": tok.decode(new[:end])},
                "finish_reason": "stop" if end < len(new) or new[end - 1] in stop else "length",
                "token_ids": new[:end], "logprobs": {"content": content} if body.get("logprobs") else None}


def _assert_same(got, want, *, logprobs: bool, atol: float = 1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.n == w.n
        for a, b in zip(g.completions, w.completions):
            assert a.token_ids == b.token_ids
            assert a.finish_reason == b.finish_reason
            if logprobs:
                np.testing.assert_allclose(a.logprobs, b.logprobs, atol=atol, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_dialect_server_equals_sync_engine(family):
    proc, model = processor_for(family), model_for(family)
    rows = prompt_rows(proc)
    server = VLLMWireServer(model, proc, overlap=2)
    try:
        engine = OpenAIEngine(server.base_url, "tiny", processor=proc, max_concurrency=2)
        assert isinstance(engine, AsyncRolloutEngine)
        params = SamplingParams(max_new_tokens=8)
        got = run_sync(engine.generate(rows, params))
        want = [TransformersEngine(model, proc).generate([r], params)[0] for r in rows]
        _assert_same(got, want, logprobs=True)
        assert all(c.token_ids_exact for g in got for c in g.completions)
        assert server.max_in_flight == 2 and engine.gate.max_in_flight == 2  # 3 rows, bound 2
        for b in server.bodies:  # (arrival order varies) pixel bounds sent exactly with images
            has_images = any(p["type"] == "image_url" for p in b["messages"][0]["content"])
            assert ("mm_processor_kwargs" in b) == has_images
        assert sorted(sum(p["type"] == "image_url" for p in b["messages"][0]["content"]) for b in server.bodies) == [0, 1, 2]
        # vision tokens banned through logit_bias (and the server honoured it)
        assert len(server.bodies[0]["logit_bias"]) == 4
        # n=2 sampled: two completions per row, each with its own logprobs (through a client the caller owns)
        async def owned():
            import openai

            async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
                mine = OpenAIEngine(server.base_url, "tiny", processor=proc, client=client)
                return await mine.generate(rows[:2], SamplingParams(max_new_tokens=4, n=2, temperature=1.0, seed=1))
        many = run_sync(owned())
        assert [g.n for g in many] == [2, 2] and all(len(c.logprobs) == len(c.token_ids) for g in many for c in g.completions)
    finally:
        server.close()


def test_server_that_resizes_images_is_refused():
    """Rows encoded with one processor, served by one with smaller pixel bounds and no
    mm_processor_kwargs honoured: the server's expanded prompt differs -> PlaceholderError."""
    proc, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    rows = prompt_rows(proc, counts=(1,))
    small = testing.build_processor("qwen2_vl", max_pixels=4 * 28 * 28)
    server = VLLMWireServer(model, small)
    inputs = server._inputs
    server._inputs = lambda body: inputs(dict(body, mm_processor_kwargs=None))  # a server that ignores them
    try:
        engine = OpenAIEngine(server.base_url, "tiny", processor=proc)
        with pytest.raises(PlaceholderError, match="server's prompt differs"):
            run_sync(engine.generate(rows, SamplingParams(max_new_tokens=2)))
    finally:
        server.close()


def test_response_translation():
    tok = processor_for("qwen2_vl").tokenizer
    eos = tok.eos_token_id
    exact = {"choices": [{"index": 1, "finish_reason": "length", "logprobs": {"content": [
                 {"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:9", "logprob": -1.5}]}},
             {"index": 0, "finish_reason": "stop", "token_ids": [5, eos],
              "logprobs": {"content": [{"token": "a", "logprob": -1.0}, {"token": "b", "logprob": -2.0}]}}],
             "prompt_token_ids": [1, 2, 3]}
    g = generation_from_chat_response(exact, 0, tokenizer=tok, expected_prompt_ids=[1, 2, 3], eos_token_id=eos)
    assert [c.token_ids for c in g.completions] == [[5, eos], [7, 9]]
    assert [c.logprobs for c in g.completions] == [[-1.0, -2.0], [-0.5, -1.5]]
    assert [c.finish_reason for c in g.completions] == ["stop", "length"]
    with pytest.raises(PlaceholderError, match="from position 2"):
        generation_from_chat_response(exact, 0, tokenizer=tok, expected_prompt_ids=[1, 2, 4])
    text = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "hi there"}}],
            "usage": {"prompt_tokens": 3}}
    c = generation_from_chat_response(text, 0, tokenizer=tok, expected_prompt_ids=[1, 2, 3], eos_token_id=eos).completions[0]
    assert not c.token_ids_exact and c.logprobs is None
    assert c.token_ids == tok.encode("hi there", add_special_tokens=False) + [eos]
    with pytest.raises(PlaceholderError, match="4 prompt tokens"):
        generation_from_chat_response(dict(text, usage={"prompt_tokens": 4}), 0, tokenizer=tok, expected_prompt_ids=[1, 2, 3])


def test_request_body_round_trips_the_prompt():
    """The verbatim template over the request's content re-creates the row's ids exactly."""
    proc = processor_for("qwen3_vl")
    rows = prompt_rows(proc)
    for i, r in enumerate(rows):
        body = request_body(r, SamplingParams(), model="m", processor=proc, index=i)
        parts = body["messages"][0]["content"]
        assert sum(p["type"] == "image_url" for p in parts) == r.num_images
        assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in parts if p["type"] == "image_url")
        server = VLLMWireServer.__new__(VLLMWireServer)
        server.processor = proc
        ids = server._inputs(body)["input_ids"][0].numpy()
        np.testing.assert_array_equal(ids, r.input_ids)
    with pytest.raises(ArgumentError, match="allow_vision_tokens"):
        request_body(rows[0], SamplingParams(), model="m", processor=proc, server="transformers")
    with pytest.raises(ArgumentError, match="stop_token_ids"):
        request_body(rows[0], SamplingParams(allow_vision_tokens=True, stop_token_ids=(5,)), model="m", processor=proc,
                     server="transformers")
    with pytest.raises(ArgumentError, match="server must be one of"):
        OpenAIEngine("http://127.0.0.1:1/v1", "m", processor=proc, server="sglang")


# ---- transformers serve ------------------------------------------------------------------
SERVE_MISSING = [m for m in ("fastapi", "uvicorn", "accelerate") if importlib.util.find_spec(m) is None]
REMOTE_PROCESSOR = """from mmpipe.offline.processors import image_only_processor_class

{name} = image_only_processor_class({family!r})
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _save_for_serve(family: str, path) -> None:
    """Tiny model + processor in a folder `transformers serve` loads offline: the image-only
    processor (no torchvision here) is found through ``auto_map`` (trust_remote_code)."""
    model_for(family).save_pretrained(path)
    proc = processor_for(family)
    proc.save_pretrained(path)
    name = type(proc).__name__
    (path / "processing_mmpipe.py").write_text(REMOTE_PROCESSOR.format(name=name, family=family))
    for f in ("processor_config.json", "tokenizer_config.json"):
        cfg = json.loads((path / f).read_text())
        cfg["auto_map"] = {"AutoProcessor": f"processing_mmpipe.{name}"}
        (path / f).write_text(json.dumps(cfg))


@pytest.fixture
def transformers_serve(tmp_path):
    if SERVE_MISSING:
        pytest.skip(f"transformers serve needs {SERVE_MISSING} (pip install fastapi uvicorn accelerate)")
    exe = shutil.which("transformers", path=os.path.dirname(sys.executable))
    port = _free_port()
    family = "qwen2_vl"
    _save_for_serve(family, tmp_path / "model")
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([exe, "serve", str(tmp_path / "model"), "--host", "127.0.0.1", "--port", str(port),
                             "--device", "cpu", "--dtype", "float32", "--trust-remote-code"],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a hang guard for the server's start (~10-20 s idle)
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("transformers serve did not start:\n" + (tmp_path / "serve.log").read_text()[-3000:])
                time.sleep(0.3)
        yield base + "/v1", str(tmp_path / "model"), family
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_transformers_serve_equals_sync_engine(transformers_serve):
    base_url, name, family = transformers_serve
    proc, model = processor_for(family), model_for(family)
    rows = prompt_rows(proc)
    engine = OpenAIEngine(base_url, name, processor=proc, server="transformers", max_concurrency=1)
    params = SamplingParams(max_new_tokens=8, allow_vision_tokens=True)  # the server cannot ban tokens
    got = run_sync(engine.generate(rows, params))
    want = [TransformersEngine(model, proc).generate([r], params)[0] for r in rows]
    assert all(not c.token_ids_exact and c.logprobs is None for g in got for c in g.completions)
    tok = proc.tokenizer
    for g, w in zip(got, want):  # the server sampled the same ids: its text is their decode, stripped
        a, b = g.completions[0], w.completions[0]
        assert tok.decode(a.token_ids) == tok.decode(b.token_ids).strip()
        assert a.finish_reason == b.finish_reason
    # ... but text is not ids: the server strips the reply's leading space (" la" -> "la", another
    # token) and partial UTF-8 tokens decode to U+FFFD: re-tokenized ids differ from the sampled ones (all 3 rows here)
    assert any(g.completions[0].token_ids != w.completions[0].token_ids for g, w in zip(got, want))
    # the images reach the model: the same prompts without them answer otherwise
    blind = [TransformersEngine(model, proc, see_images=False).generate([r], params)[0] for r in rows[1:]]
    assert any(g.completions[0].token_ids != b.completions[0].token_ids for g, b in zip(got[1:], blind))
    two = run_sync(engine.generate(rows[:1], SamplingParams(max_new_tokens=4, n=2, temperature=1.0, seed=0,
                                                            allow_vision_tokens=True)))
    assert two[0].n == 2
