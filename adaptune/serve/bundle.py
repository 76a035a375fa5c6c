"""One model, many tasks: the frozen backbone once, plus each task's trained tensors, in one directory.

    BUNDLE_DIR/
      manifest.json    format version, the backbone, per task: run id, method, validation metric, files,
                       bytes, sha256; and the size multiple. Written last: a directory is a bundle
                       once it has one, and it names every file that belongs to the bundle.
      backbone/        what from_pretrained needs to rebuild the backbone: config.json, its weights
                       (*.safetensors) and the tokenizer's files, copied byte for byte
      tasks/<task>/    the selected run's compact checkpoint (adaptune.model.checkpoint: task.safetensors
                       holds what the method trained, task.json how to rebuild the model), byte for byte

Adding a task writes only tasks/<new task>/ and a new manifest.json; no other task's file is touched,
and as the backbone is frozen their predictions cannot change: the paper's "new tasks can be added
without revisiting previous ones". A full fine-tuning run can be bundled, but its task.safetensors
holds its whole model (`carries_whole_model` in the manifest), so it adds about one backbone's bytes.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from adaptune.core.errors import UserError
from adaptune.core.files import write_json
from adaptune.data.tasks import get_task
from adaptune.model.backbone import resolve_backbone
from adaptune.model.checkpoint import INFO_FILE, WEIGHTS_FILE
from adaptune.model.params import total_size_multiple
from adaptune.report.results import run_precision
from adaptune.serve.file_digests import copy_file, file_entry, sha256_of
from adaptune.sweep.store import CHECKPOINT_DIR, RUNS_DIR, RunStore

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
BACKBONE_DIR = "backbone"
TASKS_DIR = "tasks"
# Besides config.json and *.safetensors: what a tokenizer (or sharded weights) may need, where present.
BACKBONE_SIDE_FILES = ("model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                       "vocab.txt", "merges.txt", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model")
SERVED_KINDS = ("classification", "regression")  # predict does not serve extractive QA (span): see predict.py
SIZE_NOTE = ("bundle_bytes: every file the manifest lists (backbone/ and tasks/), manifest.json itself left out; "
             "backbone_bytes: the backbone's weights (*.safetensors); multiple = bundle_bytes / backbone_bytes")


class BundleError(UserError, ValueError):
    """A bundle that cannot be written, read or extended as asked; the message says what to do."""


def create_bundle(out_dir: str | os.PathLike[str], chosen: pd.DataFrame, store: RunStore, method: str,
                  data_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A new bundle in out_dir (absent or empty) of the chosen runs (one per task, one backbone)."""
    out = Path(out_dir)
    if (out / MANIFEST_FILE).exists():
        raise BundleError(f"{out} already holds a bundle: add tasks to it with --into {out}, or pass a new --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} exists and is not an empty directory: pass a new --out (a bundle never mixes with other files)")
    backbones = sorted(set(chosen["backbone"]))
    if len(backbones) != 1:
        raise BundleError(f"the chosen runs use {len(backbones)} backbones {backbones}: a bundle shares one")
    _check_servable(chosen)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        manifest = {"format_version": FORMAT_VERSION, "backbone": _copy_backbone(backbones[0], store, out / BACKBONE_DIR), "tasks": {}}
        return _add_tasks(out, manifest, chosen, store, method, data_dir)
    except BaseException:
        # No half bundle left behind: it would block the next --out (the directory was absent or empty).
        for path in [out] if created else list(out.iterdir()):
            shutil.rmtree(path, ignore_errors=True)
        raise


def add_to_bundle(bundle_dir: str | os.PathLike[str], chosen: pd.DataFrame, store: RunStore, method: str,
                  data_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Add the chosen runs' tasks to an existing bundle; every file already there is left as it is."""
    bundle = Path(bundle_dir)
    manifest = read_manifest(bundle)
    backbone = manifest["backbone"]
    foreign = sorted(set(chosen["backbone"]) - {backbone["name"]})
    if foreign:
        raise BundleError(f"the chosen runs use backbone(s) {foreign}, the bundle {bundle} shares {backbone['name']!r}")
    already = sorted(set(chosen["task"]) & set(manifest["tasks"]))
    if already:
        raise BundleError(f"task(s) {already} are already in {bundle}: a bundle never rewrites a task (its other users rely "
                          "on it); leave them out of --tasks, or make a new bundle with --out")
    _check_servable(chosen)
    source = _backbone_source(backbone["name"], store)
    for name in backbone["weights"]:  # the same name could be another copy: the frozen weights must be these
        if file_entry(source / name)["sha256"] != backbone["files"][name]["sha256"]:
            raise BundleError(f"backbone {backbone['name']!r} at {source} differs from the one in {bundle} ({name}): "
                              "its tasks were trained on other weights; make a new bundle with --out")
    return _add_tasks(bundle, manifest, chosen, store, method, data_dir)


def read_manifest(bundle_dir: str | os.PathLike[str]) -> dict[str, Any]:
    bundle = Path(bundle_dir)
    path = bundle / MANIFEST_FILE
    if not path.is_file():
        raise BundleError(f"{bundle} is not a bundle: no {MANIFEST_FILE} (make one with python -m adaptune bundle --runs-root DIR --out {bundle})")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BundleError(f"{path} is not valid JSON ({error}): the bundle is damaged; make it again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tasks"), dict) or "backbone" not in manifest:
        raise BundleError(f"{path} is not a bundle manifest (it lacks 'backbone' or 'tasks')")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path} has format version {manifest.get('format_version')!r}; this adaptune reads version {FORMAT_VERSION}")
    return manifest


def bundled_task(bundle_dir: str | os.PathLike[str], task: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(the task's checkpoint dir, its manifest entry, the manifest), its tensors checked against the sha256."""
    bundle = Path(bundle_dir)
    manifest = read_manifest(bundle)
    name = task.strip().lower().replace("-", "_")
    if name not in manifest["tasks"]:
        raise BundleError(f"task {task!r} is not in the bundle {bundle}; it holds: {', '.join(sorted(manifest['tasks'])) or 'no task'}")
    entry = manifest["tasks"][name]
    weights = bundle / entry["dir"] / WEIGHTS_FILE
    if not weights.is_file() or sha256_of(weights) != entry["files"][WEIGHTS_FILE]["sha256"]:
        raise BundleError(f"{weights} is missing or differs from the sha256 in {bundle / MANIFEST_FILE}: the bundle is damaged")
    return bundle / entry["dir"], entry, manifest


def size_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """Bytes on disk as a multiple of one backbone, beside the parameter multiple that the report's
    Table 1 computes (adaptune.model.params.total_size_multiple) and the paper's 1.3x."""
    backbone, tasks = manifest["backbone"], manifest["tasks"]
    bundle_bytes = sum(f["bytes"] for f in backbone["files"].values()) + sum(entry["bytes"] for entry in tasks.values())
    trained = [int(entry["trained_params"]) for entry in tasks.values()]
    summary: dict[str, Any] = {
        "bundle_bytes": bundle_bytes,
        "backbone_bytes": backbone["weights_bytes"],
        "multiple": bundle_bytes / backbone["weights_bytes"],
        "tasks": len(tasks),
        # The bundle always stores the backbone once, so it shares it even with full fine-tuning runs.
        "params_multiple": total_size_multiple(trained, backbone["params"], shares_backbone=True) if trained else 1.0,
        "note": SIZE_NOTE,
    }
    paper = _paper_table1({entry["method"]["name"] for entry in tasks.values()})
    if paper is not None and trained:
        # Table 1's extrapolation: the mean trained parameters per task, for all of the paper's tasks.
        mean = round(sum(trained) / len(trained))
        summary["params_multiple_at_paper_tasks"] = total_size_multiple([mean] * paper["tasks"], backbone["params"], shares_backbone=True)
        summary["paper"] = paper
    return summary


def _add_tasks(bundle: Path, manifest: dict[str, Any], chosen: pd.DataFrame, store: RunStore, method: str,
               data_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    for _, run in chosen.sort_values("task").iterrows():
        manifest["tasks"][run["task"]] = _copy_task(run, store, bundle, method, data_dir)
    manifest["tasks"] = dict(sorted(manifest["tasks"].items()))
    manifest["size"] = size_summary(manifest)
    write_json(bundle / MANIFEST_FILE, manifest)  # last, atomically: the bundle now names the new files
    return manifest


def _check_servable(chosen: pd.DataFrame) -> None:
    kinds = {task: get_task(task).kind for task in chosen["task"]}
    refused = sorted(task for task, kind in kinds.items() if kind not in SERVED_KINDS)
    if refused:
        raise BundleError(f"task(s) {refused} are extractive question answering, which predict does not serve (it serves "
                          f"{', '.join(SERVED_KINDS)}): leave them out with --tasks")


def _copy_task(run: pd.Series, store: RunStore, bundle: Path, method: str, data_dir: Any) -> dict[str, Any]:
    task = get_task(run["task"])
    target = bundle / TASKS_DIR / task.name
    if target.exists():  # not in the manifest (checked by the caller): left by an interrupted bundle
        shutil.rmtree(target)
    with store.files.local_copy(RUNS_DIR, run["run_id"], CHECKPOINT_DIR) as checkpoint:
        for name in (WEIGHTS_FILE, INFO_FILE):
            if not (checkpoint / name).is_file():
                raise BundleError(f"run {run['run_id']} has no checkpoint ({store.files.url(RUNS_DIR, run['run_id'], CHECKPOINT_DIR, name)} "
                                  "not found): it cannot be bundled")
        target.mkdir(parents=True)
        files = {name: copy_file(checkpoint / name, target / name) for name in (WEIGHTS_FILE, INFO_FILE)}
    info = json.loads((target / INFO_FILE).read_text(encoding="utf-8"))
    config = json.loads(run["config_json"])
    return {
        "run_id": run["run_id"],
        "method": info["method"],
        "method_label": run["method_label"],
        "lr": float(run["lr"]),
        "epochs": int(run["epochs"]),
        "seed": int(run["seed"]),
        "selection": {"rule": "best", "method": method,
                      "means": "the single run best on validation for this task (Table 1's rule)"},
        "metric": run["primary_metric"],
        "val_score": float(run["val_score"]),
        "test_score": None if pd.isna(run["test_score"]) else float(run["test_score"]),
        "task_kind": info["task_kind"],
        "num_labels": int(info["num_labels"]),
        "labels": task_label_names(task, data_dir),
        "max_length": int(config.get("max_length", 128)),
        # The precision the run was scored in: predict computes in it, to reproduce the run's own evaluation (bit
        # for bit for a run alone in float32; a fused run's, scored in its group's pass, to rounding: docs/operating.md).
        "precision": run_precision(run.get("device")) or "float32",
        "trained_params": int(info["trained_params"]),
        "carries_whole_model": info["method"]["name"] == "full",
        "dir": f"{TASKS_DIR}/{task.name}",
        "files": files,
        "bytes": sum(entry["bytes"] for entry in files.values()),
        "sha256": files[WEIGHTS_FILE]["sha256"],
        "added_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _copy_backbone(name: str, store: RunStore, target: Path) -> dict[str, Any]:
    source = _backbone_source(name, store)
    weights = sorted(path.name for path in source.glob("*.safetensors"))
    if not (source / "config.json").is_file() or not weights:
        raise BundleError(f"backbone {name!r} at {source} lacks config.json or *.safetensors weights: stage a copy saved "
                          "with save_pretrained(safe_serialization=True) (make stage-models)")
    names = ["config.json", *weights, *(side for side in BACKBONE_SIDE_FILES if (source / side).is_file())]
    target.mkdir(parents=True, exist_ok=True)
    files = {file_name: copy_file(source / file_name, target / file_name) for file_name in names}
    return {"name": name, "dir": BACKBONE_DIR, "weights": weights, "files": files,
            "weights_bytes": sum(files[file_name]["bytes"] for file_name in weights),
            "params": _tensor_elements(target / file_name for file_name in weights)}


def _backbone_source(name: str, store: RunStore) -> Path:
    """The local directory of the backbone the runs trained on: staged in the run store (what its pods
    loaded), else the embedded copy or a local path, else the Hugging Face cache (or hub)."""
    staged = store.staged_backbone(name)
    if staged is not None:
        return Path(staged)
    path = Path(resolve_backbone(name)).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=["config.json", "*.safetensors", *BACKBONE_SIDE_FILES]))
    except Exception as error:  # noqa: BLE001 (offline, unknown name, gated: one line says which)
        raise BundleError(f"backbone {name!r} is not staged in {store.root}, not a local directory, and not in the Hugging Face "
                          f"cache or reachable hub ({type(error).__name__}): stage it (make stage-models)") from None


def task_label_names(task: Any, data_dir: Any) -> list[str] | None:
    """The task's class names in label order: declared in tasks.py, else read from its data as the
    runs did (None where the data is not at hand: predict then gives label ids only)."""
    if task.kind != "classification":
        return None
    if task.labels:
        return list(task.labels)
    from adaptune.data.loading import load_task_data
    from adaptune.data.sources import DataError, DataNotFoundError

    try:
        return list(load_task_data(task, data_dir, splits=("validation",))["validation"].features["label"].names)
    except (DataError, DataNotFoundError, OSError):
        return None


def _tensor_elements(paths: Iterable[Path]) -> int:
    """Parameters stored in safetensors files, read from their headers (no tensor is loaded)."""
    from safetensors import safe_open

    total = 0
    for path in paths:
        with safe_open(str(path), framework="numpy") as weights:
            total += sum(math.prod(weights.get_slice(key).get_shape()) for key in weights.keys())
    return total


# The paper's Table 1 rows a bundle's method is compared with: full fine-tuning and adapters have one; the head
# alone and LayerNorm-only (and the other methods) have none, so their bundles stand without a paper figure.
PAPER_SIZE_ROWS = {"full": "full", "adapters": "adapters_best"}


def _paper_table1(methods: set[str]) -> dict[str, Any] | None:
    """The paper's Table 1 row of the bundle's one method (analysis/paper_reference.json: adapters 1.3x, full
    fine-tuning 9x, for its 9 GLUE tasks); None for a method it has no row of, or a bundle of several methods."""
    from adaptune.report.reference import load_reference

    if len(methods) != 1 or next(iter(methods)) not in PAPER_SIZE_ROWS:
        return None
    try:
        reference = load_reference()
    except FileNotFoundError:
        return None
    row = reference["table1"]["rows"][PAPER_SIZE_ROWS[next(iter(methods))]]
    return {"multiple": row["total_size_multiple"], "trained_params_percent": row["trained_params_percent"],
            "tasks": len(reference["table1"]["tasks"]), "backbone": "bert-large-uncased",
            "what": f"Table 1, {row['label']}: 9 GLUE tasks (MNLI-m and MNLI-mm counted apart, footnote 3) on BERT-large"}
