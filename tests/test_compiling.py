"""The training forward under torch.compile (adaptune.train.compiling, ADAPTUNE_COMPILE): a compiled run is
the run it is eagerly, alone and in a group, with both dropout mask schemes.

Real data (MRPC from ../shared/data), the embedded backbone, the fused-group tests' small sizes and
tolerance: compiling fuses operators, which changes float32 reduction order only. The test compiles with
torch.compile's "aot_eager" backend: the same graph capture (dynamo's tracing of the run's dropout and
its counts advanced in place, AOT autograd's backward) without inductor's C++ code generation, which
takes over 10 minutes on a loaded 2-core machine. With inductor (`ADAPTUNE_TEST_INDUCTOR=1`) the same
test passed in 706 s on 2026-11-26 with the model compiled whole, and in 307 s compiled by layer. CUDA graphs (mode "graphs") need a GPU; the GPU benchmark runs that
mode (adaptune.bench.gpu_fused).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import adaptune.train.compiling as compiling
from adaptune.model.run_dropout import DROPOUT_MASKS_ENV
from adaptune.train.compiling import COMPILE_ENV, compile_mode
from adaptune.train.group_loop import train_group
from adaptune.train.loop import train_and_evaluate
from adaptune.train.step_graphs import COMPILED_STEP_GRAPHS
from tests.test_fused_groups import METHODS, TOLERANCE, _config, assert_a_group_in_mode_trains_as_eager, step_losses  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("ADAPTUNE_TEST_INDUCTOR") == "1":
        return
    real = torch.compile

    def aot_eager(model: Any, dynamic: bool, mode: str | None) -> Any:
        return real(model, dynamic=dynamic, backend="aot_eager")

    monkeypatch.setattr(compiling.torch, "compile", aot_eager)


def _same_training(compiled: dict, eager: dict) -> None:
    assert compiled["compile"] == "compiled" and eager["compile"] == "eager"
    assert [p["train_loss"] for p in compiled["curve"]] == pytest.approx([p["train_loss"] for p in eager["curve"]], abs=TOLERANCE)
    assert compiled["val_metrics"] == pytest.approx(eager["val_metrics"], abs=TOLERANCE)
    assert compiled["test_metrics"] == pytest.approx(eager["test_metrics"], abs=TOLERANCE)


@pytest.mark.heavy
def test_a_compiled_run_trains_as_it_does_eagerly_alone_and_in_a_group(tmp_path: Path, shared_data_dir: Path, backend: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    method = METHODS["adapters"]
    a, b = _config(method, 1e-3, 0), _config(method, 3e-3, 1)
    monkeypatch.setenv(DROPOUT_MASKS_ENV, "counter")
    monkeypatch.setenv(COMPILE_ENV, "compiled")
    group = train_group([a, b], [tmp_path / "group" / "a", tmp_path / "group" / "b"], data_dir=shared_data_dir)
    monkeypatch.setenv(DROPOUT_MASKS_ENV, "generator")
    alone_b = train_and_evaluate(b, data_dir=shared_data_dir, out_dir=tmp_path / "alone_b", progress=False)
    monkeypatch.setenv(COMPILE_ENV, "eager")
    for compiled, masks in ((alone_b, "generator"), (group[0], "counter"), (group[1], "counter")):
        monkeypatch.setenv(DROPOUT_MASKS_ENV, masks)
        config = a if compiled is group[0] else b
        eager = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "eager" / masks / config.run_id, progress=False)
        assert compiled["dropout_masks"] == eager["dropout_masks"] == masks
        _same_training(compiled, eager)


@pytest.mark.heavy
def test_a_group_stepped_for_cuda_graphs_around_compiled_layers_trains_as_it_does_eagerly(
        tmp_path: Path, shared_data_dir: Path, backend: None, step_losses: list[list[float]], monkeypatch: pytest.MonkeyPatch) -> None:
    """ADAPTUNE_COMPILE=compiled_step_graphs on a CPU: the step a CUDA graph would hold around the compiled
    layers (dynamo traces each run's counter masks inside the layer, so a GPU's inductor draws them in the
    kernels that apply them), padded to its bucket, dropout on: the eager group's training. The capture
    itself needs a GPU (`make bench-gpu`'s graph check with --fused-compile compiled_step_graphs)."""
    assert_a_group_in_mode_trains_as_eager(COMPILED_STEP_GRAPHS, tmp_path, shared_data_dir, step_losses, monkeypatch)


def test_the_compile_mode_is_a_setting_checked_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    assert compile_mode() == "eager"
    monkeypatch.setenv(COMPILE_ENV, "jit")
    with pytest.raises(ValueError, match="ADAPTUNE_COMPILE='jit' is not a compile mode: use one of eager, compiled, graphs"):
        compile_mode()


def test_the_autotuned_mode_compiles_each_layer_with_max_autotune_and_leaves_the_capture_to_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """ADAPTUNE_COMPILE=autotuned_step_graphs: every Transformer layer compiled with inductor's max-autotune without its own
    CUDA graphs (the step's capture holds them), the model itself not; compiled_step_graphs' layers in the default mode."""
    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.core.step_settings import STEP_GRAPH_MODES

    asked = []
    monkeypatch.setattr(compiling.torch, "compile", lambda module, dynamic, mode: asked.append((type(module).__name__, dynamic, mode)) or module)
    model = BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64))
    assert "autotuned_step_graphs" in STEP_GRAPH_MODES
    compiling.training_forward(model, "autotuned_step_graphs")
    assert asked == [("BertLayer", True, "max-autotune-no-cudagraphs")] * 3
    asked.clear()
    compiling.training_forward(model, COMPILED_STEP_GRAPHS)
    assert asked == [("BertLayer", True, "default")] * 3
