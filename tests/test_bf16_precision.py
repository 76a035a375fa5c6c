"""The bf16 path, the default on a CPU with native bf16: what it keeps equal and how far apart it leaves the rest,
at the gaps bench/bf16_gap.py measures (float32's equalities are tests/test_fused_groups.py's and
tests/test_bundle.py's). Skipped, with the reason, on a CPU without native bf16, where bf16 is never the default.

- A run alone scored in bf16, bundled: predict computes in the run's precision (the manifest says bf16) and its
  predictions score exactly what the run recorded; in float32 its logits move.
- A fused group's runs in bf16 against the same runs alone: not equal (bf16 rounds the group's batched matmuls
  otherwise), within BF16_FUSED_POINTS of each other.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from adaptune.core.devices import native_cpu_bf16

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bundle"),
              pytest.mark.skipif(not native_cpu_bf16(), reason="this CPU has no native bf16 (avx512_bf16 or AMX): bf16 is "
                                 "emulated here, many times slower, and never the default")]

# tests/test_bundle.py's runs: small enough for seconds, large enough not to collapse to one class (32 steps).
SMALL = dict(task="sst2", epochs=2, max_length=64, max_train_examples=128, max_eval_examples=64, batch_size=8, experiment="test_bf16")
# The largest |fused - alone| validation or test score in bf16, in points: measured up to 0.9 (validation) and 0.6
# (test) on two tasks of 1,000 training rows, groups of 4 (issue 64); bench/bf16_gap.py measures it here. The bound
# is about twice that, so rounding passes and a run scored on another run's rows, batches or seed does not.
BF16_MEASURED_POINTS = 0.9
BF16_FUSED_POINTS = 2.0


def test_a_bf16_runs_bundle_predicts_in_bf16_and_reproduces_its_record(tmp_path: Path, shared_data_dir: Path,
                                                                       patch_settings: Callable[..., object]) -> None:
    from adaptune.cli import main
    from adaptune.data.batching import subsample
    from adaptune.data.loading import load_task_data
    from adaptune.train.config import TrainConfig
    from adaptune.train.loop import train_and_evaluate
    from adaptune.train.metrics import compute_metrics

    patch_settings(cpu_bf16="1")
    config = TrainConfig(method={"name": "adapters", "size": 8}, lr=3e-3, seed=0, **SMALL)
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "store" / "runs" / config.run_id, progress=False)
    assert record["status"] == "ok" and record["device"] == "cpu:bf16"
    assert main(["bundle", "--runs-root", str(tmp_path / "store"), "--select", "best", "--out", str(tmp_path / "b"), "--tasks", "sst2"]) == 0
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["tasks"]["sst2"]["precision"] == "bf16"

    validation = subsample(load_task_data("sst2", shared_data_dir)["validation"], SMALL["max_eval_examples"])
    inputs = tmp_path / "sst2.jsonl"
    inputs.write_text("".join(json.dumps({"sentence": row["text_a"]}) + "\n" for row in validation))
    served = {}
    for precision in ("run", "float32"):
        out = tmp_path / f"{precision}.jsonl"
        assert main(["predict", "--bundle", str(tmp_path / "b"), "--task", "sst2", "--input", str(inputs), "--output", str(out),
                     "--precision", precision]) == 0
        served[precision] = [json.loads(line) for line in out.read_text().splitlines()]
    labels = list(validation["label"])
    scored = compute_metrics("sst2", [p["label_id"] for p in served["run"]], labels)
    assert scored == record["val_metrics"]  # the run's own bf16 evaluation, reproduced
    moved = max(abs(a - b) for p, q in zip(served["run"], served["float32"], strict=True) for a, b in zip(p["logits"], q["logits"], strict=True))
    assert 0 < moved < 0.1  # float32 is another computation: bf16 rounding apart, no more


def test_bf16_fused_runs_stay_within_the_measured_gap_of_their_runs_alone(tmp_path: Path, shared_data_dir: Path,
                                                                          patch_settings: Callable[..., object]) -> None:
    from adaptune.train.config import TrainConfig
    from adaptune.train.group_loop import train_group
    from adaptune.train.loop import train_and_evaluate

    patch_settings(cpu_bf16="1")
    configs = [TrainConfig(method={"name": "adapters", "size": 8}, lr=lr, seed=seed, **SMALL) for lr, seed in ((1e-3, 0), (3e-3, 1))]
    fused = train_group(configs, [tmp_path / "group" / config.run_id for config in configs], data_dir=shared_data_dir)
    alone = [train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "alone" / config.run_id, progress=False)
             for config in configs]
    for grouped, solo in zip(fused, alone, strict=True):
        assert grouped["device"] == solo["device"] == "cpu:bf16" and grouped["group_size"] == 2
        for split in ("val_metrics", "test_metrics"):
            for metric, value in solo[split].items():
                assert abs(100 * (grouped[split][metric] - value)) <= BF16_FUSED_POINTS, (split, metric)
        assert grouped["curve"][-1]["train_loss"] == pytest.approx(solo["curve"][-1]["train_loss"], abs=0.05)
