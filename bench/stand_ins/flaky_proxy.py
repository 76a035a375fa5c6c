"""A flaky bucket: a loopback HTTP proxy in front of the GCS emulator that answers some requests 503 or 429,
either instead of forwarding them ("before") or after the emulator has done them ("after").

Real Cloud Storage does both: a request may fail before it reaches the bucket or after the bucket made the
change, and the client cannot tell which ("an operation may have succeeded even though the client
received an error": https://cloud.google.com/storage/docs/retry-strategy). gcsfs retries 429 and 5xx
(gcsfs/retry.py, `is_retriable`), so a create-only upload (ifGenerationMatch=0) failed after its write is
retried and then refused 412: the object its first try wrote is there.

Which requests fail is a `rule(request) -> Fault | None`: `RandomFaults` fails a share of them, bounded in
count and time (the soak); a test passes its own, to fail exactly the request it aims at. Hand-written on
http.server because the fault must come after the upstream answered, which general proxies (toxiproxy,
mitmproxy) do not do without a plugin and a binary of their own.

Usage:
    with gcs_emulator() as emulator, FlakyProxy(emulator.endpoint, RandomFaults(0.05)) as proxy:
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import random
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.stand_ins.loopback import free_port

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str  # with its query
    body: bytes

    @property
    def query(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)

    @property
    def is_create_only(self) -> bool:
        """An upload with the precondition ifGenerationMatch=0 (StoreFiles.create_exclusive on a bucket)."""
        return self.method == "POST" and self.query.get("ifGenerationMatch") == ["0"]

    def names(self, name: str) -> bool:
        """Whether the request is about an object whose name ends with `name` (in its URL, or an upload's metadata)."""
        return name in urllib.parse.unquote(self.path) or f'{name}"'.encode() in self.body


@dataclasses.dataclass(frozen=True)
class Fault:
    when: str  # "before": not forwarded; "after": forwarded, the emulator's answer replaced
    status: int = 503


Rule = Callable[[Request], "Fault | None"]


class RandomFaults:
    """Fails `share` of the requests, half before forwarding and half after, 503 and 429 in turn; at most
    `max_faults` in all, and none once `stop()` is called or `for_s` seconds have passed since the first request."""

    def __init__(self, share: float, max_faults: int = 10_000, for_s: float = 3600.0, seed: int = 0) -> None:
        self.share, self.max_faults, self.for_s = share, max_faults, for_s
        self._random, self._lock, self._started, self._stopped, self.made = random.Random(seed), threading.Lock(), None, False, 0

    def stop(self) -> None:
        self._stopped = True

    def __call__(self, request: Request) -> Fault | None:
        with self._lock:
            now = time.monotonic()
            self._started = self._started or now
            if self._stopped or self.made >= self.max_faults or now - self._started > self.for_s:
                return None
            if self._random.random() >= self.share:
                return None
            self.made += 1
            return Fault(when="before" if self.made % 2 else "after", status=503 if self.made % 4 in (1, 2) else 429)


class FlakyProxy:
    """The proxy, on a free loopback port, in a thread; `counts` says what it did (forwarded, before, after)."""

    def __init__(self, upstream: str, rule: Rule) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.rule, self.counts, self._lock = rule, Counter[str](), threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="flaky-proxy", daemon=True)

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1


def _handler(proxy: FlakyProxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as gcsfs's aiohttp session expects

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base class's name
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _fail(self, fault: Fault) -> None:
            proxy.count(fault.when)
            body = json.dumps({"error": {"code": fault.status, "message": f"injected by the flaky proxy ({fault.when} the request)"}})
            self._answer(fault.status, [("Content-Type", "application/json")], body.encode())

        def _forward(self) -> None:
            request = Request(self.command, self.path, self._body())
            fault = proxy.rule(request)
            if fault is not None and fault.when == "before":
                self._fail(fault)
                return
            connection = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
            try:
                headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_BY_HOP}
                connection.request(self.command, self.path, body=request.body or None, headers=headers)
                response = connection.getresponse()
                body = response.read()
            finally:
                connection.close()
            if fault is not None:  # the emulator did it; the client hears an error
                self._fail(fault)
                return
            proxy.count("forwarded")
            self._answer(response.status, response.getheaders(), body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

    return Handler
