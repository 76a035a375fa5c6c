"""The report on a small real result set: tables follow from the runs, figures are drawn or skipped
with a reason, and failed / degenerate / missing runs are marked, never a crash."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from results_fixture import real_ablation, real_records, real_results_dir  # noqa: F401  (session fixtures)

from adaptune.report import build_report
from adaptune.report.reference import load_reference
from adaptune.report.results import read_results, write_results
from adaptune.report.tables import adapter_size_table, table1, table1_markdown, table2, table2_markdown

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
    # §3.5 names no backbone: the report says which one Figure 5 takes, why, and the alternative.
    assert "The paper's backbone for it: BERT-large, inferred" in text and "not BERT-base (88.5)" in text
    assert drawn == len(FIGURES) - 1
    # Each table (4) and each drawn figure says which backbone it shows: the fixture has one.
    assert text.count("Backbone: `") == drawn + 4
    for name in ("table1", "table2", "adapter_sizes", "methods"):
        assert (out / "tables" / f"{name}.parquet").stat().st_size > 0
        assert (out / "tables" / f"{name}.md").read_text().startswith("|")


def test_failed_and_degenerate_runs_are_counted_listed_and_never_selected(real_report, real_records, real_results_dir):
    """Table 1 never selects a failed or degenerate run; Table 2 keeps degenerate seeds (the paper's
    95.1 ± 2.2 on SMS spam says its seeds did) and counts them, but never a failed run (no score)."""
    report, out = real_report
    text = report.read_text()
    statuses = [record["status"] for record in real_records]
    assert statuses.count("failed") >= 1 and statuses.count("degenerate") >= 1, "fixture should hold both kinds"
    assert f"{statuses.count('failed')} failed, {statuses.count('degenerate')} degenerate" in text
    excluded_section = text.split("## Excluded runs")[1]
    bad = [record for record in real_records if record["status"] != "ok"]
    for record in bad:
        assert record["run_id"] in excluded_section
    table1_ids = set(pd.read_parquet(out / "tables" / "table1.parquet")["run_id"].dropna())
    assert table1_ids and not table1_ids & {record["run_id"] for record in bad}
    t2 = pd.read_parquet(out / "tables" / "table2.parquet")
    table2_ids = {run_id for ids in t2["run_ids"].dropna() for run_id in ids.split(",")}
    assert table2_ids and not table2_ids & {record["run_id"] for record in bad if record["status"] == "failed"}
    degenerate = {record["run_id"] for record in bad if record["status"] == "degenerate"}
    for cell in t2[t2["run_ids"].notna()].itertuples():
        assert cell.n_degenerate == len(set(cell.run_ids.split(",")) & degenerate)
    assert "Degenerate seeds (predictions collapsed to one class) are kept" in text


def test_table2_keeps_a_degenerate_seed_in_the_mean_and_says_so(real_records, tmp_path):
    """The real two-seed adapters configuration on disasters, its seed 1 marked degenerate (as a collapsed
    seed comes back from training): Table 2's mean and s.e.m. still cover both seeds and the cell says so."""
    records = copy.deepcopy(real_records)
    seed1 = next(r for r in records if r["task"] == "disasters" and r["method_label"] == "adapters64" and r["seed"] == 1)
    seed1.update(status="degenerate", reason="validation predictions at the final epoch are all one class")
    write_results(records, tmp_path / "results")
    runs = read_results(tmp_path / "results")["runs"]
    cell = table2(runs, load_reference()).query("task == 'disasters' and method == 'adapters'").iloc[0]
    seeds = runs[runs["run_id"].isin(cell["run_ids"].split(","))]
    assert cell["n_seeds"] == 2 and cell["n_degenerate"] == 1 and seed1["run_id"] in set(seeds["run_id"])
    assert cell["measured_mean"] == pytest.approx(100 * seeds["test_score"].mean())
    text = build_report(tmp_path / "results", tmp_path / "out").read_text()
    assert "(1 degenerate)" in text


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
            assert cell["measured"].iloc[0] == pytest.approx(100 * best["test_score"])  # GLUE's test split: dev.tsv
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


def test_tables_show_tasks_and_methods_with_a_run_and_name_the_rest_on_one_line(real_report, real_records, tmp_path):
    """Issue #30: the report leads with what was measured. The fixture ran disasters (Table 2) and SST-2
    (Table 1), never airline or CoLA, nor top-k: those are no row or column of the Markdown but are named
    on the one line beneath the table; the Parquet tables keep every task and method."""
    report, out = real_report
    text = report.read_text()
    paper = load_reference()
    t2_md = (out / "tables" / "table2.md").read_text()
    header, *rows = [line for line in t2_md.splitlines() if line.startswith("| ")]
    row_names = [line.split(" | ")[0].removeprefix("| ") for line in rows[1:]]
    names = {task: paper["table2"]["tasks"][task]["paper_name"] for task in ("disasters", "airline")}
    assert names["disasters"] in row_names and names["airline"] not in row_names
    assert "Adapters measured" in header and "Variable FT (top-k)" not in header
    not_run = [line for line in t2_md.splitlines() if line.startswith("Not run in this experiment: ")]
    assert len(not_run) == 1 and not_run[0] in text
    extra = [task for task in dict.fromkeys(pd.read_parquet(out / "tables" / "table2.parquet")["task"])
             if task not in ("average", "trained_params_percent", "total_size_multiple")]
    run_tasks = {record["task"] for record in real_records}
    absent = [task for task in extra if task not in run_tasks]
    assert "airline" in absent and "disasters" not in absent
    assert not_run[0] == f"Not run in this experiment: {len(absent)} tasks ({', '.join(absent)}); 1 method (Variable FT (top-k))."
    assert "airline" in set(pd.read_parquet(out / "tables" / "table2.parquet")["task"])  # Parquet keeps every task

    t1_md = (out / "tables" / "table1.md").read_text()
    t1_header = t1_md.splitlines()[0]
    assert "| sst2 |" in t1_header and "| cola |" not in t1_header
    t1_not_run = [line for line in t1_md.splitlines() if line.startswith("Not run in this experiment: ")]
    assert len(t1_not_run) == 1 and "cola" in t1_not_run[0] and "sst2" not in t1_not_run[0]
    assert {"cola", "sst2"} <= set(pd.read_parquet(out / "tables" / "table1.parquet")["task"])

    # A task whose only run failed was run: it stays a row, its empty cell said to have no usable run.
    write_results([record for record in real_records if record["status"] == "failed"], tmp_path / "results")
    failed_text = build_report(tmp_path / "results", tmp_path / "out").read_text()
    assert f"| {names['disasters']} |" in failed_text and "Not measured (no usable run): Fine-tune: disasters." in failed_text
    assert "(no run of Table 1's tasks and methods)" in failed_text


def test_report_uses_the_ablation_it_was_given(real_report, real_ablation):
    report, out = real_report
    assert len(real_ablation) == 21  # 6 layers: every contiguous span
    assert f"{len(real_ablation)} ablation row(s)" in report.read_text()
    assert (out / "figures" / "figure6_ablation.png").stat().st_size > 1000


def test_table1_uses_the_papers_backbone_even_when_another_scores_higher(real_records, tmp_path):
    """Table 1 is BERT-large in the paper; paper_full also holds BERT-base GLUE runs (tradeoff, ablation).

    The records are real SST-2 full fine-tuning runs (trained on the test backbone) copied twice with only
    `backbone`, `config.backbone`, `run_id` and the scores changed, to stand for a BERT-large and a
    BERT-base run: the BERT-base copy scores higher on validation and must still not be chosen.
    """
    sst2_full = next(r for r in real_records if r["status"] == "ok" and r["task"] == "sst2" and r["method"]["name"] == "full")
    records = []
    for backbone, val in (("bert-large-uncased", 0.7), ("bert-base-uncased", 0.9), ("bert-base-uncased", 0.8)):
        record = copy.deepcopy(sst2_full)
        scores = {**record["val_metrics"], record["primary_metric"]: val}
        record.update(backbone=backbone, run_id=f"{backbone}-{val}", val_metrics=scores, test_metrics=scores)
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


def _as_task(record: dict, task: str, method: dict, metrics: dict, run_id: str) -> dict:
    """A real record re-labelled as another task's run (config included, so baselines use its subsets)."""
    copied = copy.deepcopy(record)
    primary = next(iter(metrics))
    copied.update(task=task, method=method, run_id=run_id, primary_metric=primary, val_metrics=metrics, test_metrics={})
    copied["config"] = {**copied["config"], "task": task, "method": method}
    return copied


def test_table1_mean_is_compared_with_the_papers_column_mean_not_its_server_score(real_records, tmp_path):
    """Every one of the nine columns measured (real SST-2 records re-labelled as each task): the paper's
    figure beside our mean is the mean of its nine columns, 82.0 / 81.5 / 81.1, not the GLUE server's
    'Total' 80.4 / 80.0 / 79.6, which stays in the table as paper_server_score."""
    reference = load_reference()
    full = next(r for r in real_records if r["status"] == "ok" and r["task"] == "sst2" and r["method"]["name"] == "full")
    records = []
    for task in reference["table1"]["tasks"]:
        metric = reference["table1"]["metrics"][task]
        for method in ({"name": "full"}, {"name": "adapters", "size": 64, "init_std": 0.01}):
            records.append(_as_task(full, task, method, {metric: 0.5}, f"{task}-{method['name']}"))
    write_results(records, tmp_path)
    table = table1(read_results(tmp_path)["runs"], reference)
    means = table[table["task"] == "glue_mean"].set_index("row")
    assert {row: round(means.loc[row, "paper"], 1) for row in means.index} == {"full": 82.0, "adapters_best": 81.5, "adapters_64": 81.1}
    assert means["paper_server_score"].to_dict() == {"full": 80.4, "adapters_best": 80.0, "adapters_64": 79.6}
    assert means["measured"].tolist() == pytest.approx([50.0] * 3) and (means["n_tasks"] == 9).all()
    assert "mean of 9 columns" in table1_markdown(table) and "glue_score" not in set(table["task"])
    # Over fewer columns, the header counts them: one measured task is a mean of 1 column, not of 9.
    one = [record for record in records if record["task"] == "cola"]
    write_results(one, tmp_path / "one")
    table = table1(read_results(tmp_path / "one")["runs"], reference)
    assert "mean of 1 column |" in table1_markdown(table)


def test_majority_class_baseline_stands_beside_every_measured_task(real_results_dir, shared_data_dir):
    """The baseline is the training labels' majority class (the run's seeded training subset) scored on
    the reported split's subset: computed here from the raw splits, independently of the report."""
    from collections import Counter

    from adaptune.data.batching import subsample
    from adaptune.data.loading import load_task_data

    runs = read_results(real_results_dir)["runs"]

    def expected(task: str, split: str) -> float:
        data = load_task_data(task, shared_data_dir)
        counts = Counter(subsample(data["train"], 128)["label"])  # the fixture's max_train_examples
        majority = max(sorted(counts), key=counts.get)
        gold = subsample(data[split], 64)["label"]  # its max_eval_examples
        return 100.0 * sum(label == majority for label in gold) / len(gold)

    t1 = table1(runs, load_reference(), data_dir=shared_data_dir)
    sst2 = t1[(t1["row"] == "full") & (t1["task"] == "sst2")].iloc[0]
    assert sst2["majority"] == pytest.approx(expected("sst2", "test"))  # GLUE reports dev.tsv, its test split
    t2 = table2(runs, load_reference(), data_dir=shared_data_dir)
    disasters = t2[(t2["task"] == "disasters") & (t2["method"] == "adapters")].iloc[0]
    assert disasters["majority"] == pytest.approx(expected("disasters", "test"))
    assert "majority class" in table1_markdown(t1) and "| majority class |" in table2_markdown(t2, load_reference())


def test_majority_baseline_of_f1_mcc_and_missing_data(shared_data_dir, tmp_path):
    """MRPC: predicting 'paraphrase' everywhere scores F1 2p/(1+p) (0.81 on dev), which must not pass as
    learning; CoLA's MCC of a constant is 0; a mirror without the task's files gives None (no hub)."""
    from adaptune.report.baselines import majority_baseline

    dev = pd.read_csv(shared_data_dir / "glue" / "MRPC" / "dev.tsv", sep="\t", quoting=3)
    positive = dev.iloc[:, 0].mean()  # the Quality column: 1 = paraphrase, the training majority too
    mrpc = majority_baseline("mrpc", "test", data_dir=shared_data_dir)  # test: GLUE's dev.tsv
    assert mrpc["f1"] == pytest.approx(2 * positive / (1 + positive)) and round(mrpc["f1"], 2) == 0.81
    assert mrpc["accuracy"] == pytest.approx(positive)
    cola = majority_baseline("cola", "test", data_dir=shared_data_dir)
    assert cola["matthews_correlation"] == 0.0 and 0.6 < cola["accuracy"] < 0.75
    assert majority_baseline("cola", "test", data_dir=tmp_path) is None  # an empty mirror


def test_adapter_size_table_reports_accuracy_whatever_the_selection_metric(real_records, tmp_path):
    """Section 3.6 averages validation accuracy: a CoLA run (selected by MCC) and an MRPC run (by F1)
    count with their accuracy, and the configuration is chosen by accuracy too."""
    adapters = next(r for r in real_records if r["status"] == "ok" and r["task"] == "sst2" and r["method"]["name"] == "adapters")
    method = {"name": "adapters", "size": 64, "init_std": 0.01}
    records = [
        _as_task(adapters, "cola", method, {"matthews_correlation": 0.10, "accuracy": 0.70}, "cola-a"),
        _as_task(adapters, "mrpc", method, {"f1": 0.90, "accuracy": 0.60}, "mrpc-a"),
        # Better F1 but worse accuracy, at another lr: accuracy chooses, so this one loses.
        {**_as_task(adapters, "mrpc", method, {"f1": 0.95, "accuracy": 0.50}, "mrpc-b"), "lr": 0.5},
    ]
    records[2]["config"] = {**records[2]["config"], "lr": 0.5}
    write_results(records, tmp_path)
    sizes = adapter_size_table(read_results(tmp_path)["runs"], load_reference())
    row = sizes[sizes["adapter_size"] == 64].iloc[0]
    assert row["metric"] == "accuracy" and row["tasks"] == "cola,mrpc"
    assert row["measured"] == pytest.approx(100 * (0.70 + 0.60) / 2)


def test_figure6_heatmaps_read_accuracy_where_the_ablation_has_it(real_ablation):
    from adaptune.report.figures import ablation_metric

    rows = pd.DataFrame(real_ablation)
    assert ablation_metric(rows) == "accuracy"
    mcc = rows.assign(metric="matthews_correlation")
    assert ablation_metric(pd.concat([mcc, rows])) == "accuracy"  # CoLA: MCC rows first, accuracy chosen
    assert ablation_metric(mcc) == "matthews_correlation"  # no accuracy recorded: the metric there is


def test_squad_figure_says_when_its_runs_used_the_local_standin_split(tmp_path: Path) -> None:
    from adaptune.report.figures import figure5_squad
    from adaptune.report.reference import load_reference
    from adaptune.report.results import read_results, write_runs
    from adaptune.train.config import TrainConfig
    from adaptune.train.record import run_record

    record = run_record(TrainConfig(task="squad", method={"name": "adapters", "size": 64}, backbone="bert-base-uncased"), "f1")
    record.update(val_metrics={"f1": 0.31, "exact_match": 0.2}, trained_params=10, total_params=100,
                  data_split="squad_dev_standin", split_note="squad_dev_standin: NOT the paper's split")
    write_runs([record], tmp_path)
    figure = figure5_squad(read_results(tmp_path)["runs"], load_reference(), tmp_path / "figures")
    assert figure.skipped is None and "squad_dev_standin, NOT the paper's split" in figure.title
    standard = dict(record, data_split="standard", split_note=None)
    write_runs([standard], tmp_path / "standard")
    assert "NOT the paper's" not in figure5_squad(read_results(tmp_path / "standard")["runs"], load_reference(), tmp_path / "f2").title


def test_methods_table_sets_every_method_side_by_side_on_its_best_configuration(real_results_dir, shared_data_dir):
    """Per task and method: the configuration best on mean validation, its test mean ± s.e.m. over seeds
    (disasters adapters: two seeds), the lr selected, and the majority class on the same rows."""
    from adaptune.report.methods_table import methods_markdown, methods_table
    from adaptune.report.selection import best_configuration, scored_runs

    runs = read_results(real_results_dir)["runs"]
    table = methods_table(runs, data_dir=shared_data_dir).set_index(["task", "method"])
    assert set(table.index) == {("disasters", "full"), ("disasters", "adapters"), ("disasters", "layernorm"),
                                ("sst2", "full"), ("sst2", "adapters")}
    usable = scored_runs(runs)
    for (task, method), row in table.iterrows():
        group = usable[(usable["task"] == task) & (usable["method"] == method)]
        best = best_configuration(group, ["task", "method"]).iloc[0]
        seeds = runs[runs["run_id"].isin(best["run_ids"].split(","))]
        # The reported split as its publisher names it: GLUE's is its dev set; disasters' test is cut here.
        assert row["mean"] == pytest.approx(100 * seeds["test_score"].mean()) and row["split"] == {"sst2": "dev", "disasters": "test"}[task]
        assert row["n_seeds"] == len(seeds) and row["rows"] == 64 and f"lr={best['lr']:g}" in row["selected"]
    adapters = table.loc[("disasters", "adapters")]
    assert adapters["n_seeds"] == 2 and adapters["sem"] > 0  # the degenerate init-std-0.1 seed is another configuration
    assert table.loc[("sst2", "full"), "majority"] == table.loc[("sst2", "adapters"), "majority"] is not None
    text = methods_markdown(methods_table(runs, data_dir=shared_data_dir))
    assert "| sst2 | accuracy (dev, 64) |" in text and "2 seeds" in text and "trained % of the backbone" in text


def test_squad_figure_shows_bert_large_the_backbone_its_f1_points_to(tmp_path: Path) -> None:
    from adaptune.report.figures import figure5_squad
    from adaptune.report.reference import load_reference
    from adaptune.report.results import read_results, write_runs
    from adaptune.train.config import TrainConfig
    from adaptune.train.record import run_record

    records = []
    for backbone in ("bert-base-uncased", "bert-base-uncased", "bert-large-uncased"):  # BERT-base the most common
        record = run_record(TrainConfig(task="squad", method={"name": "adapters", "size": 64}, backbone=backbone, seed=len(records)), "f1")
        record.update(val_metrics={"f1": 0.9}, trained_params=10, total_params=100)
        records.append(record)
    write_runs(records, tmp_path)
    figure = figure5_squad(read_results(tmp_path)["runs"], load_reference(), tmp_path / "figures")
    assert figure.backbone == "bert-large-uncased" == load_reference()["figures"]["figure5_squad_f1"]["backbone"]


def test_report_says_when_its_runs_were_trained_in_more_than_one_precision(real_report, real_records, tmp_path):
    """A results set whose scoring runs mix residual streams (a resubmission under a preset that changed) or CPU
    precisions says so above its tables, with the counts; one trained alike says nothing of it."""
    assert "more than one precision" not in real_report[0].read_text()
    mixed = copy.deepcopy(real_records)
    scored = [record for record in mixed if record["status"] != "failed"]
    for record in scored[:2]:
        record["residual"] = "bf16"
    scored[0]["device"] = "cpu:bf16" if scored[0]["device"] == "cpu" else "cpu"
    write_results(mixed, tmp_path / "results")
    text = build_report(tmp_path / "results", tmp_path / "report").read_text()
    others = len(scored) - 2
    assert f"**Trained in more than one precision:** residual stream: float32 ({others} runs), bf16 (2 runs); CPU precision: " in text
    assert text.index("more than one precision") < text.index("## Methods side by side")


def test_the_head_alone_stands_beside_the_majority_class_in_every_table(shared_data_dir):
    """Head-only runs (the frozen backbone, a trained head) are the floor: Table 1's row, Table 2's and the
    methods table's first method, each beside the majority class; the paper has no such row, so no paper line."""
    from results_fixture import constructed_runs

    from adaptune.report.methods_table import methods_markdown, methods_table

    head, full = {"name": "head"}, {"name": "full"}
    rows = [{"task": task, "method": method, "lr": lr, "seed": seed, "val": val + 0.01 * seed, "test": test + 0.01 * seed}
            for task in ("sst2", "sms_spam") for method, lr, val, test in ((head, 3e-3, 0.70, 0.68), (full, 1e-4, 0.90, 0.88))
            for seed in range(2)]
    runs = constructed_runs(rows)
    reference = load_reference()
    first = table1(runs, reference, shared_data_dir).set_index(["row", "task"])
    assert first.loc[("head", "sst2"), "measured"] == pytest.approx(69.0) and pd.isna(first.loc[("head", "sst2"), "paper"])
    assert first.loc[("head", "sst2"), "majority"] == first.loc[("full", "sst2"), "majority"] is not None
    text = table1_markdown(table1(runs, reference, shared_data_dir), runs)
    assert text.index("| Head only (frozen backbone) | measured | 69.0 |") < text.index("| Full fine-tuning | measured | 89.0 |")
    head_lines = text.split("| Head only")[1].split("| Full fine-tuning")[0].splitlines()
    assert [line.split(" | ")[1] for line in head_lines if line] == ["measured", "majority class"]  # no paper line
    second = table2(runs, reference, shared_data_dir).set_index(["method", "task"])
    assert second.loc[("head", "sms_spam"), "measured_mean"] == pytest.approx(68.5)
    assert "Head only measured" in table2_markdown(table2(runs, reference, shared_data_dir), reference, runs)
    methods = methods_markdown(methods_table(runs, data_dir=shared_data_dir))
    assert methods.splitlines()[0].startswith("| task | metric (split, rows) | majority class | Head only (frozen backbone) | Full fine-tuning |")
    assert "| sms_spam | accuracy (test" in methods and "| sst2 | accuracy (dev" in methods
    assert "| trained % of the backbone | | | 0.01 | 100.00 |" in methods  # the head's 100 of 1,000,000 parameters


def test_a_report_copied_beside_its_results_names_that_folder(real_results_dir, tmp_path):
    """The line under the title names the folder the results are in: a report copied out of a pipeline's
    internal folders into the user's --out is pointed at that folder; anything but a report is refused."""
    from adaptune.report.markdown import name_results_folder

    internal = tmp_path / "kfp_root" / "aggregate" / "results"
    shutil.copytree(real_results_dir, internal)
    report = build_report(internal, tmp_path / "report")
    assert f"Results: `{internal}` — " in report.read_text()
    before = report.read_text().splitlines()
    name_results_folder(report, tmp_path / "out")
    after = report.read_text().splitlines()
    changed = [index for index, (old, new) in enumerate(zip(before, after, strict=True)) if old != new]
    assert len(changed) == 1 and after[changed[0]].startswith(f"Results: `{tmp_path / 'out'}` — ") and "kfp_root" not in report.read_text()
    other = tmp_path / "notes.md"
    other.write_text("# notes\n")
    with pytest.raises(ValueError, match="has no results line"):
        name_results_folder(other, tmp_path)


def test_the_report_says_what_its_methods_table_lists_and_states_the_evidence_rule_once(real_report):
    """The methods table lists regression tasks too (every non-SQuAD task), and the claims section states once how
    many seeds a verdict needs."""
    from adaptune.report.bootstrap import rule_text

    text = real_report[0].read_text()
    methods = text.split("## Methods side by side")[1].split("\n## ")[0]
    assert "Every classification and regression task measured" in methods and "Every classification task" not in text
    claims = text.split("## The paper's claims")[1].split("\n## ")[0]
    assert text.count(rule_text()) == 1 and rule_text() in claims
