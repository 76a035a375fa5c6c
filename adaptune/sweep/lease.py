"""Who trains a run now: a lease that its holder keeps renewing, so one attempt at a time owns a run in the run store.

Two submissions that share runs (glue_full and paper_full), or an orchestrator's retry racing a pod
that is still alive, would otherwise train one run twice and both write its state and record.

A lease is a small file `runs/<run_id>/lease-<n>.json` ({owner, acquired_at, taken_at, expires_at}: what
the holder claims, shown to people, never trusted); the highest n is the current one. Every step that
decides ownership is one create-only write (`StoreFiles.create_exclusive`: O_EXCL on a filesystem,
`ifGenerationMatch=0` on a bucket), so of two attempts racing for lease n exactly one wins, with no lock
service:
- a run with no lease file: create lease-1;
- a run whose current lease expired (its holder died without releasing it): create lease-(n+1);
- a lease whose owner is this attempt is its own, whatever the create answered (a bucket may fail a request
  after doing it; StoreFiles.create_exclusive reads back what is there): an attempt never waits on itself;
- the holder renews its own file (a background thread, every third of the lease length) and, before
  it publishes anything, checks that its lease is still the current one (fencing): a holder that
  stalled past its expiry and was superseded publishes nothing.

Expiry is judged by what the store shows, never by a time another machine wrote: a waiting attempt
notes each lease's version (its generation on a bucket; inode, mtime and size on a filesystem; and its
content) and when, on its own monotonic clock, it first saw that version (LeaseWatch). A lease the
store shows unchanged for a full lease length has expired, whatever its `expires_at` claims. So clocks
set apart by any amount, ahead or behind, neither hang a run nor take a live one; the tolerance is in
the holder's renewals alone: it is taken over only after missing two in a row. A holder writes its lease
length into the lease; a waiter judges by the shorter of that and its own ($ADAPTUNE_LEASE_SECONDS), so
every attempt on a store should use the same one. A one-look reader (status, the fan-in) cannot
watch a lease for that long and judges by the store's own timestamp of its last write (renewed_within).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from adaptune.core import environment
from adaptune.core.files import json_text
from adaptune.core.run_files import LEASE_FILE, STATE_FILE
from adaptune.sweep.store import RUNS_DIR, RunStore
from adaptune.sweep.store_files import UnreadableFileError
from adaptune.train.record import is_stale

LEASE_SECONDS_ENV = "ADAPTUNE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = environment.DEFAULTS.lease_seconds  # 900: a stalled holder delays a run by at most this


def lease_seconds() -> float:
    return environment.settings().lease_seconds


def new_owner() -> str:
    """An attempt's name, readable in the store: host, process, and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclasses.dataclass(frozen=True)
class Holder:
    """The current lease of a run held by someone else (what a waiting attempt reports)."""

    owner: str
    expires_in: float  # at most this long on our own clock, unless the store shows a renewal meanwhile

    def describe(self) -> str:
        return f"held by {self.owner}, taken over in at most {math.ceil(max(self.expires_in, 0.0))} s unless its holder renews it"


class LeaseWatch:
    """What one attempt has seen of other attempts' leases: each lease's version and when this process first saw
    that version, on its own monotonic clock. Kept for the attempt's life, so the time it spends training
    other runs counts towards a dead holder's expiry."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[tuple[str, str, int], tuple[str, float]] = {}

    def unchanged_for(self, store: RunStore, run_id: str, number: int, version: str) -> float:
        """Seconds this lease has shown `version` to us (0 on first sight or after a change)."""
        key, now = (store.root, run_id, number), self._clock()
        seen = self._seen.get(key)
        if seen is None or seen[0] != version:
            self._seen[key] = (version, now)
            return 0.0
        return now - seen[1]


def lease_number(names: Iterable[str]) -> int | None:
    """The number of the current (highest-numbered) lease file among a run directory's file names."""
    numbers = [int(match.group(1)) for name in names if (match := LEASE_FILE.match(name))]
    return max(numbers) if numbers else None


def current_lease(store: RunStore, run_id: str) -> tuple[int, dict[str, Any] | None] | None:
    """(n, content) of the highest-numbered lease file, content None where it vanished meanwhile (released);
    a file that cannot be read gives {"unreadable": reason}, the reason naming the file and why: it expires as any
    lease does, unchanged for a lease length."""
    number = lease_number(store.files.names(RUNS_DIR, run_id))
    if number is None:
        return None
    name = f"lease-{number}.json"
    try:
        content = store.files.read_json(RUNS_DIR, run_id, name)
    except UnreadableFileError as error:
        content = {"unreadable": str(error)}
    if content is None or isinstance(content, dict):
        return number, content
    return number, {"unreadable": f"{store.files.url(RUNS_DIR, run_id, name)} is not a lease (a JSON {type(content).__name__}, not an object)"}


def renewed_within(store_written: float | None, now: float, seconds: float) -> bool:
    """For a one-look reader (status, the fan-in): whether a lease the store last wrote at `store_written` (its
    own timestamp: a bucket's server time, a filesystem's mtime) may still be renewed by a live holder. Its
    tolerance is the skew between the reader's clock and the store's; it decides only what is shown and
    what litter is removed, never who trains."""
    return store_written is not None and now - store_written < seconds


def judged_length(content: dict[str, Any], seconds: float) -> float:
    """How long a lease must show no change to have expired: our lease length, or the holder's where it promised
    to renew more often. A longer claim is not taken: it would let a dead holder keep the run as long as it says."""
    promised = content.get("lease_seconds")
    if isinstance(promised, int | float) and not isinstance(promised, bool) and 0 < promised < seconds:
        return float(promised)
    return seconds


def lease_owner(content: dict[str, Any] | None) -> str:
    """Who holds a lease, as people read it: its owner, or an unreadable lease with its file and why."""
    owner = (content or {}).get("owner")
    if isinstance(owner, str):
        return owner
    if content and "unreadable" in content:
        return f"an unreadable lease ({content['unreadable']})"
    return "(being taken)"


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
        return {"owner": self.owner, "acquired_at": self.acquired_at, "taken_at": now, "expires_at": now + self.seconds,
                "lease_seconds": self.seconds}

    def renew(self) -> None:
        if self.still_held() or self.reclaim():
            self.store.files.write_json(self.content(), RUNS_DIR, self.run_id, self.file)

    def reclaim(self) -> bool:
        """Take the run again where its lease files are gone and nobody else holds it (its folder was deleted
        while it trained): lease-1 anew, one create-only write as ever. True where the lease is ours now."""
        if current_lease(self.store, self.run_id) is not None:
            return self.still_held()
        number = self.number
        self.number = 1
        if self.store.files.create_exclusive(json_text(self.content()).encode(), RUNS_DIR, self.run_id, self.file) or self.still_held():
            return True
        self.number = number
        return False

    def still_held(self) -> bool:
        """Fencing: this lease is the current one and ours (nobody took the run over)."""
        current = current_lease(self.store, self.run_id)
        return current is not None and current[0] == self.number and (current[1] or {}).get("owner") == self.owner

    def release(self) -> None:
        """Drop our lease file and the expired ones before it, never a successor's."""
        self._stop.set()
        ours = self.still_held()
        for name in self.store.files.names(RUNS_DIR, self.run_id):
            match = LEASE_FILE.match(name)
            if match and (int(match.group(1)) < self.number or (int(match.group(1)) == self.number and ours)):
                self.store.files.remove(RUNS_DIR, self.run_id, name)

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


def try_acquire(store: RunStore, run_id: str, owner: str | None = None, seconds: float | None = None,
                watch: LeaseWatch | None = None) -> Lease | Holder:
    """Take the run's lease: a Lease, or the Holder of a lease that is not ours and that `watch` (this attempt's
    sightings; a fresh one sees every lease for the first time) has not seen unchanged for a lease length."""
    owner = owner or new_owner()
    seconds = seconds or lease_seconds()
    watch = watch or LeaseWatch()
    current = current_lease(store, run_id)
    if current is None:
        number = 1
    else:
        number, content = current
        if content is None:  # released (or replaced) between the listing and the read: look again soon
            return Holder(owner="(being released or taken)", expires_in=1.0)
        if content.get("owner") == owner:  # ours: a create whose answer was lost, a release that failed
            return Lease(store, run_id, number, owner, seconds)
        version = f"{store.files.version(RUNS_DIR, run_id, f'lease-{number}.json')}|{json_text(content)}"
        unchanged, length = watch.unchanged_for(store, run_id, number, version), judged_length(content, seconds)
        if unchanged < length:
            return Holder(owner=lease_owner(content), expires_in=length - unchanged)
        number += 1
    lease = Lease(store, run_id, number, owner, seconds)
    if store.files.create_exclusive(json_text(lease.content()).encode(), RUNS_DIR, run_id, lease.file):
        return lease
    taken = current_lease(store, run_id)
    if taken is not None and taken[0] == number and (taken[1] or {}).get("owner") == owner:
        return lease  # the create's answer was a refusal, yet the lease it left is ours
    return Holder(owner=lease_owner(taken[1]) if taken and taken[1] else "(another attempt)", expires_in=seconds)


def remove_litter(store: RunStore, files: dict[str, dict[str, str]], records: Iterable[dict[str, Any]], now: float | None = None) -> int:
    """What attempts killed between publishing a record and cleaning up leave behind: the lease files and
    resume state (up to 3x the model) of runs whose record stands (ok or degenerate, current), which no
    attempt trains again. A failed or stale run may be retrained (retry_failed, retrain_stale), so only its
    leases that the store shows unrenewed for a lease length go; its state stays for the retry to resume
    from. `files`: RunStore.run_files(). Returns how many files were removed."""
    now = time.time() if now is None else now
    doomed: list[tuple[str, ...]] = []
    retrainable: list[tuple[str, ...]] = []  # leases of failed or stale runs: judged by the store's timestamps, read at once
    for record in records:
        run_id = record["run_id"]
        names = files.get(run_id, {})
        leases = [(RUNS_DIR, run_id, name) for name in names if LEASE_FILE.match(name)]
        if record.get("status") != "failed" and not is_stale(record):
            doomed += leases + ([(RUNS_DIR, run_id, STATE_FILE)] if STATE_FILE in names else [])
        else:
            retrainable += leases
    written = store.files.modified_times(retrainable)
    doomed += [parts for parts in retrainable if not renewed_within(written.get(parts), now, lease_seconds())]
    for parts in doomed:
        store.files.remove(*parts)
    return len(doomed)
