"""Figure 6: evaluate a trained adapter checkpoint with the adapters of each contiguous layer span off.

For a model with L layers there are L(L+1)/2 spans [first, last] (0-based, inclusive); each gives one
record per task metric (the selection metric first; the paper's Figure 6 reads accuracy) on
validation, beside the baseline with no adapter switched off. Switched-off adapters are exactly the identity, so span [0, L-1] is the model without adapters
(its trained LayerNorms and head kept), as in the paper.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from adaptune.core.devices import pick_device
from adaptune.data.batching import make_collator
from adaptune.data.tasks import get_task
from adaptune.model.adapters import adapters_disabled, encoder_layers
from adaptune.model.backbone import load_tokenizer
from adaptune.model.checkpoint import load_task_checkpoint
from adaptune.train.evaluate import evaluate_split
from adaptune.train.run_data import prepare_run_data


def ablate(
    checkpoint_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_eval_examples: int | None = None,
) -> list[dict[str, Any]]:
    """One record per layer span and task metric: run_id, task, first_layer, last_layer, metric, value,
    baseline_value, relative_change.

    Evaluates on the validation split the run was scored on: `max_eval_examples` None means the
    run's own `max_eval_examples` (so baseline_value equals the run record's validation score).
    relative_change = (value - baseline_value) / |baseline_value| (None when the baseline is 0).
    """
    model, method_cfg, info = load_task_checkpoint(checkpoint_dir)
    metadata = _ablation_metadata(checkpoint_dir, method_cfg.name, info)
    config = metadata.get("config") or {}
    task = get_task(metadata["task"])
    device = pick_device()
    tokenizer = load_tokenizer(info["backbone"])
    data = prepare_run_data(
        task,
        tokenizer,
        max_length=int(config.get("max_length", 128)),
        doc_stride=int(config.get("doc_stride", 128)),
        max_train_examples=None,
        max_eval_examples=max_eval_examples if max_eval_examples is not None else config.get("max_eval_examples"),
        data_dir=data_dir,
        cache_dir=cache_dir,
        with_train=False,
        data_split=metadata.get("data_split"),  # SQuAD's stand-in: its own validation articles, not all of dev
    )
    validation = data.eval_splits["validation"]
    collator = make_collator(tokenizer, pad_to_multiple_of=device.pad_multiple)  # as the run evaluated
    model.to(device.torch_device)

    def scores() -> dict[str, float | None]:
        values = evaluate_split(model, task, validation, device, collator).metrics
        return {metric: None if values.get(metric) is None else float(values[metric]) for metric in task.metrics}

    baseline = scores()
    layer_count = len(encoder_layers(model))
    records = []
    for first in range(layer_count):
        for last in range(first, layer_count):
            with adapters_disabled(model, first, last):
                values = scores()
            records += [_span_record(metadata.get("run_id"), task.name, first, last, metric, values[metric], baseline[metric])
                        for metric in task.metrics]
    return records


def _ablation_metadata(checkpoint_dir: str | os.PathLike[str], method: str, info: dict[str, Any]) -> dict[str, Any]:
    """The run's metadata from its checkpoint, refused unless it is an adapters run's checkpoint written by a run."""
    if method != "adapters":
        raise ValueError(f"{checkpoint_dir} was trained with method {method!r}; ablation switches adapters off, so it needs an adapters checkpoint")
    metadata: dict[str, Any] = info.get("metadata") or {}
    if "task" not in metadata:
        raise ValueError(f"{checkpoint_dir}/task.json has no metadata.task: it was not written by adaptune.train.loop; pass a run's checkpoint dir")
    return metadata


def _span_record(run_id: str | None, task: str, first: int, last: int, metric: str, value: float | None,
                 base: float | None) -> dict[str, Any]:
    """One ablation row: a layer span's score on a metric beside the run's own."""
    return {
        "run_id": run_id,
        "task": task,
        "first_layer": first,
        "last_layer": last,
        "metric": metric,
        "value": value,
        "baseline_value": base,
        "relative_change": (value - base) / abs(base) if value is not None and base else None,
    }


def add_ablate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="a run's checkpoint dir (<run out>/checkpoint) trained with adapters")
    parser.add_argument("--data-dir", default=None, help="local data mirror (default: found automatically)")
    parser.add_argument("--cache-dir", default=None, help="tokenization cache")
    parser.add_argument("--max-eval-examples", type=int, default=None, help="validation subset (default: the run's own)")
    parser.add_argument("--out", default=None, help="write the records as JSON here (default: print them)")


def ablate_from_args(args: argparse.Namespace) -> int:
    records = ablate(args.checkpoint, data_dir=args.data_dir, cache_dir=args.cache_dir, max_eval_examples=args.max_eval_examples)
    text = json.dumps(records, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        print(f"{len(records)} ablation records -> {args.out}")
    else:
        print(text)
    return 0
