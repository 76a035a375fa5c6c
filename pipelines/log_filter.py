"""Keep kfp.local's output readable: drop the executor-input JSON that kfp prints for every task.

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
    sys.stdout = ExecutorInputFilter(original)  # type: ignore[assignment]
    try:
        yield
    finally:
        pending = getattr(sys.stdout._pending, "text", "")  # type: ignore[attr-defined]
        sys.stdout = original
        if pending:
            original.write(pending)
