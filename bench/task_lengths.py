"""`make bench-lengths`: the tokens a training row of each task is padded to, as a run batches it; JSON out.

    python -m bench.task_lengths --out bench/task_lengths.json [--experiment paper_full]

Per task of the experiment whose training file is here: a seeded sample of up to 8,192 training rows, tokenized at
the experiment's max_length, in one epoch's length-grouped batches of 32 padded to a GPU's multiple of 8 (the trainer's
own code): the mean row length and the mean tokens a row is padded to. A replayed group's step keeps the device busy
and grows with its tokens, while bench-gpu's fused figures (adaptune.sweep.cost.FUSED_SPEEDUP) were measured on one
mix of tasks (CoLA, SST-2, MRPC and RTE: 39.8 tokens): this says how far each task is from that mix. SQuAD's figure
comes from bench.squad_lengths. A task without its file here is listed as missing, with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.squad_lengths import padded_batch_lengths, squad_lengths

SAMPLE_ROWS = 8192
BATCH_SIZE = 32
PAD_MULTIPLE = 8  # a GPU's (adaptune.core.devices.Device.pad_multiple)


def task_lengths(experiment: str, data_dir: str | None = None) -> dict[str, Any]:
    from datasets import DatasetDict

    from adaptune.data.batching import model_rows, subsample
    from adaptune.data.loading import load_task_data
    from adaptune.data.tasks import get_task
    from adaptune.data.token_cache import tokenize_task
    from adaptune.model.backbone import load_tokenizer
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan

    tokenizer = load_tokenizer(None)  # BERT's uncased WordPiece, as bert-base- and bert-large-uncased
    runs = plan(get_experiment(experiment)).runs
    lengths_by_task = dict.fromkeys((run.task, run.max_length) for run in runs)
    tasks: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for name, max_length in lengths_by_task:
        task = get_task(name)
        if task.kind == "span":
            written = squad_lengths(data_dir, None, PAD_MULTIPLE, max_length=max_length)
            tasks[name] = {"rows": written["features"], "max_length": max_length, "mean_length": written["mean_feature_length"],
                           "mean_padded_length": written["mean_padded_length"], "data_split": written["data_split"]}
            continue
        try:
            raw = subsample(load_task_data(task, data_dir, splits=("train",))["train"], SAMPLE_ROWS)
        except Exception as error:  # noqa: BLE001 -- a task whose files are not here is reported, not fatal
            missing[name] = str(error).splitlines()[0][:200]
            continue
        rows = model_rows(tokenize_task(task, DatasetDict(train=raw), tokenizer, max_length, None)["train"])
        lengths = [len(row["input_ids"]) for row in rows]
        _, mean_padded = padded_batch_lengths(lengths, BATCH_SIZE, PAD_MULTIPLE)
        tasks[name] = {"rows": len(lengths), "max_length": max_length, "mean_length": round(sum(lengths) / len(lengths), 1),
                       "mean_padded_length": round(mean_padded, 1)}
    return {"experiment": experiment, "sample_rows": SAMPLE_ROWS, "batch_size": BATCH_SIZE, "pad_multiple": PAD_MULTIPLE,
            "tasks": tasks, "missing": missing}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.task_lengths", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/task_lengths.json")
    parser.add_argument("--experiment", default="paper_full")
    parser.add_argument("--data-dir", default=None, help="local data mirror (default: found automatically)")
    args = parser.parse_args(argv)
    results = task_lengths(args.experiment, args.data_dir)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["tasks"], indent=1))
    print(f"bench: wrote {out} ({len(results['tasks'])} tasks, {len(results['missing'])} without their files here)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
