"""The analysis notebooks run top to bottom (nbclient) on a small real result set."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from results_fixture import real_ablation, real_records, real_results_dir  # noqa: F401  (session fixtures)

from adaptune.report.results import write_runs

pytestmark = pytest.mark.xdist_group("results_report")

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"


def _execute(name: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ANALYSIS.parent), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(ANALYSIS / name, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ANALYSIS)}}).execute()
    return notebook


def _outputs(notebook: nbformat.NotebookNode) -> str:
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            texts.extend(str(value) for value in output.get("data", {}).values())
    return "\n".join(texts)


def test_results_notebook_renders_every_table_and_figure(real_results_dir, tmp_path, monkeypatch):
    notebook = _execute("results.ipynb", {"ADAPTUNE_RESULTS": str(real_results_dir), "ADAPTUNE_FIGURES": str(tmp_path)}, monkeypatch)
    text = _outputs(notebook)
    assert "| Full fine-tuning | measured |" in text  # Table 1
    assert "Crowdflower disasters" in text  # Table 2
    assert "Figure 5: SQuAD F1 vs trained parameters: skipped" in text
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == len(list(tmp_path.glob("*.png"))) == 5


def test_compare_notebook_shows_per_task_method_deltas(real_results_dir, real_records, tmp_path, monkeypatch):
    # Sweep b: the same real runs minus one method, so the comparison has equal cells and a missing one.
    sweep_b = tmp_path / "b"
    write_runs([record for record in real_records if record["method"]["name"] != "full"], sweep_b)
    notebook = _execute(
        "compare_sweeps.ipynb", {"ADAPTUNE_RESULTS_A": str(real_results_dir), "ADAPTUNE_RESULTS_B": str(sweep_b)}, monkeypatch
    )
    text = _outputs(notebook)
    assert "| disasters | adapters64 |" in text
    assert "| a only |" in text and "| 0.0 |" in text  # removed method shows; equal runs give zero deltas
    shutil.rmtree(sweep_b)


def test_compare_notebook_defaults_to_the_kept_stores_and_marks_rows_whose_sides_selected_differently(monkeypatch):
    # A fresh clone has both stores (analysis/measured/); on CoLA, LayerNorm-only's best is 20 epochs in float32 but
    # 3 in bf16 (whose store lacks the 20-epoch runs), so its -15.8 is between two choices, and says so.
    monkeypatch.delenv("ADAPTUNE_RESULTS_A", raising=False)
    monkeypatch.delenv("ADAPTUNE_RESULTS_B", raising=False)
    text = _outputs(_execute("compare_sweeps.ipynb", {}, monkeypatch))
    assert "a = measured/glue_local" in text and "b = measured/bf16_local" in text
    rows = {tuple(cell.strip() for cell in line.split("|")[1:4]): line for line in text.splitlines() if line.startswith("| ")}
    assert rows[("cola", "layernorm", "lr 0.003 x 20")].rstrip(" |").endswith("different configurations selected")
    assert not rows[("cola", "full", "lr 0.0001 x 3")].rstrip(" |").endswith("different configurations selected")


def test_compare_notebook_names_the_variable_it_could_not_read(tmp_path, monkeypatch):
    from nbclient.exceptions import CellExecutionError

    monkeypatch.delenv("ADAPTUNE_RESULTS_A", raising=False)
    with pytest.raises(CellExecutionError) as failed:
        _execute("compare_sweeps.ipynb", {"ADAPTUNE_RESULTS_B": str(tmp_path / "nowhere")}, monkeypatch)
    assert f"ADAPTUNE_RESULTS_B={tmp_path / 'nowhere'} is neither a results directory" in str(failed.value)


def test_results_notebook_reads_a_run_store_too(tmp_path, monkeypatch):
    store = Path(__file__).resolve().parents[1] / "analysis" / "measured" / "glue_local"
    text = _outputs(_execute("results.ipynb", {"ADAPTUNE_RESULTS": str(store), "ADAPTUNE_FIGURES": str(tmp_path)}, monkeypatch))
    assert f"{store}: 93 runs" in text
