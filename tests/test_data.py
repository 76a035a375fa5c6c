"""Loading, splitting and tokenizing the real shared data; clear errors on broken files."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest

from adaptune.data import loading as data_module
from adaptune.data.loading import load_task_data, prepare
from adaptune.data.readers import MalformedFileError
from adaptune.data.sources import DataError, DataNotFoundError, resolve_data_dir
from adaptune.data.splits import holdout_indices, split_indices
from adaptune.data.tasks import EXTRA_TASKS, TASKS, get_task
from adaptune.data.token_cache import tokenize_task

# Row counts from the shared data README (train.tsv, dev.tsv); label counts of train.tsv read off the files.
GLUE_EXPECTED = {
    "cola": ((8551, 1043), {"acceptable": 6023, "unacceptable": 2528}),
    "sst2": ((67349, 872), {"positive": 37569, "negative": 29780}),
    "mrpc": ((3668, 408), {"equivalent": 2474, "not_equivalent": 1194}),
    "rte": ((2490, 277), {"entailment": 1249, "not_entailment": 1241}),
}
# Extras in the shared copy: label set and (after the README's filters) total rows.
EXTRA_EXPECTED = {
    "sms_spam": {"ham": 4827, "spam": 747},
    "airline": {"negative": 9178, "neutral": 3099, "positive": 2363},
    "disasters": {"Not Relevant": 6187, "Relevant": 4673},  # 16 "Can't Decide" dropped
    "emotion": None,  # 13 classes, checked below
    "global_warming": {"yes": 3111, "no": 1114},  # Y/Yes, N/No merged; NA, N/A, empty dropped
    "political_bias": {"neutral": 3689, "partisan": 1311},
    "newsgroups_20": None,  # 20 groups, checked below
}


def _label_counts(dataset: datasets.Dataset) -> Counter:
    names = dataset.features["label"].names
    return Counter(names[i] for i in dataset["label"])


@pytest.mark.parametrize("name", sorted(GLUE_EXPECTED))
def test_glue_loads_with_expected_rows_and_labels(shared_data_dir: Path, name: str) -> None:
    (train_file, dev_file), train_labels = GLUE_EXPECTED[name]
    dsd = load_task_data(name, shared_data_dir)
    held_out = min(train_file // 10, 10_000)
    assert {split: len(ds) for split, ds in dsd.items()} == {"train": train_file - held_out, "validation": held_out,
                                                             "test": dev_file}  # test = dev.tsv
    assert _label_counts(dsd["train"]) + _label_counts(dsd["validation"]) == train_labels
    assert dsd["train"].features["label"].names == list(TASKS[name].labels)
    row = dsd["validation"][0]
    assert row["text_a"] and (row["text_b"] is not None) == TASKS[name].is_pair


@pytest.mark.parametrize("name", sorted(GLUE_EXPECTED))
def test_glue_validation_is_a_stratified_deterministic_slice_of_train_disjoint_from_dev(
        shared_data_dir: Path, name: str, monkeypatch) -> None:
    dsd = load_task_data(name, shared_data_dir)
    train_ids, validation_ids = set(dsd["train"]["idx"]), set(dsd["validation"]["idx"])
    assert not train_ids & validation_ids
    assert train_ids | validation_ids == set(range(GLUE_EXPECTED[name][0][0]))  # all of train.tsv, nothing else
    # Disjoint from dev: the reported split is dev.tsv, row for row.
    dev_alone = load_task_data(name, shared_data_dir, splits=["test"])["test"]  # parses dev.tsv only
    assert dsd["test"]["text_a"] == dev_alone["text_a"] and len(dev_alone) == GLUE_EXPECTED[name][0][1]
    test_pairs = set(zip(dsd["test"]["text_a"], dsd["test"]["text_b"]))
    validation_pairs = list(zip(dsd["validation"]["text_a"], dsd["validation"]["text_b"]))
    assert sum(pair in test_pairs for pair in validation_pairs) <= 0.01 * len(validation_pairs)
    # Stratified: each class's share of the slice is within one row of its share of train.tsv.
    whole = _label_counts(dsd["train"]) + _label_counts(dsd["validation"])
    held = _label_counts(dsd["validation"])
    n_file, n_held = sum(whole.values()), len(dsd["validation"])
    assert all(abs(held[label] - n_held * count / n_file) < 1 for label, count in whole.items())
    # Deterministic: parsed again from scratch, the same rows.
    monkeypatch.setattr(data_module, "_LOADED", {})
    again = load_task_data(name, shared_data_dir)
    assert again["validation"]["idx"] == dsd["validation"]["idx"] and again["train"]["idx"] == dsd["train"]["idx"]
    # Spread over the file, not a cut of it.
    assert min(validation_ids) < 0.1 * n_file and max(validation_ids) > 0.9 * n_file


def test_holdout_indices_keep_class_shares_and_bin_regression_scores() -> None:
    labels = [0] * 70 + [1] * 30
    cut = holdout_indices(labels, 10)
    assert Counter(labels[i] for i in cut["validation"]) == {0: 7, 1: 3}
    assert sorted(cut["train"] + cut["validation"]) == list(range(100))
    assert holdout_indices(labels, 10, seed=1)["validation"] != cut["validation"]  # the seed picks the rows
    scores = [0.2] * 50 + [4.6] * 25 + [5.0] * 25  # 5.0 shares the top bin with 4.x
    held = [scores[i] for i in holdout_indices(scores, 20)["validation"]]
    assert held.count(0.2) == 10 and held.count(4.6) + held.count(5.0) == 10
    with pytest.raises(ValueError, match="cannot hold out 5 of 5 rows"):
        holdout_indices([0] * 5, 5)


def test_mrpc_reads_quotes_as_text(shared_data_dir: Path) -> None:
    first = load_task_data("mrpc", shared_data_dir)["train"][0]
    assert first["text_a"].startswith('Amrozi accused his brother, whom he called "the witness"')
    assert first["text_b"].startswith('Referring to him as only "the witness"')


@pytest.mark.parametrize("name", sorted(EXTRA_EXPECTED))
def test_extras_match_table_3_and_label_sets(shared_data_dir: Path, name: str) -> None:
    dsd = load_task_data(name, shared_data_dir)
    task = TASKS[name]
    assert tuple(len(dsd[s]) for s in ("train", "validation", "test")) == task.paper_sizes
    total = sum((_label_counts(dsd[s]) for s in dsd), Counter())
    if EXTRA_EXPECTED[name] is not None:
        assert total == EXTRA_EXPECTED[name]
    assert set(total) == set(task.labels) and len(task.labels) == task.num_classes
    assert all(row is None for row in dsd["train"]["text_b"][:5])


def test_newsgroups_pools_bydate_and_restores_line_breaks(shared_data_dir: Path) -> None:
    dsd = load_task_data("newsgroups_20", shared_data_dir)
    texts = [t for s in dsd for t in dsd[s]["text_a"]]
    assert len(texts) == 18846  # 11314 train + 7532 test; the stray 54473-o skipped
    # The train half of this copy had its line breaks turned into tabs: they are line breaks again.
    # One exception: in this copy message 54473 has spaces where its line breaks were.
    flat = [t for t in texts if "\n" not in t]
    assert len(flat) == 1 and flat[0].startswith("From: I3150101@dbstu1.rz.tu-bs.de")
    assert sum("\t" in t for t in texts) < 0.15 * len(texts)  # only the test half's real tabs remain


def test_split_sizes_reproduce_table_3_for_every_extra() -> None:
    for name in EXTRA_TASKS:
        sizes = TASKS[name].paper_sizes
        splits = split_indices(sum(sizes))
        assert tuple(len(splits[s]) for s in ("train", "validation", "test")) == sizes, name


def test_split_is_deterministic_disjoint_and_complete(shared_data_dir: Path, monkeypatch) -> None:
    first = load_task_data("disasters", shared_data_dir)
    monkeypatch.setattr(data_module, "_LOADED", {})  # parse the file again, from scratch
    second = load_task_data("disasters", shared_data_dir)
    assert first is not second
    ids = {split: first[split]["idx"] for split in first}
    assert ids == {split: second[split]["idx"] for split in second}
    assert first["test"]["text_a"] == second["test"]["text_a"]
    sets = [set(v) for v in ids.values()]
    assert sum(len(s) for s in sets) == len(set().union(*sets)) == 10860
    # A permutation, not a cut of the file: every split draws from the whole file.
    assert min(ids["test"]) < 500 and max(ids["test"]) > 10000


def test_squad_validation_from_official_json(shared_data_dir: Path) -> None:
    dsd = load_task_data("squad", shared_data_dir, splits=["validation"])
    validation = dsd["validation"]
    assert len(validation) == 10570
    assert set(validation.column_names) == {"id", "title", "context", "question", "answers"}
    first = validation[0]
    assert first["answers"]["text"][0] == "Denver Broncos"
    start = first["answers"]["answer_start"][0]
    assert first["context"][start:start + len("Denver Broncos")] == "Denver Broncos"


@pytest.mark.parametrize("name, split, path", [("qnli", "train", "glue/QNLI/train.tsv"),
                                               ("squad", "train", "squad/train-v1.1.json")])
def test_split_missing_locally_names_path_and_hub(shared_data_dir: Path, name: str, split: str, path: str) -> None:
    with pytest.raises(DataNotFoundError) as error:  # "standard": SQuAD's local stand-in is not wanted here
        load_task_data(name, shared_data_dir, data_split="standard")
    message = str(error.value)
    assert str(shared_data_dir / path) in message and "hub" in message
    dev = "test" if name == "qnli" else "validation"  # GLUE's dev.tsv is its test split
    assert len(load_task_data(name, shared_data_dir, splits=[dev])[dev]) > 5000


def test_missing_file_names_expected_path_and_alternative(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="expected .*extra/sms_spam/SMSSpamCollection.*ucirvine/sms_spam"):
        load_task_data("sms_spam", tmp_path)
    with pytest.raises(DataNotFoundError, match="no hub copy.*data.world/crowdflower"):
        load_task_data("emotion", tmp_path)


def test_file_lacking_the_label_column_is_reported(shared_data_dir: Path, tmp_path: Path) -> None:
    # the bias-only copy of the political file (political_social_media.csv) where the full one is expected
    relative = get_task("political_audience").source.file_map["all"]
    (tmp_path / relative).parent.mkdir(parents=True)
    shutil.copyfile(shared_data_dir / "extra/political_bias/political_social_media.csv", tmp_path / relative)
    with pytest.raises(DataError, match=r"\['audience'\].*not in this file"):
        load_task_data("political_audience", tmp_path)


def _mirror_with(tmp_path: Path, relative: str, content: str) -> Path:
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path


def test_truncated_csv_names_file_and_line(shared_data_dir: Path, tmp_path: Path) -> None:
    original = (shared_data_dir / "extra/emotion/text_emotion.csv").read_text(encoding="utf-8")
    lines = original.splitlines(keepends=True)[:51]
    lines.append('1956967342,worry,someone,"an unfinished quoted tweet')  # cut inside a quoted field
    path = _mirror_with(tmp_path, "extra/emotion/text_emotion.csv", "".join(lines))
    with pytest.raises(MalformedFileError, match=rf"{path}: line 52: .*truncated"):
        load_task_data("emotion", tmp_path)


def test_truncated_tsv_row_names_file_and_line(shared_data_dir: Path, tmp_path: Path) -> None:
    lines = (shared_data_dir / "glue/RTE/train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:31]
    lines.append("30\tA premise cut off before its hypothesis")
    _mirror_with(tmp_path, "glue/RTE/train.tsv", "".join(lines))
    _mirror_with(tmp_path, "glue/RTE/dev.tsv", (shared_data_dir / "glue/RTE/dev.tsv").read_text(encoding="utf-8"))
    with pytest.raises(MalformedFileError, match=r"RTE/train.tsv: line 32: expected 4 fields .* found 2"):
        load_task_data("rte", tmp_path)


def test_unknown_label_is_an_error_not_a_new_class(tmp_path: Path) -> None:
    rows = "".join(f"ham\tmessage {i}\n" for i in range(20)) + "spma\ta typo in the label\n"
    _mirror_with(tmp_path, "extra/sms_spam/SMSSpamCollection", rows)
    with pytest.raises(DataError, match=r"SMSSpamCollection: line 21: unknown label 'spma' .*\['ham', 'spam'\]"):
        load_task_data("sms_spam", tmp_path)


def test_empty_split_is_an_error(shared_data_dir: Path, tmp_path: Path) -> None:
    header = (shared_data_dir / "glue/RTE/dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[0]
    _mirror_with(tmp_path, "glue/RTE/dev.tsv", header)
    _mirror_with(tmp_path, "glue/RTE/train.tsv", (shared_data_dir / "glue/RTE/train.tsv").read_text(encoding="utf-8"))
    with pytest.raises(DataError, match="test split is empty") as error:
        load_task_data("rte", tmp_path)
    # The message names the file that is empty (dev.tsv), not the first file of the task (train.tsv).
    assert str(tmp_path / "glue/RTE/dev.tsv") in str(error.value)
    assert "train.tsv" not in str(error.value)


def test_hub_rows_go_through_the_same_canonicalisation(shared_data_dir: Path, monkeypatch) -> None:
    # The hub's ucirvine/sms_spam layout (sms with a trailing newline, ClassLabel ham/spam), built
    # from the same raw rows as the mirror: both sources must give identical datasets and splits.
    raw = [line.split("\t", 1) for line in
           (shared_data_dir / "extra/sms_spam/SMSSpamCollection").read_text(encoding="utf-8").splitlines()]
    features = datasets.Features({"sms": datasets.Value("string"), "label": datasets.ClassLabel(names=["ham", "spam"])})
    hub_copy = datasets.Dataset.from_dict({"sms": [text + "\n" for _, text in raw],
                                           "label": [0 if label == "ham" else 1 for label, _ in raw]}, features=features)
    calls = []

    def fake_load_dataset(path, name=None, split=None, revision=None):
        calls.append((path, name, split))
        return hub_copy

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    from_hub = load_task_data("sms_spam", data_dir="hub")
    from_mirror = load_task_data("sms_spam", shared_data_dir)
    assert calls == [("ucirvine/sms_spam", "plain_text", "train")]
    for split in ("train", "validation", "test"):
        assert from_hub[split]["text_a"] == from_mirror[split]["text_a"]
        assert from_hub[split]["label"] == from_mirror[split]["label"]


def test_resolve_data_dir_order(tmp_path: Path, monkeypatch, shared_data_dir: Path, patch_settings: Callable[..., object]) -> None:
    patch_settings(data_dir=tmp_path)
    assert resolve_data_dir(shared_data_dir) == shared_data_dir.resolve()
    assert resolve_data_dir() == tmp_path.resolve()
    patch_settings(data_dir=None)
    project = tmp_path / "project"
    (project / "shared" / "data").mkdir(parents=True)
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")
    assert resolve_data_dir() == (project / "shared" / "data").resolve()  # the nearest above the current directory
    monkeypatch.chdir(tmp_path)
    # None above tmp_path on most machines: then found from the package's location. A machine may hold one above
    # its temporary directory (a /tmp/shared link); the rule says that one comes first.
    above = next(((d / "shared" / "data").resolve() for d in (tmp_path, *tmp_path.parents) if (d / "shared" / "data").is_dir()), None)
    assert resolve_data_dir() == (above or shared_data_dir.resolve())
    assert resolve_data_dir("hub") is None
    with pytest.raises(DataNotFoundError, match="does not exist"):
        resolve_data_dir(tmp_path / "nowhere")


class _CountingTokenizer:
    """Delegates to a real tokenizer and counts encode calls, to see the cache at work."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer, self.calls = tokenizer, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_tokenize_task_is_unpadded_truncated_and_cached(shared_data_dir: Path, backbone_path: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    rte = load_task_data("rte", shared_data_dir)
    small = datasets.DatasetDict({"train": rte["train"].select(range(150)), "validation": rte["validation"].select(range(50))})
    tokenizer = _CountingTokenizer(AutoTokenizer.from_pretrained(backbone_path))
    tokenized = tokenize_task("rte", small, tokenizer, max_length=48, cache_dir=tmp_path)
    train = tokenized["train"]
    assert {"input_ids", "attention_mask", "token_type_ids", "labels"} <= set(train.column_names)
    assert "text_a" not in train.column_names
    lengths = [len(ids) for ids in train["input_ids"]]
    assert max(lengths) == 48 and min(lengths) < 48  # truncated, and not padded
    assert train["labels"] == small["train"]["label"]
    assert 1 in train[0]["token_type_ids"]  # a sentence pair
    first_calls = tokenizer.calls
    again = tokenize_task("rte", small, tokenizer, max_length=48, cache_dir=tmp_path)
    assert tokenizer.calls == first_calls  # read back from the cache, not re-tokenized
    assert again["validation"]["input_ids"] == tokenized["validation"]["input_ids"]
    tokenize_task("rte", small, tokenizer, max_length=32, cache_dir=tmp_path)
    assert tokenizer.calls > first_calls  # another max_length is another cache entry
    markers = sorted((tmp_path / "tokenized").glob("*.json"))
    assert len(markers) == 2  # one published entry per max_length: a marker file, written last
    for marker in markers:
        assert (tmp_path / "tokenized" / json.loads(marker.read_text())["dir"] / "dataset_dict.json").is_file()


def test_prepare_summarises_splits(shared_data_dir: Path, backbone_path: str, tmp_path: Path) -> None:
    summary = prepare("global_warming", shared_data_dir, tokenizer_name=backbone_path, cache_dir=tmp_path, max_length=32)
    assert {s: v["rows"] for s, v in summary["splits"].items()} == {"train": 3380, "validation": 422, "test": 423}
    assert sum(summary["splits"]["train"]["labels"].values()) == 3380
    saved = datasets.load_from_disk(summary["output_dir"])
    assert len(saved["test"]) == 423 and "input_ids" in saved["test"].column_names


def test_prepare_skips_splits_the_mirror_lacks(shared_data_dir: Path, tmp_path: Path) -> None:
    summary = prepare("squad", shared_data_dir, cache_dir=tmp_path)
    assert summary["splits"]["validation"]["rows"] == 10570
    assert "train-v1.1.json" in summary["missing_splits"]["train"]


STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


def _stsb_row(i: int, score: str) -> str:
    return f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\tA man is playing a flute {i}.\tA man plays a flute.\t{score}\n"


def test_stsb_labels_are_float_scores(tmp_path: Path) -> None:
    _mirror_with(tmp_path, "glue/STS-B/train.tsv", STSB_HEADER + "".join(_stsb_row(i, f"{i / 4:.3f}") for i in range(12)))
    _mirror_with(tmp_path, "glue/STS-B/dev.tsv", STSB_HEADER + _stsb_row(0, "3.800") + _stsb_row(1, "0.500"))
    dsd = load_task_data("stsb", tmp_path)
    assert dsd["train"].features["label"].dtype == "float32"
    assert dsd["test"]["label"] == pytest.approx([3.8, 0.5])
    assert dsd["train"][4]["text_b"] == "A man plays a flute."


def test_stsb_non_numeric_score_names_file_and_line(tmp_path: Path) -> None:
    _mirror_with(tmp_path, "glue/STS-B/train.tsv", STSB_HEADER + _stsb_row(0, "1.0") + _stsb_row(1, "high"))
    _mirror_with(tmp_path, "glue/STS-B/dev.tsv", STSB_HEADER + _stsb_row(0, "1.0"))
    with pytest.raises(DataError, match=r"STS-B/train.tsv: line 3: label 'high' is not a number"):
        load_task_data("stsb", tmp_path)


def _mnli_file(rows: list[tuple[str, str, str]]) -> str:
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
    return header + "".join(f"{i}\t{i}\t{i}e\tfiction\t{a}\t{b}\t{g}\t{g}\n" for i, (a, b, g) in enumerate(rows))


def test_mnli_matched_and_mismatched_share_train_with_their_own_dev(tmp_path: Path) -> None:
    labels = ["entailment", "neutral", "contradiction"]
    _mirror_with(tmp_path, "glue/MNLI/train.tsv", _mnli_file([(f"premise {i}", f"hypothesis {i}", labels[i % 3]) for i in range(9)]))
    _mirror_with(tmp_path, "glue/MNLI/dev_matched.tsv", _mnli_file([("matched p", "matched h", "neutral")]))
    _mirror_with(tmp_path, "glue/MNLI/dev_mismatched.tsv", _mnli_file([("other p", "other h", "contradiction")] * 2))
    matched, mismatched = load_task_data("mnli_m", tmp_path), load_task_data("mnli_mm", tmp_path)
    assert matched["train"]["text_a"] == mismatched["train"]["text_a"] and len(matched["train"]) == 8
    assert matched["validation"]["text_a"] == mismatched["validation"]["text_a"]  # one held-out slice of train.tsv
    assert matched["test"]["text_a"] == ["matched p"] and matched["test"]["label"] == [1]
    assert mismatched["test"]["text_b"] == ["other h"] * 2 and mismatched["test"]["label"] == [2, 2]
    assert load_task_data("mnli_mm", tmp_path, splits=["test"])["test"]["label"] == [2, 2]  # dev alone: no train parse


def test_tokenizing_shows_no_datasets_progress_bars(shared_data_dir: Path, backbone_path: str, tmp_path: Path, capfd) -> None:
    from transformers import AutoTokenizer

    rte = load_task_data("rte", shared_data_dir)
    small = datasets.DatasetDict({"train": rte["train"].select(range(40)), "validation": rte["validation"].select(range(10))})
    datasets.enable_progress_bars()
    capfd.readouterr()
    tokenize_task("rte", small, AutoTokenizer.from_pretrained(backbone_path), max_length=32, cache_dir=tmp_path)
    err = capfd.readouterr().err
    assert "tokenize rte" not in err and "Saving the dataset" not in err, err
    assert datasets.is_progress_bar_enabled()  # the caller's own setting comes back afterwards


def test_a_splits_cache_key_is_its_rows_whether_selected_flattened_or_chunked_otherwise() -> None:
    """The tokenized cache's key hashes the rows a split shows: a select()ed view (as carved validation
    splits are), the same rows written out, and the same rows in other record batches key alike; other
    rows key otherwise. Columns read as lists give the view's rows in its order."""
    from adaptune.data.batching import column_values, model_rows

    base = datasets.Dataset.from_dict({"input_ids": [[i, i + 1] for i in range(50)], "label": [i % 2 for i in range(50)]})
    view = base.select([7, 3, 42, 0])
    written = datasets.Dataset.from_dict({"input_ids": [[7, 8], [3, 4], [42, 43], [0, 1]], "label": [1, 1, 0, 0]})
    rechunked = datasets.concatenate_datasets([written.select(range(2)).flatten_indices(), written.select(range(2, 4)).flatten_indices()])
    keys = {data_module.dataset_fingerprint(datasets.DatasetDict(train=split)) for split in (view, view.flatten_indices(), written, rechunked)}
    assert len(keys) == 1
    assert data_module.dataset_fingerprint(datasets.DatasetDict(train=base.select([3, 7, 42, 0]))) not in keys
    assert column_values(view, "label") == [1, 1, 0, 0] and column_values({"label": (1, 0)}, "label") == [1, 0]
    assert model_rows(view) == [{"input_ids": ids} for ids in ([7, 8], [3, 4], [42, 43], [0, 1])]
