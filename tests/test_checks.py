"""Checks that refuse a run before anything is created: the backbone (config only, no weights) and
the run's numbers, method and top_k depth; each refusal is one line saying what to do."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adaptune.data.tasks import UnknownTaskError
from adaptune.model import backbone as backbone_module
from adaptune.model.backbone import BackboneError, check_backbone
from adaptune.train.checks import ConfigError, check_train_config
from adaptune.train.config import TrainConfig


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_the_embedded_backbone_passes_with_its_depth() -> None:
    for name in (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        info = check_backbone(name)
        assert (info.name, info.model_type, info.num_layers, info.hidden_size) == (name or "all-MiniLM-L6-v2", "bert", 6, 384)
        assert Path(info.path, "config.json").is_file()


def test_missing_path_unusable_directory_and_unsupported_model(tmp_path: Path) -> None:
    with pytest.raises(BackboneError) as error:
        check_backbone("/nonexistent")
    assert "backbone path /nonexistent does not exist" in _one_line(error)
    with pytest.raises(BackboneError) as error:
        check_backbone(str(tmp_path))
    assert "without config.json" in _one_line(error)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(BackboneError) as error:
        check_backbone(str(tmp_path / "weights.bin"))
    assert "is a file, not a model directory" in _one_line(error)

    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=64, n_head=2).save_pretrained(tmp_path / "gpt2-tiny")
    with pytest.raises(BackboneError) as error:
        check_backbone(str(tmp_path / "gpt2-tiny"))
    message = _one_line(error)
    assert "model_type 'gpt2'" in message and "is not supported" in message and "BERT-family" in message
    assert not list((tmp_path / "gpt2-tiny").glob("*.safetensors"))  # nothing was loaded or written


def test_hub_names_without_the_hub_say_so_and_suggest_a_local_path(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BackboneError) as error:  # the tests run with HF_HUB_OFFLINE=1
        check_backbone("gpt2")
    message = _one_line(error)
    assert "backbone 'gpt2'" in message and "hub is unreachable (HF_HUB_OFFLINE is set)" in message
    assert "local directory" in message

    # Online mode, but the hub's host does not answer: said at once, not after the hub client's retries.
    monkeypatch.setattr(backbone_module, "_hub_offline", lambda: False)
    monkeypatch.setattr(backbone_module, "_hub_answers", lambda timeout_s=5.0: False)
    started = time.perf_counter()
    with pytest.raises(BackboneError) as error:
        check_backbone("adaptune-tests/no-such-model")
    assert "hub is unreachable (no connection to https://" in _one_line(error)
    assert time.perf_counter() - started < 10


def test_check_train_config_refuses_numbers_methods_and_depth() -> None:
    base = dict(task="rte", method={"name": "adapters", "size": 8})
    assert check_train_config(TrainConfig(**base)).num_layers == 6
    assert check_train_config(TrainConfig(**base), backbone=False) is None
    for changes, says in (({"lr": float("inf")}, "lr must be a finite number > 0, got inf"),
                          ({"lr": float("nan")}, "lr must be a finite number > 0"),
                          ({"epochs": 0}, "epochs must be a whole number >= 1"),
                          ({"seed": -1}, "seed must be a whole number"),
                          ({"max_train_examples": 0}, "max_train_examples must be"),
                          ({"method": {"name": "adapters", "size": 0}}, "adapters size must be >= 1"),
                          ({"method": {"name": "top_k", "k": 7}}, "top_k k=7 exceeds the 6 Transformer layers")):
        with pytest.raises(ConfigError) as error:
            check_train_config(TrainConfig(**{**base, **changes}))
        assert says in _one_line(error)
    with pytest.raises(UnknownTaskError):
        check_train_config(TrainConfig(**{**base, "task": "rtee"}))
    with pytest.raises(BackboneError):
        check_train_config(TrainConfig(**{**base, "backbone": "/nonexistent"}))
