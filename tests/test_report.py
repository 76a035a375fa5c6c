"""The report on a small real result set: tables follow from the runs, figures are drawn or skipped
with a reason, and failed / degenerate / missing runs are marked, never a crash."""

from __future__ import annotations

import copy
import re

import numpy as np
import pandas as pd
import pytest
from results_fixture import real_ablation, real_records, real_results_dir  # noqa: F401  (session fixtures)

from adaptune.report import build_report
from adaptune.report.reference import load_reference
from adaptune.report.tables import table1, table2
from adaptune.results import read_results, write_results

pytestmark = pytest.mark.xdist_group("results_report")

FIGURES = ("figure3_tradeoff", "figure4_per_task", "figure5_squad", "figure6_ablation", "figure6_init_std", "figure7_lr_robustness")


@pytest.fixture(scope="module")
def real_report(real_results_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return build_report(real_results_dir, out), out


def test_report_links_every_figure_it_drew_and_says_why_others_were_skipped(real_report, real_records):
    report, out = real_report
    text = report.read_text()
    drawn = 0
    for name in FIGURES:
        png, pdf = out / "figures" / f"{name}.png", out / "figures" / f"{name}.pdf"
        if png.exists():
            drawn += 1
            assert png.stat().st_size > 1000 and pdf.stat().st_size > 1000
            assert f"](figures/{name}.png)" in text and f"](figures/{name}.pdf)" in text
        else:
            assert not pdf.exists()
            assert re.search(r"skipped — .+", text)
    # The fixture has no SQuAD run: Figure 5 is skipped with its reason, the rest are drawn.
    assert "Figure 5: SQuAD F1 vs trained parameters**: skipped — no usable SQuAD runs" in text
    assert drawn == len(FIGURES) - 1
    # Each table (3) and each drawn figure says which backbone it shows: the fixture has one.
    assert text.count("Backbone: `") == drawn + 3
    for name in ("table1", "table2", "adapter_sizes"):
        assert (out / "tables" / f"{name}.parquet").stat().st_size > 0
        assert (out / "tables" / f"{name}.md").read_text().startswith("|")


def test_failed_and_degenerate_runs_are_counted_listed_and_never_selected(real_report, real_records, real_results_dir):
    report, out = real_report
    text = report.read_text()
    statuses = [record["status"] for record in real_records]
    assert statuses.count("failed") >= 1 and statuses.count("degenerate") >= 1, "fixture should hold both kinds"
    assert f"{statuses.count('failed')} failed, {statuses.count('degenerate')} degenerate" in text
    excluded_section = text.split("## Excluded runs")[1]
    bad = [record for record in real_records if record["status"] != "ok"]
    for record in bad:
        assert record["run_id"] in excluded_section
    selected_ids = set()
    for name in ("table1", "table2"):
        frame = pd.read_parquet(out / "tables" / f"{name}.parquet")
        column = "run_id" if name == "table1" else "run_ids"
        for ids in frame[column].dropna():
            selected_ids.update(ids.split(","))
    assert selected_ids, "some run should have been selected"
    assert not selected_ids & {record["run_id"] for record in bad}


def test_table1_is_the_best_validation_run_per_task_and_method(real_results_dir):
    runs = read_results(real_results_dir)["runs"]
    table = table1(runs, load_reference())
    ok = runs[runs["status"] == "ok"]
    checked = 0
    for row, method_filter in (("full", ok["method"] == "full"), ("adapters_64", (ok["method"] == "adapters") & (ok["adapter_size"] == 64))):
        for task, group in ok[method_filter].groupby("task"):
            cell = table[(table["row"] == row) & (table["task"] == task)]
            if cell.empty:
                continue  # not a GLUE task
            best = group.loc[group["val_score"].idxmax()]
            assert cell["run_id"].iloc[0] == best["run_id"]
            assert cell["measured"].iloc[0] == pytest.approx(100 * best["val_score"])  # GLUE: no test split, so dev
            checked += 1
    assert checked >= 2
    paper = load_reference()["table1"]["rows"]["full"]
    full_sst2 = table[(table["row"] == "full") & (table["task"] == "sst2")].iloc[0]
    assert full_sst2["paper"] == paper["sst2"]
    assert full_sst2["difference"] == pytest.approx(full_sst2["measured"] - paper["sst2"])


def test_selection_uses_validation_not_test(real_records, tmp_path):
    """Two real runs given crossed scores: the run best on test but worse on validation must lose."""
    ok = [record for record in real_records if record["status"] == "ok"]
    first, second = (copy.deepcopy(record) for record in ok[:2])
    for record, (val, test) in ((first, (0.9, 0.5)), (second, (0.6, 0.95))):
        record.update(task="sst2", method={"name": "full"}, val_metrics={"accuracy": val}, test_metrics={"accuracy": test}, primary_metric="accuracy")
    write_results([first, second], tmp_path)
    table = table1(read_results(tmp_path)["runs"], load_reference())
    cell = table[(table["row"] == "full") & (table["task"] == "sst2")].iloc[0]
    assert cell["run_id"] == first["run_id"]
    assert cell["measured"] == pytest.approx(50.0) and cell["split"] == "test"


def test_table2_reports_mean_and_sem_across_seeds_of_the_best_configuration(real_results_dir):
    runs = read_results(real_results_dir)["runs"]
    table = table2(runs, load_reference())
    cell = table[(table["task"] == "disasters") & (table["method"] == "adapters")].iloc[0]
    seeds = runs[runs["run_id"].isin(cell["run_ids"].split(","))]
    assert len(seeds) == cell["n_seeds"] >= 2
    assert seeds["status"].eq("ok").all() and seeds["seed"].is_unique
    assert cell["measured_mean"] == pytest.approx(100 * seeds["test_score"].mean())
    assert cell["measured_sem"] == pytest.approx(100 * seeds["test_score"].std(ddof=1) / np.sqrt(len(seeds)))
    assert cell["paper_mean"] == 84.1 and cell["difference"] == pytest.approx(cell["measured_mean"] - 84.1)


def test_report_marks_missing_cells_and_renders_with_only_failed_runs(real_records, tmp_path):
    failed_only = [record for record in real_records if record["status"] == "failed"]
    write_results(failed_only, tmp_path / "results")
    text = build_report(tmp_path / "results", tmp_path / "out").read_text()
    assert "0 ok" in text and "Not measured (no usable run)" in text
    assert text.count("skipped —") == len(FIGURES)
    assert not list((tmp_path / "out").rglob("*.png"))  # no empty plots


def test_report_uses_the_ablation_it_was_given(real_report, real_ablation):
    report, out = real_report
    assert len(real_ablation) == 21  # 6 layers: every contiguous span
    assert f"{len(real_ablation)} ablation row(s)" in report.read_text()
    assert (out / "figures" / "figure6_ablation.png").stat().st_size > 1000


def test_table1_uses_the_papers_backbone_even_when_another_scores_higher(real_records, tmp_path):
    """Table 1 is BERT-large in the paper; paper_full also holds BERT-base GLUE runs (tradeoff, ablation).

    The records are real SST-2 full fine-tuning runs (trained on the test backbone) copied twice with only
    `backbone`, `config.backbone`, `run_id` and the validation score changed, to stand for a BERT-large
    and a BERT-base run: the BERT-base copy scores higher on validation and must still not be chosen.
    """
    sst2_full = next(r for r in real_records if r["status"] == "ok" and r["task"] == "sst2" and r["method"]["name"] == "full")
    records = []
    for backbone, val in (("bert-large-uncased", 0.7), ("bert-base-uncased", 0.9), ("bert-base-uncased", 0.8)):
        record = copy.deepcopy(sst2_full)
        record.update(backbone=backbone, run_id=f"{backbone}-{val}", val_metrics={**record["val_metrics"], record["primary_metric"]: val})
        record["config"] = {**record["config"], "backbone": backbone}
        records.append(record)
    write_results(records, tmp_path / "results")
    table = table1(read_results(tmp_path / "results")["runs"], load_reference())
    cell = table[(table["row"] == "full") & (table["task"] == "sst2")].iloc[0]
    assert cell["run_id"] == "bert-large-uncased-0.7" and cell["measured"] == pytest.approx(70.0)
    assert set(table["backbone"]) == {"bert-large-uncased"}
    # Without any BERT-large run, the most common backbone among the candidates is used, and said.
    write_results(records[1:], tmp_path / "base_only")
    table = table1(read_results(tmp_path / "base_only")["runs"], load_reference())
    assert table[(table["row"] == "full") & (table["task"] == "sst2")].iloc[0]["run_id"] == "bert-base-uncased-0.9"
    text = build_report(tmp_path / "results", tmp_path / "out").read_text()
    assert "Backbone: `bert-large-uncased`; the paper's: BERT-large" in text
