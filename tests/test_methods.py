"""The tuning methods: trainable sets, frozen weights staying frozen, configs round-tripping."""

from __future__ import annotations

import copy
import csv
import dataclasses

import pandas as pd
import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    RobertaConfig,
    RobertaForSequenceClassification,
)
from transformers.models.bert.modeling_bert import BertPooler

from adaptune.model.backbone import MeanPooler, load_model, load_tokenizer, pooler_is_untrained
from adaptune.model.methods import (
    METHODS,
    AdaptersConfig,
    FullConfig,
    HeadOnlyConfig,
    LayerNormConfig,
    TopKConfig,
    apply_method,
    method_from_dict,
    parse_method,
    register_method,
)
from adaptune.train.config import TrainConfig, method_label

ALL_CONFIGS = [FullConfig(), AdaptersConfig(size=64), AdaptersConfig(size=8, init_std=1e-3, nonlinearity="relu"), TopKConfig(k=3), LayerNormConfig(),
               HeadOnlyConfig()]


@pytest.fixture(scope="module")
def classifier(backbone_path) -> torch.nn.Module:
    return load_model(backbone_path, "classification", num_labels=2)


@pytest.fixture(scope="module")
def sst2(shared_data_dir, backbone_path) -> dict[str, torch.Tensor]:
    dev = pd.read_csv(shared_data_dir / "glue" / "SST-2" / "dev.tsv", sep="\t", quoting=csv.QUOTE_NONE)
    tokenizer = load_tokenizer(backbone_path)
    batch = dict(tokenizer(list(dev.sentence[:16]), return_tensors="pt", padding=True, truncation=True, max_length=48))
    batch["labels"] = torch.tensor(dev.label[:16].to_numpy())
    return batch


def trainable_names(model: torch.nn.Module) -> set[str]:
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def applied(model: torch.nn.Module, cfg) -> torch.nn.Module:
    return apply_method(copy.deepcopy(model), cfg)


# Expected sets written from parameter names, independently of the structural selection in methods.py.
def test_full_trains_everything(classifier) -> None:
    model = applied(classifier, FullConfig())
    assert trainable_names(model) == {name for name, _ in model.named_parameters()}


def test_adapters_train_adapters_layernorms_and_head_not_pooler(classifier) -> None:
    model = applied(classifier, AdaptersConfig(size=64))
    expected = {name for name, _ in model.named_parameters() if ".adapter." in name or "LayerNorm" in name or name.startswith("classifier.")}
    assert trainable_names(model) == expected
    assert "bert.embeddings.LayerNorm.weight" in expected
    assert not any(name.startswith("bert.pooler.") for name in trainable_names(model))
    # DESIGN.md's fact: 12 adapters x (2*64*384 + 384 + 64) + 13 LayerNorms x 768 + 384*2 + 2.
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 605_954


def _bert_checkpoint(directory, pooler_bias: float) -> str:
    """A small BERT initialised as BERT is (std 0.02), saved as a checkpoint; a nonzero pooler bias
    stands for a pooler that was trained (any optimizer step moves a bias)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    model = BertModel(config)
    with torch.no_grad():
        model.pooler.dense.bias.fill_(pooler_bias)
    model.save_pretrained(directory)
    return str(directory)


@pytest.mark.parametrize("cfg", [AdaptersConfig(size=8), LayerNormConfig(), HeadOnlyConfig()], ids=["adapters", "layernorm", "head"])
def test_a_pretrained_pooler_is_kept_and_stays_frozen(tmp_path, cfg) -> None:
    """BERT as the paper has it: a checkpoint whose pooler was trained keeps it, and adapters /
    LayerNorm-only leave it frozen (the paper's and the official code's trained set)."""
    model = load_model(_bert_checkpoint(tmp_path, pooler_bias=0.01), "classification", num_labels=2)
    assert isinstance(model.bert.pooler, BertPooler) and not pooler_is_untrained(model)
    assert model.bert.pooler.dense.weight.std().item() == pytest.approx(0.02, rel=0.1)
    trained = trainable_names(apply_method(model, cfg))
    assert not any(name.startswith("bert.pooler.") for name in trained)
    assert {"classifier.weight", "classifier.bias"} <= trained


def test_an_untrained_pooler_is_replaced_by_mean_pooling(tmp_path, backbone_path, classifier) -> None:
    """The rule reads the weights: the embedded MiniLM's pooler (bias exactly 0, weight std ~0.009) and a
    fresh BERT pooler (bias 0, std 0.02) were never trained; load_model pools as MiniLM was trained."""
    raw = AutoModelForSequenceClassification.from_pretrained(backbone_path, num_labels=2)
    pooler = raw.bert.pooler.dense
    assert torch.count_nonzero(pooler.bias) == 0 and pooler.weight.std().item() < 0.015
    assert pooler_is_untrained(raw)
    assert isinstance(classifier.bert.pooler, MeanPooler) and not list(classifier.bert.pooler.parameters())
    assert sum(p.numel() for p in classifier.parameters()) == sum(p.numel() for p in raw.parameters()) - (384 * 384 + 384)
    fresh = load_model(_bert_checkpoint(tmp_path, pooler_bias=0.0), "classification", num_labels=2)
    assert isinstance(fresh.bert.pooler, MeanPooler)
    # The same MiniLM weights with a pooler bias that moved: pre-trained, whatever the name.
    with torch.no_grad():
        pooler.bias.fill_(1e-3)
    assert not pooler_is_untrained(raw)
    # Zero bias but weights far larger than an initialisation's: counted as trained.
    with torch.no_grad():
        pooler.bias.zero_()
        pooler.weight.mul_(10.0)
    assert not pooler_is_untrained(raw)
    # No pooler (RoBERTa's classifier has none) or no weights (meta device): the paper's layout.
    tiny = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=64, pad_token_id=1)
    assert not pooler_is_untrained(RobertaForSequenceClassification(tiny))
    with torch.device("meta"):
        assert not pooler_is_untrained(BertForSequenceClassification(BertConfig()))


def test_mean_pooling_averages_the_unpadded_tokens(classifier, backbone_path) -> None:
    """The pooled vector is the attention-masked mean of the last hidden states: padding changes
    nothing, and a deep copy of the model (as the tests and the ablation make) pools its own inputs."""
    tokenizer = load_tokenizer(backbone_path)
    texts = ["a good movie", "a much longer sentence about a film that goes on"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    model = copy.deepcopy(classifier).eval()
    with torch.inference_mode():
        outputs = model.bert(**batch)
        mask = batch["attention_mask"].unsqueeze(-1).float()
        expected = (outputs.last_hidden_state * mask).sum(1) / mask.sum(1)
        alone = model.bert(**tokenizer(texts[:1], return_tensors="pt")).pooler_output
    assert torch.allclose(outputs.pooler_output, expected, atol=1e-6)
    assert torch.allclose(outputs.pooler_output[0], alone[0], atol=1e-5)
    assert model.bert.pooler.attention_mask is None  # the mask is not kept between calls


@pytest.mark.parametrize("k", [1, 3, 5])
def test_top_k_trains_top_layers_pooler_and_head(classifier, k: int) -> None:
    model = applied(classifier, TopKConfig(k=k))
    top = tuple(f"bert.encoder.layer.{index}." for index in range(6 - k, 6))
    expected = {name for name, _ in model.named_parameters() if name.startswith((*top, "bert.pooler.", "classifier."))}
    assert trainable_names(model) == expected


def test_top_k_with_every_layer_is_exactly_full_fine_tuning(classifier) -> None:
    """The paper: top-k with k = the number of layers is full fine-tuning, the embeddings included."""
    top_all = applied(classifier, TopKConfig(k=6))
    full = applied(classifier, FullConfig())
    assert trainable_names(top_all) == trainable_names(full) == {name for name, _ in classifier.named_parameters()}
    assert "bert.embeddings.word_embeddings.weight" in trainable_names(top_all)


def test_layernorm_trains_layernorms_and_head(classifier) -> None:
    model = applied(classifier, LayerNormConfig())
    expected = {name for name, _ in model.named_parameters() if "LayerNorm" in name or name.startswith("classifier.")}
    assert trainable_names(model) == expected
    assert len([name for name in expected if "LayerNorm" in name]) == 13 * 2


def test_head_only_trains_the_classifier_alone(classifier) -> None:
    """The floor beneath every method: the frozen backbone's features, a linear probe on top (384 x 2 + 2)."""
    model = applied(classifier, HeadOnlyConfig())
    assert trainable_names(model) == {"classifier.weight", "classifier.bias"}
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 384 * 2 + 2
    assert method_label(HeadOnlyConfig().to_dict()) == "head" and parse_method("head") == HeadOnlyConfig()


def test_head_only_without_a_head_is_refused() -> None:
    tiny = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    with pytest.raises(ValueError, match="BertModel has no task head beside its base model to train"):
        apply_method(BertModel(tiny), HeadOnlyConfig())


def test_span_and_regression_heads_are_trained(backbone_path) -> None:
    qa = apply_method(load_model(backbone_path, "span"), AdaptersConfig(size=4))
    assert {"qa_outputs.weight", "qa_outputs.bias"} <= trainable_names(qa)
    regression = apply_method(load_model(backbone_path, "regression"), LayerNormConfig())
    assert regression.classifier.out_features == 1 and regression.config.problem_type == "regression"
    assert {"classifier.weight", "classifier.bias"} <= trainable_names(regression)
    assert trainable_names(apply_method(load_model(backbone_path, "span"), HeadOnlyConfig())) == {"qa_outputs.weight", "qa_outputs.bias"}


def test_head_found_by_structure_on_roberta() -> None:
    tiny = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=64, pad_token_id=1)
    model = apply_method(RobertaForSequenceClassification(tiny), TopKConfig(k=1))
    expected = {name for name, _ in model.named_parameters() if name.startswith(("roberta.encoder.layer.1.", "classifier."))}
    assert trainable_names(model) == expected  # RoBERTa's classifier is a dense + out_proj head, no pooler
    assert "classifier.out_proj.weight" in expected and "classifier.dense.weight" in expected


@pytest.mark.parametrize("cfg", [AdaptersConfig(size=16), TopKConfig(k=2), HeadOnlyConfig()], ids=["adapters", "top_k", "head"])
def test_frozen_parameters_stay_bit_identical_under_training(classifier, sst2, cfg) -> None:
    torch.manual_seed(0)
    model = applied(classifier, cfg).train()
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    # Hand every parameter to the optimiser, as a careless trainer would: freezing must still hold.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for _ in range(3):
        optimizer.zero_grad()
        model(**sst2).loss.backward()
        optimizer.step()
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert not torch.equal(parameter, before[name]), f"{name} is trainable but did not change"
        else:
            assert torch.equal(parameter, before[name]), f"{name} is frozen but changed"


@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=lambda cfg: cfg.name)
def test_config_round_trips_through_dict(cfg) -> None:
    data = cfg.to_dict()
    assert data["name"] == cfg.name
    assert method_from_dict(data) == cfg
    # The run config carries the same dict and labels it.
    assert method_label(TrainConfig(task="rte", method=data).method) == method_label(data)


def test_whole_floats_from_kfp_are_accepted() -> None:
    assert method_from_dict({"name": "adapters", "size": 64.0, "init_std": 0.001, "nonlinearity": "gelu"}) == AdaptersConfig(64, 1e-3)
    assert method_from_dict({"name": "top_k", "k": 3.0}) == TopKConfig(3)
    with pytest.raises(ValueError, match="'k' needs an integer, got 2.5"):
        method_from_dict({"name": "top_k", "k": 2.5})


def test_unknown_method_or_field_lists_the_known_ones() -> None:
    known = r"\['adapters', 'full', 'head', 'ia3', 'layernorm', 'lora', 'pfeiffer', 'top_k'\]"
    with pytest.raises(ValueError, match=rf"unknown method 'bitfit'; known methods: {known}"):
        method_from_dict({"name": "bitfit"})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['sise'\] for method 'adapters'; known fields: \['init_std', 'nonlinearity', 'size'\]"):
        method_from_dict({"name": "adapters", "sise": 64})
    with pytest.raises(ValueError, match="has no 'name'"):
        method_from_dict({"size": 64})


def test_parse_method_cli_forms() -> None:
    assert parse_method("full") == FullConfig()
    assert parse_method("layernorm") == LayerNormConfig()
    assert parse_method("adapters:64") == AdaptersConfig(size=64)
    assert parse_method("top_k:3") == TopKConfig(k=3)
    assert parse_method("adapters:8,init_std=1e-3,nonlinearity=relu") == AdaptersConfig(8, 1e-3, "relu")
    with pytest.raises(ValueError, match="known methods"):
        parse_method("adapter:64")
    with pytest.raises(ValueError, match="'size' needs an integer, got 'big'"):
        parse_method("adapters:big")


def test_validation() -> None:
    with pytest.raises(ValueError, match="size must be >= 1"):
        AdaptersConfig(size=0)
    with pytest.raises(ValueError, match="k >= 1"):
        TopKConfig(k=0)
    with pytest.raises(ValueError, match="unknown adapters nonlinearity"):
        AdaptersConfig(size=8, nonlinearity="nope")
    with pytest.raises(dataclasses.FrozenInstanceError):
        AdaptersConfig(size=8).size = 16  # type: ignore[misc]


def test_top_k_beyond_the_model_depth_fails_in_apply(classifier) -> None:
    with pytest.raises(ValueError, match=r"k=7 exceeds the model's 6 Transformer layers"):
        applied(classifier, TopKConfig(k=7))


def test_registry_is_explicit_and_guarded() -> None:
    assert sorted(METHODS) == ["adapters", "full", "head", "ia3", "layernorm", "lora", "pfeiffer", "top_k"]
    with pytest.raises(ValueError, match="already registered"):
        register_method("full", FullConfig, lambda model, cfg: None)
    with pytest.raises(ValueError, match="name must be 'bitfit'"):
        register_method("bitfit", FullConfig, lambda model, cfg: None)
