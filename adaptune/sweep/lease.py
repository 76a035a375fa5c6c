"""Who trains a run now: a lease with an expiry, so one attempt at a time owns a run in the run store.

Two submissions that share runs (glue_full and paper_full), or an orchestrator's retry racing a pod
that is still alive, would otherwise train one run twice and both write its state and record.

A lease is a small file `runs/<run_id>/lease-<n>.json` ({owner, expires_at}); the highest n is the
current one. Every step that decides ownership is one create-only write (`RunStore.create_exclusive`:
O_EXCL on a filesystem, `ifGenerationMatch=0` on a bucket), so of two attempts racing for lease n
exactly one wins, with no lock service:
- a run with no lease file: create lease-1;
- a run whose current lease expired (its holder died without releasing it): create lease-(n+1);
- the holder renews its own file (a background thread, every third of the lease time) and, before
  it publishes anything, checks that its lease is still the current one (fencing): a holder that
  stalled past its expiry and was superseded publishes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from adaptune.core.files import json_text
from adaptune.sweep.store import RUNS_DIR, RunStore

LEASE_SECONDS_ENV = "ADAPTUNE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 900.0  # a stalled holder delays a run by at most this; renewed every 5 minutes
LEASE_FILE = re.compile(r"^lease-(\d+)\.json$")


def lease_seconds() -> float:
    return float(os.environ.get(LEASE_SECONDS_ENV) or DEFAULT_LEASE_SECONDS)


def new_owner() -> str:
    """An attempt's name, readable in the store: host, process, and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclasses.dataclass(frozen=True)
class Holder:
    """The current lease of a run held by someone else (what a waiting attempt reports)."""

    owner: str
    expires_at: float

    def describe(self, now: float | None = None) -> str:
        left = self.expires_at - (now or time.time())
        return f"held by {self.owner}, expires in {left:.0f} s"


def lease_number(names: Iterable[str]) -> int | None:
    """The number of the current (highest-numbered) lease file among a run directory's file names."""
    numbers = [int(match.group(1)) for name in names if (match := LEASE_FILE.match(name))]
    return max(numbers) if numbers else None


def current_lease(store: RunStore, run_id: str) -> tuple[int, dict[str, Any] | None] | None:
    """(n, content) of the highest-numbered lease file, content None while it is being written."""
    number = lease_number(store.names(RUNS_DIR, run_id))
    if number is None:
        return None
    return number, store.read_json(RUNS_DIR, run_id, f"lease-{number}.json")


class Lease:
    """A lease this process holds on one run."""

    def __init__(self, store: RunStore, run_id: str, number: int, owner: str, seconds: float) -> None:
        self.store, self.run_id, self.number, self.owner, self.seconds = store, run_id, number, owner, seconds
        self.acquired_at = time.time()  # kept through renewals: how long this attempt has held the run (status)
        self._stop = threading.Event()

    @property
    def file(self) -> str:
        return f"lease-{self.number}.json"

    def content(self) -> dict[str, Any]:
        now = time.time()
        return {"owner": self.owner, "acquired_at": self.acquired_at, "taken_at": now, "expires_at": now + self.seconds}

    def renew(self) -> None:
        if self.still_held():
            self.store.write_json(self.content(), RUNS_DIR, self.run_id, self.file)

    def still_held(self) -> bool:
        """Fencing: this lease is the current one and ours (nobody took the run over)."""
        current = current_lease(self.store, self.run_id)
        return current is not None and current[0] == self.number and (current[1] or {}).get("owner") == self.owner

    def release(self) -> None:
        """Drop our lease file and the expired ones before it, never a successor's."""
        self._stop.set()
        ours = self.still_held()
        for name in self.store.names(RUNS_DIR, self.run_id):
            match = LEASE_FILE.match(name)
            if match and (int(match.group(1)) < self.number or (int(match.group(1)) == self.number and ours)):
                self.store.remove(RUNS_DIR, self.run_id, name)

    @contextlib.contextmanager
    def kept_alive(self) -> Iterator[Lease]:
        """Renew in the background while the body runs (a training run of hours)."""
        def renew_until_stopped() -> None:
            while not self._stop.wait(self.seconds / 3):
                with contextlib.suppress(Exception):  # a storage hiccup: the next renewal tries again
                    self.renew()

        thread = threading.Thread(target=renew_until_stopped, name=f"lease-{self.run_id}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=5)


def try_acquire(store: RunStore, run_id: str, owner: str | None = None, seconds: float | None = None) -> Lease | Holder:
    """Take the run's lease: a Lease, or the Holder of a live lease that is not ours."""
    owner = owner or new_owner()
    seconds = seconds or lease_seconds()
    current = current_lease(store, run_id)
    if current is None:
        number = 1
    else:
        number, content = current
        if content is None:  # being written right now: someone is taking it
            return Holder(owner="(being taken)", expires_at=time.time() + seconds)
        if content["expires_at"] > time.time():
            return Holder(owner=content["owner"], expires_at=content["expires_at"])
        number += 1
    lease = Lease(store, run_id, number, owner, seconds)
    if store.create_exclusive(json_text(lease.content()).encode(), RUNS_DIR, run_id, lease.file):
        return lease
    taken = current_lease(store, run_id)
    content = (taken[1] if taken else None) or {}
    return Holder(owner=content.get("owner", "(another attempt)"), expires_at=content.get("expires_at", time.time() + seconds))
