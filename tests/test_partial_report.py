"""A report at any time: half a sweep aggregated and rendered, every partial table, figure and claim saying so."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from adaptune.report import build_report
from adaptune.sweep.fan_in import IncompleteSweepError, aggregate_sweep
from adaptune.sweep.plan import plan
from adaptune.sweep.shard_runner import run_shard
from adaptune.sweep.spec_file import spec_from_dict
from adaptune.sweep.store import RunStore
from pipelines.__main__ import main

# 8 runs: RTE (GLUE, Table 1) and SMS spam (additional tasks, Table 2) x full, adapters x 2 seeds; shards of 3.
SWEEP = {
    # runs_per_group 1: the shards this test reads part of are packed run by run, not by the CPU preset's fused groups
    "name": "partial_check", "backbone": "all-MiniLM-L6-v2", "accelerator": {"family": "cpu", "runs_per_group": 1},
    "max_train_examples": 64, "shard_size": 3,
    "sweeps": [{"tasks": ["rte", "sms_spam"], "methods": ["full", "adapters:8"], "learning_rates": [1e-4], "epochs": [1],
                "seeds": [0, 1]}],
}


def test_half_a_sweep_is_reported_and_says_where_it_is_partial(stub: Path, tmp_path: Path, shared_data_dir: Path) -> None:
    spec, store = spec_from_dict(SWEEP), RunStore(tmp_path / "store")
    shards = plan(spec).shards
    assert [(shard.task, len(shard.runs)) for shard in shards] == [("rte", 3), ("rte", 1), ("sms_spam", 3), ("sms_spam", 1)]
    for shard in (shards[0], shards[3]):  # 3 of RTE's 4 runs and 1 of SMS spam's: half the sweep
        run_shard(spec, shard.id, store)

    results = tmp_path / "results"
    left_out = dataclasses.replace(spec, grid_left_out="every rate but 1e-4, and epochs 3 and 20")
    summary = aggregate_sweep(left_out, store, results, partial=True)
    assert (summary["runs"], summary["planned"]) == (4, 8)
    assert len(pd.read_parquet(results / "runs.parquet")) == 4
    with pytest.raises(IncompleteSweepError, match="4 of 8 planned runs have no record"):
        aggregate_sweep(spec, store, tmp_path / "complete_only")  # the DAG's aggregate still wants every run

    report = build_report(results, tmp_path / "report", data_dir=shared_data_dir).read_text()
    assert "**Partial report: 4 of 8 planned runs have finished.**" in report
    assert "Left out of the paper's grid, as experiment `partial_check` says: every rate but 1e-4, and epochs 3 and 20" in report
    tables = tmp_path / "report" / "tables"
    assert (tables / "table1.md").read_text().startswith("*partial: 3 of 4 runs*")  # GLUE: RTE's runs
    assert (tables / "table2.md").read_text().startswith("*partial: 1 of 4 runs*")  # additional tasks: SMS spam's
    assert (tables / "methods.md").read_text().startswith("*partial: 4 of 8 runs*")
    claims = pd.read_parquet(tables / "claims.parquet").set_index("claim_id")["coverage"]
    assert claims["adapters_glue_within_0.4pt"] == "partial: 3 of 4 runs"
    assert claims["adapters_extra_within_0.4pt"] == "partial: 1 of 4 runs"
    assert set(claims.drop(["adapters_glue_within_0.4pt", "adapters_extra_within_0.4pt"])) == {"partial: 4 of 8 runs"}
    assert "— *partial: 3 of 4 runs*" in (tables / "claims.md").read_text()
    drawn = [line for line in report.splitlines() if line.startswith("### Figure")]
    assert drawn and report.count("\n*partial: ") >= len(drawn)  # under each drawn figure's title

    for shard in (shards[1], shards[2]):  # the rest: complete, nothing says partial
        run_shard(spec, shard.id, store)
    aggregate_sweep(spec, store, results, partial=True)
    complete = build_report(results, tmp_path / "complete", data_dir=shared_data_dir).read_text()
    assert "partial" not in complete.lower() and "Left out of the paper's grid" not in complete  # this spec says nothing
    assert pd.read_parquet(tmp_path / "complete" / "tables" / "claims.parquet")["coverage"].eq("complete").all()


def test_the_report_command_reports_what_the_store_holds_and_refuses_an_empty_one(
        stub: Path, tmp_path: Path, shared_data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "partial_check.json"
    sweep.write_text(json.dumps(SWEEP))
    spec, store = spec_from_dict(SWEEP), RunStore(tmp_path / "store")
    args = ["report", str(sweep), "--runs-root", store.root, "--out", str(tmp_path / "out"), "--data-dir", str(shared_data_dir)]
    (tmp_path / "store").mkdir()
    assert main(args) == 2
    assert "no planned run of 'partial_check' has finished yet" in capsys.readouterr().err

    run_shard(spec, plan(spec).shards[0].id, store)
    assert main(args) == 0
    assert "partial: 3 of 8 runs" in capsys.readouterr().out
    assert "Partial report: 3 of 8" in (tmp_path / "out" / "report.md").read_text()
