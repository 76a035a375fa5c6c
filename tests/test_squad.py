"""SQuAD v1.1 windows and answer post-processing on a real dev paragraph; the span path of a run."""

from __future__ import annotations

import os
from pathlib import Path

from types import SimpleNamespace

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

from datasets import Dataset, DatasetDict  # noqa: E402

from adaptune import run_data  # noqa: E402
from adaptune.backbone import load_tokenizer  # noqa: E402
from adaptune.batching import evaluation_batches, make_collator  # noqa: E402
from adaptune.config import TrainConfig  # noqa: E402
from adaptune.data import load_task_data  # noqa: E402
from adaptune.devices import Device  # noqa: E402
from adaptune.evaluate import EvalSplit, evaluate_split  # noqa: E402
from adaptune.metrics import squad_scores  # noqa: E402
from adaptune.squad import prepare_features, postprocess_predictions  # noqa: E402
from adaptune.tasks import get_task  # noqa: E402
from adaptune.train import train_and_evaluate  # noqa: E402

# Short windows so one real paragraph (Super Bowl 50, 775 characters) spans several overlapping ones.
MAX_LENGTH, STRIDE = 128, 32


@pytest.fixture(scope="module")
def squad_dev(shared_data_dir: Path) -> Dataset:
    return load_task_data("squad", shared_data_dir, splits=["validation"])["validation"]


@pytest.fixture(scope="module")
def paragraph(squad_dev: Dataset) -> Dataset:
    first_context = squad_dev[0]["context"]
    return squad_dev.filter(lambda row: row["context"] == first_context)


@pytest.fixture(scope="module")
def tokenizer(backbone_path: str):
    return load_tokenizer(backbone_path)


def test_windows_overlap_and_gold_spans_map_back_to_the_answer_text(paragraph: Dataset, tokenizer) -> None:
    features = prepare_features(paragraph[:], tokenizer, MAX_LENGTH, STRIDE, for_evaluation=True)
    windows_per_question = len(features["input_ids"]) / len(paragraph)
    assert windows_per_question > 1, "the paragraph needs several windows at this length"
    assert max(len(ids) for ids in features["input_ids"]) <= MAX_LENGTH

    found = set()
    for ids, example_id, offsets, start, end in zip(
        features["input_ids"], features["example_id"], features["offset_mapping"], features["start_positions"], features["end_positions"], strict=True
    ):
        assert len(offsets) == len(ids) and offsets[0] is None  # [CLS] and the question are not context
        if start == 0:
            assert end == 0  # answer not wholly in this window: both point at [CLS]
            continue
        example = paragraph[paragraph["id"].index(example_id)]
        gold_start = example["answers"]["answer_start"][0]
        gold_end = gold_start + len(example["answers"]["text"][0])
        # The tokens cover the answer exactly, up to word pieces ("gold" inside the token "golden").
        assert offsets[start][0] <= gold_start < offsets[start][1] and offsets[end][0] < gold_end <= offsets[end][1]
        span_text = example["context"][offsets[start][0] : offsets[end][1]]
        exact_tokens = offsets[start][0] == gold_start and offsets[end][1] == gold_end
        assert span_text == example["answers"]["text"][0] or not exact_tokens
        found.add(example_id)
    assert found == set(paragraph["id"]), "every question's gold answer lies wholly inside some window"


def test_postprocessing_recovers_gold_answers_and_respects_max_answer_length(paragraph: Dataset, tokenizer) -> None:
    features = prepare_features(paragraph[:], tokenizer, MAX_LENGTH, STRIDE, for_evaluation=True)
    width = max(len(ids) for ids in features["input_ids"])
    rng = np.random.default_rng(0)
    start_logits = rng.normal(0, 0.1, (len(features["input_ids"]), width))
    end_logits = rng.normal(0, 0.1, start_logits.shape)
    for row, (start, end) in enumerate(zip(features["start_positions"], features["end_positions"], strict=True)):
        if start:
            start_logits[row, start] += 5
            end_logits[row, end] += 5
        start_logits[row, 0] += 50  # [CLS] is never an answer in v1.1, however high it scores
        end_logits[row, 0] += 50
    predictions = postprocess_predictions(paragraph, features, start_logits, end_logits)
    answers = dict(zip(paragraph["id"], (a["text"] for a in paragraph["answers"]), strict=True))
    scores = squad_scores(predictions, answers)
    # All but word-piece answers ("gold" inside "golden", which another annotator wrote) match exactly.
    assert scores["exact_match"] >= 1 - 1 / len(paragraph) and scores["f1"] >= scores["exact_match"]

    # The highest-scoring pair spans more than 30 tokens: it is skipped for the best legal span.
    row = 0
    context_tokens = [k for k, offset in enumerate(features["offset_mapping"][row]) if offset is not None]
    too_long_start, too_long_end = context_tokens[0], context_tokens[40]
    start_logits[row, too_long_start] += 20
    end_logits[row, too_long_end] += 20
    single = {column: [features[column][row]] for column in ("example_id", "offset_mapping")}
    example = paragraph.filter(lambda r: r["id"] == features["example_id"][row])
    prediction = postprocess_predictions(example, single, start_logits[:1], end_logits[:1])[example["id"][0]]
    assert prediction and len(tokenizer(prediction, add_special_tokens=False)["input_ids"]) <= 30


def test_span_run_trains_and_scores_exact_match_and_f1(tmp_path: Path, squad_dev: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    # The local mirror has only SQuAD dev: disjoint dev questions stand in for a training split.
    shuffled = squad_dev.shuffle(seed=1)
    stand_in = DatasetDict(train=shuffled.select(range(32)), validation=shuffled.select(range(32, 48)))
    monkeypatch.setattr(run_data, "load_task_data", lambda task, data_dir=None, splits=None: stand_in)
    config = TrainConfig(task="squad", method={"name": "adapters", "size": 16}, lr=1e-3, epochs=1, batch_size=16, max_length=160, doc_stride=48)
    record = train_and_evaluate(config, out_dir=tmp_path, progress=False)
    assert record["status"] == "ok", record["reason"]
    assert record["primary_metric"] == "f1"
    assert set(record["val_metrics"]) == {"exact_match", "f1"}
    assert 0.0 <= record["val_metrics"]["exact_match"] <= record["val_metrics"]["f1"] <= 1.0
    assert record["curve"][0]["train_loss"] > 0 and (tmp_path / "checkpoint" / "task.json").is_file()


class _GoldSpanModel(torch.nn.Module):
    """Stands in for a QA model: one-hot start/end logits at the positions it was given per window.

    Windows are recognised by their token ids, so the logits follow each window through
    evaluate_split's length-sorted batches; a wrong row order back into the features would show.
    """

    def __init__(self, positions: dict[tuple[int, ...], tuple[int, int]]) -> None:
        super().__init__()
        self.positions = positions

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: torch.Tensor) -> SimpleNamespace:
        starts = torch.zeros(input_ids.shape)
        ends = torch.zeros(input_ids.shape)
        for row, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist(), strict=True)):
            start, end = self.positions[tuple(ids[: sum(mask)])]
            if end >= sum(mask):  # another window's positions can lie past this one's end: point at [CLS]
                start = end = 0
            starts[row, start] = 10.0
            ends[row, end] = 10.0
        return SimpleNamespace(start_logits=starts, end_logits=ends)


def test_span_evaluation_scores_gold_logits_as_perfect_and_misplaced_ones_as_wrong(squad_dev: Dataset, tokenizer) -> None:
    # Real dev questions whose first answer is exactly a run of whole tokens (not "gold" inside
    # "golden"), over contexts long enough for several windows of different lengths.
    candidates = squad_dev.shuffle(seed=2).select(range(40))
    chosen = []
    for index, example in enumerate(candidates):
        single = {k: [v] for k, v in example.items()}
        features = prepare_features(single, tokenizer, MAX_LENGTH, STRIDE, for_evaluation=True)
        spans = [
            example["context"][offsets[start][0] : offsets[end][1]]
            for offsets, start, end in zip(features["offset_mapping"], features["start_positions"], features["end_positions"], strict=True)
            if start
        ]
        if len(features["input_ids"]) > 1 and spans and all(span == example["answers"]["text"][0] for span in spans):
            chosen.append(index)
    assert len(chosen) >= 4
    examples = candidates.select(chosen[:6])
    features = examples.map(
        prepare_features, batched=True, remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "max_length": MAX_LENGTH, "doc_stride": STRIDE, "for_evaluation": True},
    )
    model_columns = ("input_ids", "attention_mask", "token_type_ids")
    rows = [{k: row[k] for k in model_columns if k in row} for row in features]
    split = EvalSplit("validation", rows, examples=examples, features=features.select_columns(["example_id", "offset_mapping"]))
    batch_size = 4
    order = [i for batch in evaluation_batches(split.lengths, batch_size) for i in batch]
    assert order != sorted(order), "the windows must be evaluated out of order for the test to check the reordering"

    keys = [tuple(row["input_ids"]) for row in rows]
    assert len(set(keys)) == len(keys)
    gold = list(zip(features["start_positions"], features["end_positions"], strict=True))
    cpu = Device("cpu", torch.device("cpu"), "cpu", None)
    collator = make_collator(tokenizer)
    task = get_task("squad")

    result = evaluate_split(_GoldSpanModel(dict(zip(keys, gold, strict=True))), task, split, cpu, collator, batch_size=batch_size)
    assert result.metrics == {"exact_match": 1.0, "f1": 1.0}

    # The same one-hot logits given to the wrong windows (each window gets the next one's) score badly.
    shifted = gold[1:] + gold[:1]
    misplaced = evaluate_split(_GoldSpanModel(dict(zip(keys, shifted, strict=True))), task, split, cpu, collator, batch_size=batch_size)
    assert misplaced.metrics["exact_match"] < 0.5 and misplaced.metrics["f1"] < 0.5


def test_window_too_small_for_the_stride_is_a_clear_error(paragraph: Dataset, tokenizer) -> None:
    with pytest.raises(ValueError, match="max_length=384, doc_stride=128"):
        prepare_features(paragraph[:2], tokenizer, max_length=128, doc_stride=128)
