"""The adapter module, its two insertion points per layer, and the ablation switch."""

from __future__ import annotations

import copy
import csv

import pandas as pd
import pytest
import torch
from transformers import (
    ElectraConfig,
    ElectraForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from adaptune.model.adapters import (
    Adapter,
    UnsupportedModelError,
    adapters_disabled,
    add_adapters,
    all_adapters,
    encoder_layers,
    layer_adapters,
    set_adapters_enabled,
)
from adaptune.model.backbone import load_model, load_tokenizer
from adaptune.model.methods import AdaptersConfig, apply_method


def sst2_batch(shared_data_dir, backbone_path, rows: int = 8) -> dict[str, torch.Tensor]:
    dev = pd.read_csv(shared_data_dir / "glue" / "SST-2" / "dev.tsv", sep="\t", quoting=csv.QUOTE_NONE)
    tokenizer = load_tokenizer(backbone_path)
    return dict(tokenizer(list(dev.sentence[:rows]), return_tensors="pt", padding=True, truncation=True, max_length=64))


@pytest.fixture(scope="module")
def batch(shared_data_dir, backbone_path) -> dict[str, torch.Tensor]:
    return sst2_batch(shared_data_dir, backbone_path)


@pytest.fixture(scope="module")
def base_model(backbone_path) -> torch.nn.Module:
    return load_model(backbone_path, "classification", num_labels=2).eval()


def logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**batch).logits


def adapted_copy(base_model: torch.nn.Module, **kwargs) -> torch.nn.Module:
    model = copy.deepcopy(base_model)
    return add_adapters(model, kwargs.pop("size", 64), **kwargs)


@pytest.mark.parametrize(("hidden", "size"), [(384, 64), (768, 8), (1024, 256), (16, 1)])
def test_adapter_parameter_count_is_2md_plus_d_plus_m(hidden: int, size: int) -> None:
    adapter = Adapter(hidden, size)
    assert sum(p.numel() for p in adapter.parameters()) == 2 * size * hidden + hidden + size


def test_adapter_init_is_truncated_normal_with_zero_biases() -> None:
    torch.manual_seed(0)
    std = 1e-2
    adapter = Adapter(384, 256, init_std=std)
    for projection in (adapter.down, adapter.up):
        weights = projection.weight
        assert weights.abs().max() <= 2 * std
        assert 0.5 * std < weights.std() < std  # a normal cut at 2 sigma has std ~0.88 sigma
        assert torch.count_nonzero(projection.bias) == 0


def test_zero_init_adapter_is_exactly_the_identity() -> None:
    adapter = Adapter(32, 4, init_std=0.0)
    hidden = torch.randn(3, 5, 32)
    assert torch.equal(adapter(hidden), hidden)


def test_adapter_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="size must be >= 1"):
        Adapter(32, 0)
    with pytest.raises(ValueError, match="unknown adapter nonlinearity 'swishy'.*known"):
        Adapter(32, 4, nonlinearity="swishy")
    assert isinstance(Adapter(32, 4, nonlinearity="relu").activation, torch.nn.ReLU)


def test_two_adapters_per_layer(base_model) -> None:
    model = adapted_copy(base_model)
    layers = encoder_layers(model)
    assert len(layers) == 6
    assert all(len(layer_adapters(layer)) == 2 for layer in layers)
    assert len(all_adapters(model)) == 12
    names = {name for name, _ in model.named_parameters() if ".adapter." in name}
    assert "bert.encoder.layer.0.attention.output.dropout.adapter.down.weight" in names
    assert "bert.encoder.layer.5.output.dropout.adapter.up.bias" in names


def test_adapter_sits_after_dropout_before_residual_and_layernorm(base_model, batch) -> None:
    model = adapted_copy(base_model, init_std=0.1)
    seen: dict[str, torch.Tensor] = {}

    def record(key: str, pick):
        def hook(_module, args, output) -> None:
            seen[key] = pick(args, output)

        return hook

    layer = model.bert.encoder.layer[2]
    for block_name, block in (("attention", layer.attention.output), ("ffn", layer.output)):
        block.register_forward_hook(record(f"{block_name}.residual", lambda args, _out: args[1]))
        block.dense.register_forward_hook(record(f"{block_name}.dense_out", lambda _args, out: out))
        block.dropout.dropout.register_forward_hook(record(f"{block_name}.dropout_out", lambda _args, out: out))
        block.dropout.adapter.register_forward_hook(record(f"{block_name}.adapter_in", lambda args, _out: args[0]))
        block.dropout.adapter.register_forward_hook(record(f"{block_name}.adapter_out", lambda _args, out: out))
        block.LayerNorm.register_forward_hook(record(f"{block_name}.norm_in", lambda args, _out: args[0]))
    with torch.no_grad():
        model.train()(**batch)  # training mode, so dropout really drops and its place is observable
    for block_name in ("attention", "ffn"):
        assert not torch.equal(seen[f"{block_name}.dropout_out"], seen[f"{block_name}.dense_out"])
        assert torch.equal(seen[f"{block_name}.adapter_in"], seen[f"{block_name}.dropout_out"])
        assert not torch.allclose(seen[f"{block_name}.adapter_out"], seen[f"{block_name}.adapter_in"])
        assert torch.equal(seen[f"{block_name}.norm_in"], seen[f"{block_name}.adapter_out"] + seen[f"{block_name}.residual"])


def test_zero_init_std_reproduces_the_base_model_exactly(base_model, batch) -> None:
    assert torch.equal(logits(adapted_copy(base_model, init_std=0.0), batch), logits(base_model, batch))


def test_default_init_std_stays_close_to_the_base_model(base_model, batch) -> None:
    torch.manual_seed(0)
    model = adapted_copy(base_model, init_std=1e-2)
    with torch.no_grad():
        adapted = model(**batch, output_hidden_states=True)
        base = base_model(**batch, output_hidden_states=True)
    assert not torch.equal(adapted.logits, base.logits)
    assert torch.allclose(adapted.logits, base.logits, atol=1e-2)
    similarity = torch.nn.functional.cosine_similarity(adapted.hidden_states[-1], base.hidden_states[-1], dim=-1)
    assert similarity.min() > 0.99


def test_switching_off_every_adapter_gives_the_base_model_exactly(base_model, batch) -> None:
    model = adapted_copy(base_model, init_std=0.1)  # far from identity, so the switch has work to do
    adapted = logits(model, batch)
    assert not torch.allclose(adapted, logits(base_model, batch), atol=1e-3)
    with adapters_disabled(model, 0, 5):
        assert torch.equal(logits(model, batch), logits(base_model, batch))
    assert torch.equal(logits(model, batch), adapted)  # restored on exit


def test_disabling_a_span_switches_exactly_those_layers(base_model, batch) -> None:
    model = adapted_copy(base_model, init_std=0.1)
    adapted = logits(model, batch)
    with adapters_disabled(model, 1, 3):
        states = [[adapter.enabled for adapter in layer_adapters(layer)] for layer in encoder_layers(model)]
        assert states == [[True, True], [False, False], [False, False], [False, False], [True, True], [True, True]]
        assert not torch.allclose(logits(model, batch), adapted, atol=1e-4)
    assert all(adapter.enabled for adapter in all_adapters(model))


def test_context_restores_previous_states_and_plain_switch(base_model) -> None:
    model = adapted_copy(base_model)
    set_adapters_enabled(model, [5], False)
    with adapters_disabled(model, 0, 0):
        assert not any(a.enabled for a in layer_adapters(encoder_layers(model)[0]))
    assert [a.enabled for a in all_adapters(model)] == [True] * 10 + [False, False]
    with pytest.raises(IndexError, match=r"layers 0\.\.5"):
        set_adapters_enabled(model, [6], True)


@pytest.mark.parametrize(("first", "last"), [(-1, 2), (3, 2), (0, 6)])
def test_bad_ablation_span_is_refused(base_model, first: int, last: int) -> None:
    with pytest.raises(ValueError, match="first <= last < 6"):
        with adapters_disabled(adapted_copy(base_model), first, last):
            pass


def test_switch_needs_adapters(base_model) -> None:
    with pytest.raises(ValueError, match="no adapters"):
        set_adapters_enabled(copy.deepcopy(base_model), [0], False)


def test_adding_adapters_twice_is_refused(base_model) -> None:
    model = adapted_copy(base_model)
    with pytest.raises(ValueError, match="already has adapters"):
        add_adapters(model, 8)


TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)


@pytest.mark.parametrize(
    "build",
    [
        lambda: RobertaForSequenceClassification(RobertaConfig(**TINY, pad_token_id=1)),
        lambda: ElectraForSequenceClassification(ElectraConfig(**TINY, embedding_size=16)),
    ],
    ids=["roberta", "electra"],
)
def test_other_bert_family_encoders(build) -> None:
    torch.manual_seed(0)
    base = build().eval()
    input_ids = torch.randint(3, 100, (2, 10))
    model = add_adapters(copy.deepcopy(base), 4, init_std=0.0)
    assert len(all_adapters(model)) == 6
    with torch.no_grad():
        assert torch.equal(model(input_ids=input_ids).logits, base(input_ids=input_ids).logits)
        for adapter in all_adapters(model):
            adapter.reset_parameters(0.1)
        assert not torch.allclose(model(input_ids=input_ids).logits, base(input_ids=input_ids).logits)
        with adapters_disabled(model, 0, 2):
            assert torch.equal(model(input_ids=input_ids).logits, base(input_ids=input_ids).logits)


def test_unsupported_model_gets_a_clear_error() -> None:
    gpt2 = GPT2ForSequenceClassification(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=32))
    with pytest.raises(UnsupportedModelError, match=r"GPT2ForSequenceClassification is not supported: expected a BERT-family encoder"):
        add_adapters(gpt2, 4)
    with pytest.raises(UnsupportedModelError, match="GPT2ForSequenceClassification"):
        apply_method(gpt2, AdaptersConfig(size=4))


def test_adapters_follow_the_model_dtype(base_model, batch) -> None:
    model = add_adapters(copy.deepcopy(base_model).to(torch.bfloat16), 8)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert logits(model, batch).dtype == torch.bfloat16
