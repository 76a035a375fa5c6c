"""SQuAD v1.1 windows and answer post-processing on a real dev paragraph; the span path of a run; the
local stand-in split (only dev-v1.1.json is local) and the per-split hub fallback; predictions.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset  # noqa: E402

from adaptune.cli import main  # noqa: E402
from adaptune.core.devices import Device  # noqa: E402
from adaptune.core.run_files import PREDICTIONS_FILE  # noqa: E402
from adaptune.data import loading as data
from adaptune.data import sources, squad_data
from adaptune.data.batching import evaluation_batches, make_collator, subsample  # noqa: E402
from adaptune.data.loading import load_task_data, load_task_splits
from adaptune.data.sources import DataNotFoundError
from adaptune.data.squad import postprocess_predictions, prepare_features  # noqa: E402
from adaptune.data.squad_data import squad_standin_titles
from adaptune.data.tasks import (
    SQUAD_STANDIN,
    STANDARD_SPLIT,
    get_task,  # noqa: E402
)
from adaptune.model.backbone import load_tokenizer  # noqa: E402
from adaptune.train import (
    ablation,  # noqa: E402
    run_data,
)
from adaptune.train.evaluate import EvalSplit, evaluate_split  # noqa: E402
from adaptune.train.metrics import squad_scores  # noqa: E402

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


# ------------------------------------------------------------------ the local stand-in and the hub fallback
@pytest.fixture
def fresh_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """No datasets cached in this process: every load reads (and announces) again."""
    monkeypatch.setattr(data, "_LOADED", {})


def test_standin_split_is_deterministic_disjoint_by_article_and_covers_all_dev_questions(
    shared_data_dir: Path, squad_dev: Dataset, fresh_loads: None
) -> None:
    standin = load_task_splits("squad", shared_data_dir, data_split=SQUAD_STANDIN)
    assert standin.data_split == SQUAD_STANDIN and "NOT the paper's split" in standin.split_note
    train, validation = standin.splits["train"], standin.splits["validation"]
    # Whole articles on one side: no title, no context, no question id on both.
    assert not set(train["title"]) & set(validation["title"])
    assert not set(train["context"]) & set(validation["context"])
    assert not set(train["id"]) & set(validation["id"])
    # Together they are exactly the 10,570 dev questions, each once.
    assert len(train) + len(validation) == len(squad_dev) == 10570
    assert sorted([*train["id"], *validation["id"]]) == sorted(squad_dev["id"])
    assert (len(set(train["title"])), len(set(validation["title"]))) == (38, 10)  # 80% of the 48 dev articles train
    # Deterministic: the assignment depends only on the titles (sha256), not on their order or on a
    # process; these sizes are pinned so that a change to the split shows here.
    assert (len(train), len(validation)) == (8877, 1693)
    titles = list(squad_dev["title"])
    assert squad_standin_titles(titles) == squad_standin_titles(tuple(titles))
    shuffled = squad_standin_titles(list(reversed(titles)))
    assert set(shuffled["train"]) == set(train["title"]) and set(shuffled["validation"]) == set(validation["title"])
    data._LOADED.clear()
    again = load_task_splits("squad", shared_data_dir, data_split=SQUAD_STANDIN).splits
    assert list(again["train"]["id"]) == list(train["id"]) and list(again["validation"]["id"]) == list(validation["id"])


def test_without_train_file_or_hub_a_run_gets_the_named_standin_and_one_line_says_so(
    shared_data_dir: Path, fresh_loads: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # conftest sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, and the mirror has only dev-v1.1.json.
    loaded = load_task_splits("squad", shared_data_dir)
    assert loaded.data_split == SQUAD_STANDIN and set(loaded.splits) == {"train", "validation"}
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "stand-in" in lines[0] and "NOT the paper's split" in lines[0] and "train-v1.1.json" in lines[0]
    load_task_splits("squad", shared_data_dir)
    assert capsys.readouterr().err == ""  # said once per process, not per load
    # Evaluation alone reads the official dev set; the standard split is refused, naming the file and the hub.
    dev = load_task_splits("squad", shared_data_dir, splits=["validation"])
    assert dev.data_split == STANDARD_SPLIT and dev.split_note is None and len(dev.splits["validation"]) == 10570
    with pytest.raises(DataNotFoundError, match="train-v1.1.json.*hub cannot be used.*squad_dev_standin"):
        load_task_splits("squad", shared_data_dir, data_split=STANDARD_SPLIT)
    with pytest.raises(ValueError, match="SQuAD's local stand-in"):
        load_task_splits("rte", shared_data_dir, data_split=SQUAD_STANDIN)


def test_where_the_hub_is_usable_train_comes_from_the_hub_and_dev_from_the_mirror(
    shared_data_dir: Path, squad_dev: Dataset, fresh_loads: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The hub is unreachable here: its train split is stood in for by 5 dev questions, and who asked for what is recorded.
    asked = []

    def hub(task, split, instead_of=None):
        asked.append((split, instead_of))
        return squad_dev.select(range(5))

    monkeypatch.setattr(sources, "hub_usable", lambda: True)
    monkeypatch.setattr(squad_data, "_squad_hub", hub)
    loaded = load_task_splits("squad", shared_data_dir)
    assert loaded.data_split == STANDARD_SPLIT and loaded.split_note is None
    assert asked == [("train", shared_data_dir / "squad" / "train-v1.1.json")]
    assert len(loaded.splits["train"]) == 5 and len(loaded.splits["validation"]) == 10570  # dev: the mirror's file
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "train split comes from the hub (rajpurkar/squad train)" in lines[0]


def test_squad_run_on_the_standin_from_the_command_line_writes_official_predictions(
    shared_data_dir: Path, backbone_path: str, tmp_path: Path, fresh_loads: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`python -m adaptune train --task squad` with its defaults (384-token windows, stride 128,
    adapters:64) on the dev-only mirror, kept tiny: 32 training questions, 24 scored, one epoch."""
    out = tmp_path / "run"
    argv = ["train", "--task", "squad", "--backbone", backbone_path, "--data-dir", str(shared_data_dir), "--epochs", "1",
            "--max-train-examples", "32", "--max-eval-examples", "24", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
            "--no-progress"]
    assert main(argv) == 0
    stderr = capsys.readouterr().err
    assert sum("stand-in" in line for line in stderr.splitlines()) == 1

    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "ok", record["reason"]
    assert (record["config"]["max_length"], record["config"]["doc_stride"]) == (384, 128)
    assert record["data_split"] == SQUAD_STANDIN and "NOT the paper's split" in record["split_note"]
    checkpoint = json.loads((out / "checkpoint" / "task.json").read_text())
    assert checkpoint["metadata"]["data_split"] == SQUAD_STANDIN  # an ablation scores the same held-out articles

    # The official evaluate-v1.1.py reads the file with json.load(open(path)) and looks up
    # predictions[qa["id"]] as a string: a flat JSON object of str -> str, plain ASCII.
    raw = (out / PREDICTIONS_FILE).read_bytes()
    assert raw.isascii()
    with open(out / PREDICTIONS_FILE) as prediction_file:
        predictions = json.load(prediction_file)
    assert isinstance(predictions, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in predictions.items())

    # Exactly the scored questions: the run's seeded 24 of the stand-in's validation articles.
    validation = load_task_data("squad", shared_data_dir, data_split=SQUAD_STANDIN)["validation"]
    scored = subsample(validation, 24)
    assert list(predictions) == list(scored["id"])
    standin_train_titles = set(load_task_data("squad", shared_data_dir, data_split=SQUAD_STANDIN)["train"]["title"])
    assert not set(scored["title"]) & standin_train_titles

    # The project's metric on the file gives the record's validation scores.
    answers = {question_id: answer["text"] for question_id, answer in zip(scored["id"], scored["answers"], strict=True)}
    assert squad_scores(predictions, answers) == pytest.approx(record["val_metrics"], abs=1e-12)
    assert set(record["val_metrics"]) == {"exact_match", "f1"} and record["primary_metric"] == "f1"
    assert 0.0 <= record["val_metrics"]["exact_match"] <= record["val_metrics"]["f1"] <= 1.0
    assert record["curve"][0]["train_loss"] > 0

    # The ablation of this checkpoint scores the same questions (the stand-in's, not all of dev): stopped
    # once its data is prepared, before the 21 layer spans are evaluated.
    class Prepared(Exception):
        pass

    def prepared(*args, **kwargs):
        raise Prepared(run_data.prepare_run_data(*args, **kwargs))

    monkeypatch.setattr(ablation, "prepare_run_data", prepared)
    with pytest.raises(Prepared) as stopped:
        ablation.ablate(out / "checkpoint", data_dir=shared_data_dir)
    ablated = stopped.value.args[0]
    assert ablated.data_split == SQUAD_STANDIN and list(ablated.eval_splits["validation"].examples["id"]) == list(predictions)


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
