"""The registry: every task of the paper declared once, with consistent fields."""

from __future__ import annotations

import pytest

from adaptune.data.readers import READERS
from adaptune.data.task_table import format_task_table
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
    assert "file lacks audience" in by_name["political_audience"]
    assert " no " in by_name["qqp"]
