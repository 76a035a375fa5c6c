"""Estimates that learn: a plan given a run store's records estimates at the throughput they measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptune.sweep.cost import (
    EVALUATION_OVERHEAD,
    FUSED_SPEEDUP,
    MEAN_PADDED_LENGTH,
    MEASURED_ONE_RUN_AT_LENGTH,
    MEASURED_PARAMETER_EFFICIENT_STEP_COST,
    THROUGHPUT,
    estimate_hours,
    planned_group_size,
    table_fused_speedup,
)
from adaptune.sweep.plan import plan
from adaptune.sweep.shard_runner import run_shard
from adaptune.sweep.spec_file import spec_from_dict
from adaptune.sweep.status_cache import store_summaries
from adaptune.sweep.store import RunStore
from adaptune.sweep.throughput import Measured, accelerator_hours, measure_on, measure_throughput, runs_on
from pipelines.__main__ import main

SWEEP = {
    "name": "calibration_check", "backbone": "all-MiniLM-L6-v2", "accelerator": "cpu", "max_train_examples": 200,
    "sweeps": [{"tasks": ["rte"], "methods": ["full", "adapters:8"], "learning_rates": [1e-4], "epochs": [2], "seeds": [0, 1]}],
}
GROWN = {**SWEEP, "sweeps": [{**SWEEP["sweeps"][0], "methods": ["full", "adapters:8", "layernorm"], "seeds": [0, 1, 2]}]}


@pytest.fixture()
def measured_store(stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    """SWEEP's 4 runs trained by the stub at 0.01 s per example (100 examples/s) on the CPU."""
    monkeypatch.setenv("STUB_SECONDS_PER_EXAMPLE", "0.01")
    monkeypatch.setenv("STUB_DEVICE", "cpu")
    monkeypatch.setenv("ADAPTUNE_CACHE_DIR", str(tmp_path / "cache"))
    store = RunStore(tmp_path / "store")
    spec = spec_from_dict(SWEEP)
    for shard in plan(spec).shards:
        run_shard(spec, shard.id, store)
    return store


def test_the_measured_throughput_is_the_stub_records_own(measured_store: RunStore) -> None:
    records = store_summaries(measured_store).values()
    assert measure_throughput(records, "cpu") == {
        ("all-MiniLM-L6-v2", "cpu", "full", 1): Measured(pytest.approx(100.0), 2),
        ("all-MiniLM-L6-v2", "cpu", "adapters", 1): Measured(pytest.approx(100.0), 2),
    }
    assert measure_throughput(records, "NVIDIA_H100_80GB") == {}  # trained on another device: not this one's speed


def test_a_grown_grid_is_estimated_from_the_store_and_the_table_where_it_has_no_measurement(measured_store: RunStore) -> None:
    grown = spec_from_dict(GROWN)
    measured = measure_throughput(store_summaries(measured_store).values(), "cpu")
    calibrated, published = plan(grown, measured), plan(grown)
    for run in calibrated.runs:
        if run.method["name"] == "layernorm":  # never measured: the published table
            assert calibrated.run_hours[run.run_id] == published.run_hours[run.run_id] == estimate_hours(run, grown)
        else:  # 200 examples x 2 epochs at 100 examples/s
            assert calibrated.run_hours[run.run_id] == pytest.approx(4.0 / 3600)
    assert [shard.runs for shard in calibrated.shards] == [shard.runs for shard in published.shards]  # the DAG's shards
    source = calibrated.estimate_source()
    assert "all-MiniLM-L6-v2 adapters on cpu: 100.0 examples/s from 2 run(s)" in source
    assert "all-MiniLM-L6-v2 full on cpu: 100.0 examples/s from 2 run(s)" in source
    assert "adaptune.sweep.cost.THROUGHPUT (published figures, not a measurement) for the other 1" in source
    assert "not a measurement" in published.estimate_source() and "measured" not in published.estimate_source().split("(")[0]


def test_the_plan_command_says_which_throughput_it_used(measured_store: RunStore, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "grown.json"
    sweep.write_text(json.dumps(GROWN))
    assert main(["plan", str(sweep), "--runs-root", measured_store.root]) == 0
    assert "estimate basis: throughput measured by the run store's records" in capsys.readouterr().out
    assert main(["plan", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "estimate basis: throughput from adaptune.sweep.cost.THROUGHPUT" in out and "pass --runs-root" in out


@pytest.mark.parametrize(("device", "label", "expected"), [
    ("cuda:NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB", True), ("cuda:NVIDIA A100-SXM4-40GB", "NVIDIA_TESLA_A100", True),
    ("cuda:NVIDIA A100-SXM4-40GB", "NVIDIA_H100_80GB", False), ("cpu", "cpu", True), ("xla:TPU", "TPU_V5_LITEPOD", True),
    ("stub", "cpu", False), (None, "cpu", False),
])
def test_a_record_counts_for_the_accelerator_it_ran_on(device: str | None, label: str, expected: bool) -> None:
    assert runs_on(device, label) is expected


def _record(method: str, wall_s: float, group_size: int | None = None, device: str = "cpu") -> dict:
    record = {"status": "ok", "backbone": "all-MiniLM-L6-v2", "method": {"name": method}, "device": device, "epochs": 2,
              "wall_time_s": wall_s, "split_sizes": {"train": 1000}, "config": {"max_length": 128}}
    return record if group_size is None else {**record, "group_size": group_size}


@pytest.mark.parametrize(("cpu_precision", "env", "expected"), [
    ("bf16", "0", 80.0), ("float32", "1", 40.0), ("auto", "1", 80.0), ("auto", "0", 40.0),
])
def test_a_cpu_plan_is_priced_by_the_records_of_the_precision_its_runs_will_train_in(
    cpu_precision: str, env: str, expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same adapter run in float32 (50 s) and in bf16 (25 s, "cpu:bf16"): an experiment pinned to a
    precision is priced by that precision's record, one left to the machine by the machine's setting."""
    monkeypatch.setenv("ADAPTUNE_CPU_BF16", env)
    spec = spec_from_dict({**SWEEP, "accelerator": {"cpu_precision": cpu_precision}})
    records = [_record("adapters", 50.0), _record("adapters", 25.0, device="cpu:bf16")]
    assert measure_on(records, spec.accelerator) == {("all-MiniLM-L6-v2", "cpu", "adapters", 1): Measured(pytest.approx(expected), 1)}


def test_a_fused_group_is_charged_once_and_prices_the_runs_that_will_train_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 adapter runs fused in one group for 40 s (each record carries the group's wall time) and one
    alone for 50 s, each 1,000 rows x 2 epochs: the group took 40 accelerator-seconds, not 160."""
    grouped = [_record("adapters", 40.0, 4) for _ in range(4)]
    alone = _record("adapters", 50.0)
    assert accelerator_hours(grouped + [alone], 1) == pytest.approx(90.0 / 3600)
    measured = measure_throughput(grouped + [alone], "cpu")
    assert measured == {("all-MiniLM-L6-v2", "cpu", "adapters", 4): Measured(pytest.approx(200.0), 4),
                        ("all-MiniLM-L6-v2", "cpu", "adapters", 1): Measured(pytest.approx(40.0), 1)}
    spec = spec_from_dict({**GROWN, "max_train_examples": 1000})
    adapters = next(run for run in plan(spec).runs if run.method["name"] == "adapters")
    layernorm = next(run for run in plan(spec).runs if run.method["name"] == "layernorm")
    monkeypatch.setenv("ADAPTUNE_RUNS_PER_GROUP", "1")  # the CPU preset fuses 4: here each run trains alone
    assert estimate_hours(adapters, spec, measured) == pytest.approx(2000 / 40.0 / 3600)  # trains alone: priced alone
    monkeypatch.setenv("ADAPTUNE_RUNS_PER_GROUP", "4")
    assert estimate_hours(adapters, spec, measured) == pytest.approx(2000 / 200.0 / 3600)  # fused 4 at a time, as measured
    monkeypatch.setenv("ADAPTUNE_RUNS_PER_GROUP", "8")  # fused 8 at a time: not measured, priced one run at a time
    assert estimate_hours(adapters, spec, measured) == pytest.approx(2000 / 40.0 / 3600)
    assert estimate_hours(layernorm, spec, measured) == estimate_hours(layernorm, spec)
    source = plan(spec, measured).estimate_source()
    assert "all-MiniLM-L6-v2 adapters on cpu: 40.0 examples/s from 1 run(s)" in source
    # 3 adapter and 3 LayerNorm-only runs: each method's 3 seeds train as one group of 3, as the runner will form it
    assert "6 run(s) that train fused 3 at a time priced one run at a time" in source
    monkeypatch.setenv("ADAPTUNE_RUNS_PER_GROUP", "4")  # 4 seeds a method: groups of 4, priced as the store measured them
    four_seeds = spec_from_dict({**GROWN, "max_train_examples": 1000, "sweeps": [{**GROWN["sweeps"][0], "seeds": [0, 1, 2, 3]}]})
    assert "adapters fused 4 at a time on cpu: 200.0 examples/s from 4 run(s)" in plan(four_seeds, measured).estimate_source()


def test_a_gpu_plan_prices_each_group_at_its_size_from_the_measured_fused_speedups() -> None:
    """On the H100 preset (8 runs per group) with no store measurement, an adapter or LayerNorm-only run is priced
    at the table's one-run throughput times bench-gpu's fused speedup at its own group's size: at a measured size
    (1, 2, 4, 6, 8 and 12 for BERT-base) its measurement, on the line between two measured sizes' step times in
    between, the largest's above. Full fine-tuning trains one a group, replayed, at the whole-model figure. The plan
    prices the groups it forms, and says so."""
    eight_seeds = spec_from_dict({**GROWN, "backbone": "bert-base-uncased", "accelerator": "h100",
                                  "sweeps": [{**GROWN["sweeps"][0], "seeds": list(range(8))}]})
    planned = plan(eight_seeds)
    assert {planned.group_sizes[run.run_id] for run in planned.runs if run.method["name"] != "full"} == {8}
    assert {planned.group_sizes[run.run_id] for run in planned.runs if run.method["name"] == "full"} == {1}
    runs = {run.method["name"]: run for run in planned.runs}
    speedups = FUSED_SPEEDUP["frozen_backbone"]["bert-base-uncased"]
    hours = {size: estimate_hours(runs["adapters"], eight_seeds, group_size=size) for size in range(1, 17)}
    assert planned.run_hours[runs["adapters"].run_id] == hours[8]
    assert planned.run_hours[runs["full"].run_id] == estimate_hours(runs["full"], eight_seeds, group_size=1)
    alone_in_the_table = hours[1] * speedups[1]  # the table's one-run hours
    for size in speedups:
        assert hours[size] * speedups[size] == pytest.approx(alone_in_the_table)
    step_4, step_6 = 4 / speedups[4], 6 / speedups[6]  # in one plain run's step times
    assert hours[5] * 5 / ((step_4 + step_6) / 2) == pytest.approx(alone_in_the_table)
    assert hours[16] == hours[12]  # above the largest measured size: its speedup
    # A measured adapter step on an H100 is no cheaper than a full one (launch-bound): the table says so. A full
    # fine-tuning run alone is replayed as a group of one, at the whole-model figure.
    full_alone = estimate_hours(runs["full"], eight_seeds, group_size=1)
    whole = FUSED_SPEEDUP["whole_model"]["bert-base-uncased"][1]
    assert alone_in_the_table == pytest.approx(
        full_alone * whole * MEASURED_PARAMETER_EFFICIENT_STEP_COST[("bert-base-uncased", "NVIDIA_H100_80GB")])
    assert ("24 run(s) priced at bench-gpu's measured fused speedup (16 fused 8 at a time, 8 alone, the step replayed as "
            "CUDA graphs;") in planned.estimate_source()
    # 3 seeds a method: the plan forms groups of 3 and prices them at 3
    three_seeds = spec_from_dict({**GROWN, "backbone": "bert-base-uncased", "accelerator": "h100"})
    planned = plan(three_seeds)
    adapters = next(run for run in planned.runs if run.method["name"] == "adapters")
    assert planned.run_hours[adapters.run_id] == pytest.approx(hours[3])
    assert "9 run(s) priced at bench-gpu's measured fused speedup (6 fused 3 at a time, 3 alone, the step replayed as CUDA graphs;" in planned.estimate_source()
    # The A100 preset fuses nothing and replays no steps: every run priced alone
    a100 = spec_from_dict({**GROWN, "backbone": "bert-base-uncased", "accelerator": "a100"})
    assert {table_fused_speedup(run, a100) for run in plan(a100).runs} == {1.0}
    assert "fused" not in plan(a100).estimate_source()


def test_a_gpu_plan_prices_top_k_groups_at_the_shallowest_measured_depth_at_least_theirs() -> None:
    """top_k below the full depth trains fused on the H100 preset. A GPU measured groups of top_k 1, 3, 6 and 11
    on BERT-base: top_k 3 prices at top_k 3's speedup, top_k 5 at top_k 6's (more stacked layers share less:
    the deeper figure is the floor); top_k over every layer trains alone at the whole-model figure, and BERT-large's top_k, never measured
    fused, is priced one run at a time; the plan says which is which."""
    spec = spec_from_dict({**GROWN, "backbone": "bert-base-uncased", "accelerator": "h100",
                           "sweeps": [{**GROWN["sweeps"][0], "methods": ["top_k:3", "top_k:5", "top_k:12"]}]})
    runs = plan(spec).runs
    by_k = {k: [run for run in runs if run.method["k"] == k] for k in (3, 5, 12)}
    assert {planned_group_size(run, spec) for run in by_k[3] + by_k[5]} == {8}
    assert {planned_group_size(run, spec) for run in by_k[12]} == {1}
    assert {table_fused_speedup(run, spec) for run in by_k[3]} == {FUSED_SPEEDUP["top_k3"]["bert-base-uncased"][8]}
    assert {table_fused_speedup(run, spec) for run in by_k[5]} == {FUSED_SPEEDUP["top_k6"]["bert-base-uncased"][8]}
    assert FUSED_SPEEDUP["top_k6"]["bert-base-uncased"][8] < FUSED_SPEEDUP["top_k3"]["bert-base-uncased"][8]
    assert {table_fused_speedup(run, spec) for run in by_k[12]} == {FUSED_SPEEDUP["whole_model"]["bert-base-uncased"][1]}
    grouped, alone = (estimate_hours(by_k[5][0], spec, group_size=size) for size in (8, 1))
    assert grouped * FUSED_SPEEDUP["top_k6"]["bert-base-uncased"][8] == pytest.approx(alone * FUSED_SPEEDUP["top_k6"]["bert-base-uncased"][1])
    # top_k 3 was measured at 8 only: a group of 3 at 8's step time, three eighths of its runs' work
    assert table_fused_speedup(by_k[3][0], spec, 3) == pytest.approx(FUSED_SPEEDUP["top_k3"]["bert-base-uncased"][8] * 3 / 8)
    source = plan(spec).estimate_source()
    assert "9 run(s) priced at bench-gpu's measured fused speedup (6 fused 3 at a time, 3 alone, the step replayed as CUDA graphs;" in source
    large = spec_from_dict({**GROWN, "backbone": "bert-large-uncased", "accelerator": "h100",
                            "sweeps": [{**GROWN["sweeps"][0], "methods": ["top_k:3"]}]})
    assert {table_fused_speedup(run, large) for run in plan(large).runs} == {1.0}
    assert "3 run(s) that train fused 3 at a time priced one run at a time (no fused measurement for their method" in plan(large).estimate_source()



def test_squads_long_steps_train_alone_and_adapters_price_at_the_step_measured_at_their_length() -> None:
    """SQuAD's 384-token steps keep an H100 busy alone (grouping.LONG_STEP_TOKENS): its runs are planned alone. An
    adapter run prices at the one-run step bench-gpu measured at 384 tokens on BERT-large, not at the 128-token
    row scaled by length (a host-bound step's); top_k, whose backward grows with its depth, stays at the scaled row,
    scaled to the tokens SQuAD's batches are padded to on average (MEAN_PADDED_LENGTH), not to 384."""
    spec = spec_from_dict({**SWEEP, "backbone": "bert-large-uncased", "accelerator": "h100",
                           "sweeps": [{"tasks": ["squad"], "methods": ["adapters:64", "top_k:3"], "learning_rates": [1e-4],
                                       "epochs": [2], "seeds": [0], "max_length": 384}]})
    runs = {run.method["name"]: run for run in plan(spec).runs}
    assert {planned_group_size(run, spec) for run in runs.values()} == {1}
    examples = SWEEP["max_train_examples"] * 2  # SQuAD's training set capped
    assert estimate_hours(runs["adapters"], spec) == pytest.approx(examples / MEASURED_ONE_RUN_AT_LENGTH[
        ("bert-large-uncased", "NVIDIA_H100_80GB", 384)] * EVALUATION_OVERHEAD / 3600)
    scaled = THROUGHPUT[("bert-large-uncased", "NVIDIA_H100_80GB")] * 128 / MEAN_PADDED_LENGTH[("squad", 384, 128, 32)]
    assert estimate_hours(runs["top_k"], spec) == pytest.approx(
        examples / (scaled / MEASURED_PARAMETER_EFFICIENT_STEP_COST[("bert-large-uncased", "NVIDIA_H100_80GB")]) * EVALUATION_OVERHEAD / 3600)
    assert "1 run(s) priced at bench-gpu's one-run step measured at their length" in plan(spec).estimate_source()
    assert "1 run(s) priced at the tokens their task's batches are padded to on average" in plan(spec).estimate_source()


def test_squads_mean_padded_length_is_what_its_data_gives(tmp_path: Path, shared_data_dir: Path) -> None:
    """MEAN_PADDED_LENGTH's SQuAD row is the mean tokens a feature is padded to in the trainer's own batches of the
    local SQuAD files (bench.squad_lengths), at a GPU's pad multiple; far below 384, and above 128."""
    from bench.squad_lengths import write_squad_lengths

    written = write_squad_lengths(tmp_path / "lengths.json", str(shared_data_dir), None, pad_multiple=8)
    assert MEAN_PADDED_LENGTH[("squad", written["max_length"], written["doc_stride"], written["batch_size"])] == written["mean_padded_length"]
    assert 128 < written["mean_padded_length"] < 384 / 2


def test_the_fused_speedups_are_bench_gpus_measurements_over_the_table() -> None:
    """FUSED_SPEEDUP's rows measured on 2026-11-28 are bench/gpu.json's examples/s over the table's one-run throughput
    for the method's step (an adapter step's for the frozen-backbone kind, a full one's for whole models)."""
    measured = json.loads((Path(__file__).resolve().parents[1] / "bench" / "gpu.json").read_text())["h100_2026_11_28"]
    h100 = "NVIDIA_H100_80GB"
    names = {"bert-base": "bert-base-uncased", "bert-large": "bert-large-uncased"}
    for kind, rows, cost in (("frozen_backbone", measured["group_sizes_bert_base_adapters64"], MEASURED_PARAMETER_EFFICIENT_STEP_COST),
                             ("whole_model", measured["whole_model_groups_full_fine_tuning"], {})):
        for row in rows:
            backbone = names[row["backbone"]]
            table = THROUGHPUT[(backbone, h100)] / cost.get((backbone, h100), 1.0)  # a step's cost over a full one's
            assert FUSED_SPEEDUP[kind][backbone][row["k"]] == pytest.approx(row["examples_per_s"] / table, abs=0.01), (kind, row["k"])
