"""Metrics agree with scikit-learn / scipy on known inputs; SQuAD EM/F1 follow the official v1.1 definition."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from adaptune.train.metrics import compute_metrics, normalize_answer, squad_scores

RNG = np.random.default_rng(7)
GOLD = RNG.integers(0, 2, size=200)
PRED = np.where(RNG.random(200) < 0.8, GOLD, 1 - GOLD)


def test_cola_is_matthews_correlation_then_accuracy() -> None:
    result = compute_metrics("cola", PRED, GOLD)
    assert list(result) == ["matthews_correlation", "accuracy"]  # MCC selects; accuracy for Section 3.6 / Figure 6
    assert result["matthews_correlation"] == pytest.approx(skm.matthews_corrcoef(GOLD, PRED))
    assert result["accuracy"] == pytest.approx(skm.accuracy_score(GOLD, PRED))


@pytest.mark.parametrize("task", ["mrpc", "qqp"])
def test_mrpc_qqp_report_f1_then_accuracy(task: str) -> None:
    result = compute_metrics(task, PRED, GOLD)
    assert list(result) == ["f1", "accuracy"]
    assert result["f1"] == pytest.approx(skm.f1_score(GOLD, PRED))
    assert result["accuracy"] == pytest.approx(skm.accuracy_score(GOLD, PRED))


def test_hand_computed_accuracy_and_f1() -> None:
    # 3 of 4 right; positives: tp=1, fp=0, fn=1 -> precision 1, recall 1/2, F1 2/3.
    result = compute_metrics("mrpc", [1, 0, 0, 0], [1, 1, 0, 0])
    assert result == pytest.approx({"f1": 2 / 3, "accuracy": 0.75})


def test_logits_are_argmaxed() -> None:
    logits = np.array([[2.0, -1.0, 0.0], [0.0, 0.1, 3.0], [0.0, 5.0, 1.0]])
    assert compute_metrics("airline", logits, [0, 2, 0])["accuracy"] == pytest.approx(2 / 3)


def test_stsb_spearman_and_pearson_match_scipy() -> None:
    gold = RNG.uniform(0, 5, size=100)
    predicted = gold + RNG.normal(0, 1, size=100)
    result = compute_metrics("stsb", predicted, gold)
    assert list(result) == ["spearman", "pearson"]
    assert result["spearman"] == pytest.approx(stats.spearmanr(predicted, gold)[0])
    assert result["pearson"] == pytest.approx(stats.pearsonr(predicted, gold)[0])


def test_constant_regression_prediction_scores_zero_not_nan() -> None:
    assert compute_metrics("stsb", np.full(5, 2.5), [0.0, 1.0, 2.0, 3.0, 4.0]) == {"spearman": 0.0, "pearson": 0.0}


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="shape"):
        compute_metrics("sst2", [0, 1, 1], [0, 1])


def test_squad_is_not_scored_by_compute_metrics() -> None:
    with pytest.raises(ValueError, match="squad_scores"):
        compute_metrics("squad", [0], [0])


def test_squad_normalisation() -> None:
    assert normalize_answer("  The  Denver Broncos!! ") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words


def test_squad_scores_hand_made_cases() -> None:
    references = {
        "q1": ["Denver Broncos", "The Denver Broncos"],
        "q2": ["Santa Clara, California"],
        "q3": ["1995"],
        "q4": ["gold"],
    }
    predictions = {
        "q1": "the Denver Broncos.",  # exact after normalisation
        "q2": "Santa Clara",  # precision 1, recall 2/3 -> F1 0.8
        "q3": "in 1994",  # no overlap
        # q4: no prediction -> 0, still counted (official script)
    }
    result = squad_scores(predictions, references)
    assert result["exact_match"] == pytest.approx(1 / 4)
    assert result["f1"] == pytest.approx((1 + 0.8 + 0 + 0) / 4)


def test_squad_takes_best_gold_answer() -> None:
    result = squad_scores({"q": "Broncos"}, {"q": ["Denver Broncos", "Broncos"]})
    assert result == {"exact_match": 1.0, "f1": 1.0}


def test_squad_rejects_unknown_ids() -> None:
    with pytest.raises(ValueError, match="not among the references"):
        squad_scores({"zz": "x"}, {"q": ["x"]})
