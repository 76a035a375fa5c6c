"""The registry: every task of the paper declared once, with consistent fields."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from adaptune.cli import main
from adaptune.data.loading import load_task_data
from adaptune.data.readers import READERS
from adaptune.data.task_table import UNVERIFIED, format_task_table
from adaptune.data.tasks import EXTRA_TASKS, GLUE_SCORE_TASKS, GLUE_TASKS, TASKS, UnknownTaskError, get_task


def test_registry_holds_the_papers_tasks() -> None:
    assert GLUE_TASKS == ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli_m", "mnli_mm", "qnli", "rte", "wnli")
    assert len(EXTRA_TASKS) == 17
    assert set(TASKS) == {*GLUE_TASKS, *EXTRA_TASKS, "squad"}
    assert "wnli" not in GLUE_SCORE_TASKS and len(GLUE_SCORE_TASKS) == 9  # Table 1's nine sets


def test_metrics_follow_the_paper() -> None:
    assert TASKS["cola"].metrics == ("matthews_correlation", "accuracy")  # MCC selects (Table 1); accuracy: Section 3.6, Figure 6
    assert TASKS["mrpc"].metrics == TASKS["qqp"].metrics == ("f1", "accuracy")
    assert TASKS["stsb"].kind == "regression" and TASKS["stsb"].metrics == ("spearman", "pearson")
    assert TASKS["squad"].kind == "span" and set(TASKS["squad"].metrics) == {"exact_match", "f1"}
    assert all(TASKS[name].metrics == ("accuracy",) for name in EXTRA_TASKS)


def test_every_task_is_consistent() -> None:
    for task in TASKS.values():
        assert task.source.reader in READERS, task.name
        assert task.metrics and task.family in {"glue", "extra", "squad"}
        if task.kind == "classification":
            assert task.num_labels >= 2, task.name
            assert not task.labels or len(set(task.labels)) == len(task.labels)
            assert set(task.alias_map.values()) <= set(task.labels), task.name
        if task.family == "extra":
            assert task.paper_sizes and task.paper_epochs and task.source.file_map.keys() == {"all"}
            assert task.num_classes and (not task.labels or len(task.labels) == task.num_classes), task.name
        if task.source.hub_id is None:
            assert task.source.url, f"{task.name} needs a hub id or a publisher url"


def test_mnli_matched_and_mismatched_share_train() -> None:
    matched, mismatched = TASKS["mnli_m"].source.file_map, TASKS["mnli_mm"].source.file_map
    assert matched["train"] == mismatched["train"]
    assert matched["dev"] != mismatched["dev"]


def test_table_3_sizes_and_table_4_epochs() -> None:
    assert TASKS["newsgroups_20"].paper_sizes == (15076, 1885, 1885)
    assert TASKS["customer_complaints"].num_classes == 157
    assert TASKS["us_economic_performance"].paper_epochs == (100, 20)


def test_get_task_accepts_spelling_variants() -> None:
    assert get_task("SST2") is TASKS["sst2"]
    assert get_task("mnli-m") is TASKS["mnli_m"]
    assert get_task(TASKS["rte"]) is TASKS["rte"]


def test_unknown_task_names_closest() -> None:
    with pytest.raises(UnknownTaskError, match="did you mean.*sst2") as error:
        get_task("sst")
    assert isinstance(error.value, ValueError)


def test_task_table_lists_every_task_and_local_data(shared_data_dir) -> None:
    table = format_task_table(shared_data_dir)
    lines = table.splitlines()
    assert len(lines) == 2 + len(TASKS)
    by_name = {line.split()[0]: line for line in lines[2:]}
    assert set(by_name) == set(TASKS)
    assert " yes " in by_name["cola"] and "nyu-mll/glue" in by_name["cola"]
    assert "only dev" in by_name["qnli"]
    assert " yes " in by_name["political_audience"] and "Political-media-DFE.csv" in by_name["political_audience"]
    assert " no " in by_name["qqp"]


def test_tasks_command_marks_unverified_definitions(shared_data_dir, capsys) -> None:
    assert main(["tasks", "--data-dir", str(shared_data_dir)]) == 0
    by_name = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert not TASKS["news_aggregator"].source.verified and UNVERIFIED in by_name["news_aggregator"]
    for name in ("political_message", "progressive_stance", "cola"):
        assert TASKS[name].source.verified and UNVERIFIED not in by_name[name], name
    assert {name for name, line in by_name.items() if UNVERIFIED in line} == {
        name for name, task in TASKS.items() if not task.source.verified}


# The five tasks read from the publishers' full files: split sizes are Table 3's, every declared label occurs.
READ_FROM_FULL_FILES = ("political_audience", "political_bias", "political_message", "progressive_stance",
                        "progressive_opinion")


@pytest.mark.parametrize("name", READ_FROM_FULL_FILES)
def test_political_and_progressive_tasks_load_the_papers_splits(shared_data_dir: Path, name: str) -> None:
    task = TASKS[name]
    assert task.source.verified
    splits = load_task_data(name, shared_data_dir)
    assert tuple(len(splits[split]) for split in ("train", "validation", "test")) == task.paper_sizes
    names = splits["train"].features["label"].names
    assert tuple(names) == task.labels and len(names) == task.num_classes
    counts = Counter(names[i] for split in splits.values() for i in split["label"])
    assert set(counts) == set(task.labels), counts
    assert all(text.strip() for text in splits["test"]["text_a"])


def _csv_rows(path: Path, encoding: str) -> list[dict[str, str]]:
    with path.open(encoding=encoding, newline="") as handle:
        return list(csv.DictReader(handle))


def test_political_full_file_matches_the_bias_only_copy_row_for_row(shared_data_dir: Path) -> None:
    """The full file (Mac OS Roman, bare-CR lines) and political_social_media.csv (UTF-8): the same posts, in the
    same order, with the same bias labels; their texts agree too (which the Mac Roman decoding gives; latin-1 does
    not), but for one post that Excel turned from "14-Feb" into "Feb-14"."""
    full = _csv_rows(shared_data_dir / "extra/political_media/Political-media-DFE.csv", "mac_roman")
    bias_only = _csv_rows(shared_data_dir / "extra/political_bias/political_social_media.csv", "utf-8-sig")
    assert len(full) == len(bias_only) == 5000
    read = READERS["csv_mac_roman"](shared_data_dir / "extra/political_media/Political-media-DFE.csv")
    assert [row.fields for row in read] == full
    assert [row["bias"] for row in full] == [row["bias"] for row in bias_only]
    assert [(a["text"], b["text"]) for a, b in zip(bias_only, full) if a["text"] != b["text"]] == [("14-Feb", "Feb-14")]
    assert Counter(row["audience"] for row in full).keys() == set(TASKS["political_audience"].labels)
    assert Counter(row["message"] for row in full).keys() == set(TASKS["political_message"].labels)


def test_a_never_read_definition_whose_file_splits_to_table_3_reads_here(tmp_path: Path) -> None:
    """`tasks` reads a present file of an unverified definition: Table 3's sizes give READ_HERE with the file's md5;
    other sizes stay UNVERIFIED, saying what the file splits to."""
    from adaptune.data.checksums import file_md5
    from adaptune.data.task_table import READ_HERE, definition_status

    task = TASKS["corporate_messaging"]
    rel = task.source.files[0][1]
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    categories = ("Action", "Dialogue", "Exclude", "Information")

    def write(rows: int) -> None:
        path.write_text("\n".join(["text,category"] + [f"message {i},{categories[i % 4]}" for i in range(rows)]) + "\n", encoding="utf-8")

    assert definition_status(task, tmp_path) == UNVERIFIED  # no file yet
    write(sum(task.paper_sizes))
    assert definition_status(task, tmp_path) == f"{READ_HERE} (md5 {file_md5(path)} {rel})"
    by_name = {line.split()[0]: line for line in format_task_table(tmp_path).splitlines()[2:]}
    assert READ_HERE in by_name["corporate_messaging"] and UNVERIFIED in by_name["news_aggregator"]
    write(1000)
    assert definition_status(task, tmp_path).startswith(f"{UNVERIFIED}; read here, splits 800/100/100, not Table 3's 2494/312/312")


def test_the_readmes_predict_fields_are_the_registrys() -> None:
    """The README's table of predict's input fields is fields_table's text: per task what read_inputs accepts."""
    from adaptune.serve.predict import FIELDS_MARKERS, accepted_fields, fields_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split(FIELDS_MARKERS[0], 1)[1].split(FIELDS_MARKERS[1], 1)[0].strip()
    assert block == fields_table(), "regenerate README's block from adaptune.serve.predict.fields_table()"
    assert "| corporate_messaging | `text` or `text_a` |" in block and accepted_fields(TASKS["emotion"]) == [("content", "text_a")]
