"""The same runs trained twice (another precision, device or code), compared run by run: `python -m
pipelines compare A B` and adaptune.report.compare.paired_runs, on the records kept in analysis/measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from adaptune.report.compare import paired_runs, paired_summary
from adaptune.report.results import run_row
from adaptune.sweep.store import RunStore
from pipelines.__main__ import main

MEASURED = Path(__file__).resolve().parents[1] / "analysis" / "measured"
GLUE_LOCAL = MEASURED / "glue_local"


def _rows(records: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([run_row(record) for record in records])


@pytest.fixture(scope="module")
def float32_records() -> list[dict]:
    records = RunStore(str(GLUE_LOCAL)).records()
    return [records[run_id] for run_id in sorted(records) if records[run_id]["epochs"] == 3 and records[run_id]["task"] in ("cola", "mrpc")]


def test_pairs_are_the_runs_both_sides_trained_with_b_minus_a(float32_records: list[dict]) -> None:
    a = float32_records
    b = [json.loads(json.dumps(record)) for record in a[1:]]  # the first run only a has
    for record in b:
        record["device"], record["train_examples_per_s"] = "cpu:bf16", 2 * record["train_examples_per_s"]
    lowered, flipped = b[0], b[1]
    lowered["test_metrics"][lowered["primary_metric"]] -= 0.02
    flipped["status"] = "degenerate" if flipped["status"] == "ok" else "ok"
    only_b = json.loads(json.dumps(a[0]))
    only_b["run_id"] = "mrpc-adapters64-s9-0000000000"
    pairs = paired_runs(_rows(a), _rows([*b, only_b]))

    assert sorted(pairs["run_id"]) == sorted(record["run_id"] for record in b)
    assert set(pairs["device_a"]) == {"cpu"} and set(pairs["device_b"]) == {"cpu:bf16"}
    by_id = pairs.set_index("run_id")
    assert by_id.loc[lowered["run_id"], "test_delta"] == pytest.approx(-2.0)
    assert (by_id.drop(index=lowered["run_id"])["test_delta"] == 0).all() and (pairs["val_delta"] == 0).all()
    assert pairs["speed_ratio"].to_numpy() == pytest.approx(2.0)
    # Some of these records predate the step settings (unknown, not "none"); the others recorded two, alike on both sides.
    recorded = pairs["run_id"].map({record["run_id"]: "dropout_masks" in record for record in b})
    assert recorded.any() and (~recorded).any()
    assert pairs.loc[~recorded, "settings_changed"].isna().all() and (pairs.loc[recorded, "settings_changed"] == "").all()

    summary = paired_summary(pairs).set_index("task")
    overall = summary.loc["all"]
    assert overall["pairs"] == len(b) and overall["status_changed"] == 1
    assert overall["test_delta"] == pytest.approx(-2.0 / len(b))
    assert overall["test_low"] <= overall["test_delta"] <= overall["test_high"] <= 0  # no pair moved up
    assert overall["max_abs_test_delta"] == pytest.approx(2.0)
    # The seeds of one configuration differ: the scale a delta is read on, per task and over all of them
    # (an average of per-task spreads, never a spread across tasks).
    spreads = summary.drop(index="all")["seed_spread_a"]
    assert (spreads > 0).all() and spreads.min() <= overall["seed_spread_a"] <= spreads.max()


def _store(root: Path, records: list[dict]) -> Path:
    store = RunStore(str(root))
    for record in records:
        assert store.publish_record(record)
    return root


def test_compare_command_prints_and_writes_the_pairs(float32_records: list[dict], tmp_path: Path, capsys) -> None:
    a = _store(tmp_path / "a", float32_records)
    b = shutil.copytree(a, tmp_path / "b")
    out = tmp_path / "out"
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{len(float32_records)} runs in both" in printed and float32_records[0]["run_id"] in printed
    unknown = sum("dropout_masks" not in record for record in float32_records)
    assert f"\n{unknown} runs with a side whose record predates the step settings" in printed
    written = pd.read_parquet(out / "paired_runs.parquet")
    assert len(written) == len(float32_records) and (written["test_delta"] == 0).all()
    assert list(pd.read_parquet(out / "paired_summary.parquet")["task"]) == ["cola", "mrpc", "all"]


def test_compare_command_says_in_one_line_when_nothing_pairs(float32_records: list[dict], tmp_path: Path, capsys) -> None:
    a = _store(tmp_path / "a", float32_records[:1])
    b = _store(tmp_path / "b", float32_records[1:])
    assert main(["compare", str(a), str(b)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "share no run id" in error and str(a) in error
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    assert main(["compare", str(a), str(tmp_path / "empty")]) == 2
    assert "holds no run records" in capsys.readouterr().err


def test_the_kept_bf16_check_pairs_every_run_with_its_float32_record(tmp_path: Path, capsys) -> None:
    """analysis/measured/bf16_local (the README's bf16 check) holds glue_local's runs trained again in
    bf16: each pairs with its float32 record, and the command reads the two kept stores as they are."""
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan

    assert main(["compare", str(GLUE_LOCAL), str(MEASURED / "bf16_local"), "--out", str(tmp_path)]) == 0
    pairs = pd.read_parquet(tmp_path / "paired_runs.parquet")
    kept = set(RunStore(MEASURED / "bf16_local").records())
    assert sorted(pairs["run_id"]) == sorted(kept)  # each kept bf16 run pairs with its float32 record
    assert kept <= {config.run_id for config in plan(get_experiment("bf16_local")).runs}
    assert set(pairs["device_a"]) == {"cpu"} and set(pairs["device_b"]) == {"cpu:bf16"}
    assert f"{len(pairs)} runs in both" in capsys.readouterr().out


def test_pairs_name_the_step_settings_that_changed(float32_records: list[dict]) -> None:
    """Where both sides' records say how their steps were computed, each pair names what differs (the residual stream
    here), and "" where nothing does."""
    from adaptune.fused.settings import RECORDED_SETTINGS

    settings = {"compile": "eager", "dropout_masks": "generator", "attention": "eager", "dropout": "mask",
                "projections": "stacked", "layer_norm": "torch", "residual": "float32", "branch_sums": "separate"}
    assert set(settings) == set(RECORDED_SETTINGS)
    a = [{**record, **settings} for record in float32_records]
    b = [{**record, **settings, "residual": "bf16" if index % 2 else "float32"} for index, record in enumerate(a)]
    pairs = paired_runs(_rows(a), _rows(b)).set_index("run_id")
    for index, record in enumerate(a):
        assert pairs.loc[record["run_id"], "settings_changed"] == ("residual: float32 -> bf16" if index % 2 else "")
    older = [{key: value for key, value in record.items() if key != "branch_sums"} for record in a]  # before branch_sums
    pairs = paired_runs(_rows(older), _rows(a)).set_index("run_id")
    assert set(pairs["settings_changed"]) == {"branch_sums: unrecorded -> separate"}


def test_a_fused_groups_runs_are_compared_as_a_group(float32_records: list[dict]) -> None:
    """Runs of a group of 4 each train their own rows at a quarter of the group's rate: read as the device's rate
    (examples/s x group size) a group as fast as its runs one after another compares at 1, not at 0.25; and each
    side's group size and precision stand in the printed table."""
    from adaptune.report.compare import paired_markdown

    a = float32_records
    b = [json.loads(json.dumps(record)) for record in a]
    for record in b:
        record.update(device="cpu:bf16", group_size=4, train_examples_per_s=record["train_examples_per_s"] / 4 * 1.1)
    pairs = paired_runs(_rows(a), _rows(b))
    assert pairs["speed_ratio"].to_numpy() == pytest.approx(1.1)
    assert set(pairs["group_size_a"]) == {1} and set(pairs["group_size_b"]) == {4}
    assert set(pairs["precision_a"]) == {"float32"} and set(pairs["precision_b"]) == {"bf16"}
    by_id = pairs.set_index("run_id")
    for record in b:
        assert by_id.loc[record["run_id"], "run_seconds_b"] == pytest.approx(record["wall_time_s"] / 4)
    table = paired_markdown(pairs)
    header = table.splitlines()[0]
    assert all(column in header for column in ("precision_a", "precision_b", "group_size_a", "group_size_b", "speed_ratio"))
    overall = paired_summary(pairs).set_index("task").loc["all"]
    assert overall["group_sizes_a"] == "1" and overall["group_sizes_b"] == "4" and overall["precisions_b"] == "bf16"


def test_printed_deltas_are_those_of_the_values_shown_and_never_negative_zero() -> None:
    """48.924 vs 48.926 prints as 48.92 vs 48.93: its delta prints as 0.01 (not 0.00, the unrounded 0.002); 48.921 vs
    48.919 prints as 48.92 vs 48.92: 0.00, not -0.00. The summary's means print no -0.00 either."""
    from adaptune.report.compare import SHOWN_PAIR_COLUMNS, paired_markdown, summary_markdown

    base = {"precision_a": "float32", "precision_b": "bf16", "group_size_a": 1, "group_size_b": 1, "status_a": "ok",
            "status_b": "ok", "speed_ratio": 1.0}
    pairs = pd.DataFrame([
        {**base, "run_id": "up", "val_a": 48.924, "val_b": 48.926, "test_a": 48.924, "test_b": 48.926, "test_delta": 0.002},
        {**base, "run_id": "flat", "val_a": 48.921, "val_b": 48.919, "test_a": 48.921, "test_b": 48.919, "test_delta": -0.002},
    ])[SHOWN_PAIR_COLUMNS]
    table = paired_markdown(pairs)
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines()[2:]}
    delta = SHOWN_PAIR_COLUMNS.index("test_delta")
    assert rows["up"][SHOWN_PAIR_COLUMNS.index("test_a"):delta + 1] == ["48.92", "48.93", "0.01"]
    assert rows["flat"][SHOWN_PAIR_COLUMNS.index("test_a"):delta + 1] == ["48.92", "48.92", "0.00"]
    assert "-0.00" not in table
    summary = pd.DataFrame({"task": ["all"], "test_delta": [-0.0004], "test_low": [-0.003], "test_high": [0.002]})
    assert "-0.00" not in summary_markdown(summary) and "0.00" in summary_markdown(summary)
