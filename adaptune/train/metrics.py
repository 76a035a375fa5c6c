"""Task metrics, all as fractions in [0, 1] (correlations in [-1, 1]); never x100.

Classification and regression metrics come from scikit-learn and scipy. SQuAD's exact match and F1
are written by hand after the official v1.1 evaluation script (its answer normalisation and token
F1): no maintained library ships them without downloading the script from the network.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from scipy import stats
from sklearn import metrics as skm

from adaptune.data.tasks import Task, get_task


def compute_metrics(task: Task | str, predictions: Any, references: Any) -> dict[str, float]:
    """The task's metrics, in the task's order (the first one selects the best epoch).

    predictions: class indices, or logits of shape (n, num_classes) (argmax taken); for STS-B the
    predicted scores. references: class indices (STS-B: gold scores).
    """
    task = get_task(task)
    if task.kind == "span":
        raise ValueError("squad is scored with squad_scores(predictions_by_id, answers_by_id), not compute_metrics")
    predicted = np.asarray(predictions)
    gold = np.asarray(references)
    if task.kind == "classification" and predicted.ndim == 2:
        predicted = predicted.argmax(axis=-1)
    if task.kind == "regression" and predicted.ndim == 2 and predicted.shape[1] == 1:
        predicted = predicted[:, 0]
    if predicted.shape != gold.shape:
        raise ValueError(f"{task.name}: predictions have shape {predicted.shape}, references {gold.shape}; they must match")
    if len(gold) == 0:
        raise ValueError(f"{task.name}: no examples to score")
    return {name: float(_METRICS[name](predicted, gold)) for name in task.metrics}


def _correlation(function: Any, predicted: np.ndarray, gold: np.ndarray) -> float:
    # Constant predictions have no defined correlation; scipy returns nan with a warning. Report 0.0
    # (no linear/rank agreement), the convention GLUE leaderboards use for a collapsed model.
    if np.all(predicted == predicted[0]) or np.all(gold == gold[0]):
        return 0.0
    return function(predicted.astype(float), gold.astype(float))[0]


_METRICS = {
    "accuracy": lambda p, g: skm.accuracy_score(g, p),
    "matthews_correlation": lambda p, g: skm.matthews_corrcoef(g, p),
    "f1": lambda p, g: skm.f1_score(g, p, pos_label=1, average="binary", zero_division=0.0),
    "pearson": lambda p, g: _correlation(stats.pearsonr, p, g),
    "spearman": lambda p, g: _correlation(stats.spearmanr, p, g),
}


# ------------------------------------------------------------------------------------- SQuAD v1.1
def normalize_answer(text: str) -> str:
    """Official v1.1 normalisation: lower case, no punctuation, no articles (a/an/the), single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_PUNCTUATION = set(string.punctuation)


def _exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def _token_f1(prediction: str, truth: str) -> float:
    predicted_tokens = normalize_answer(prediction).split()
    true_tokens = normalize_answer(truth).split()
    common = collections.Counter(predicted_tokens) & collections.Counter(true_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted_tokens)
    recall = overlap / len(true_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Iterable[str]]) -> dict[str, float]:
    """{"exact_match", "f1"} over the reference questions, each the max over its gold answers.

    Like the official script, a question without a prediction scores 0 (and is counted).
    """
    if not references:
        raise ValueError("squad_scores: no reference questions to score")
    unknown = set(predictions) - set(references)
    if unknown:
        raise ValueError(f"squad_scores: {len(unknown)} predicted id(s) not among the references, e.g. {sorted(unknown)[:3]}")
    exact = f1 = 0.0
    for question_id, answers in references.items():
        answers = list(answers)
        if not answers:
            raise ValueError(f"squad_scores: question {question_id!r} has no gold answers")
        if question_id not in predictions:
            continue
        prediction = predictions[question_id]
        exact += max(_exact_match(prediction, a) for a in answers)
        f1 += max(_token_f1(prediction, a) for a in answers)
    return {"exact_match": exact / len(references), "f1": f1 / len(references)}
