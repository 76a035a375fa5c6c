"""A small *real* result set for the results-store, report and notebook tests.

Tiny real runs of the training engine on the shared data (Crowdflower disasters: an extra task with a
test split; SST-2: GLUE, its validation slice held out of train.tsv and dev.tsv as its test split), covering every method, two adapter sizes, two seeds, two
learning rates and two init stds, plus one run whose learning rate is absurd on purpose so that the
set holds a real failure. Records are memoised per process and the engine skips runs already
finished in the work dir, so the three test modules train once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

# Set to a fixed directory to keep the trained runs between pytest sessions (the engine skips runs
# already finished there); by default they live in pytest's session temp dir.
WORK_DIR_ENV = "ADAPTUNE_TEST_RUNS_DIR"

# (task, method, lr, seed): small on purpose (128 examples, 2 epochs, max length 32).
RUN_GRID: tuple[tuple[str, dict[str, Any], float, int], ...] = (
    ("disasters", {"name": "full"}, 2e-4, 0),
    ("disasters", {"name": "full"}, 1e-4, 0),
    ("disasters", {"name": "adapters", "size": 64, "init_std": 1e-2}, 3e-3, 0),
    ("disasters", {"name": "adapters", "size": 64, "init_std": 1e-2}, 3e-3, 1),
    ("disasters", {"name": "adapters", "size": 64, "init_std": 1e-1}, 3e-3, 0),  # init far from identity: a real "degenerate" record
    ("disasters", {"name": "adapters", "size": 8, "init_std": 1e-2}, 3e-3, 0),
    ("disasters", {"name": "layernorm"}, 3e-3, 0),
    ("disasters", {"name": "full"}, 1e6, 0),  # diverges: a real "failed" record
    ("sst2", {"name": "full"}, 3e-4, 0),  # lower rates collapse to one class on 128 examples in 2 epochs
    ("sst2", {"name": "adapters", "size": 64, "init_std": 1e-2}, 3e-3, 0),
)

_MEMO: dict[str, list[dict[str, Any]]] = {}


def constructed_runs(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A runs frame (runs.parquet's columns, through results.run_row) of records never trained, for rules
    that must be tested on chosen numbers. Each row: task, method (dict), lr, seed, val (fraction);
    optional test (None: no labelled test split), epochs (3), status ("ok"), backbone (bert-base-uncased).
    Trained parameters: 100% for full fine-tuning, 2% for adapters (of 1,000,000), 0.1% for LayerNorm, 0.01% for the head;
    beside the paper's methods, 1% for Pfeiffer adapters, 0.2% for LoRA and 0.05% for (IA)3."""
    from adaptune.report.results import run_row
    from adaptune.train.config import TrainConfig
    from adaptune.train.record import run_record

    base = 1_000_000
    trained = {"full": base, "adapters": base // 50, "layernorm": base // 1000, "head": base // 10000, "pfeiffer": base // 100,
               "lora": base // 500, "ia3": base // 2000}
    frame = []
    for row in rows:
        config = TrainConfig(task=row["task"], method=row["method"], lr=row["lr"], seed=row["seed"], epochs=row.get("epochs", 3),
                             backbone=row.get("backbone", "bert-base-uncased"), experiment="constructed")
        record = run_record(config, "accuracy")
        name = row["method"]["name"]
        record.update(status=row.get("status", "ok"), val_metrics={"accuracy": row["val"]},
                      test_metrics={} if row.get("test") is None else {"accuracy": row["test"]},
                      trained_params=trained[name], total_params=base + (trained[name] if name not in ("full", "layernorm", "head") else 0))
        frame.append(run_row(record))
    return pd.DataFrame(frame)


def build_real_records(work_dir: Path, data_dir: Path, backbone: str) -> list[dict[str, Any]]:
    from adaptune.train.config import TrainConfig
    from adaptune.train.loop import train_and_evaluate

    key = str(work_dir)
    if key not in _MEMO:
        records = []
        for task, method, lr, seed in RUN_GRID:
            config = TrainConfig(
                task=task, method=method, lr=lr, seed=seed, epochs=2, batch_size=16, max_length=32,
                max_train_examples=128, max_eval_examples=64, backbone=backbone, experiment="report_test",
            )
            records.append(
                train_and_evaluate(
                    config, data_dir=data_dir, out_dir=work_dir / "runs" / config.run_id,
                    cache_dir=work_dir / "cache", progress=False,
                )
            )
        _MEMO[key] = records
    return _MEMO[key]


@pytest.fixture(scope="session")
def real_records(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path, backbone_path: str) -> list[dict[str, Any]]:
    return build_real_records(_work_dir(tmp_path_factory), shared_data_dir, backbone_path)


def build_real_ablation(records: list[dict[str, Any]], work_dir: Path, data_dir: Path) -> list[dict[str, Any]]:
    """Figure 6's spans on the first usable adapters run (6 layers: 21 spans of 64 validation examples)."""
    from adaptune.train.ablation import ablate

    key = f"ablation:{work_dir}"
    if key not in _MEMO:
        run = next(r for r in records if r["method"]["name"] == "adapters" and r["status"] == "ok")
        _MEMO[key] = ablate(run["checkpoint_dir"], data_dir=data_dir, cache_dir=work_dir / "cache")
    return _MEMO[key]


@pytest.fixture(scope="session")
def real_ablation(real_records: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> list[dict[str, Any]]:
    return build_real_ablation(real_records, _work_dir(tmp_path_factory), shared_data_dir)


@pytest.fixture(scope="session")
def real_results_dir(real_records: list[dict[str, Any]], real_ablation: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real records and ablation written to a results store (read-only for tests: copy before changing)."""
    from adaptune.report.results import write_results

    out = tmp_path_factory.mktemp("real_store")
    write_results(real_records, out, ablation=real_ablation)
    return out


def _work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get(WORK_DIR_ENV) or tmp_path_factory.getbasetemp() / "real_results")
