"""One sweep as one TensorBoard view: its planned runs' event files (train.event_log), and nothing else
of a run store that other sweeps share, under readable names, plus the sweep's HParams experiment.

The view is a local directory:
- EXPERIMENT_FILE at its root: the HParams experiment (every hyperparameter with the values the plan
  gives it, the score metrics), so the dashboard's table and parallel coordinates span the whole grid
  and fill in as runs finish.
- one entry per planned run (its curve and summary; with curves=False its summary only, which is
  what the HParams dashboard reads, for sweeps too large to load every curve), named <task>/<method>_lr<lr>_e<epochs>_s<seed>: on a local store a
  symlink to the run's event folder (TensorBoard follows it, and sees the run live; a link to a run
  not started yet dangles until it starts); on a bucket a copy, refreshed by `mirror` (one listing of
  the store per refresh; only files whose version changed are downloaded).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from adaptune.core.run_files import EVENTS_DIR
from adaptune.sweep.plan import plan
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.store import RUNS_DIR, RunStore
from adaptune.train.config import TrainConfig, method_label
from adaptune.train.event_log import SCORE_TAGS, SESSION_STATUS, SUMMARY_FILE, run_hparams, write_events

EXPERIMENT_FILE = "events.out.tfevents.experiment"


def run_label(run: TrainConfig) -> str:
    return f"{run.task}/{method_label(run.method)}_lr{run.lr:g}_e{run.epochs}_s{run.seed}"


def view_labels(runs: list[TrainConfig]) -> dict[str, str]:
    """{run_id: label}; runs that differ in something the label leaves out keep their id's hash."""
    labels = {run.run_id: run_label(run) for run in runs}
    taken: dict[str, int] = {}
    for label in labels.values():
        taken[label] = taken.get(label, 0) + 1
    return {run_id: label if taken[label] == 1 else f"{label}_{run_id.rsplit('-', 1)[-1]}" for run_id, label in labels.items()}


class SweepView:
    def __init__(self, spec: ExperimentSpec, store: RunStore, view_dir: Path, curves: bool = True) -> None:
        self.spec, self.store, self.view_dir, self.curves = spec, store, Path(view_dir), curves
        self.runs = plan(spec).runs
        self.labels = view_labels(self.runs)
        self._mirrored: dict[str, str] = {}  # bucket path -> version copied

    def build(self) -> int:
        """Write the experiment and every run's entry; returns the number of runs with events now."""
        if self.view_dir.exists():
            shutil.rmtree(self.view_dir)
        self.view_dir.mkdir(parents=True)
        write_experiment(self.view_dir / EXPERIMENT_FILE, self.spec, self.runs)
        if self.store.files.is_local:
            for run_id, label in self.labels.items():
                events = Path(self.store.root) / RUNS_DIR / run_id / EVENTS_DIR
                if self.curves:
                    (self.view_dir / label).parent.mkdir(parents=True, exist_ok=True)
                    (self.view_dir / label).symlink_to(events, target_is_directory=True)
                else:
                    (self.view_dir / label).mkdir(parents=True)
                    (self.view_dir / label / SUMMARY_FILE).symlink_to(events / SUMMARY_FILE)
            return self._with_events()
        return self.mirror()

    def mirror(self) -> int:
        """A bucket store: copy the event files that changed since the last call; returns runs with events."""
        if self.store.files.is_local:
            return self._with_events()
        with_events = set()
        for path, version in self.store.files.file_versions(RUNS_DIR).items():
            parts = path.split("/")
            if (len(parts) != 3 or parts[1] != EVENTS_DIR or parts[0] not in self.labels or "tfevents" not in parts[2]
                    or (not self.curves and parts[2] != SUMMARY_FILE)):
                continue
            with_events.add(parts[0])
            if self._mirrored.get(path) != version:
                target = self.view_dir / self.labels[parts[0]] / parts[2]
                target.parent.mkdir(parents=True, exist_ok=True)
                self.store.files.get_file(target, RUNS_DIR, *parts)
                self._mirrored[path] = version
        return len(with_events)

    def _with_events(self) -> int:
        return sum(any(path.exists() for path in (self.view_dir / label).iterdir()) if (self.view_dir / label).is_dir() else False
                   for label in self.labels.values())

    def keep_mirroring(self, every_s: float, until: Any) -> None:
        """Refresh a bucket's copy every `every_s` seconds while `until()` is false (TensorBoard serving)."""
        while not until():
            time.sleep(every_s)
            if not until():
                self.mirror()


def write_experiment(path: Path, spec: ExperimentSpec, runs: list[TrainConfig]) -> None:
    """The sweep's HParams experiment: each hyperparameter's values over the planned runs (a discrete
    domain, so the dashboard filters by value), the status values, and the score metrics."""
    from tensorboard.compat.proto.event_pb2 import Event
    from torch.utils.tensorboard.summary import hparams

    rows = [run_hparams({"task": run.task, "method": run.method, "method_label": method_label(run.method), "lr": run.lr,
                         "epochs": run.epochs, "seed": run.seed, "backbone": run.backbone, "status": "ok"}) for run in runs]
    domains = {name: sorted({row[name] for row in rows}) for name in rows[0]}
    domains["status"] = sorted(SESSION_STATUS)
    experiment, _, _ = hparams(rows[0], {tag: 0.0 for tag in SCORE_TAGS}, hparam_domain_discrete=domains)
    _mark_shown(experiment, shown_by_default({name for name, values in domains.items() if len(values) > 1}))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_events(path, [Event(wall_time=time.time(), step=0, summary=experiment)])


# The HParams dashboard ticks the first 5 hyperparameters for its table, those marked `differs` first, then by
# name (tf-hparams-query-pane: Math.min(5, ...); the backend sorts by (not differs, name):
# tensorboard/plugins/hparams/backend_context.py, _sort_and_reduce_to_hparams_limit).
DASHBOARD_COLUMNS = 5
# What a user reads a row by, always: the task, the method (its label carries the adapter size or rank) and the
# status (a degenerate or failed run must not pass for a score).
ALWAYS_SHOWN = ("task", "method", "status")
# Then what the grid varies, in this order; a seed last, as the row's name (the trial id) carries it too.
SHOWN_IF_VARIED = ("lr", "epochs", "backbone", "seed")


def shown_by_default(varied: set[str]) -> list[str]:
    """The hyperparameters the table shows without the user ticking them: ALWAYS_SHOWN, then the varied ones of
    SHOWN_IF_VARIED, at most DASHBOARD_COLUMNS."""
    return [*ALWAYS_SHOWN, *(name for name in SHOWN_IF_VARIED if name in varied)][:DASHBOARD_COLUMNS]


def _mark_shown(experiment: Any, names: list[str]) -> None:
    """Set `differs` on exactly the hyperparameters to show (the dashboard's one lever over its default columns);
    the others stay one tick away in its list."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    value = experiment.value[0]
    content = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in content.experiment.hparam_infos:
        info.differs = info.name in names
    value.metadata.plugin_data.content = content.SerializeToString()
