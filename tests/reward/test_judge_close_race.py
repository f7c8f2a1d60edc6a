"""`VLMJudge.close` while a question is between the judge's stop check and its socket (load hunt).

The vLLM judge test closes the judge as soon as its request counter reaches 2, i.e. while the
second request is being sent: the counter is bumped before the request's deadline guard is
registered and before its connection is opened. A close() landing there was missed: the
request was not in the set `RequestDeadline.abort` shut down (not registered yet, or registered
but its new connection opened after the abort), so it was sent after close() returned and ran
to its answer (up to max_tokens; on a loaded CPU vLLM past the test's 120 s join). Here the
request thread is paused at each point by an event (no timing), the judge closed, then resumed:
nothing may reach the server, and the question comes back cancelled. The server holds any
answer that does get through (the gate), so the old code's escaped request is seen, then let go.
"""

from __future__ import annotations

import threading

import pytest

from mmpipe.reward import JudgeClient, VLMJudge
from mmpipe.testing import tiny_image

from helpers import HANG_S, bounded
from judge_server import ACTION_OK, PROGRESS_OK, JudgeServer, ok

FRAME = tiny_image(12, 16, seed=4)


def _pause(client: JudgeClient, name: str, reached: threading.Event, go: threading.Event) -> None:
    """Wrap ``client.name`` so that its first call inside a request (``_openai`` also builds the
    client in `connect`) sets ``reached`` and waits for ``go`` (bounded)."""
    real = getattr(client, name)

    def paused(*args, **kwargs):
        in_request = name == "_send" or getattr(client._deadline._local, "guard", None) is not None
        if in_request and not reached.is_set():
            reached.set()
            assert go.wait(HANG_S), "the test never resumed the request"
        return real(*args, **kwargs)

    setattr(client, name, paused)


@pytest.mark.parametrize("where", ["_send", "_openai"], ids=["before the guard", "guard registered, no socket yet"])
def test_close_in_the_send_window_sends_nothing(where):
    gate = threading.Event()

    def held(request, index):
        gate.wait(HANG_S)
        return ok(ACTION_OK if request.kind == "action" else PROGRESS_OK)

    with JudgeServer(held, lifetime_s=3 * HANG_S) as server:
        client = JudgeClient(server.base_url, "judge-model", timeout_s=2 * HANG_S, max_retries=0)
        judge = VLMJudge(client, primitives=["reach"])
        client.connect()  # the HTTP client exists before close(): close() must not leave a way round it
        reached, go = threading.Event(), threading.Event()
        _pause(client, where, reached, go)
        out: list = []
        worker = threading.Thread(target=lambda: out.append(judge.ask(FRAME, "reach")), daemon=True)
        worker.start()
        assert reached.wait(HANG_S), "the question never reached the send"
        bounded(judge.close, timeout=HANG_S)
        go.set()
        # the request either ends without reaching the server (fixed) or reaches it and is held
        # by the gate (before: it was sent after close() returned); either way this ends
        ended = threading.Event()
        threading.Thread(target=lambda: (worker.join(2 * HANG_S), ended.set()), daemon=True).start()
        while not ended.is_set() and not server.requests:
            ended.wait(0.01)
        sent_after_close = len(server.requests)
        gate.set()  # let an escaped request finish so that the worker ends
        worker.join(HANG_S)
        assert not worker.is_alive(), "hang: the question never came back"
    assert sent_after_close == 0, "a request was sent after close() returned"
    action = out[0].action
    assert action.error.startswith("cancelled"), action
    assert out[0].progress.error.startswith("cancelled"), out[0].progress
    assert judge.stats.snapshot()["cancelled"] == 2
