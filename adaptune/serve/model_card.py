"""The model card (README.md) of an exported run: the Hugging Face hub's YAML metadata header (base_model,
library_name, tags, datasets, pipeline_tag, model-index with the recorded scores, their split and the precision they
were computed in), then what the run is, its scores, how to load the folder, and where it came from (run id, code
version)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from adaptune.data.splits import GLUE_SPLIT_SOURCES, HOLDOUT_FRACTION, HOLDOUT_MAX_ROWS
from adaptune.data.tasks import Task
from adaptune.serve.export_formats import ExportedRun, WrittenFormat

SPLITS = (("validation", "val_metrics", "val_rows"), ("test", "test_metrics", "test_rows"))
# The base models' licenses, as each model's own README states them (declared once; a base model not here: "see its card").
BASE_MODEL_LICENSES = {"all-MiniLM-L6-v2": "apache-2.0", "bert-base-uncased": "apache-2.0", "bert-large-uncased": "apache-2.0"}
METHOD_NAMES = {
    "adapters": "Houlsby bottleneck adapters (two per layer) with the LayerNorms and the task head",
    "pfeiffer": "bottleneck adapters after each feed-forward block (Pfeiffer placement) with the LayerNorms and the task head",
    "lora": "LoRA (peft) and the task head", "ia3": "(IA)3 (peft) and the task head",
    "full": "full fine-tuning", "top_k": "the top layers, the pooler and the task head (variable fine-tuning)",
    "layernorm": "the LayerNorms and the task head", "head": "the task head alone, the backbone frozen",
}


def render_card(run: ExportedRun, written: WrittenFormat, selection: str, files: dict[str, str]) -> str:
    """README.md for the folder; `files` names every file in it with what it holds."""
    row = run.run
    license = base_model_license(run.base_model)
    header = {
        "base_model": run.base_model,
        **({"license": license} if license else {}),
        "library_name": written.library_name,
        "pipeline_tag": "text-classification",  # the hub's tag for a sequence head, one output (regression) or several
        "tags": list(dict.fromkeys(["adaptune", *written.tags, run.method.name, run.task.name, "text-classification"])),
        **({"datasets": [run.task.source.hub_id]} if run.task.source.hub_id else {}),
        "model-index": [{"name": f"{run.task.name}-{row['method_label']}-{_short(run.base_model)}", "results": model_index_results(run)}],
    }
    title = run.task.title or run.task.name
    lines = [
        "---", yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
        f"# {title}: {row['method_label']} on {run.base_model}", "",
        f"{title} ({run.task.kind}), trained with adaptune, a reproduction of Houlsby et al. (2019, "
        f"[arXiv:1902.00751](https://arxiv.org/abs/1902.00751)): {METHOD_NAMES.get(run.method.name, run.method.name)}, "
        f"{int(row['trained_params']):,} trained parameters ({_percent(row)} of {int(row['total_params']):,}); "
        f"{head_text(run.task)}. {selection}", "",
        "## License", "",
        f"- the weights: those of the base model `{run.base_model}`, "
        + (f"license {license} (its model card)" if license else "see its model card") + "; the trained tensors are derived from them",
        f"- the data it was trained on ({title}): {dataset_terms(run.task)}", "",
        "## Scores", "",
        f"As the run recorded them, computed in {run.precision} ({row['device']}):", "",
        "| split | rows | what they are | metric | value |", "|---|---|---|---|---|",
        *[f"| {split} | {_rows(row, rows)} | {split_meaning(run.task, split)} | {metric} | {value:.4f} |"
          for split, metrics, rows in SPLITS for metric, value in sorted(_metrics(row, metrics).items())],
        "", f"The primary metric is {row['primary_metric']}; the run was selected on validation, never on test."
        + (" The run computed in bf16: a model loaded in float32 may differ from these scores by bf16 rounding."
           if run.precision == "bf16" else ""), "",
        f"## Load it ({written.format})", "", written.loading, "",
        f"Inputs are tokenized as the run's were: truncated to {run.max_length} tokens"
        + (", the two texts as one pair." if run.task.is_pair else "."),
        *([f"Labels, in logit order: {', '.join(run.labels)}."] if run.labels else []), "",
        "## Files", "", "| file | holds |", "|---|---|", *[f"| `{name}` | {what} |" for name, what in files.items()],
        "| `CHECKSUMS` | the sha256 of every other file (`sha256sum -c CHECKSUMS`) |", "",
        "## Where it came from", "",
        f"- run id: `{row['run_id']}` (experiment `{row['experiment']}`), code version `{row.get('code_version') or 'unknown'}`",
        f"- method: `{json.dumps(run.method.to_dict())}`; lr {row['lr']:g}, {int(row['epochs'])} epochs (best epoch {_int(row.get('best_epoch'))}), "
        f"seed {int(row['seed'])}, batch size {json.loads(row['config_json']).get('batch_size')}",
        f"- backbone: `{row['backbone']}`; data scheme `{row.get('data_scheme')}`, split `{row.get('data_split')}`"
        + (f" ({row['split_note']})" if row.get("split_note") else ""),
        f"- status: {row['status']}" + (f" ({row['reason']})" if _text(row.get("reason")) else ""), "",
    ]
    return "\n".join(lines)


def model_index_results(run: ExportedRun) -> list[dict[str, Any]]:
    """One model-index result per split with scores: the hub split its rows come from, adaptune's split name and row
    count, and each metric with the precision it was computed in."""
    source = run.task.source
    results = []
    for split, metrics, rows in SPLITS:
        scores = _metrics(run.run, metrics)
        if not scores:
            continue
        dataset = {"name": run.task.title or run.task.name, "type": source.hub_id or run.task.name,
                   **({"config": source.hub_config} if source.hub_config else {}), "split": hub_split(run.task, split),
                   "args": {"adaptune_split": split, "rows": _rows(run.run, rows), "what": split_meaning(run.task, split)}}
        results.append({
            "task": {"type": "text-classification", "name": "Text Regression" if run.task.kind == "regression" else "Text Classification"},
            "dataset": dataset,
            "metrics": [{"type": metric, "value": float(value), "name": f"{split} {metric}", "args": {"precision": run.precision}}
                        for metric, value in sorted(scores.items())],
        })
    return results


def base_model_license(base_model: str) -> str | None:
    return BASE_MODEL_LICENSES.get(_short(base_model))


def head_text(task: Task) -> str:
    """What the task head is: a regression head (one output) or a classification head over the task's classes."""
    if task.kind == "regression":
        return "the task head is a regression head (one output, trained with mean squared error)"
    return f"the task head is a classification head ({task.num_labels} classes)"


def dataset_terms(task: Task) -> str:
    """The dataset's terms: the publisher's, at the link where they are stated (the project restates none)."""
    link = f"https://huggingface.co/datasets/{task.source.hub_id}" if task.source.hub_id else task.source.url
    return f"the terms are the publisher's: see the publisher, {link}" if link else "the terms are the publisher's: see the publisher"


def selection_text(run: dict[str, Any], method: str) -> str:
    """How this run was selected: by the rule of the report's table its task is in (serve.selection)."""
    if run.get("table") == "Table 2":
        sem = run.get("config_sem")
        spread = f" ± {100 * float(sem):.1f} (s.e.m.)" if sem is not None and _text(sem) else ""
        return (f"Selected as the report's Table 2 selects: of the store's usable `{method}` runs of this task, the configuration "
                f"(learning rate, epochs, size) with the best mean validation score over seeds; Table 2 reports its mean test "
                f"score over its {int(run['config_seeds'])} seed(s), {100 * run['config_mean']:.1f}{spread}, not this one run's. "
                "A folder holds one model: this is that configuration's seed best on validation.")
    return (f"Selected as the report's Table 1 selects: of the store's usable `{method}` runs of this task, the single run "
            "best on validation (over every configuration and seed).")


def _text(value: Any) -> bool:
    """A value the card can print: not None, not NaN (a runs.parquet row's missing reason), not empty."""
    return value is not None and value == value and value != ""


def hub_split(task: Task, split: str) -> str:
    """The hub split a canonical split's rows are cut from (GLUE: validation from train, test is dev: the hub's validation)."""
    role = GLUE_SPLIT_SOURCES.get(split, split) if task.family == "glue" else ("all" if "all" in task.source.file_map else split)
    return task.source.hub_split_map.get(role, role)


def split_meaning(task: Task, split: str) -> str:
    if task.family == "glue":
        if split == "validation":
            return (f"a seeded, stratified {HOLDOUT_FRACTION:.0%} of GLUE's train set (at most {HOLDOUT_MAX_ROWS:,} rows), "
                    "held out of training")
        return "GLUE's dev set (GLUE's test labels are not public)"
    if "all" in task.source.file_map:
        return f"the {split} tenth of a seeded 80/10/10 split of the task's one data file"
    return f"the task's {split} split"


def _metrics(row: dict[str, Any], column: str) -> dict[str, float]:
    value = row.get(column)
    return {name: score for name, score in (json.loads(value) if isinstance(value, str) else value or {}).items()
            if isinstance(score, int | float)}


def _rows(row: dict[str, Any], column: str) -> int | str:
    value = row.get(column)
    return "?" if value is None or value != value else int(value)  # NaN where the record has no split sizes


def _int(value: Any) -> Any:
    return "?" if value is None or value != value else int(value)


def _percent(row: dict[str, Any]) -> str:
    return f"{100 * float(row['trained_params']) / float(row['total_params']):.2f}%"


def _short(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]
