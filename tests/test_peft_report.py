"""The methods beside the paper's (issue #21) in its sweeps and its report: peft_compare and peft_local
plan them under the paper's protocol, and Figures 3-4 and the methods table show them as curves and
columns of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from results_fixture import constructed_runs
from transformers import BertConfig, BertForSequenceClassification

from adaptune.core.paper_grids import DEVLIN_GLUE_LRS, GLUE_LRS
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.model.params import count_parameters
from adaptune.report import figures
from adaptune.report.methods_table import methods_markdown, methods_table
from adaptune.report.reference import load_reference
from adaptune.sweep.experiments import EXPERIMENTS
from adaptune.sweep.plan import plan
from adaptune.train.config import method_label


def _labels(spec_name: str) -> dict[str, set[tuple[float, int]]]:
    by_label: dict[str, set[tuple[float, int]]] = {}
    for run in plan(EXPERIMENTS[spec_name]).runs:
        by_label.setdefault(method_label(run.method), set()).add((run.lr, run.epochs))
    return by_label


def test_peft_compare_runs_every_method_at_the_papers_glue_protocol_on_bert_base() -> None:
    planned = plan(EXPERIMENTS["peft_compare"])
    assert {run.backbone for run in planned.runs} == {"bert-base-uncased"}
    assert set(planned.tasks) == set(plan(EXPERIMENTS["glue_full"]).tasks)  # Table 1's tasks (MNLI-mm scored off MNLI's runs)
    grid = _labels("peft_compare")
    assert set(grid) == {"full", "adapters8", "adapters64", "pfeiffer64", "lora8", "ia3"}
    adapter_grid = {(lr, epochs) for lr in GLUE_LRS for epochs in (3, 20)}  # §3.2
    for label in ("adapters8", "adapters64", "pfeiffer64", "lora8", "ia3"):
        assert grid[label] == adapter_grid, label
    assert grid["full"] == {(lr, 3) for lr in DEVLIN_GLUE_LRS}  # Table 1's baseline: Devlin et al.'s grid
    assert {run.seed for run in planned.runs} == {0, 1, 2, 3, 4}


def test_peft_local_shares_glue_locals_3_epoch_runs_and_adds_lora_and_ia3() -> None:
    """Same run ids: the store trains glue_local's 3-epoch full, adapter and LayerNorm runs once for both (its runs of the
    head alone are glue_local's floor, not peft_local's)."""
    glue_local = {run.run_id for run in plan(EXPERIMENTS["glue_local"]).runs if run.epochs == 3 and run.method["name"] != "head"}
    peft_local = plan(EXPERIMENTS["peft_local"]).runs
    added = [run for run in peft_local if run.run_id not in glue_local]
    assert glue_local <= {run.run_id for run in peft_local}
    assert {run.epochs for run in peft_local} == {3}
    assert sorted({(method_label(run.method), run.lr) for run in added}) == [("ia3", 3e-3), ("lora8", 3e-4), ("lora8", 3e-3)]
    assert len(added) == 3 * 3 * 3  # 3 configurations x 3 tasks x 3 seeds


def test_glue_local_gives_adapters_the_papers_epochs_and_full_fine_tuning_devlins() -> None:
    """§3.2: adapters over epochs {3, 20} at each rate they run; full fine-tuning at Devlin et al.'s 3;
    LayerNorm-only at 20 on CoLA only; what is left out is said in the spec."""
    grid = _labels("glue_local")
    assert grid["adapters64"] == {(lr, epochs) for lr in (3e-4, 3e-3) for epochs in (3, 20)}
    assert grid["full"] == {(1e-4, 3)}
    assert grid["layernorm"] == {(3e-3, 3), (3e-3, 20)}
    planned = plan(EXPERIMENTS["glue_local"])
    assert {run.task for run in planned.runs if run.method["name"] == "layernorm" and run.epochs == 20} == {"cola"}
    assert {run.seed for run in planned.runs} == {0, 1, 2}
    assert "3e-5" in EXPERIMENTS["glue_local"].grid_left_out  # §3.2's third rate, left out and said so
    # The pair that decides the claim comes first in every task's shards (the grid runs in parts).
    cola = [run for run in planned.runs if run.task == "cola"]
    assert [(method_label(run.method), run.epochs, run.seed) for run in cola[:2]] == [("full", 3, 0), ("adapters64", 20, 0)]


def _trained_on_bert_base(method: dict[str, Any]) -> int:
    # BERT-base's shape on the meta device: the counts without the weights (or the hub).
    with torch.device("meta"):
        model = BertForSequenceClassification(BertConfig(num_labels=2))
    return count_parameters(apply_method(model, method_from_dict(method))).trained


def test_adapters_8_and_lora_8_train_a_matched_share_of_bert_base() -> None:
    """peft_compare's matched-size comparison, as its comment says: within 20% of each other, both ~0.3%."""
    base = 109_483_778  # BertForSequenceClassification(num_labels=2): BERT-base and a 2-way head
    adapters8 = _trained_on_bert_base({"name": "adapters", "size": 8})
    lora8 = _trained_on_bert_base({"name": "lora", "r": 8, "alpha": 8})
    assert 0.8 < lora8 / adapters8 < 1.0
    assert 0.25 < 100 * lora8 / base < 0.3 and 0.3 < 100 * adapters8 / base < 0.35


def _runs_with_peft_methods() -> pd.DataFrame:
    rows = []
    for task in ("rte", "cola"):
        for seed in (0, 1):
            rows += [
                {"task": task, "method": {"name": "full"}, "lr": 3e-5, "seed": seed, "val": 0.70, "test": 0.70},
                {"task": task, "method": {"name": "adapters", "size": 64}, "lr": 3e-4, "seed": seed, "val": 0.69, "test": 0.69},
                {"task": task, "method": {"name": "lora", "r": 8, "alpha": 8}, "lr": 3e-3, "seed": seed, "val": 0.67, "test": 0.66},
                {"task": task, "method": {"name": "ia3"}, "lr": 3e-3, "seed": seed, "val": 0.64, "test": 0.63},
                {"task": task, "method": {"name": "pfeiffer", "size": 64}, "lr": 3e-4, "seed": seed, "val": 0.68, "test": 0.68},
            ]
    return constructed_runs(rows)


@pytest.fixture
def drawn_legends(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The legend entries of each figure drawn, read from the matplotlib figure before it is saved."""
    legends: dict[str, list[str]] = {}
    save = figures._save

    def recording_save(fig: Any, out_dir: Path, name: str, title: str, backbone: str | None = None) -> Any:
        legends[name] = [text.get_text() for ax in fig.axes if ax.get_legend() for text in ax.get_legend().get_texts()]
        return save(fig, out_dir, name, title, backbone)

    monkeypatch.setattr(figures, "_save", recording_save)
    return legends


def test_figures_3_and_4_draw_the_methods_beside_the_papers_as_their_own_curves(drawn_legends, tmp_path: Path) -> None:
    runs = _runs_with_peft_methods()
    figure3 = figures.figure3_tradeoff(runs, load_reference(), tmp_path)
    figure4 = figures.figure4_per_task(runs, tmp_path)
    assert figure3.skipped is None and figure4.skipped is None
    for name in ("figure3_tradeoff", "figure4_per_task"):
        text = " ".join(drawn_legends[name])
        for method in ("Adapters", "LoRA", "(IA)3", "Adapters, Pfeiffer placement"):
            assert method in text, (name, method, text)
    # Figure 3 plots each method relative to full fine-tuning: LoRA's point is its own delta, 3 points below.
    points = figures._relative_points(runs)
    lora = points[points["method"] == "lora"]
    assert set(lora["task"]) == {"rte", "cola"} and lora["delta"].round(6).eq(-4.0).all()


def test_the_methods_table_gives_lora_and_ia3_columns_with_their_trained_share(shared_data_dir: Path) -> None:
    table = methods_table(_runs_with_peft_methods(), shared_data_dir)
    assert {"lora", "ia3", "pfeiffer"} <= set(table["method"])
    lora = table[(table["method"] == "lora") & (table["task"] == "rte")].iloc[0]
    assert lora["mean"] == pytest.approx(66.0) and lora["n_seeds"] == 2
    header = methods_markdown(table).splitlines()[0]
    assert "LoRA" in header and "(IA)3" in header and "majority class" in header
