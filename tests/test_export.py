"""`python -m adaptune export` on a run store of tiny real runs, one per method (tests/export_runs.py): a peft or
safetensors folder loads with its own library (PeftModel.from_pretrained; LOADING.md's load_state_dict, which
load_exported runs) and gives adaptune's own logits and the run's recorded score; an AdapterHub folder holds the run's
tensors under adapters' names; every folder's model card carries the run's record and CHECKSUMS its files; the runs
are bundle's selection; bad input is one line, exit 2. AdapterHub folders are loaded by adapters 1.3 itself, which
needs transformers 4.57, in tests/adapterhub (make test-adapterhub)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from adaptune.cli import main
from adaptune.data.tasks import data_scheme
from adaptune.model.backbone import embedded_backbone_path, load_tokenizer
from adaptune.serve.export_formats import load_exported
from adaptune.serve.predict import predict_logits
from adaptune.serve.selection import select_runs, store_runs
from adaptune.sweep.store import RunStore
from tests.export_runs import METHODS, config, project_logits, train_store, validation_rows

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("export")]  # one worker trains the store once

# float32 on a CPU: the largest |logit difference| allowed between an export loaded by its library and adaptune's own
# model, on the 64 validation rows each run was scored on. Measured: 0.0 for every method (the same operators on the
# same tensors in the same order); tests/adapterhub holds the AdapterHub formats to the same bound.
LOGIT_TOLERANCE = 1e-5
FORMAT_FILES = {
    "peft": {"adapter_config.json", "adapter_model.safetensors"},
    "transformers": {"model.safetensors", "LOADING.md"},
    "adapterhub": {"adapter_config.json", "pytorch_adapter.bin", "head_config.json", "pytorch_model_head.bin", "layer_norms.safetensors"},
}
COMMON_FILES = {"README.md", "export.json", "mean_pooling.py", "CHECKSUMS"}  # MiniLM's runs pool by mean
LIBRARIES = {"peft": "peft", "transformers": "transformers", "adapterhub": "adapter-transformers"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> tuple[Path, dict[str, dict]]:
    """Every method's run on SST-2, and a second adapters seed (the selection has two to choose from)."""
    root = tmp_path_factory.mktemp("store")
    configs = [config(label) for label in METHODS] + [config("adapters8", seed=1)]
    return root, train_store(root, tmp_path_factory.mktemp("cache"), shared_data_dir, configs)


def export(*args: str) -> int:
    return main(["export", *args])


def exported(root: Path, out: Path, data_dir: Path, *selection: str) -> Path:
    assert export("--runs-root", str(root), "--out", str(out), "--data-dir", str(data_dir), *selection) == 0
    return out / "sst2"


@pytest.mark.parametrize("label", ["lora8", "ia3", "full", "top_k1", "layernorm", "head"])
def test_a_peft_or_safetensors_export_loads_with_its_library_and_gives_the_runs_logits(store, shared_data_dir, tmp_path, label) -> None:
    root, records = store
    folder = exported(root, tmp_path, shared_data_dir, "--method", label)
    info = json.loads((folder / "export.json").read_text())
    assert info["format"] == ("peft" if label in ("lora8", "ia3") else "transformers") and info["pooling"] == "mean"
    assert {path.name for path in folder.iterdir()} == FORMAT_FILES[info["format"]] | COMMON_FILES

    model = load_exported(folder, backbone=embedded_backbone_path())  # PeftModel.from_pretrained / load_state_dict
    if info["format"] == "peft":
        assert type(model).__name__ == "PeftModelForSequenceClassification"
    texts, labels = validation_rows("sst2", shared_data_dir)
    theirs = predict_logits(model, load_tokenizer(None), texts, info["max_length"])
    ours = project_logits(root, info["run_id"], texts)
    largest = float(np.abs(theirs - ours).max())
    print(f"{label}: largest |logit difference| {largest:.3g} over {len(texts)} rows")  # the figure docs/operating.md quotes
    assert largest <= LOGIT_TOLERANCE
    accuracy = float(np.mean(np.argmax(theirs, axis=1) == np.array(labels)))
    assert accuracy == records[info["run_id"]]["val_metrics"]["accuracy"]  # the score the run recorded on these rows


def test_a_safetensors_export_holds_exactly_what_its_method_trained(store, shared_data_dir, tmp_path) -> None:
    root, _ = store
    folder = exported(root, tmp_path, shared_data_dir, "--method", "layernorm")
    run_id = json.loads((folder / "export.json").read_text())["run_id"]
    assert (folder / "model.safetensors").read_bytes() == (root / "runs" / run_id / "checkpoint" / "task.safetensors").read_bytes()
    names = set(load_file(str(folder / "model.safetensors")))
    assert names and all(".LayerNorm." in name or name.startswith("classifier.") for name in names)
    assert "load_state_dict" in (folder / "LOADING.md").read_text()


@pytest.mark.parametrize("label", ["adapters8", "pfeiffer8"])
def test_an_adapter_export_holds_the_runs_tensors_under_adapterhubs_names(store, shared_data_dir, tmp_path, label) -> None:
    """The file layout and names adapters 1.3 reads (tests/adapterhub loads them with it and compares logits)."""
    root, _ = store
    folder = exported(root, tmp_path, shared_data_dir, "--method", label, "--tasks", "sst2")
    info = json.loads((folder / "export.json").read_text())
    assert info["format"] == "adapterhub" and {path.name for path in folder.iterdir()} == FORMAT_FILES["adapterhub"] | COMMON_FILES
    config_file = json.loads((folder / "adapter_config.json").read_text())
    houlsby = label == "adapters8"
    assert config_file["model_class"] == "BertAdapterModel" and config_file["name"] == "sst2" and config_file["version"] == "adapters.1.3.0"
    assert {key: config_file["config"][key] for key in ("mh_adapter", "output_adapter", "reduction_factor", "non_linearity",
                                                        "original_ln_before", "original_ln_after", "residual_before_ln",
                                                        "ln_before", "ln_after", "scaling")} == {
        "mh_adapter": houlsby, "output_adapter": True, "reduction_factor": 48, "non_linearity": "gelu",  # 384 / 8
        "original_ln_before": False, "original_ln_after": True, "residual_before_ln": True,
        "ln_before": False, "ln_after": False, "scaling": 1.0}
    head = json.loads((folder / "head_config.json").read_text())["config"]
    assert head["head_type"] == "adaptune_mean_pooling_classification" and head["layers"] == 1
    assert head["label2id"] == {"negative": 0, "positive": 1}

    trained = load_file(str(root / "runs" / info["run_id"] / "checkpoint" / "task.safetensors"))
    adapter = torch.load(folder / "pytorch_adapter.bin", weights_only=True)
    assert len(adapter) == 6 * (2 if houlsby else 1) * 4  # 6 layers, per adapter: down and up, weight and bias
    point = "attention.output" if houlsby else "output"
    assert torch.equal(adapter[f"bert.encoder.layer.5.{point}.adapters.sst2.adapter_down.0.weight"],
                       trained[f"bert.encoder.layer.5.{point}.dropout.adapter.down.weight"])
    assert torch.equal(torch.load(folder / "pytorch_model_head.bin", weights_only=True)["heads.sst2.1.bias"], trained["classifier.bias"])
    layer_norms = load_file(str(folder / "layer_norms.safetensors"))
    assert len(layer_norms) == 2 * (1 + 6 * 2) and all(torch.equal(tensor, trained[name]) for name, tensor in layer_norms.items())
    assert len(adapter) + 2 + len(layer_norms) == len(trained)  # every trained tensor has its place, once


@pytest.mark.parametrize("label", ["adapters8", "lora8", "head"])
def test_every_folder_carries_a_model_card_of_the_runs_record_and_checksums_of_its_files(store, shared_data_dir, tmp_path, label) -> None:
    root, records = store
    folder = exported(root, tmp_path, shared_data_dir, "--method", label, "--tasks", "sst2")
    info = json.loads((folder / "export.json").read_text())
    record = records[info["run_id"]]
    card = (folder / "README.md").read_text()
    _, header, body = card.split("---\n", 2)
    meta = yaml.safe_load(header)
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["pipeline_tag"] == "text-classification"
    assert meta["library_name"] == LIBRARIES[info["format"]] and "adaptune" in meta["tags"] and meta["datasets"] == ["nyu-mll/glue"]
    results = {result["dataset"]["args"]["adaptune_split"]: result for result in meta["model-index"][0]["results"]}
    for split, hub_split, metrics in (("validation", "train", record["val_metrics"]), ("test", "validation", record["test_metrics"])):
        assert results[split]["dataset"]["split"] == hub_split and results[split]["dataset"]["config"] == "sst2"
        assert {m["type"]: m["value"] for m in results[split]["metrics"]} == metrics
        assert all(m["args"]["precision"] == "float32" for m in results[split]["metrics"])
    assert record["run_id"] in body and f"code version `{record['provenance']['code_version']}`" in body
    assert "nan" not in card.lower().replace("nano", "") and f"- status: {record['status']}\n" in body  # no "ok (nan)"
    assert meta["license"] == "apache-2.0" and "license apache-2.0" in body
    assert "see the publisher, https://huggingface.co/datasets/nyu-mll/glue" in body
    assert "Selected as the report's Table 1 selects" in body and "classification head (2 classes)" in body

    listed = dict(reversed(line.split("  ", 1)) for line in (folder / "CHECKSUMS").read_text().splitlines())
    assert set(listed) == {path.name for path in folder.iterdir()} - {"CHECKSUMS"}
    assert all(hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest for name, digest in listed.items())
    assert all(f"`{name}`" in body for name in listed)  # the card names every file


def test_the_exported_runs_are_bundles_selection_or_the_one_named(store, shared_data_dir, tmp_path, capsys) -> None:
    root, records = store
    chosen = select_runs(store_runs(RunStore(str(root))), "adapters")  # bundle's own selection code
    folder = exported(root, tmp_path / "best", shared_data_dir)  # --method adapters is the default, as bundle's
    assert json.loads((folder / "export.json").read_text())["run_id"] == chosen.loc[0, "run_id"]
    assert "sst2" in capsys.readouterr().out
    other = next(run_id for run_id, record in records.items() if record["method_label"] == "adapters8" and run_id != chosen.loc[0, "run_id"])
    folder = exported(root, tmp_path / "named", shared_data_dir, "--run-id", other)
    info = json.loads((folder / "export.json").read_text())
    assert info["run_id"] == other and "--run-id" in info["selection"]


def test_bad_input_is_one_line_and_writes_nothing(store, shared_data_dir, tmp_path, capsys) -> None:
    root, records = store
    lora = next(run_id for run_id, record in records.items() if record["method_label"] == "lora8")
    odd = tmp_path / "odd"  # a run of a method no library has a format for, and one of a QA task
    changes = {"prefix": {"method": {"name": "prefix_tuning"}, "method_label": "prefix_tuning"},
               "squad": {"task": "squad", "data_scheme": data_scheme("squad")}}
    for name, change in changes.items():
        record = {**records[lora], **change, "run_id": f"{name}-run"}
        (odd / name / "runs" / record["run_id"]).mkdir(parents=True)
        (odd / name / "runs" / record["run_id"] / "record.json").write_text(json.dumps(record, default=str))
    (tmp_path / "taken" / "sst2").mkdir(parents=True)
    (tmp_path / "taken" / "sst2" / "notes.txt").write_text("someone's")
    measured = Path(__file__).resolve().parents[1] / "analysis" / "measured" / "glue_local"
    out = tmp_path / "out"
    cases = [
        (["--runs-root", str(measured), "--tasks", "mrpc"], "has no checkpoint", "analysis/measured"),
        (["--runs-root", str(root), "--run-id", "sst2-nope-s0-0"], "run 'sst2-nope-s0-0' is not among", "current run records"),
        (["--runs-root", str(odd / "prefix"), "--method", "prefix_tuning"], "method 'prefix_tuning' has no export format", "--method"),
        (["--runs-root", str(odd / "squad"), "--method", "lora"], "task squad is extractive question answering", "--tasks"),
        (["--runs-root", str(root), "--run-id", lora, "--method", "lora"], "--run-id names one run", "--method"),
        (["--runs-root", str(root), "--method", "layernorm", "--out", str(tmp_path / "taken")], "exists and is not empty", "--out"),
        (["--runs-root", str(root), "--method", "bitfit"], "no usable run", "'bitfit'"),
    ]
    for argv, *says in cases:
        full = argv if "--out" in argv else [*argv, "--out", str(out)]
        assert export(*full) == 2, argv
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and error.startswith("adaptune export: error:"), (argv, error)
        assert all(fact in error for fact in says), (argv, error)
    assert not out.exists() and [p.name for p in (tmp_path / "taken" / "sst2").iterdir()] == ["notes.txt"]


def test_export_help_names_the_formats_it_writes(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in ("AdapterHub format", "peft format", "safetensors"))


def test_a_table_2_task_exports_a_seed_of_table_2s_configuration_and_its_card_says_so() -> None:
    """Disasters (Table 2): configuration A's seeds average best on validation, configuration B holds the single best
    seed. Table 2 reports A's mean, so the export is A's best seed and the card gives A's mean over seeds."""
    from adaptune.serve.model_card import selection_text
    from tests.results_fixture import constructed_runs

    adapters = {"name": "adapters", "size": 64, "init_std": 1e-2}
    rows = ([{"task": "disasters", "method": adapters, "lr": 3e-4, "seed": s, "val": v, "test": t}
             for s, v, t in ((0, 0.80, 0.78), (1, 0.79, 0.80), (2, 0.78, 0.79))]
            + [{"task": "disasters", "method": adapters, "lr": 3e-3, "seed": s, "val": v, "test": 0.5}
               for s, v in ((0, 0.90), (1, 0.50), (2, 0.50))])
    runs = constructed_runs(rows)
    chosen = select_runs(runs, "adapters").iloc[0]
    best_seed_of_a = runs[(runs["lr"] == 3e-4) & (runs["seed"] == 0)]["run_id"].iloc[0]
    assert chosen["run_id"] == best_seed_of_a and chosen["table"] == "Table 2" and chosen["config_seeds"] == 3
    text = selection_text(chosen.to_dict(), "adapters")
    assert "Table 2 reports its mean test score over its 3 seed(s), 79.0 ± 0.6 (s.e.m.)" in text and "Table 1" not in text


def test_a_regression_head_is_called_one() -> None:
    from adaptune.data.tasks import get_task
    from adaptune.serve.model_card import head_text

    assert head_text(get_task("stsb")) == "the task head is a regression head (one output, trained with mean squared error)"
    assert "classification" not in head_text(get_task("stsb")) and head_text(get_task("mnli_m")).endswith("(3 classes)")
