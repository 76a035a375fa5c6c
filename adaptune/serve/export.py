"""Trained runs in the formats their users already load: one folder per task, `OUT/<task>/`.

The runs are the ones `bundle` would take (adaptune.serve.selection: per task the single usable run best on
validation, `--method`, `--tasks`), or the one `--run-id` names. Each folder holds its method's format
(adaptune.serve.export_formats: AdapterHub for adapters, peft for LoRA and (IA)3, safetensors for the rest), and
  README.md      the model card (adaptune.serve.model_card)
  export.json    what was exported: run id, method, format, backbone, pooling, labels, max length
  mean_pooling.py  where the run classified the mean of the hidden states (adaptune/serve/export_pooling.py)
  CHECKSUMS      sha256 of every other file, as `sha256sum -c` reads them; written last
Every selected run is checked (a format for its method, a served task kind, a checkpoint, a free folder) before
anything is written; a folder whose writing fails is removed, so a folder with CHECKSUMS is whole.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
from transformers import PreTrainedModel

from adaptune.core.files import current_umask
from adaptune.data.tasks import get_task
from adaptune.model.backbone import EMBEDDED_BACKBONE_NAMES, MeanPooler, resolve_backbone
from adaptune.model.checkpoint import INFO_FILE, WEIGHTS_FILE, load_task_checkpoint
from adaptune.report.results import run_precision
from adaptune.serve import export_pooling
from adaptune.serve.bundle import task_label_names
from adaptune.serve.export_adapterhub import write_adapterhub
from adaptune.serve.export_formats import (
    EMBEDDED_HUB_ID,
    EXPORT_FILE,
    POOLING_FILE,
    ExportedRun,
    ExportError,
    Writer,
    write_peft,
    write_tensors,
)
from adaptune.serve.file_digests import copy_file, file_entry
from adaptune.serve.model_card import render_card, selection_text
from adaptune.serve.selection import select_runs, store_runs
from adaptune.sweep.store import CHECKPOINT_DIR, RUNS_DIR, RunStore

FORMAT_VERSION = 1
CHECKSUMS_FILE = "CHECKSUMS"
CARD_FILE = "README.md"
EXPORTED_KINDS = ("classification", "regression")  # as bundle: extractive QA needs post-processing no library format holds
# Each method's format (adaptune.serve.export_formats); a method missing here is refused in one line, never skipped.
FORMATS: dict[str, Writer] = {
    "adapters": write_adapterhub, "pfeiffer": write_adapterhub,
    "lora": write_peft, "ia3": write_peft,
    "full": write_tensors, "top_k": write_tensors, "layernorm": write_tensors, "head": write_tensors,
}


def writer_for(method: str) -> Writer:
    if method not in FORMATS:
        raise ExportError(f"method {method!r} has no export format (adapters and pfeiffer: AdapterHub; lora and ia3: peft; "
                          f"{', '.join(name for name, writer in FORMATS.items() if writer is write_tensors)}: safetensors); "
                          "leave it out with --method")
    return FORMATS[method]


def select_for_export(store: RunStore, method: str, tasks: list[str] | None = None, run_id: str | None = None) -> pd.DataFrame:
    """The runs to export: bundle's selection (one per task, best on validation), or the one run `run_id` names."""
    runs = store_runs(store)
    if run_id is None:
        return select_runs(runs, method, tasks, where=store.root)
    chosen = runs[runs["run_id"] == run_id]
    if chosen.empty:
        near = sorted(runs["run_id"])[:3]
        raise ExportError(f"run {run_id!r} is not among the {len(runs)} current run records in {store.root} "
                          f"(e.g. {', '.join(near)}): pass a run id from its runs/ folder")
    return chosen.reset_index(drop=True)


def export_runs(store: RunStore, chosen: pd.DataFrame, out_dir: str | os.PathLike[str], selection: str | None,
                data_dir: str | os.PathLike[str] | None = None, method: str = "") -> list[dict[str, Any]]:
    """Write OUT/<task>/ for each chosen run; what each folder holds (task, run id, format, bytes). `selection`: how the
    runs were chosen, in words; None: each card states its table's rule (model_card.selection_text, of `method`'s runs)."""
    out = Path(out_dir)
    runs = [run.to_dict() for _, run in chosen.sort_values("task").iterrows()]
    for run in runs:  # every refusal before the first file
        _check_exportable(run, store, out)
    return [_export_run(run, store, out / run["task"], selection or selection_text(run, method), data_dir) for run in runs]


def _check_exportable(run: dict[str, Any], store: RunStore, out: Path) -> None:
    writer_for(run["method"])
    task = get_task(run["task"])
    if task.kind not in EXPORTED_KINDS:
        raise ExportError(f"task {task.name} is extractive question answering, which export does not write (it exports "
                          f"{', '.join(EXPORTED_KINDS)}): leave it out with --tasks")
    names = store.files.names(RUNS_DIR, run["run_id"], CHECKPOINT_DIR)
    if not {WEIGHTS_FILE, INFO_FILE} <= set(names):
        raise ExportError(f"run {run['run_id']} has no checkpoint ({store.files.url(RUNS_DIR, run['run_id'], CHECKPOINT_DIR, WEIGHTS_FILE)} "
                          "not found): it cannot be exported (the stores kept in analysis/measured/ hold records only)")
    target = out / task.name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ExportError(f"{target} exists and is not empty: pass a new --out (an export never mixes with other files)")


def _export_run(run: dict[str, Any], store: RunStore, target: Path, selection: str, data_dir: Any) -> dict[str, Any]:
    target.mkdir(parents=True, exist_ok=True)
    try:
        with store.files.local_copy(RUNS_DIR, run["run_id"], CHECKPOINT_DIR) as checkpoint:
            exported = _rebuild(run, store, checkpoint, data_dir)
            written = writer_for(run["method"])(exported, target)
        files = dict(written.files)
        if exported.mean_pooling:
            copy_file(Path(export_pooling.__file__), target / POOLING_FILE)
            files[POOLING_FILE] = "the mean pooling the run classified, for a model loaded without adaptune"
        (target / EXPORT_FILE).write_text(json.dumps(_export_info(exported, written, selection), indent=2, sort_keys=True) + "\n")
        files[EXPORT_FILE] = "what was exported (run id, method, format, backbone, pooling, labels), for scripts"
        files[CARD_FILE] = "this model card"
        (target / CARD_FILE).write_text(render_card(exported, written, selection, dict(sorted(files.items()))), encoding="utf-8")
        size = write_checksums(target)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # no half folder: CHECKSUMS marks a whole one
        raise
    return {"task": run["task"], "run_id": run["run_id"], "method_label": run["method_label"], "format": written.format,
            "library": written.library_name, "folder": str(target), "bytes": size, "val_score": run["val_score"],
            "metric": run["primary_metric"]}


def _rebuild(run: dict[str, Any], store: RunStore, checkpoint: Path, data_dir: Any) -> ExportedRun:
    staged = store.staged_backbone(run["backbone"])  # the weights the run trained on, where the store holds them
    backbone_path = str(staged) if staged is not None else resolve_backbone(run["backbone"])
    model, method, _ = load_task_checkpoint(checkpoint, backbone=backbone_path)
    assert isinstance(model, PreTrainedModel)  # load_model's models all are
    task = get_task(run["task"])
    return ExportedRun(
        run=run, task=task, model=model, method=method, checkpoint=checkpoint, backbone_path=backbone_path,
        base_model=EMBEDDED_HUB_ID if run["backbone"] in EMBEDDED_BACKBONE_NAMES else run["backbone"],
        labels=task_label_names(task, data_dir), mean_pooling=isinstance(getattr(model.base_model, "pooler", None), MeanPooler),
        precision=run_precision(run.get("device")) or "float32",
    )


def _export_info(run: ExportedRun, written: Any, selection: str) -> dict[str, Any]:
    row = run.run
    return {
        "format_version": FORMAT_VERSION, "format": written.format, "library_name": written.library_name,
        "run_id": row["run_id"], "task": run.task.name, "task_kind": run.task.kind, "num_labels": run.num_labels,
        "labels": run.labels, "method": run.method.to_dict(), "method_label": row["method_label"],
        "backbone": row["backbone"], "base_model": run.base_model, "pooling": "mean" if run.mean_pooling else "pooler",
        "max_length": run.max_length, "precision": run.precision, "code_version": row.get("code_version"),
        "selection": selection, **written.details,
    }


def write_checksums(folder: Path) -> int:
    """CHECKSUMS (sha256sum's format) of every other file in the folder; returns the folder's bytes, CHECKSUMS included."""
    files = [path for path in sorted(folder.iterdir()) if path.is_file() and path.name != CHECKSUMS_FILE]
    for path in files:  # safetensors and peft write 0600: a folder made to be shared reads as the umask allows
        path.chmod(0o666 & ~current_umask())
    entries = {path.name: file_entry(path) for path in files}
    (folder / CHECKSUMS_FILE).write_text("".join(f"{entry['sha256']}  {name}\n" for name, entry in entries.items()))
    return sum(entry["bytes"] for entry in entries.values()) + (folder / CHECKSUMS_FILE).stat().st_size
