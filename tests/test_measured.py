"""The measured runs kept with the code (analysis/measured/, the README's numbers) stay the runs their
experiment plans: readable records of planned run ids, made under the task's current data scheme, so a
fresh machine that seeds its run store from them trains only what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

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
