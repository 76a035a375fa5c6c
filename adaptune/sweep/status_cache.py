"""What a status needs of each run record, cached on this machine by the record's version in the store.

A record is written once (create-only) and replaced only by being removed and written again, which
gives it a new version (GCS generation, or mtime and size), so a summary cached under a version
stays true. A status of a long sweep then reads only the records that appeared since the last one:
seconds at paper_full size, where reading all 8,556 records again costs a minute on a slow store.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from adaptune.core import environment
from adaptune.core.files import write_json
from adaptune.sweep.store import RECORD_FILE, RunStore

# The record keys a status and the throughput calibration read (adaptune.sweep.status, adaptune.sweep.throughput).
SUMMARY_KEYS = ("run_id", "task", "status", "reason", "data_scheme", "wall_time_s", "backbone", "method", "device", "epochs",
                "group_size", "time_s")


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """The record's keys a status reads, record-shaped (records.is_stale and throughput.record_rate take it)."""
    summary = {key: record.get(key) for key in SUMMARY_KEYS}
    summary["split_sizes"] = {"train": (record.get("split_sizes") or {}).get("train")}
    summary["config"] = {"max_length": (record.get("config") or {}).get("max_length")}
    return summary


def cache_path(store: RunStore) -> Path:
    return environment.cache_dir() / "record-summaries" / f"{hashlib.sha256(store.root.encode()).hexdigest()[:16]}.json"


def record_summaries(store: RunStore, versions: dict[str, str], unreadable: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """{run_id: summary} of the records whose current version `versions` gives ({run_id: version}, from
    RunStore.run_files); only those not cached at that version are read (concurrently). Records that
    cannot be read go into `unreadable` ({run_id: reason}) where given."""
    path = cache_path(store)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: read everything once more
        cached = {}
    # A summary cached before a key was added to SUMMARY_KEYS is read again.
    known = {run_id: entry["summary"] for run_id, entry in cached.items()
             if entry.get("version") == versions.get(run_id) and set(SUMMARY_KEYS) <= set(entry.get("summary") or {})}
    missing = [run_id for run_id in versions if run_id not in known]
    read = store.records(missing, files={run_id: {RECORD_FILE: versions[run_id]} for run_id in missing}, unreadable=unreadable)
    known.update({run_id: summarize(record) for run_id, record in read.items()})
    if read:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {run_id: {"version": versions[run_id], "summary": summary} for run_id, summary in known.items()
                          if run_id in versions})
    return known


def store_summaries(store: RunStore) -> dict[str, dict[str, Any]]:
    """The summary of every record in the store (of any experiment): what calibrates a plan's estimate."""
    files = store.run_files()
    return record_summaries(store, {run_id: names[RECORD_FILE] for run_id, names in files.items() if RECORD_FILE in names})
