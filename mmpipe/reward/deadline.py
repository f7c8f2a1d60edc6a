"""A deadline for one whole HTTP request.

The HTTP client's timeouts bound each socket operation: a server that sends one byte per
second never trips a 2 s read timeout and holds a request for as long as it likes. So each
request gets a timer; when it fires, the request's socket is shut down (the read in
progress returns at once and the request fails) and the caller reports a timeout.

The socket is learnt from the HTTP client's event hooks and its ``trace`` extension: when
a new connection is opened (which covers a request's whole life, headers included) and
when the response headers arrive (a reused keep-alive connection: the body). A server
that stalls the headers on a reused connection is bounded by the per-read timeout only.

`RequestDeadline.abort` is the client's ``close()``: closing a socket does not wake a thread
blocked reading it (Linux), so every socket the client opened is shut down, which ends the
requests in flight at once, on new and reused connections alike.
"""

from __future__ import annotations

import socket
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Optional


class _Guard:
    """The timer and the sockets of one request."""

    def __init__(self, seconds: float, opened: Optional["weakref.WeakSet"] = None):
        self.fired = False
        self.aborted = False  # `RequestDeadline.abort` shut the sockets down under this request
        self._opened = opened
        self._done = False
        self._lock = threading.Lock()
        self._socks: list = []
        self._timer = threading.Timer(seconds, self.fire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def watch(self, sock: Optional[socket.socket]) -> None:
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
            if self.fired or self.aborted:  # a connection opened after the deadline or the abort
                _shutdown(sock)

    def abort(self) -> None:
        """`RequestDeadline.abort` for this request: its sockets now and any it opens later."""
        with self._lock:
            self.aborted = True
            for sock in self._socks:
                _shutdown(sock)

    def fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            for sock in self._socks:
                _shutdown(sock)

    def trace(self, event: str, info: dict) -> None:
        """``trace`` request extension: the socket of a newly opened connection."""
        if event == "connection.connect_tcp.complete":
            sock = _socket_of(info.get("return_value"))
            if sock is not None and self._opened is not None:
                self._opened.add(sock)  # kept for `RequestDeadline.abort`, reused or not
            self.watch(sock)

    def finish(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


class RequestDeadline:
    """Event hooks for the HTTP client plus the current request's deadline, per thread.

    Example::

        deadline = RequestDeadline()
        http = openai.DefaultHttpxClient(event_hooks=deadline.event_hooks())
        with deadline.guard(2.0) as guard:
            ...  # the request; when it fails and guard.fired, the deadline passed
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._active: set = set()  # guards of the requests in flight, all threads
        self._opened: weakref.WeakSet = weakref.WeakSet()  # sockets of the connections opened

    def abort(self) -> None:
        """End every request in flight now: shut down each socket the client has opened
        (``guard.aborted`` turns true for the requests it cuts). For the client's
        ``close()``, before its connections are closed."""
        with self._lock:
            guards, socks = list(self._active), list(self._opened)
        for g in guards:
            g.abort()
        for sock in socks:
            _shutdown(sock)

    def event_hooks(self) -> dict:
        return {"request": [self._on_request], "response": [self._on_response]}

    @contextmanager
    def guard(self, seconds: float) -> Iterator[_Guard]:
        """Shut down this thread's request's sockets after ``seconds``; yields the guard
        (``guard.fired``: the deadline passed)."""
        g = _Guard(seconds, self._opened)
        self._local.guard = g
        with self._lock:
            self._active.add(g)
        g.start()
        try:
            yield g
        finally:
            g.finish()
            with self._lock:
                self._active.discard(g)
            self._local.guard = None

    def _on_request(self, request: Any) -> None:
        g = getattr(self._local, "guard", None)
        if g is not None:
            request.extensions["trace"] = g.trace

    def _on_response(self, response: Any) -> None:
        g = getattr(self._local, "guard", None)
        if g is not None:
            g.watch(_socket_of(response.extensions.get("network_stream")))


def _socket_of(stream: Any) -> Optional[socket.socket]:
    try:
        sock = stream.get_extra_info("socket") if stream is not None else None
    except Exception:  # a stream type without the extra info: no deadline for it
        return None
    return sock if isinstance(sock, socket.socket) else None


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass
