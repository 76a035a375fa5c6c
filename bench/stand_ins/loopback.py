"""A loopback server's small helpers: a free port, and a JSON POST to a TensorBoard plugin route (the HParams API
the dashboard calls), shared by bench.tensorboard_timing and the tests."""

from __future__ import annotations

import json
import socket
import urllib.request
from typing import Any

# Every session status the HParams API's ListSessionGroupsRequest can filter on: ask for all of them.
HPARAMS_STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody holds now (another process may take it before the caller binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post_json(port: int, route: str, body: dict[str, Any]) -> Any:
    """POST `body` as JSON to http://127.0.0.1:port/route and read the JSON answer; with the X-XSRF-Protected header
    TensorBoard's POST routes ask for."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)
