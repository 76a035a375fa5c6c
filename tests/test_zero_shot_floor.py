"""The backbone's zero-shot similarity floor (adaptune/report/zero_shot.py) on real MRPC, and the report's floors:
no line says a method stands above a floor that is above it; a backbone that is no sentence encoder gets no such
floor, and the report says why once.

The mirror here holds MRPC (not STS-B or QQP). Subsets are the smoke experiment's (384 training, 128 evaluation
rows), so the real embedding stays within seconds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adaptune.core.backbones import BERT_BASE, DEFAULT_BACKBONE, SENTENCE_ENCODERS
from adaptune.report import build_report
from adaptune.report.baselines import majority_baseline
from adaptune.report.claims import claims_table
from adaptune.report.methods_table import methods_markdown, methods_table
from adaptune.report.reference import load_reference
from adaptune.report.results import read_results, write_results
from adaptune.report.tables import table1, table1_markdown
from adaptune.report.zero_shot import (
    THRESHOLD_SPLIT,
    best_threshold,
    pair_cosines,
    zero_shot_floor,
    zero_shot_reason,
)

MAX_TRAIN, MAX_EVAL = 384, 128  # the smoke experiment's subsets
FULL, LAYERNORM, HEAD = {"name": "full"}, {"name": "layernorm"}, {"name": "head"}


def _records(rows: list[dict[str, Any]], backbone: str) -> list[dict[str, Any]]:
    """Run records (never trained) on chosen numbers, with the smoke experiment's subsets in their config."""
    from adaptune.train.config import TrainConfig
    from adaptune.train.record import run_record

    records = []
    for row in rows:
        config = TrainConfig(task=row["task"], method=row["method"], lr=row["lr"], seed=row["seed"], epochs=3, backbone=backbone,
                             experiment="constructed", max_train_examples=MAX_TRAIN, max_eval_examples=MAX_EVAL)
        record = run_record(config, "f1")
        record.update(status="ok", val_metrics={"f1": row["val"], "accuracy": row["val"]},
                      test_metrics={"f1": row["test"], "accuracy": row["test"]}, trained_params=1000, total_params=1_000_000)
        records.append(record)
    return records


def test_mrpc_zero_shot_floor_is_a_real_metric_its_threshold_chosen_on_train(shared_data_dir: Path) -> None:
    floors = {split: zero_shot_floor("mrpc", DEFAULT_BACKBONE, split, MAX_TRAIN, MAX_EVAL, shared_data_dir)
              for split in ("validation", "test")}
    for split, floor in floors.items():
        assert floor is not None and floor.rows == MAX_EVAL and floor.split == split
        assert set(floor.metrics) == {"f1", "accuracy"}
        assert 0.6 < floor.metrics["accuracy"] < 1.0 and 0.6 < floor.metrics["f1"] < 1.0
        majority = majority_baseline("mrpc", split, MAX_TRAIN, MAX_EVAL, shared_data_dir)
        assert majority is not None
        # Measured: the untrained encoder beats predicting "equivalent" for every pair, on both metrics.
        assert floor.metrics["accuracy"] > majority["accuracy"] and floor.metrics["f1"] > majority["f1"]
        # Chosen on the runs' training subset, by the task's primary metric, and said so.
        assert floor.threshold_rows == MAX_TRAIN and floor.threshold_metric == "f1"
        assert f"{MAX_TRAIN} {THRESHOLD_SPLIT} rows" in floor.selected()
    validation, test = floors["validation"], floors["test"]
    assert validation is not None and test is not None
    assert validation.threshold == test.threshold  # one threshold, from train, for both
    trained = pair_cosines(DEFAULT_BACKBONE, "mrpc", THRESHOLD_SPLIT, MAX_TRAIN, str(shared_data_dir.resolve()))
    assert trained is not None
    cosines, gold = trained
    assert len(gold) == MAX_TRAIN and np.all(np.abs(cosines) <= 1 + 1e-9)
    assert test.threshold == best_threshold(cosines, gold, "f1")
    # Paraphrases sit closer than non-paraphrases: the cosine carries the label.
    assert cosines[gold == 1].mean() > cosines[gold == 0].mean()


def test_best_threshold_maximises_the_metric_at_a_realisable_cut() -> None:
    cosines = np.array([0.9, 0.8, 0.8, 0.5, 0.2])
    gold = np.array([1, 1, 0, 0, 0])
    # Accuracy: cutting between the tied 0.8s is impossible; above 0.8 (only 0.9): 4/5; at 0.8: 4/5 too; the higher wins.
    assert best_threshold(cosines, gold, "accuracy") == pytest.approx(0.9)
    assert best_threshold(cosines, gold, "f1") == pytest.approx(0.8)  # F1 0.8 at 0.8, 0.67 at 0.9
    assert best_threshold(np.array([0.3, 0.1]), np.array([0, 0]), "accuracy") > 0.3  # nothing positive
    with pytest.raises(ValueError):
        best_threshold(cosines, gold, "spearman")


def test_only_a_sentence_encoder_on_a_similarity_task_gets_the_floor(shared_data_dir: Path) -> None:
    assert DEFAULT_BACKBONE in SENTENCE_ENCODERS and BERT_BASE not in SENTENCE_ENCODERS
    assert zero_shot_floor("mrpc", BERT_BASE, "test", MAX_TRAIN, MAX_EVAL, shared_data_dir) is None
    assert "not a sentence encoder" in (zero_shot_reason("mrpc", BERT_BASE) or "")
    assert zero_shot_floor("rte", DEFAULT_BACKBONE, "test", MAX_TRAIN, MAX_EVAL, shared_data_dir) is None  # inference
    assert "not a similarity task" in (zero_shot_reason("rte", DEFAULT_BACKBONE) or "")
    assert zero_shot_floor("sms_spam", DEFAULT_BACKBONE, "test", MAX_TRAIN, MAX_EVAL, shared_data_dir) is None
    assert zero_shot_reason("stsb", DEFAULT_BACKBONE) is None  # applies; this mirror has no STS-B files:
    assert zero_shot_floor("stsb", DEFAULT_BACKBONE, "test", data_dir=shared_data_dir) is None


def _below_floor_rows(floor_val: float, floor_test: float) -> list[dict[str, Any]]:
    """MRPC runs whose every method scores 3-5 points under the zero-shot floor; the head alone 10 under."""
    return [{"task": "mrpc", "method": method, "lr": lr, "seed": seed, "val": floor_val - gap + 0.001 * seed,
             "test": floor_test - gap + 0.001 * seed}
            for method, lr, gap in ((FULL, 3e-5, 0.03), (LAYERNORM, 3e-3, 0.05), (HEAD, 1e-2, 0.10)) for seed in range(3)]


def test_a_report_never_puts_a_method_above_a_floor_that_is_above_it(shared_data_dir: Path, tmp_path: Path) -> None:
    val = zero_shot_floor("mrpc", DEFAULT_BACKBONE, "validation", MAX_TRAIN, MAX_EVAL, shared_data_dir)
    test = zero_shot_floor("mrpc", DEFAULT_BACKBONE, "test", MAX_TRAIN, MAX_EVAL, shared_data_dir)
    assert val is not None and test is not None
    write_results(_records(_below_floor_rows(val.metrics["f1"], test.metrics["f1"]), DEFAULT_BACKBONE), tmp_path / "results")
    runs = read_results(tmp_path / "results")["runs"]

    table = methods_table(runs, data_dir=shared_data_dir)
    assert list(table["zero_shot"]) == pytest.approx([100 * test.metrics["f1"]] * len(table))
    assert (table["zero_shot_selected"] == test.selected()).all()
    markdown = methods_markdown(table)
    assert "zero-shot similarity" in markdown.splitlines()[0]
    zero = f"{100 * test.metrics['f1']:.1f}"
    assert f"mrpc: the zero-shot similarity ({zero}) beats every trained method" in markdown
    assert re.search(rf"mrpc: below the zero-shot similarity \({zero}\): Full fine-tuning [\d.]+, LayerNorm only [\d.]+, the head alone", markdown)

    # Table 1 (MRPC is a GLUE column): each row's floor on its run's own reported split and subsets.
    first = table1(runs, load_reference(), data_dir=shared_data_dir)
    mrpc = first[(first["task"] == "mrpc") & first["measured"].notna()]
    assert set(mrpc["row"]) == {"head", "full"}
    for _, row in mrpc.iterrows():
        assert row["zero_shot"] == pytest.approx(100 * {"validation": val, "test": test}[row["split"]].metrics["f1"])
    markdown1 = table1_markdown(first, runs)
    assert [line.split("|")[2].strip() for line in markdown1.splitlines() if line.startswith("|") and "zero-shot" in line] == [
        "zero-shot similarity"] * 2
    # Under Table 1 in words: the floor above every trained row, and each row below it (the head alone's 10 under).
    assert f"mrpc: the zero-shot similarity ({zero}) beats every trained method" in markdown1
    assert re.search(rf"mrpc: below the zero-shot similarity \({zero}\): Full fine-tuning [\d.]+, the head alone", markdown1)

    detail = claims_table({"runs": runs}, load_reference(), data_dir=shared_data_dir).set_index("claim_id").loc[
        "layernorm_clearly_worse", "detail"]
    assert f"the highest floor is the zero-shot similarity floor (frozen backbone, mean-pooled cosine) ({100 * val.metrics['f1']:.2f}" in detail
    assert "(LayerNorm-only, full fine-tuning below the zero-shot similarity floor" in detail
    assert "margin over the head alone" not in detail and "higher than the head alone (frozen backbone, trained head)" in detail

    report = build_report(tmp_path / "results", tmp_path / "out", data_dir=shared_data_dir).read_text()
    assert "margin over the head alone (frozen backbone, trained head), by the same selection" not in report
    assert f"mrpc: the zero-shot similarity ({zero}) beats every trained method" in report
    assert "Zero-shot similarity floor (the frozen backbone as a sentence encoder, no training): mrpc:" in report


def test_a_bert_backbone_gets_no_zero_shot_row_and_the_reason_once(shared_data_dir: Path, tmp_path: Path) -> None:
    rows = [{"task": "mrpc", "method": method, "lr": lr, "seed": seed, "val": val, "test": val}
            for method, lr, val in ((FULL, 3e-5, 0.85), (HEAD, 1e-2, 0.82)) for seed in range(2)]
    write_results(_records(rows, BERT_BASE), tmp_path / "results")
    runs = read_results(tmp_path / "results")["runs"]
    table = methods_table(runs, data_dir=shared_data_dir)
    assert table["zero_shot"].isna().all()
    first = table1(runs, load_reference(), data_dir=shared_data_dir)
    assert first["zero_shot"].isna().all() and "zero-shot" not in table1_markdown(first, runs)
    markdown = methods_markdown(table)
    assert "zero-shot similarity" not in markdown.splitlines()[0]
    assert markdown.count("not a sentence encoder") == 1
    assert f"No zero-shot similarity floor on mrpc: `{BERT_BASE}` is not a sentence encoder" in markdown


def test_a_regression_floor_is_the_cosines_correlation_with_the_scores_nothing_selected(stsb_mirror: Path) -> None:
    """STS-B's path (no STS-B copy offline: the conftest's mirror scores MRPC's real pairs 0-5 by word overlap): the
    floor is Spearman and Pearson of the pairs' cosines against the gold scores on the reported split, no threshold.
    Checked against sentence-transformers and scipy called here on the same 40 dev pairs."""
    from scipy.stats import pearsonr, spearmanr
    from sentence_transformers import SentenceTransformer

    from adaptune.model.backbone import resolve_backbone

    floor = zero_shot_floor("stsb", DEFAULT_BACKBONE, "test", data_dir=stsb_mirror)
    assert floor is not None and floor.rows == 40 and floor.threshold is None
    assert floor.selected() == "nothing selected (the cosine is the prediction)"
    lines = (stsb_mirror / "glue" / "STS-B" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    first, second, gold = zip(*((line.split("\t")[7], line.split("\t")[8], float(line.split("\t")[9])) for line in lines), strict=True)
    encoder = SentenceTransformer(resolve_backbone(DEFAULT_BACKBONE), device="cpu")
    a, b = (encoder.encode(list(texts), normalize_embeddings=True, show_progress_bar=False) for texts in (first, second))
    cosines = (np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)).sum(axis=1)
    assert floor.metrics["spearman"] == pytest.approx(spearmanr(cosines, gold).statistic, abs=1e-6)
    assert floor.metrics["pearson"] == pytest.approx(pearsonr(cosines, gold).statistic, abs=1e-6)
    assert floor.metrics["spearman"] > 0.5  # word overlap and meaning agree on most of these pairs
