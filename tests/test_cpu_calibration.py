"""A CPU plan with no store records priced by this machine's `make bench-peer` result (issue 84): the table's rate
scaled by the benchmark's measured rate over the table's price of the benchmark's own runs, the basis said; the
table alone, with the reason, where the JSON is another CPU's, malformed or absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptune.sweep.cpu_calibration import CpuIdentity, calibration_from_bench, table_price, this_cpu
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.throughput import measure_on
from bench.peer import calibration_entry

HERE = CpuIdentity("AVX2", "float32", 2)


def _bench(path: Path, cpu: CpuIdentity, examples_per_s: float) -> Path:
    """A bench-peer result as bench.peer writes it: the project's round and the entry made from it."""
    rounds = [{"group_sizes": [4], "examples_per_s_in_runs": examples_per_s},
              {"group_sizes": [4], "examples_per_s_in_runs": examples_per_s / 2}]
    path.write_text(json.dumps({"date": "2026-12-08", "cpu_capability": cpu.capability, "precision": cpu.precision,
                                "cores": cpu.cores, "methods": {"adapters": {"calibration": calibration_entry("adapters", rounds)}}}))
    return path


def test_this_cpus_benchmark_scales_the_table_by_its_measured_rate(tmp_path: Path) -> None:
    spec = get_experiment("smoke")
    bench = _bench(tmp_path / "peer.json", HERE, 60.0)
    calibration = calibration_from_bench(bench, spec, HERE)
    entry = json.loads(bench.read_text())["methods"]["adapters"]["calibration"]
    assert entry["examples_per_s"] == 60.0  # the fastest round
    assert calibration.factor == pytest.approx(60.0 / table_price(entry, spec))
    table, scaled = plan(spec), plan(spec, cpu_calibration=calibration)
    for run in table.runs:
        assert scaled.run_hours[run.run_id] == pytest.approx(table.run_hours[run.run_id] / calibration.factor)
    assert [shard.id for shard in scaled.shards] == [shard.id for shard in table.shards]  # packing is the table's
    basis = scaled.summary()
    assert f"scaled x{calibration.factor:.2f} to this CPU (AVX2, float32, 2 cores) by {tmp_path.name}/peer.json of 2026-12-08" in basis
    assert "adapters fused 4 at a time 60.0 examples/s" in basis


@pytest.mark.parametrize("other", [CpuIdentity("AVX512", "float32", 2), CpuIdentity("AVX2", "bf16", 2),
                                   CpuIdentity("AVX2", "float32", 16)])
def test_another_cpus_benchmark_leaves_the_table_and_says_why(tmp_path: Path, other: CpuIdentity) -> None:
    spec = get_experiment("smoke")
    calibration = calibration_from_bench(_bench(tmp_path / "peer.json", other, 60.0), spec, HERE)
    assert calibration.factor is None
    table, said = plan(spec), plan(spec, cpu_calibration=calibration)
    assert said.run_hours == table.run_hours
    assert (f"; the table's CPU rate not scaled to this machine: {tmp_path.name}/peer.json measured another CPU "
            f"({other.describe()}; this one: {HERE.describe()}): make bench-peer measures this one") in said.summary()


def test_a_missing_or_malformed_benchmark_is_one_reason_not_an_error(tmp_path: Path) -> None:
    spec = get_experiment("smoke")
    assert calibration_from_bench(tmp_path / "absent.json", spec, HERE).basis.startswith("no ")
    (tmp_path / "peer.json").write_text('{"cores": 2}')
    malformed = calibration_from_bench(tmp_path / "peer.json", spec, HERE)
    assert malformed.factor is None and "is not a bench-peer result this version reads" in malformed.basis


def test_the_stores_records_price_their_runs_before_any_benchmark(tmp_path: Path) -> None:
    """A run a store's record measured keeps the record's price; only the table's rates are scaled."""
    spec = get_experiment("smoke")
    run = plan(spec).runs[0]
    record = {"status": "ok", "wall_time_s": 100.0, "split_sizes": {"train": 500}, "epochs": 2, "config": {"max_length": 128},
              "backbone": run.backbone, "method": run.method, "device": "cpu:bf16" if this_cpu("auto").precision == "bf16" else "cpu"}
    measured = measure_on([record], spec.accelerator)
    calibration = calibration_from_bench(_bench(tmp_path / "peer.json", HERE, 60.0), spec, HERE)
    with_records = plan(spec, measured)
    both = plan(spec, measured, cpu_calibration=calibration)
    priced_by_record = [r.run_id for r in with_records.runs if r.method["name"] == run.method["name"]]
    assert priced_by_record and all(both.run_hours[i] == with_records.run_hours[i] for i in priced_by_record)


def test_a_gpu_plan_is_not_scaled_by_a_cpu_benchmark(tmp_path: Path) -> None:
    spec = get_experiment("glue_full")
    calibration = calibration_from_bench(_bench(tmp_path / "peer.json", HERE, 60.0), spec, HERE)
    assert plan(spec, cpu_calibration=calibration).run_hours == plan(spec).run_hours


def test_make_plan_reads_this_checkouts_benchmark_for_a_cpu_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import pipelines.__main__ as entry

    monkeypatch.setattr(entry, "BENCH_PEER_JSON", _bench(tmp_path / "peer.json", this_cpu("auto"), 60.0))
    assert entry.main(["plan", "smoke"]) == 0
    (basis,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("estimate basis: ")]
    assert basis.startswith("estimate basis: throughput from adaptune.sweep.cost.THROUGHPUT scaled x")
    assert f"by {tmp_path.name}/peer.json of 2026-12-08" in basis
