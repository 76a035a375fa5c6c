"""The files of one run's directory, named once (the run store keeps each run's under runs/<run_id>/).

Plain names: the training loop, the run store, the status and the bundle all read them."""

import re

RECORD_FILE = "record.json"  # the finished (or failed) run record: written last
CHECKPOINT_DIR = "checkpoint"  # the compact task checkpoint (what the method trained)
STATE_FILE = "train_state.pt"  # the resumable training state, until the run finishes
ATTEMPTS_FILE = "attempts.json"  # transient failures seen so far (preemption, OOM, network)
TRACEBACK_FILE = "traceback.txt"  # the full story behind a failed run's one-line reason
EVENTS_DIR = "tensorboard"  # TensorBoard event files: the curve as it trains, the HParams session when done (train.event_log)
# A SQuAD run's {question id: answer text} of the final epoch's validation questions: the prediction
# file the official evaluate-v1.1.py reads.
PREDICTIONS_FILE = "predictions.json"
# Who trains the run now (adaptune.sweep.lease); the highest n is current. Only the names the store writes
# (lease-1.json, no leading zero): any other lease-*.json is not a lease, never waited on.
LEASE_FILE = re.compile(r"^lease-([1-9][0-9]*)\.json$")
LEASE_LIKE = re.compile(r"^lease-.*\.json$")  # the store's leases and strays like them: never copied with a run
UNREADABLE_SUFFIX = ".unreadable-"  # <file>.unreadable-<unix time>: an unreadable record set aside, never deleted


def store_owned(name: str) -> bool:
    """A file only the run store's own calls write (record, attempts, leases): never copied into a run's
    scratch directory nor uploaded back from one, so a stale copy can never overwrite the live file."""
    return name in (RECORD_FILE, ATTEMPTS_FILE) or LEASE_LIKE.match(name) is not None or UNREADABLE_SUFFIX in name
