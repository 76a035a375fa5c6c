"""Frozen query, key and value projections as one stacked matmul (adaptune.fused.frozen_projections): the
same model, the same outputs and gradients, only where all three are frozen.

The embedded backbone (MiniLM, 6 layers), float32 on the CPU, dropout off. The stacked matmul computes
each output column as the separate one does, so the logits come out equal to float32 rounding (1e-6); the
input's gradient is one matmul over 3 x hidden where it was three summed, a different reduction order, so
the trained tensors' gradients agree to 1e-5 relative (measured: 2e-6), far below what a wrong projection,
bias or head split gives (order 1).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from adaptune.fused.frozen_projections import stack_frozen_projections
from adaptune.model.backbone import load_model, load_tokenizer
from adaptune.model.methods import apply_method, parse_method


def _model(method: str) -> nn.Module:
    torch.manual_seed(0)
    model = load_model(None, "classification", num_labels=2)
    apply_method(model, parse_method(method))
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model.train()


SENTENCES = ["The company said its quarterly profit rose sharply on strong demand.", "Shares fell.",
             "He declined to comment on the report, which was published on Tuesday.", "The bill passed the Senate 60 to 38."]


def _batch() -> dict[str, torch.Tensor]:
    """Sentences of unequal length, so that padding's additive mask goes through the stacked path too."""
    encoded = load_tokenizer(None)(SENTENCES, padding=True, return_tensors="pt")
    assert not bool(encoded["attention_mask"].all())
    return {**encoded, "labels": torch.tensor([0, 1, 1, 0])}


def _logits_and_gradients(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = model(**_batch())
    out.loss.backward()
    return out.logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


def _stacked_layers(model: nn.Module) -> list[bool]:
    return [hasattr(layer.attention.self, "stacked_projection_weight") for layer in model.base_model.encoder.layer]


@pytest.mark.parametrize("method", ["adapters:8", "layernorm", "top_k:2"])
def test_stacked_projections_compute_what_separate_ones_do(method: str) -> None:
    separate = _model(method)
    stacked = copy.deepcopy(separate)
    stack_frozen_projections(stacked)
    logits, gradients = _logits_and_gradients(separate)
    stacked_logits, stacked_gradients = _logits_and_gradients(stacked)
    torch.testing.assert_close(stacked_logits, logits, rtol=0, atol=1e-6)
    assert stacked_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        scale = gradient.abs().max().clamp(min=1e-12)
        assert float((stacked_gradients[name] - gradient).abs().max() / scale) < 1e-5, name


@pytest.mark.parametrize(("method", "stacked"), [
    ("adapters:8", [True] * 6),
    ("pfeiffer:8", [True] * 6),
    ("top_k:2", [True] * 4 + [False] * 2),  # the top two layers' projections train
    ("full", [False] * 6),
    ("lora", [False] * 6),  # peft wraps query and value
])
def test_only_layers_whose_three_projections_are_frozen_linears_stack(method: str, stacked: list[bool]) -> None:
    model = _model(method)
    names = set(model.state_dict())
    assert stack_frozen_projections(model) == sum(stacked)
    assert _stacked_layers(model) == stacked
    assert set(model.state_dict()) == names  # the stacked copy is never saved; the projections keep their names
    assert stack_frozen_projections(model) == 0  # once


def test_stacked_model_casts_copies_and_evaluates() -> None:
    """A deep copy keeps the stacked forward, a cast carries the stacked buffers, evaluation runs it too."""
    model = _model("adapters:8")
    stack_frozen_projections(model)
    copied = copy.deepcopy(model).eval()
    assert _stacked_layers(copied) == [True] * 6
    with torch.no_grad():
        expected = model.eval()(**_batch()).logits
        torch.testing.assert_close(copied(**_batch()).logits, expected, rtol=0, atol=0)
    halved = copied.to(torch.bfloat16)
    assert halved.base_model.encoder.layer[0].attention.self.stacked_projection_weight.dtype == torch.bfloat16


def test_the_trainers_stack_under_bf16_autocast_and_say_so(tmp_path, shared_data_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs alone and in a group, bf16 as this CPU trains by default: the records say the projections were stacked,
    and the run trains alike alone and grouped (1e-4, as tests/test_fused_groups.py bounds reduction order)."""
    from adaptune.core.devices import native_cpu_bf16
    from adaptune.train.config import TrainConfig
    from adaptune.train.group_loop import train_group
    from adaptune.train.loop import train_and_evaluate

    if not native_cpu_bf16():
        pytest.skip("the trainers stack the projections under bf16 autocast, emulated on this CPU")
    monkeypatch.setenv("ADAPTUNE_CPU_BF16", "auto")
    small = dict(task="mrpc", epochs=1, max_length=48, max_train_examples=32, max_eval_examples=16, batch_size=16)
    run, other = (TrainConfig(method={"name": "adapters", "size": 8}, lr=lr, seed=seed, **small) for lr, seed in ((1e-3, 0), (3e-4, 1)))
    stacked = train_and_evaluate(run, data_dir=shared_data_dir, out_dir=tmp_path / "stacked", progress=False)
    grouped = train_group([run, other], [tmp_path / "group" / name for name in ("run", "other")], data_dir=shared_data_dir)
    assert [record["projections"] for record in (stacked, *grouped)] == ["stacked"] * 3
    assert stacked["device"] == "cpu:bf16"
    loss = [record["curve"][-1]["train_loss"] for record in (stacked, grouped[0])]
    assert abs(loss[0] - loss[1]) < 1e-4, loss


def test_the_attention_kernel_takes_stacked_projections_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention kernel (here under Triton's interpreter, which tests/conftest.py turns on) takes the stacked output
    as one tensor and writes its gradient as one: a tiny BERT with counter dropout on computes the same logits and
    gradients stacked as separate, every attention call in the kernel (float32: 1e-5, as tests/fused/kernels/test_attention.py
    bounds the kernel against eager attention), and the stacked backward pass joins no gradients (no `cat`)."""
    pytest.importorskip("triton", reason="make venv installs triton (requirements-kernel-tests.txt)")
    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.fused.run_dropout import CounterStream, use_run_dropout
    from adaptune.fused.settings import StepSettings
    from bench.gpu_fused import KernelLaunches

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)

    def trained(stack: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
        apply_method(model, parse_method("adapters:8"))
        use_run_dropout(model, [CounterStream(3)], StepSettings(dropout_masks="counter", attention="kernel"))
        if stack:
            assert stack_frozen_projections(model) == 2
        with KernelLaunches() as launches, _Operators() as operators:
            logits, gradients = _logits_and_gradients(model.train())
        ops = operators.counts
        assert ops["run_dropout_attention_stacked_backward" if stack else "run_dropout_attention_backward"] == 2
        assert (ops["cat"] == 0) if stack else (ops["run_dropout_attention_stacked"] == 0)
        return logits, gradients, launches.forward

    (logits, gradients, calls), (stacked_logits, stacked_gradients, stacked_calls) = trained(False), trained(True)
    assert calls == stacked_calls == 2
    torch.testing.assert_close(stacked_logits, logits, rtol=0, atol=1e-5)
    for name, gradient in gradients.items():
        torch.testing.assert_close(stacked_gradients[name], gradient, rtol=0, atol=1e-5 * max(1.0, float(gradient.abs().max())))


class _Operators(TorchDispatchMode):
    """The torch operators dispatched, by name (custom operators count as one, their insides not)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))
