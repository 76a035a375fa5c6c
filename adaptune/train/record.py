"""The run record: one JSON-serialisable dict per run (ARCHITECTURE.md, "The run record").

Declared once here; train.py fills it in as a run goes, and a run that raised before train.py could
write one (a data error inside a pipeline component) still gets every key.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from pathlib import Path
from typing import Any

from adaptune.core.errors import UserError
from adaptune.core.files import atomic_write
from adaptune.core.run_files import RECORD_FILE, TRACEBACK_FILE
from adaptune.data.tasks import STANDARD_SPLIT, data_scheme, get_task
from adaptune.train.config import TrainConfig, method_label
from adaptune.train.provenance import provenance

REASON_LIMIT = 500  # characters of a one-line reason


def run_record(config: TrainConfig, primary_metric: str, device: str | None = None) -> dict[str, Any]:
    """Every key of the run record, status "ok" and nothing measured yet."""
    return {
        "run_id": config.run_id,
        "experiment": config.experiment,
        "task": config.task,
        "method": dict(config.method),
        "method_label": method_label(config.method),
        "lr": config.lr,
        "epochs": config.epochs,
        "seed": config.seed,
        "backbone": config.backbone,
        "config": config.to_dict(),
        "status": "ok",
        "reason": None,
        "trained_params": None,
        "total_params": None,
        "primary_metric": primary_metric,
        "best_epoch": None,
        "val_metrics": {},
        "test_metrics": {},
        "curve": [],
        "wall_time_s": None,
        # Where the wall time went (adaptune.train.phase_times): {setup, steps, evaluation, saving} seconds; a fused
        # group's runs each record the group's, as their wall_time_s.
        "time_s": {},
        # A group trained as CUDA graphs (ADAPTUNE_COMPILE=step_graphs): {graphs, eager_steps, replayed_steps, padded_up_steps,
        # eager_and_capture_s, capture_s, warmup} of the group; None where no step graphs were asked for.
        "step_graphs": None,
        "train_examples_per_s": None,
        "device": device,
        "checkpoint_dir": None,
        "group_size": 1,  # runs that shared its forward passes (adaptune.train.group_loop); its result is the same
        # The split scheme the run's data follows (adaptune.data.splits.TaskData): "standard" (the task's own
        # splits) or a named stand-in such as "squad_dev_standin"; split_note says what a stand-in is
        # and that it is not the paper's split (None for "standard").
        "data_split": STANDARD_SPLIT,
        "split_note": None,
        # How the task's splits are cut (tasks.DATA_SCHEMES): a record from another scheme is stale.
        "data_scheme": data_scheme(config.task),
        # What made this result (adaptune.train.provenance): code, packages, device, data files. Filled in
        # by with_provenance, wherever the run trains (train --out, the shard runner).
        "provenance": {},
        # Rows each split was used with, after subsampling: {"train": n, "validation": n, "test": n}.
        "split_sizes": {},
        # Tasks scored by this run on their own test split (tasks.scored_companions), beside this run's
        # validation scores: {"mnli_mm": {"val_metrics": {...}, "test_metrics": {...}, "split_sizes": {...}}}.
        "companions": {},
        # Distinct classes the final model predicted per split, {"validation": n, "test": n} (classification only):
        # what degenerate_reason reads.
        "predicted_classes": {},
    }


# The degenerate rule, stated once: the run book applies it as a run finishes, results.run_row when records are read.
DEGENERATE_RULE = "predicts one class on validation or on its reported split (test), whichever split shows it"


def degenerate_reason(record: dict[str, Any]) -> str | None:
    """Why a finished classification run is degenerate (DEGENERATE_RULE), from its `predicted_classes`; None if it is not
    (or the record does not say: a span or regression task, or a record written before the counts were kept)."""
    try:
        task = get_task(str(record.get("task")))
    except UserError:
        return None
    counts = record.get("predicted_classes") or {}
    splits = [split for split in ("validation", "test") if counts.get(split) == 1]
    if task.kind != "classification" or not splits:
        return None
    metric = record.get("primary_metric") or task.primary_metric
    scores = ", ".join(f"{metric} {value:g} on {split}" for split in splits
                       if (value := (record.get("val_metrics" if split == "validation" else "test_metrics") or {}).get(metric)) is not None)
    return (f"predictions at the final epoch ({record.get('epochs')}) are all one class on {' and '.join(splits)}"
            + (f" ({scores})" if scores else "") + f": degenerate, as a run that {DEGENERATE_RULE}; compare other seeds and learning rates")


def group_size(record: dict[str, Any]) -> int:
    """How many runs trained in the record's fused group (1: alone): the runs its wall time and time_s are shared by."""
    return max(int(record.get("group_size") or 1), 1)


def with_provenance(record: dict[str, Any], data_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The record with what made it filled in (provenance.provenance), where no one has yet: every record
    the loop writes and the store publishes passes here."""
    if not record.get("provenance"):
        record["provenance"] = provenance(record["task"], data_dir)
    return record


def failed_run_record(config: TrainConfig, reason: str, data_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The record of a run that raised before the training loop could write one (every key, its provenance)."""
    record = with_provenance(run_record(config, get_task(config.task).primary_metric), data_dir)
    record.update(status="failed", reason=reason[-2000:])
    return record


def is_stale(record: dict[str, Any]) -> bool:
    """A record made under another data scheme than its task's now (tasks.DATA_SCHEMES), or under none."""
    return record.get("data_scheme") != data_scheme(record["task"])


def with_companions(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record, then one row-shaped record per companion task (run id "<run_id>@<task>"), so an
    MNLI run fills both the MNLI-m and the MNLI-mm columns, trained once."""
    rows = [record]
    for task, scores in (record.get("companions") or {}).items():
        rows.append({**record, "run_id": f"{record['run_id']}@{task}", "task": task, "curve": [], "companions": {},
                     "val_metrics": scores.get("val_metrics") or {}, "test_metrics": scores.get("test_metrics") or {},
                     "split_sizes": scores.get("split_sizes") or {}})
    return rows


def one_line_reason(error: BaseException | str, limit: int = REASON_LIMIT) -> str:
    """"ExceptionType: message" on one line, for a failed run's `reason` and for command-line errors.

    `error` is an exception, or the text of a formatted traceback (traceback.format_exc(), possibly
    cut at its start): then the last exception in it is used, its module path dropped. Newlines and
    runs of spaces become one space, Python's ^^^^/~~~~ markers are dropped, and the result is cut
    to `limit` characters (ending in "…"). Keep the full traceback with `save_traceback`.
    """
    if isinstance(error, BaseException):
        message = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str) else str(error)
        text = f"{type(error).__name__}: {message}" if message.strip() else type(error).__name__
    else:
        text = _last_exception(str(error))
    text = re.sub(r"\s+", " ", re.sub(r"[\^~]{3,}", " ", text)).strip() or "(no reason given)"
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


_FRAME = re.compile(r"^\s+File \"")
_MARKERS = re.compile(r"^[\s\^~]*$")
_EXCEPTION_HEADER = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Failed|Exit|Interrupt|Warning|Iteration)\w*(?::|$)")
_QUALIFIED_TYPE = re.compile(r"^(?:[A-Za-z_][\w]*\.)+([A-Za-z_]\w*)(?=:|$)")


def _last_exception(text: str) -> str:
    """The final exception line(s) of a traceback's text: what follows its last stack frame."""
    lines = text.splitlines()
    frames = [index for index, line in enumerate(lines) if _FRAME.match(line)]
    if frames:
        rest = lines[frames[-1] + 1 :]
        start = 0
        while start < len(rest) and (rest[start][:1] in (" ", "\t") or not rest[start].strip()):
            start += 1  # the frame's source line and its ^^^^ markers
        lines = rest[start:]
    else:  # cut before its last frame: start at the last line that reads like "SomeError: ..."
        headers = [index for index, line in enumerate(lines) if _EXCEPTION_HEADER.match(line)]
        lines = lines[headers[-1] :] if headers else lines
    kept = [line.strip() for line in lines if not _MARKERS.match(line) and not line.startswith("Traceback (most recent call last)")]
    if kept:
        kept[0] = _QUALIFIED_TYPE.sub(r"\1", kept[0])  # adaptune.data.sources.DataError: ... -> DataError: ...
    return " ".join(kept)


def save_traceback(run_dir: str | os.PathLike[str], error: BaseException | str | None = None) -> Path:
    """Write the full traceback into run_dir/traceback.txt (atomically) and return its path.

    `error`: an exception (its traceback, chained ones included), a traceback's text, or None for the
    exception being handled now. The one-line `reason` of a record points here for the details.
    """
    if error is None:
        text = traceback.format_exc()
    elif isinstance(error, BaseException):
        text = "".join(traceback.format_exception(error))
    else:
        text = str(error)
    path = Path(run_dir) / TRACEBACK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda temporary: temporary.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8"))
    return path


class RunDirError(UserError, ValueError):
    """A run directory that holds an unreadable record or another run's; the message names the file."""


def record_in_run_dir(run_dir: str | os.PathLike[str], run_id: str) -> dict[str, Any] | None:
    """The record already written in a run's own directory (`train --out DIR`, runs/<run_id>/), or None.
    Refuses an unreadable file and another run's record: each run needs its own directory."""
    path = Path(run_dir) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RunDirError(f"{path} is not a readable run record ({error}); delete it or choose another --out") from None
    if not isinstance(record, dict) or record.get("run_id") != run_id:
        other = record.get("run_id") if isinstance(record, dict) else None
        raise RunDirError(f"{run_dir} holds the record of run {other!r}, not {run_id!r}: give each run its own --out")
    return record
