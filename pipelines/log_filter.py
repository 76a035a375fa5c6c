"""Keep kfp.local's output readable: drop the executor-input JSON that kfp prints for every task, and the
warnings kfp.local gives about what a local run does not use (the image named for the cloud, CPU and memory
limits).

kfp's executor logs its whole input at INFO level (`Got executor_input:` then the indented JSON) and
has no switch for it; kfp.local echoes it for every component. Hand-written because no library
filters it. The filter is self-ending: it drops only lines that look like JSON right after that
header, so an error or any other line always gets through.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import TextIO

HEADER = "Got executor_input:"
JSON_STARTS = ("{", "}", '"', "]")


class ExecutorInputFilter(io.TextIOBase):
    """A text stream that forwards to `target` all but the executor-input dumps (state per thread:
    kfp.local runs tasks in a thread pool)."""

    def __init__(self, target: TextIO) -> None:
        self.target = target
        self._state = threading.local()
        self._pending = threading.local()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        buffered = getattr(self._pending, "text", "") + text
        *lines, rest = buffered.split("\n")
        self._pending.text = rest
        kept = [line + "\n" for line in lines if self._keep(line)]
        if kept:
            self.target.write("".join(kept))
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def _keep(self, line: str) -> bool:
        stripped = line.strip()
        if getattr(self._state, "in_dump", False):
            if stripped.startswith(JSON_STARTS) or stripped in ("[", "[],"):
                return False
            self._state.in_dump = False
        if stripped.endswith(HEADER):
            self._state.in_dump = True
            return False
        return True


@contextlib.contextmanager
def without_executor_inputs() -> Iterator[None]:
    """Filter sys.stdout for the duration (kfp.local's streamed task logs go there)."""
    original = sys.stdout
    sys.stdout = ExecutorInputFilter(original)
    try:
        yield
    finally:
        pending = getattr(sys.stdout._pending, "text", "")
        sys.stdout = original
        if pending:
            original.write(pending)


# kfp.local's warnings that say only that a local run ignores what the cloud uses: the task's image (the
# subprocess runner runs this environment by design; the image is named for provenance) and its resource limits.
LOCAL_RUNNER_NOISE = (
    (RuntimeWarning, r"You may be attemping to run a task that uses custom or non-Python base image"),
    (UserWarning, r"Task '.*': settings \[.*\] have no effect in the current local runner"),
)


@contextlib.contextmanager
def without_local_runner_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        for category, message in LOCAL_RUNNER_NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
