"""Today's PEFT methods beside the paper's: LoRA and (IA)3 through peft, and the Pfeiffer adapter placement.

Each is a registered method: it round-trips through dicts and method strings, trains exactly its own
groups (counted as peft counts them, plus the head), keeps the model's class and loss, saves a compact
checkpoint that reloads to the same predictions, and is refused at plan time where a backbone lacks
what it targets.
"""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from peft import IA3Config, LoraConfig, get_peft_model

from adaptune.model.adapters import DropoutThenAdapter, all_adapters, encoder_layers
from adaptune.model.backbone import check_backbone, load_model, load_tokenizer
from adaptune.model.checkpoint import load_task_checkpoint, save_task_checkpoint
from adaptune.model.methods import (
    AdaptersConfig,
    IA3MethodConfig,
    LoraMethodConfig,
    PfeifferConfig,
    apply_method,
    head_modules,
    layer_norms,
    method_from_dict,
    parse_method,
)
from adaptune.model.params import count_parameters
from adaptune.sweep.plan import PlanError, plan
from adaptune.sweep.spec_file import load_spec_file, spec_from_dict
from adaptune.train.checks import ConfigError, check_train_config
from adaptune.train.config import TrainConfig, method_label, method_text

PEFT_METHODS = [LoraMethodConfig(), IA3MethodConfig(), PfeifferConfig(size=64)]


@pytest.fixture(scope="module")
def classifier(backbone_path: str) -> torch.nn.Module:
    return load_model(backbone_path, "classification", num_labels=2)


@pytest.fixture(scope="module")
def rte_batch(shared_data_dir: Path, backbone_path: str) -> dict[str, torch.Tensor]:
    dev = pd.read_csv(shared_data_dir / "glue" / "RTE" / "dev.tsv", sep="\t", quoting=csv.QUOTE_NONE)
    tokenizer = load_tokenizer(backbone_path)
    batch = tokenizer(list(dev.sentence1[:6]), list(dev.sentence2[:6]), return_tensors="pt", padding=True, truncation=True, max_length=32)
    return {**batch, "labels": torch.tensor([int(label == "entailment") for label in dev.label[:6]])}


def trained_names(model: torch.nn.Module) -> set[str]:
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def head_params(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for module in head_modules(model) for parameter in module.parameters())


# --- registration: dicts, strings, labels -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "label"),
    [
        ("lora:8", LoraMethodConfig(r=8, alpha=8, dropout=0.0, target_modules="query+value"), "lora8"),
        ("lora:r=4,alpha=16,dropout=0.1,target_modules=value+key+query", LoraMethodConfig(4, 16, 0.1, "key+query+value"), "lora4"),
        ("ia3", IA3MethodConfig(target_modules="key+output.dense+value", feedforward_modules="output.dense"), "ia3"),
        ("pfeiffer:64", PfeifferConfig(size=64), "pfeiffer64"),
    ],
)
def test_methods_round_trip_through_strings_and_dicts(text: str, expected, label: str) -> None:
    cfg = parse_method(text)
    assert cfg == expected
    data = cfg.to_dict()
    assert all(isinstance(value, int | float | str) for value in data.values())  # KFP / Parquet scalars
    assert method_from_dict(data) == cfg
    assert method_from_dict(json.loads(json.dumps(data))) == cfg
    assert parse_method(method_text(data)) == cfg
    assert method_label(data) == label


def test_module_lists_are_order_free_and_accept_yaml_lists() -> None:
    assert method_from_dict({"name": "lora", "target_modules": ["value", "query"]}) == LoraMethodConfig()
    one = TrainConfig(task="rte", method=parse_method("lora:target_modules=value+query").to_dict())
    other = TrainConfig(task="rte", method=LoraMethodConfig().to_dict())
    assert one.run_id == other.run_id


def test_pfeiffer_is_distinct_from_adapters_and_adapters_runs_keep_their_ids() -> None:
    adapters = AdaptersConfig(size=64).to_dict()
    assert adapters == {"name": "adapters", "size": 64, "init_std": 0.01, "nonlinearity": "gelu"}  # no new field: same run ids
    assert method_label(adapters) == "adapters64"
    pfeiffer = PfeifferConfig(size=64)
    assert pfeiffer != AdaptersConfig(size=64)
    houlsby_run, pfeiffer_run = (TrainConfig(task="rte", method=m) for m in (adapters, pfeiffer.to_dict()))
    assert houlsby_run.run_id.startswith("rte-adapters64-") and pfeiffer_run.run_id.startswith("rte-pfeiffer64-")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lora:r=0", "lora r must be >= 1"),
        ("lora:dropout=1.5", r"lora dropout must be in \[0, 1\)"),
        ("lora:target_modules=query+not a name", "not module names"),
        ("ia3:target_modules=key+value", r"feedforward_modules \['output.dense'\] must also be target_modules"),
        ("pfeiffer:0", "pfeiffer size must be >= 1"),
    ],
)
def test_bad_settings_are_refused_with_the_field_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_method(text)


# --- what each method trains --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "peft_config"),
    [
        (LoraMethodConfig(), LoraConfig(r=8, lora_alpha=8, target_modules=["query", "value"])),
        (LoraMethodConfig(r=4, target_modules="key+query+value+dense"), LoraConfig(r=4, lora_alpha=8, target_modules=["key", "query", "value", "dense"])),
        (IA3MethodConfig(), IA3Config(target_modules=["key", "value", "output.dense"], feedforward_modules=["output.dense"])),
    ],
    ids=["lora-qv", "lora-all-linear", "ia3"],
)
def test_trained_parameters_are_peft_own_count_plus_the_head(classifier, cfg, peft_config) -> None:
    model = apply_method(copy.deepcopy(classifier), cfg)
    peft_trainable, peft_total = get_peft_model(copy.deepcopy(classifier), peft_config).get_nb_trainable_parameters()
    count = count_parameters(model)
    assert count.trained == peft_trainable + head_params(model)
    assert count.total == peft_total
    assert type(model) is type(classifier)  # injected in place, not wrapped: the trainer sees the same model
    assert not any(parameter.requires_grad for norm in layer_norms(model) for parameter in norm.parameters())
    # Every parameter name outside the adapted layers is unchanged.
    adapted = {name for name in trained_names(model) if ".lora_" in name or ".ia3_" in name}
    assert adapted and trained_names(model) - adapted == {"classifier.weight", "classifier.bias"}


def test_pfeiffer_puts_one_adapter_per_layer_after_the_feed_forward_block(classifier) -> None:
    houlsby = apply_method(copy.deepcopy(classifier), AdaptersConfig(size=64))
    pfeiffer = apply_method(copy.deepcopy(classifier), PfeifferConfig(size=64))
    for layer in encoder_layers(pfeiffer):
        assert isinstance(layer.output.dropout, DropoutThenAdapter)
        assert not isinstance(layer.attention.output.dropout, DropoutThenAdapter)
    assert len(all_adapters(pfeiffer)) == len(encoder_layers(pfeiffer)) == len(all_adapters(houlsby)) // 2
    adapter_params = sum(p.numel() for adapter in all_adapters(pfeiffer) for p in adapter.parameters())
    houlsby_adapter_params = sum(p.numel() for adapter in all_adapters(houlsby) for p in adapter.parameters())
    assert adapter_params * 2 == houlsby_adapter_params
    assert count_parameters(houlsby).trained - count_parameters(pfeiffer).trained == adapter_params  # same LayerNorms and head


@pytest.mark.parametrize("cfg", PEFT_METHODS, ids=lambda cfg: cfg.name)
def test_loss_gradients_reach_exactly_the_trained_parameters(classifier, rte_batch, cfg) -> None:
    torch.manual_seed(0)
    model = apply_method(copy.deepcopy(classifier), cfg).train()
    loss = model(**rte_batch).loss
    loss.backward()
    with_grad = {name for name, parameter in model.named_parameters() if parameter.grad is not None}
    assert with_grad == trained_names(model)


# --- compact checkpoints -----------------------------------------------------------------------


@pytest.mark.parametrize("cfg", PEFT_METHODS, ids=lambda cfg: cfg.name)
def test_compact_checkpoint_reloads_to_identical_predictions(classifier, rte_batch, tmp_path, cfg) -> None:
    torch.manual_seed(0)
    model = apply_method(copy.deepcopy(classifier), cfg)
    with torch.no_grad():  # move every trained tensor, as training would (LoRA's B starts at zero)
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05 * torch.randn_like(parameter))
    inputs = {key: value for key, value in rte_batch.items() if key != "labels"}
    with torch.no_grad():
        expected = model.eval()(**inputs).logits
        untouched = classifier.eval()(**inputs).logits
    assert not torch.allclose(expected, untouched, atol=1e-4)
    save_task_checkpoint(model, cfg, "all-MiniLM-L6-v2", tmp_path)
    loaded, loaded_cfg, info = load_task_checkpoint(tmp_path)
    assert loaded_cfg == cfg
    assert info["trained_params"] == count_parameters(model).trained
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, expected)
    saved = (tmp_path / "task.safetensors").stat().st_size
    assert saved < 0.05 * count_parameters(model).total * 4  # a few percent of the fp32 model at most


# --- refused at plan time ----------------------------------------------------------------------


def one_block(method, backbone: str = "all-MiniLM-L6-v2") -> dict:
    return {"name": "t", "backbone": backbone, "sweeps": [{"tasks": ["rte"], "methods": [method], "learning_rates": [1e-3]}]}


@pytest.mark.parametrize("backbone", ["all-MiniLM-L6-v2", "bert-base-uncased"])
@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("lora:target_modules=query+q_proj",
         "lora target module 'q_proj' is not a module of backbone '{b}'; its Linear layers are named dense, key, query, value"),
        ("ia3:target_modules=k_proj+output.dense", "ia3 target module 'k_proj' is not a module of backbone '{b}'"),
        ("lora:target_modules=LayerNorm", "lora does not support backbone '{b}' with target module 'LayerNorm': it matches LayerNorm modules"),
    ],
)
def test_a_target_the_backbone_lacks_is_refused_at_plan_time(backbone: str, method: str, message: str) -> None:
    with pytest.raises(PlanError, match=message.format(b=backbone).replace("(", r"\(")):
        plan(spec_from_dict(one_block(method, backbone)))


def test_train_preflight_refuses_the_same_target(backbone_path) -> None:
    with pytest.raises(ConfigError, match="lora target module 'q_proj' is not a module"):
        check_train_config(TrainConfig(task="rte", method=parse_method("lora:target_modules=q_proj").to_dict(), backbone=backbone_path))
    assert check_backbone(backbone_path).module_types["encoder.layer.0.attention.self.query"] == "Linear"


def test_any_sweep_file_plans_them_beside_the_papers_methods(tmp_path: Path) -> None:
    sweep = tmp_path / "peft.yaml"
    sweep.write_text(
        "name: peft_small\nbackbone: all-MiniLM-L6-v2\naccelerator: cpu\n"
        "sweeps:\n"
        "  - tasks: [rte, mrpc]\n"
        "    methods: ['adapters:64', 'pfeiffer:64', 'lora:8', ia3, full,\n"
        "              {name: lora, r: 8, target_modules: [query, key, value]}]\n"
        "    learning_rates: [1.0e-3]\n"
        "    seeds: [0, 1, 2]\n"
    )
    planned = plan(load_spec_file(sweep))
    labels = {(run.task, method_label(run.method)) for run in planned.runs}
    assert labels == {(task, label) for task in ("rte", "mrpc") for label in ("adapters64", "pfeiffer64", "lora8", "ia3", "full")}
    assert len(planned.runs) == 2 * 6 * 3  # two distinct lora8 configurations, each its own run id
    assert len({run.run_id for run in planned.runs}) == len(planned.runs)
    assert planned.runs == plan(load_spec_file(sweep)).runs  # deterministic


# --- the trainer, unchanged --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora:8", "ia3"])
def test_the_trainer_runs_them_unchanged_and_records_the_count(method: str, shared_data_dir: Path, tmp_path: Path) -> None:
    from adaptune.train.loop import train_and_evaluate

    config = TrainConfig(task="rte", method=parse_method(method).to_dict(), lr=1e-3, epochs=1, max_length=32, batch_size=8,
                         max_train_examples=32, max_eval_examples=16)
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=tmp_path / "cache", progress=False)
    assert record["status"] == "ok", record["reason"]
    assert record["method_label"] == method_label(config.method)
    model, cfg, info = load_task_checkpoint(tmp_path / "checkpoint")
    assert cfg == parse_method(method)
    assert record["trained_params"] == info["trained_params"] == count_parameters(model).trained
