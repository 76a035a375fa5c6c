"""The measured runs kept with the code (analysis/measured/, the README's numbers) stay the runs their
experiment plans: readable records of planned run ids, made under the task's current data scheme, so a
fresh machine that seeds its run store from them trains only what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from adaptune.sweep import run_attempt
from adaptune.sweep.experiments import EXPERIMENTS
from adaptune.sweep.plan import plan
from adaptune.sweep.store import RunStore
from adaptune.train.record import is_stale

MEASURED = Path(__file__).resolve().parents[1] / "analysis" / "measured"
KEPT = sorted(path.name for path in MEASURED.iterdir() if (path / "runs").is_dir())


def test_something_is_kept() -> None:
    assert "glue_local" in KEPT


@pytest.mark.parametrize("experiment", KEPT)
def test_every_kept_record_is_a_planned_current_run_that_a_resumed_sweep_reuses(
    experiment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(str(MEASURED / experiment)).require_existing()
    unreadable: dict[str, str] = {}
    records = store.records(unreadable=unreadable)
    kept = sorted(path.name for path in (MEASURED / experiment / "runs").iterdir())
    assert not unreadable and sorted(records) == kept and records
    planned = {config.run_id: config for config in plan(EXPERIMENTS[experiment]).runs}
    orphaned = sorted(set(records) - set(planned))
    assert not orphaned, f"{experiment} no longer plans {orphaned}: its spec changed; rerun them or drop them here"
    for run_id, record in records.items():
        assert record["experiment"] == experiment and record["status"] in ("ok", "degenerate", "failed")
        assert not is_stale(record), f"{run_id} was made under another data scheme than {record['task']}'s now"

    # A store seeded from them (analysis/measured/README.md) reuses every kept run and trains none of them.
    seeded = RunStore(str(shutil.copytree(MEASURED / experiment, tmp_path / experiment)))
    monkeypatch.setattr(run_attempt, "_train_with_retries", lambda config, *args: pytest.fail(f"trained kept run {config.run_id}"))
    assert {run_attempt.run_in_store(planned[run_id], seeded) for run_id in records} == {"reused"}


IN_PROGRESS = MEASURED / "in_progress"
UNFINISHED = sorted(path.name for path in IN_PROGRESS.iterdir() if (path / "runs").is_dir()) if IN_PROGRESS.is_dir() else []


@pytest.mark.parametrize("experiment", UNFINISHED)
def test_every_kept_unfinished_state_is_a_planned_unfinished_run_that_fits_its_model(experiment: str) -> None:
    """A state kept under in_progress/ (analysis/measured/README.md) resumes a run its experiment still
    plans and has not finished, and fits that run's model, so a fresh machine continues it."""
    from adaptune.data.tasks import get_task
    from adaptune.fused.run_dropout import MASK_SCHEMES
    from adaptune.model.backbone import load_model
    from adaptune.model.methods import apply_method, method_from_dict
    from adaptune.train.state import resume_point, trained_parameters

    planned = {config.run_id: config for config in plan(EXPERIMENTS[experiment]).runs}
    finished = set(RunStore(str(MEASURED / experiment)).records()) if (MEASURED / experiment / "runs").is_dir() else set()
    states = sorted((IN_PROGRESS / experiment / "runs").glob("*/train_state.pt"))
    assert states and len(states) == len(list((IN_PROGRESS / experiment / "runs").iterdir()))
    for path in states:
        run_id = path.parent.name
        assert run_id in planned, f"{experiment} no longer plans {run_id}: drop its state"
        assert run_id not in finished, f"{run_id} has finished: drop its state"
        step, kept = resume_point(path.parent)
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        assert state["run_id"] == run_id and step > 0 and kept.mask_scheme in MASK_SCHEMES
        config, task = planned[run_id], get_task(planned[run_id].task)
        model = load_model(config.backbone, task.kind, task.num_labels)
        apply_method(model, method_from_dict(config.method))
        expected = {name: tuple(parameter.shape) for name, parameter in trained_parameters(model).items()}
        assert {name: tuple(tensor.shape) for name, tensor in state["trained"].items()} == expected
