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
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from adaptune.core import environment
from adaptune.core.files import json_text
from adaptune.core.run_files import LEASE_FILE
from adaptune.sweep.store import RUNS_DIR, RunStore, UnreadableFileError

LEASE_SECONDS_ENV = "ADAPTUNE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = environment.parse(LEASE_SECONDS_ENV, None)  # 900: a stalled holder delays a run by at most this


def lease_seconds() -> float:
    return environment.read(LEASE_SECONDS_ENV)


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
    """(n, content) of the highest-numbered lease file, content None where it vanished meanwhile (released);
    a file that cannot be read gives {"unreadable": reason} (lease_expires_at's rule then applies)."""
    number = lease_number(store.names(RUNS_DIR, run_id))
    if number is None:
        return None
    try:
        content = store.read_json(RUNS_DIR, run_id, f"lease-{number}.json")
    except UnreadableFileError as error:
        content = {"unreadable": str(error)}
    return number, content if content is None or isinstance(content, dict) else {"unreadable": f"not an object: {content!r:.80}"}


def lease_expires_at(store: RunStore, run_id: str, number: int, content: dict[str, Any]) -> float:
    """When a lease ends: its `expires_at`. The rule for a lease file that cannot be read or lacks a
    numeric `expires_at` (a torn write, a bug, a hand edit): it ended once the file is older than the
    lease length, since a live holder rewrites it every third of that (Lease.kept_alive)."""
    expires = content.get("expires_at")
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        return float(expires)
    written = store.modified_at(RUNS_DIR, run_id, f"lease-{number}.json")
    return (written or 0.0) + lease_seconds()


def lease_owner(content: dict[str, Any] | None) -> str:
    owner = (content or {}).get("owner")
    return owner if isinstance(owner, str) else ("(unreadable lease)" if content and "unreadable" in content else "(being taken)")


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
        expires_at = lease_expires_at(store, run_id, number, content)
        if expires_at > time.time():
            return Holder(owner=lease_owner(content), expires_at=expires_at)
        number += 1
    lease = Lease(store, run_id, number, owner, seconds)
    if store.create_exclusive(json_text(lease.content()).encode(), RUNS_DIR, run_id, lease.file):
        return lease
    taken = current_lease(store, run_id)
    content = (taken[1] if taken else None) or {}
    expires_at = content.get("expires_at")
    return Holder(owner=content.get("owner", "(another attempt)") if isinstance(content.get("owner"), str) else "(another attempt)",
                  expires_at=expires_at if isinstance(expires_at, int | float) else time.time() + seconds)


def remove_orphaned_leases(store: RunStore, files: dict[str, dict[str, str]], finished: Iterable[str]) -> int:
    """Drop the expired lease files of runs that have a record: what an attempt killed between publishing a
    record and releasing its lease leaves behind (harmless, as a record always wins, but litter). A live
    lease (a retry of a failed run now training) is left alone. `files`: RunStore.run_files(). Returns how many."""
    removed = 0
    now = time.time()
    for run_id in finished:
        for name in files.get(run_id, {}):
            match = LEASE_FILE.match(name)
            if not match:
                continue
            try:
                content = store.read_json(RUNS_DIR, run_id, name)
            except UnreadableFileError as error:
                content = {"unreadable": str(error)}
            if content is not None and lease_expires_at(store, run_id, int(match.group(1)), content if isinstance(content, dict) else {}) <= now:
                store.remove(RUNS_DIR, run_id, name)
                removed += 1
    return removed
