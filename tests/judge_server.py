"""A real OpenAI-compatible chat-completions server on 127.0.0.1 whose answers a test scripts.

    with JudgeServer(script) as server:          # port chosen by the OS
        client = JudgeClient(server.base_url, "judge-model", ...)
        ...
        server.requests, server.max_in_flight     # what it saw

``script(request, index) -> Reply`` decides each answer (``index``: 0-based count of
chat requests so far). Replies: `ok` (a chat completion, optionally after a delay, with
optional logprobs), `status` (an HTTP error with a JSON body and headers), `drop` (close
the connection without answering), `raw_body` (any bytes as the body), `drip` (a valid
answer sent one byte per ``interval``, from the status line or from the body). Bounded: sleeps wake on `stop`, delays are capped at
``max_delay_s``, idle keep-alive connections close after 5 s, and the server stops itself
after ``lifetime_s``.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

import pytest


@dataclass
class Reply:
    kind: str = "ok"                   # "ok" | "status" | "drop" | "raw"
    content: str = ""
    delay: float = 0.0
    code: int = 200
    body: Any = None
    headers: dict = field(default_factory=dict)
    logprobs: Optional[list] = None
    finish_reason: str = "stop"
    interval: float = 0.0              # drip: seconds between bytes
    drip_headers: bool = True          # drip: from the status line (else headers at once, body dripped)


def ok(content: Any, *, delay: float = 0.0, logprobs: Optional[list] = None, finish_reason: str = "stop") -> Reply:
    """A 200 chat completion whose message is ``content`` (a dict is sent as its JSON)."""
    text = content if isinstance(content, str) else json.dumps(content)
    return Reply("ok", text, delay, logprobs=logprobs, finish_reason=finish_reason)


def status(code: int, message: str = "scripted error", *, headers: Optional[dict] = None, delay: float = 0.0) -> Reply:
    body = {"error": {"message": message, "type": "scripted", "code": code}}
    return Reply("status", delay=delay, code=code, body=body, headers=dict(headers or {}))


def drop(delay: float = 0.0) -> Reply:
    return Reply("drop", delay=delay)


def raw_body(text: str, *, code: int = 200, delay: float = 0.0) -> Reply:
    """An HTTP response whose body is ``text`` as is (e.g. not JSON at all)."""
    return Reply("raw", content=text, delay=delay, code=code)


def drip(content: Any, *, interval: float = 0.05, headers: bool = True) -> Reply:
    """A 200 chat completion sent one byte per ``interval`` seconds (each read gets a byte, so
    no per-read timeout ever fires); ``headers=False``: headers at once, then the body dripped."""
    text = content if isinstance(content, str) else json.dumps(content)
    return Reply("drip", text, interval=interval, drip_headers=headers)


@dataclass
class Request:
    """One chat request as the server saw it."""

    index: int
    body: dict
    headers: dict
    started: float
    ended: float = 0.0

    @property
    def messages(self) -> list:
        return self.body.get("messages", [])

    @property
    def user_content(self) -> list:
        content = self.messages[-1].get("content", [])
        return content if isinstance(content, list) else [{"type": "text", "text": content}]

    @property
    def prompt(self) -> str:
        texts = [p["text"] for p in self.user_content if p.get("type") == "text"]
        return texts[-1] if texts else ""

    @property
    def image_url(self) -> Optional[str]:
        urls = [p["image_url"]["url"] for p in self.user_content if p.get("type") == "image_url"]
        return urls[0] if urls else None

    @property
    def kind(self) -> str:
        """ "action" or "progress": from the response_format schema name, else the prompt."""
        name = ((self.body.get("response_format") or {}).get("json_schema") or {}).get("name", "")
        if name:
            return "action" if "action" in name else "progress"
        return "action" if "reasonable" in self.prompt else "progress"

    def field(self, label: str) -> Optional[str]:
        """The rest of the prompt line ``"<label>: ..."`` (e.g. ``field("Task")``)."""
        m = re.search(rf"^{re.escape(label)}:\s*(.*)$", self.prompt, re.MULTILINE)
        return m.group(1).strip().strip('"') if m else None


ACTION_OK = {"reasonable": True, "confidence": 0.9, "reason": "the gripper is near the cube"}
PROGRESS_OK = {"progress": 0.5, "stage": "approaching", "next_step": "grasp the cube"}


def valid_answers(request: Request, index: int) -> Reply:
    """The default script: a valid JSON answer to whichever question was asked."""
    return ok(ACTION_OK if request.kind == "action" else PROGRESS_OK)


def sequence(*replies: Reply, then: Callable[[Request, int], Reply] = valid_answers) -> Callable:
    """Script: the n-th request gets ``replies[n]``; later ones get ``then``."""
    def script(request: Request, index: int) -> Reply:
        return replies[index] if index < len(replies) else then(request, index)
    return script


def overlapping(server: "JudgeServer", k: int, then: Callable[[Request, int], Reply] = valid_answers,
                hang_s: float = 60.0) -> Callable:
    """Script: every answer waits until ``k`` requests have been in flight at once (a rendezvous,
    once; later answers go at once), then ``then`` answers. Overlap is then a fact, not a race
    against a delay: ``server.max_in_flight`` reaches ``k`` on a loaded machine too. A client that
    never has ``k`` in flight is answered after ``hang_s`` (a hang guard) and its test fails on
    ``max_in_flight``."""
    met = threading.Event()

    def script(request: Request, index: int) -> Reply:
        if server.max_in_flight >= k:  # this request is counted (in flight) before the script runs
            met.set()
        met.wait(hang_s)
        return then(request, index)
    return script


def by_kind(action: Callable, progress: Callable) -> Callable:
    """Script: route action and progress questions to different scripts."""
    return lambda request, index: (action if request.kind == "action" else progress)(request, index)


def verdict_logprobs(text: str, p_true: float) -> list:
    """``logprobs.content`` for ``text`` whose verdict token has P(true) = ``p_true``."""
    pieces = re.findall(r"true|false|\s+|[A-Za-z_]+|\d+(?:\.\d+)?|.", text)
    out = []
    for piece in pieces:
        item = {"token": piece, "logprob": -0.01, "bytes": list(piece.encode()), "top_logprobs": []}
        if piece in ("true", "false"):
            p = p_true if piece == "true" else 1.0 - p_true
            item["logprob"] = math.log(max(p, 1e-12))
            item["top_logprobs"] = [
                {"token": "true", "logprob": math.log(max(p_true, 1e-12)), "bytes": None},
                {"token": "false", "logprob": math.log(max(1.0 - p_true, 1e-12)), "bytes": None},
            ]
        out.append(item)
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5.0  # an idle keep-alive connection is closed after this many seconds
    # One write per response and no Nagle delay: otherwise headers and body go out in two
    # segments and the client's delayed ACK adds ~40 ms to every answer.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    def _send(self, code: int, payload: Any, headers: Optional[dict] = None) -> None:
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _drip(self, owner: "JudgeServer", data: bytes, reply: Reply) -> None:
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                ).encode()
        self.close_connection = True
        if not reply.drip_headers:
            self.wfile.write(head)
            self.wfile.flush()
            head = b""
        whole = head + data
        for i in range(len(whole)):
            self.wfile.write(whole[i:i + 1])
            self.wfile.flush()
            owner.dripped += 1
            if owner._stop.wait(reply.interval):
                return

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "judge-model", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        owner: JudgeServer = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON"}})
            return
        request = owner._begin(body, dict(self.headers))
        try:
            reply = owner.script(request, request.index)
            owner._sleep(reply.delay)
            # Done before the first byte goes out: the client may send its next request as soon
            # as it has this answer, and that one must not be counted together with this one.
            owner._end(request)
            if reply.kind == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif reply.kind == "status":
                self._send(reply.code, reply.body, reply.headers)
            elif reply.kind == "raw":
                self._send(reply.code, reply.content)
            elif reply.kind == "drip":
                self._drip(owner, json.dumps(owner._completion(request, reply)).encode(), reply)
            else:
                self._send(200, owner._completion(request, reply))
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True  # the client gave up (timeout): nothing to answer
        finally:
            owner._end(request)  # no-op when already ended


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # listen() backlog, read in __init__: the default 5 overflows when 16 clients connect at
    # once, and an overflowing loopback connection can be reset.
    request_queue_size = 256


class JudgeServer:
    """The loopback server (see the module doc)."""

    def __init__(self, script: Optional[Callable[[Request, int], Reply]] = None, *, lifetime_s: float = 120.0,
                 max_delay_s: float = 5.0):
        self.script = script or valid_answers
        self.lifetime_s, self.max_delay_s = lifetime_s, max_delay_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.dripped = 0  # bytes sent by `drip` replies
        self._httpd: Optional[ThreadingHTTPServer] = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "JudgeServer":
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.owner = self  # type: ignore[attr-defined]
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name="judge-server").start()
        timer = threading.Timer(self.lifetime_s, self.stop)
        timer.daemon = True
        timer.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def __enter__(self) -> "JudgeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset(self, script: Optional[Callable[[Request, int], Reply]] = None) -> None:
        """Forget what was seen (and optionally change the script) between test phases."""
        with self._lock:
            self.requests.clear()
            self.max_in_flight = self.in_flight
            if script is not None:
                self.script = script

    # -- used by the handler ---------------------------------------------------------------
    def _begin(self, body: dict, headers: dict) -> Request:
        with self._lock:
            request = Request(len(self.requests), body, headers, time.monotonic())
            self.requests.append(request)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return request

    def _end(self, request: Request) -> None:
        with self._lock:
            if not request.ended:
                request.ended = time.monotonic()
                self.in_flight -= 1

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stop.wait(min(seconds, self.max_delay_s))

    def _completion(self, request: Request, reply: Reply) -> dict:
        return {
            "id": f"chatcmpl-{request.index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.body.get("model", "judge-model"),
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "finish_reason": reply.finish_reason,
                "logprobs": {"content": reply.logprobs} if reply.logprobs is not None else None,
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }


@pytest.fixture
def server():
    """A fresh `JudgeServer` (valid answers until a test scripts otherwise), stopped after the test."""
    with JudgeServer() as s:
        yield s
