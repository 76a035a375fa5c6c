"""A run's TensorBoard event files, in its own directory (run_files.EVENTS_DIR), published with the run.

Two files with fixed names, so a run store that copies files up by name (a bucket) replaces them
rather than piling up one file per attempt:
- CURVE_FILE, appended while the run trains (`CurveLog`): the training loss and learning rate at every
  logging step (each time the loop reads its losses back: every step on the CPU, every
  SYNC_EVERY_STEPS on a GPU) and each epoch's validation metrics. A resumed run first rewrites the
  file without what the killed attempt logged after the state it resumes from, so no step is ever
  there twice, whichever loader reads it (TensorBoard's purge_step would rely on the Python loader).
- SUMMARY_FILE, written once the record is final (`write_run_summary`): the run's HParams session (its
  hyperparameters and status) and its final scores under SCORE_TAGS. Made from the record alone, so
  a run that failed before training (a data error) is a session too.

Written with TensorBoard's own record writer and protos (tensorboard.summary.writer), the format its
loaders read. The HParams dashboard takes a session's metric as the last value of a scalar tag in the
session's directory (tensorboard/plugins/hparams/backend_context.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from adaptune.core.run_files import EVENTS_DIR

# "tfevents" in the name is how TensorBoard recognises an event file; sorted, the curve comes first.
CURVE_FILE = "events.out.tfevents.curve"
SUMMARY_FILE = "events.out.tfevents.summary"
VALIDATION_SCORE_TAG = "score/validation"  # the task's primary metric at the final epoch: the run's result
TEST_SCORE_TAG = "score/test"
SCORE_TAGS = (VALIDATION_SCORE_TAG, TEST_SCORE_TAG)
TRAINED_PARAMS_TAG = "score/trained_params"
# Time Series shows its tag groups (the part before the first "/") in name order: the curves' groups (loss, lr)
# sort before the single-point score cards (score), so a run's loss is what a user sees first.
LOSS_TAG = "loss/train"  # at every logging step
EPOCH_LOSS_TAG = "loss/train_epoch_mean"
LR_TAG = "lr/train"
# A degenerate run finished but predicts one class (its status hparam says so); a failed one has no scores.
SESSION_STATUS = {"ok": "STATUS_SUCCESS", "degenerate": "STATUS_SUCCESS", "failed": "STATUS_FAILURE"}


def run_hparams(record: dict[str, Any]) -> dict[str, Any]:
    """What the HParams table shows of a run: strings and numbers (TensorBoard's value types)."""
    method = record.get("method") or {}
    return {
        "task": record["task"],
        "method": record.get("method_label") or str(method.get("name")),
        "size_or_rank": float(method.get("size", method.get("r", method.get("k", 0)))),
        "lr": float(record["lr"]),
        "epochs": float(record["epochs"]),
        "seed": float(record["seed"]),
        "backbone": record["backbone"],
        "status": record.get("status") or "ok",
    }


class CurveLog:
    """The learning curve as the run trains, appended to out/EVENTS_DIR/CURVE_FILE."""

    def __init__(self, out: Path) -> None:
        self.path = out / EVENTS_DIR / CURVE_FILE
        self._writer: Any = None

    def start(self, from_step: int) -> None:
        """The run starts at `from_step` (0, or the saved state it resumes): anything logged after it is dropped."""
        from tensorboard.summary.writer.record_writer import RecordWriter

        kept = [event for event in read_events(self.path) if event.step <= from_step and not event.HasField("file_version")]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_events(self.path, kept)
        self._writer = RecordWriter(open(self.path, "ab"))  # noqa: SIM115 -- closed by close()

    def train_step(self, global_step: int, mean_loss: float, lr: float) -> None:
        self._add(global_step, {LOSS_TAG: mean_loss, LR_TAG: lr})

    def epoch(self, global_step: int, epoch: int, train_loss: float, metrics: dict[str, float | None]) -> None:
        values = {f"validation/{name}": value for name, value in metrics.items() if value is not None}
        self._add(global_step, {EPOCH_LOSS_TAG: train_loss, "validation/epoch": epoch, **values})

    def _add(self, step: int, values: dict[str, float]) -> None:
        if self._writer is not None:
            self._writer.write(scalar_event(step, values).SerializeToString())

    def flush(self) -> None:
        """Before the run directory is synced to the store (a saved state, the end)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def write_run_summary(out: Path, record: dict[str, Any]) -> None:
    """The run's HParams session and final scores, from its final record: out/EVENTS_DIR/SUMMARY_FILE."""
    from torch.utils.tensorboard.summary import hparams

    step = max([int(point.get("step") or 0) for point in record.get("curve") or []] + [0])
    primary = record.get("primary_metric")
    scores = {VALIDATION_SCORE_TAG: (record.get("val_metrics") or {}).get(primary),
              TEST_SCORE_TAG: (record.get("test_metrics") or {}).get(primary),
              **{f"score/test_{name}": value for name, value in (record.get("test_metrics") or {}).items()},
              TRAINED_PARAMS_TAG: record.get("trained_params")}
    _, session_start, _ = hparams(run_hparams(record), {tag: 0.0 for tag in SCORE_TAGS})
    from tensorboard.compat.proto.event_pb2 import Event

    events = [Event(wall_time=time.time(), step=0, summary=session_start),
              scalar_event(step, {tag: value for tag, value in scores.items() if value is not None}),
              Event(wall_time=time.time(), step=step, summary=session_end(record.get("status") or "ok"))]
    (out / EVENTS_DIR).mkdir(parents=True, exist_ok=True)
    write_events(out / EVENTS_DIR / SUMMARY_FILE, events)


def scalar_event(step: int, values: dict[str, float]) -> Any:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Event(wall_time=time.time(), step=step,
                 summary=Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()]))


def session_end(status: str) -> Any:
    """HParams' SessionEndInfo summary with the run's status (torch's hparams() always says success)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.metadata import PLUGIN_DATA_VERSION, PLUGIN_NAME, SESSION_END_INFO_TAG
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo

    content = HParamsPluginData(
        session_end_info=SessionEndInfo(status=Status.Value(SESSION_STATUS.get(status, "STATUS_UNKNOWN")), end_time_secs=time.time()),
        version=PLUGIN_DATA_VERSION,
    )
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag=SESSION_END_INFO_TAG, metadata=metadata)])


def read_events(path: Path) -> list[Any]:
    """The events of one file through TensorBoard's own loader ([] where there is none); a record cut
    off by a kill ends the list."""
    if not path.is_file():
        return []
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    return list(LegacyEventFileLoader(str(path)).Load())


def write_events(path: Path, events: list[Any]) -> None:
    """A whole event file (the format's version event first), replaced atomically."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    temporary = path.with_name(".partial")  # no "tfevents" in the name: TensorBoard never reads it
    with open(temporary, "wb") as file:
        writer = RecordWriter(file)
        for event in [Event(wall_time=time.time(), file_version="brain.Event:2"), *events]:
            writer.write(event.SerializeToString())
        writer.flush()
    os.replace(temporary, path)
