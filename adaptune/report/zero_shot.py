"""The frozen backbone's zero-shot similarity floor: what a sentence encoder scores on a task comparing two
sentences with no training at all, used as the sentence encoder it was trained to be.

Where it applies: the backbone is a sentence encoder (`core.backbones.SENTENCE_ENCODERS`: the embedded
all-MiniLM-L6-v2; BERT is not one) and the task is a similarity task (`SIMILARITY_TASKS`): a pair task whose label
says how alike its two texts are, the same in either order: MRPC (paraphrase), QQP (duplicate question), STS-B
(a similarity score). The registry's other pair tasks are inference (RTE, MNLI, QNLI, WNLI): their label is
directional (does the first text entail the second, does the sentence answer the question), which a cosine between
the two cannot express, so they get no such floor.

How: each text of a pair is embedded alone by sentence-transformers from the model's own files (modules.json:
Transformer -> mean Pooling -> Normalize): the attention-mask-weighted mean of the last hidden state, truncated at
the encoder's own `max_seq_length` (sentence_bert_config.json: 256); the pair's score is the cosine of its two
embeddings.

- A regression task (STS-B): the task's metrics (Spearman, Pearson: adaptune.train.metrics) of the cosine against
  the gold scores, on the reported split. Nothing is selected.
- A classification task (MRPC, QQP): a pair is predicted positive where its cosine is at or above a threshold
  chosen on the TRAINING split, the one that maximises the task's primary metric (F1 for both) there; it is then
  applied, unchanged, to the reported split. The training rows it is chosen on are the runs' own seeded training
  subset (`max_train_examples`), at most THRESHOLD_MAX_ROWS of it (the same seeded shuffle, so a prefix of it):
  QQP's 327k training pairs would take an hour to embed on a CPU, and a threshold is one number.

The reported split is read on the runs' subset (`max_eval_examples`), exactly as the majority-class baseline
(baselines.py) reads it, from the same data dir (a local mirror or the pipeline's prepared folder; never the hub).
Cosines are cached per (backbone, task, split, rows, data dir) for the life of the process, so one report embeds
each split once: MRPC's 3,302 training and 408 dev pairs take about a minute on 2 CPU cores.

The backbone's training data may hold the task's own source: all-MiniLM-L6-v2's data_config.json lists Quora
duplicate triplets, so on QQP its floor is zero-shot for this project (no step of ours trained it), not for the
backbone. torch and transformers are imported only when a floor is computed.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from adaptune.core.backbones import SENTENCE_ENCODERS
from adaptune.data.tasks import UnknownTaskError, get_task

# Pair tasks whose label is a symmetric similarity of the two texts -> what it says.
SIMILARITY_TASKS = {"mrpc": "paraphrase", "qqp": "duplicate question", "stsb": "similarity score"}
THRESHOLD_SPLIT = "train"
THRESHOLD_MAX_ROWS = 4000
NAME = "zero-shot similarity (frozen backbone, mean-pooled cosine)"
SHORT_NAME = "the zero-shot similarity floor"
_BATCH = 64


@dataclasses.dataclass(frozen=True)
class ZeroShotFloor:
    """The floor on one task and split: the task's metrics (fractions, as metrics.py gives), and for a classification
    task the threshold and where it was chosen."""

    task: str
    backbone: str
    split: str
    rows: int
    metrics: dict[str, float]
    threshold: float | None = None  # cosine at or above which a pair is predicted positive (classification)
    threshold_metric: str | None = None  # the metric it maximises on the training rows
    threshold_rows: int | None = None  # training rows it was chosen on
    threshold_score: float | None = None  # that metric on those rows, at the threshold

    def selected(self) -> str:
        """What was selected on which split, in words."""
        if self.threshold is None:
            return "nothing selected (the cosine is the prediction)"
        return (f"threshold cosine >= {self.threshold:.4f}, chosen on {self.threshold_rows:,} {THRESHOLD_SPLIT} rows to maximise "
                f"{self.threshold_metric} ({100 * (self.threshold_score or 0):.2f} there)")


def similarity_task(task_name: str) -> bool:
    try:
        task = get_task(task_name)
    except UnknownTaskError:
        return False
    return task.name in SIMILARITY_TASKS and task.is_pair


def is_sentence_encoder(backbone: Any) -> bool:
    return str(backbone) in SENTENCE_ENCODERS


def zero_shot_reason(task_name: str, backbone: Any) -> str | None:
    """None where the floor applies; else why not, in words."""
    if not is_sentence_encoder(backbone):
        return (f"`{backbone}` is not a sentence encoder (one trained to be mean-pooled and compared by cosine: "
                f"{', '.join(sorted(SENTENCE_ENCODERS))})")
    if not similarity_task(task_name):
        return f"{task_name} is not a similarity task ({', '.join(sorted(SIMILARITY_TASKS))})"
    return None


def zero_shot_floor(task_name: str, backbone: Any, split: str, max_train_examples: int | None = None,
                    max_eval_examples: int | None = None, data_dir: str | Path | None = None) -> ZeroShotFloor | None:
    """The floor on `split` (the runs' `max_eval_examples` subset), its threshold chosen on the runs' training subset;
    None where it does not apply (zero_shot_reason) or the local data lacks the task's train or `split` rows."""
    if zero_shot_reason(task_name, backbone) is not None:
        return None
    root = _data_root(task_name, data_dir)
    if root is None:
        return None
    return _zero_shot_floor(get_task(task_name).name, str(backbone), split, max_train_examples, max_eval_examples, root)


def run_zero_shot(task_name: str, run: Any, metric: str, split: str, data_dir: str | Path | None = None) -> float | None:
    """The floor in percent for `metric` on the reported `split`, on the subsets the run's config used and its
    backbone (`baselines.run_baseline`'s twin); None where it cannot be computed."""
    floor = run_floor(task_name, run, split, data_dir)
    value = None if floor is None else floor.metrics.get(metric)
    return None if value is None else 100.0 * float(value)


def run_floor(task_name: str, run: Any, split: str, data_dir: str | Path | None = None) -> ZeroShotFloor | None:
    """The floor itself for a run's task, backbone, subsets and the reported `split`."""
    config = json.loads(run["config_json"]) if isinstance(run.get("config_json"), str) else {}
    return zero_shot_floor(task_name, run.get("backbone"), split, config.get("max_train_examples"),
                           config.get("max_eval_examples"), data_dir)


def _data_root(task_name: str, data_dir: str | Path | None) -> str | None:
    """The data dir as a string where it holds the task (the majority baseline's test), else None."""
    from adaptune.data.prepared import PreparedData, is_prepared
    from adaptune.data.sources import local_files_status
    from adaptune.report.baselines import found_data_dir

    found = found_data_dir(data_dir)
    if found is None:
        return None
    root, task = Path(found), get_task(task_name)
    available = PreparedData.open(root).holds(task) if is_prepared(root) else local_files_status(task, root) == "yes"
    return str(root) if available else None


@lru_cache(maxsize=256)
def _zero_shot_floor(task_name: str, backbone: str, split: str, max_train: int | None, max_eval: int | None,
                     root: str) -> ZeroShotFloor | None:
    from adaptune.train.metrics import compute_metrics

    task = get_task(task_name)
    evaluated = pair_cosines(backbone, task_name, split, max_eval, root)
    if evaluated is None:
        return None
    cosines, gold = evaluated
    if task.kind == "regression":
        return ZeroShotFloor(task_name, backbone, split, len(gold), compute_metrics(task, cosines, gold))
    threshold_rows = THRESHOLD_MAX_ROWS if max_train is None else min(max_train, THRESHOLD_MAX_ROWS)
    trained = pair_cosines(backbone, task_name, THRESHOLD_SPLIT, threshold_rows, root)
    if trained is None:
        return None
    train_cosines, train_gold = trained
    threshold = best_threshold(train_cosines, train_gold, task.primary_metric)
    on_train = compute_metrics(task, (train_cosines >= threshold).astype(int), train_gold)
    return ZeroShotFloor(task_name, backbone, split, len(gold), compute_metrics(task, (cosines >= threshold).astype(int), gold),
                         threshold=threshold, threshold_metric=task.primary_metric, threshold_rows=len(train_gold),
                         threshold_score=on_train[task.primary_metric])


def best_threshold(cosines: np.ndarray, gold: np.ndarray, metric: str) -> float:
    """The cosine threshold (predict positive at or above it) that maximises `metric` ("f1" or "accuracy") of binary
    labels `gold`; every cut between two distinct cosines is tried, and the cut above them all (nothing positive).
    Ties between cuts: the higher threshold. Each threshold is a cosine seen (or just above the highest)."""
    if metric not in ("f1", "accuracy"):
        raise ValueError(f"a threshold is chosen on f1 or accuracy, not {metric!r}")
    order = np.argsort(-cosines, kind="stable")
    ranked, labels = cosines[order], gold[order].astype(int)
    positives, total = int(labels.sum()), len(labels)
    true_positives = np.concatenate([[0], np.cumsum(labels)])  # predicting the top k positive, k = 0..n
    predicted = np.arange(total + 1)
    cut = np.concatenate([[True], ranked[:-1] > ranked[1:], [True]])  # k where ranked[k-1] > ranked[k]: realisable
    if metric == "f1":
        scores = np.where(predicted + positives > 0, 2 * true_positives / np.maximum(predicted + positives, 1), 0.0)
    else:
        scores = (true_positives + (total - positives) - (predicted - true_positives)) / total
    scores = np.where(cut, scores, -np.inf)
    k = int(np.argmax(scores))  # the first maximum: the fewest positives, so the highest threshold
    return float(ranked[k - 1]) if k > 0 else float(np.nextafter(ranked[0], np.inf))


@lru_cache(maxsize=64)
def pair_cosines(backbone: str, task_name: str, split: str, max_rows: int | None, root: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(cosine of each pair's two embeddings, gold label) on `split`'s seeded subset of `max_rows` (batching.subsample,
    the runs' subset); None where the data lacks the split. Cached per (backbone, task, split, rows, data dir)."""
    from adaptune.data.batching import column_values, subsample
    from adaptune.data.loading import load_task_data

    task = get_task(task_name)
    # _data_root found the task's files: one that does not read is a data fault the loader names with its path, not
    # a floor quietly left out of the report
    data = load_task_data(task, root, splits=(split,))
    if split not in data:
        return None
    rows = subsample(data[split], max_rows)
    first, second = embed(backbone, column_values(rows, "text_a")), embed(backbone, column_values(rows, "text_b"))
    return np.sum(first * second, axis=1), np.asarray(column_values(rows, "label"))


def embed(backbone: str, texts: list[str]) -> np.ndarray:
    """Unit-length sentence embeddings (float64), as sentence-transformers computes them from the encoder's own
    modules.json (for MiniLM: the attention-mask-weighted mean of the last hidden state, normalised)."""
    return np.asarray(_encoder(backbone).encode(texts, batch_size=_BATCH, normalize_embeddings=True, convert_to_numpy=True,
                                                  show_progress_bar=False),
                      dtype=np.float64)


@lru_cache(maxsize=2)
def _encoder(backbone: str) -> Any:
    """The backbone as sentence-transformers loads it (CPU), truncating at its own max_seq_length."""
    from sentence_transformers import SentenceTransformer

    from adaptune.model.backbone import quiet_transformers, resolve_backbone

    with quiet_transformers():
        return SentenceTransformer(resolve_backbone(backbone), device="cpu")
