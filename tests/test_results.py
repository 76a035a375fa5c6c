"""The Parquet results store on real run records: round trip, schema checks, dedupe, atomic writes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from results_fixture import real_records  # noqa: F401  (session fixture: tiny real runs)

from adaptune.report.results import (
    ABLATION_SCHEMA,
    CURVES_SCHEMA,
    RUNS_SCHEMA,
    SchemaError,
    locate_results,
    metrics_table,
    read_results,
    write_ablation,
    write_results,
    write_runs,
)

pytestmark = pytest.mark.xdist_group("results_report")  # one worker trains the shared fixture once

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_round_trip_keeps_every_run_and_its_best_epoch_metrics(real_records, tmp_path):
    write_results(real_records, tmp_path)
    frames = read_results(tmp_path)
    runs = frames["runs"].set_index("run_id")
    assert sorted(runs.index) == sorted(record["run_id"] for record in real_records)
    for record in real_records:
        row = runs.loc[record["run_id"]]
        assert row["status"] == record["status"]
        assert row["task"] == record["task"] and row["method"] == record["method"]["name"]
        assert json.loads(row["config_json"]) == json.loads(json.dumps(record["config"], default=str))
        if record["val_metrics"]:
            assert row["val_score"] == pytest.approx(record["val_metrics"][record["primary_metric"]])
            assert json.loads(row["val_metrics"]) == pytest.approx(record["val_metrics"])
        if record["test_metrics"]:
            assert row["test_score"] == pytest.approx(record["test_metrics"][record["primary_metric"]])
        if record["method"]["name"] == "adapters":
            assert row["adapter_size"] == record["method"]["size"]
    expected_curve_rows = sum(max(1, len(point["val_metrics"] or {})) for record in real_records for point in record["curve"])
    assert len(frames["curves"]) == expected_curve_rows
    assert frames["ablation"].empty and list(frames["ablation"].columns) == ABLATION_SCHEMA.names


def test_failed_run_keeps_its_reason(real_records, tmp_path):
    write_runs(real_records, tmp_path)
    runs = read_results(tmp_path)["runs"]
    failed = runs[runs["status"] == "failed"]
    assert len(failed) >= 1, "the fixture's lr=1e6 run should have diverged"
    assert failed["reason"].str.contains("non-finite").all()
    assert failed["val_score"].isna().all()


def test_reappending_a_resubmitted_sweep_does_not_duplicate_and_newest_wins(real_records, tmp_path):
    write_results(real_records, tmp_path)
    rerun = copy.deepcopy(real_records[0])
    rerun["status"], rerun["reason"] = "failed", "preempted on resubmission"
    rerun["curve"] = rerun["curve"][:1]
    write_results(real_records[1:] + [rerun], tmp_path)
    frames = read_results(tmp_path)
    runs = frames["runs"]
    assert len(runs) == len(real_records)
    assert runs["run_id"].is_unique
    assert runs.set_index("run_id").loc[rerun["run_id"], "reason"] == "preempted on resubmission"
    curve = frames["curves"][frames["curves"]["run_id"] == rerun["run_id"]]
    assert set(curve["epoch"]) == {rerun["curve"][0]["epoch"]}  # the re-run's curve replaced the old one whole


def test_ablation_rows_are_checked_and_deduplicated(real_records, tmp_path):
    run = next(r for r in real_records if r["method"]["name"] == "adapters" and r["val_metrics"])
    baseline = run["val_metrics"][run["primary_metric"]]
    rows = [
        {"run_id": run["run_id"], "task": run["task"], "first_layer": first, "last_layer": last, "metric": run["primary_metric"],
         "value": baseline, "baseline_value": baseline, "relative_change": 0.0}
        for first in range(2) for last in range(first, 2)
    ]
    write_ablation(rows, tmp_path)
    write_ablation(rows, tmp_path)
    write_runs(real_records, tmp_path)
    assert len(read_results(tmp_path)["ablation"]) == 3
    bad = dict(rows[0], first_layer="bottom")
    with pytest.raises(SchemaError, match=r"ablation.parquet column 'first_layer'"):
        write_ablation([bad], tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lr": "fast"}, r"runs.parquet column 'lr': expected double, run '.+' has 'fast'"),
        ({"epochs": 2.5}, r"runs.parquet column 'epochs': expected an integer, run '.+' has 2.5"),
        ({"status": "finished"}, r"column 'status'.*'finished'.*allowed"),
        ({"trained_params": [1, 2]}, r"runs.parquet column 'trained_params'"),
    ],
)
def test_schema_violation_names_the_column_and_run(real_records, tmp_path, change, message):
    record = dict(copy.deepcopy(real_records[0]), **change)
    with pytest.raises(SchemaError, match=message) as error:
        write_runs([record], tmp_path)
    assert record["run_id"] in str(error.value)


def test_record_missing_a_contract_key_is_refused(real_records, tmp_path):
    record = copy.deepcopy(real_records[0])
    del record["seed"]
    with pytest.raises(SchemaError, match=r"lacks key\(s\) \['seed'\]"):
        write_runs([record], tmp_path)


def test_kfp_floats_for_ints_are_accepted(real_records, tmp_path):
    record = copy.deepcopy(real_records[0])
    record["epochs"], record["seed"] = float(record["epochs"]), float(record["seed"])
    write_runs([record], tmp_path)
    assert read_results(tmp_path)["runs"]["epochs"].iloc[0] == record["epochs"]


def test_a_rejected_write_leaves_the_store_as_it_was(real_records, tmp_path):
    write_runs(real_records, tmp_path)
    before = (tmp_path / "runs.parquet").read_bytes()
    with pytest.raises(SchemaError):
        write_runs([dict(real_records[0], lr="fast")], tmp_path)
    assert (tmp_path / "runs.parquet").read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs.parquet"]  # no temp files left behind


def test_read_results_explains_a_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="no runs.parquet in"):
        read_results(tmp_path)


def test_locate_results_finds_the_store_below_a_pipeline_output(real_records, tmp_path):
    write_runs(real_records, tmp_path / "pipeline" / "aggregate")
    assert locate_results(tmp_path) == tmp_path / "pipeline" / "aggregate"
    with pytest.raises(FileNotFoundError, match="ADAPTUNE_RESULTS"):
        locate_results(tmp_path / "nothing")


def test_metrics_table_spreads_the_json_metrics(real_records, tmp_path):
    write_runs(real_records, tmp_path)
    runs = read_results(tmp_path)["runs"]
    spread = metrics_table(runs, "val")
    ok = runs["val_score"].notna()
    assert (spread.loc[ok, "val_accuracy"] == runs.loc[ok, "val_score"]).all()


def test_data_split_is_a_column_and_files_written_before_it_still_read(real_records, tmp_path):
    import pyarrow.parquet as pq

    assert all(record["data_split"] == "standard" and record["split_note"] is None for record in real_records)
    standin = copy.deepcopy(real_records[0])
    standin.update(run_id="standin-run", data_split="squad_dev_standin", split_note="squad_dev_standin: NOT the paper's split")
    write_runs([*real_records, standin], tmp_path)
    runs = read_results(tmp_path)["runs"].set_index("run_id")
    assert runs.loc["standin-run", "data_split"] == "squad_dev_standin"
    assert "NOT the paper's split" in runs.loc["standin-run", "split_note"]
    assert (runs.drop(index="standin-run")["data_split"] == "standard").all()

    # A runs.parquet from before the columns existed reads with nulls there, and takes new rows.
    path = tmp_path / "runs.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["data_split", "split_note"]), path)
    older = read_results(tmp_path)["runs"]
    assert list(older.columns) == RUNS_SCHEMA.names and older["data_split"].isna().all()
    write_runs([standin], tmp_path)
    assert read_results(tmp_path)["runs"].set_index("run_id").loc["standin-run", "data_split"] == "squad_dev_standin"


def test_schema_document_lists_every_column():
    text = (REPO_ROOT / "analysis" / "SCHEMA.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE))
    for schema in (RUNS_SCHEMA, CURVES_SCHEMA, ABLATION_SCHEMA):
        assert set(schema.names) <= documented, set(schema.names) - documented


def test_how_each_runs_steps_were_computed_is_a_column(real_records, tmp_path):
    """step_settings_json holds every setting the trainer recorded (a run of the real trainer records each of
    RECORDED_SETTINGS), so sweeps trained under other settings can be told apart; a record from before them gives {}."""
    from adaptune.fused.settings import RECORDED_SETTINGS

    trained = [record for record in real_records if record["status"] != "failed"]
    assert trained and all(set(RECORDED_SETTINGS) <= set(record) for record in trained)
    older = {key: value for key, value in copy.deepcopy(real_records[0]).items() if key not in RECORDED_SETTINGS}
    older["run_id"] = "older-run"
    write_runs([*real_records, older], tmp_path)
    runs = read_results(tmp_path)["runs"].set_index("run_id")
    for record in trained:
        assert json.loads(runs.loc[record["run_id"], "step_settings_json"]) == {name: record[name] for name in RECORDED_SETTINGS}
    assert json.loads(runs.loc["older-run", "step_settings_json"]) == {}
