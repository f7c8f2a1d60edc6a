"""An S3-compatible server on loopback for the object-store tests: moto in server mode, plus a
small proxy in front of it that fails chosen GETs (a 503, or a body cut off half-way) and counts
every GET, to show s3fs retrying. Needs ``pip install "moto[server]" s3fs``."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections import Counter, defaultdict

KEY = SECRET = "testing"  # moto accepts any credentials
REGION = "us-east-1"


class S3Server:
    """``with S3Server() as s3``: moto on ``s3.endpoint``, the fault proxy on ``s3.proxy``;
    ``s3.storage_options(proxy=False)`` for s3fs / ``datasets``; ``s3.env()`` the same as
    environment variables (what a real deployment sets)."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.gets: Counter = Counter()          # path -> GETs the proxy saw
        self.faults: dict = defaultdict(list)   # path -> faults for its next GETs ("503", "cut")
        self._lock = threading.Lock()

    def __enter__(self) -> "S3Server":
        self.moto.start()
        host, port = self.moto.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self._proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _proxy_handler(self, host, port))
        self._proxy.daemon_threads = True
        threading.Thread(target=self._proxy.serve_forever, daemon=True).start()
        self.proxy = f"http://127.0.0.1:{self._proxy.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self._proxy.shutdown()
        self._proxy.server_close()
        self.moto.stop()

    def storage_options(self, proxy: bool = False) -> dict:
        return {"key": KEY, "secret": SECRET, "skip_instance_cache": True,
                "client_kwargs": {"endpoint_url": self.proxy if proxy else self.endpoint, "region_name": REGION}}

    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_DEFAULT_REGION": REGION}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                     region_name=REGION).create_bucket(Bucket=name)

    def take_fault(self, path: str):
        with self._lock:
            self.gets[path] += 1
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None


def _proxy_handler(server: S3Server, host: str, port: int):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _forward(self, method: str):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else None
            fault = server.take_fault(self.path.split("?")[0]) if method == "GET" else None
            if fault == "503":
                msg = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            conn = http.client.HTTPConnection(host, port, timeout=30)
            conn.request(method, self.path, body=body, headers={k: v for k, v in self.headers.items()})
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            self.send_response(resp.status)
            length = resp.getheader("Content-Length") if method == "HEAD" else str(len(data))
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                    self.send_header(k, v)
            self.send_header("Content-Length", length or "0")
            if fault == "cut":  # announce the whole body, send half, drop the connection
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data)

        def do_GET(self):
            self._forward("GET")

        def do_HEAD(self):
            self._forward("HEAD")

    return Handler
