"""`python -m adaptune predict`: serve one task of a bundle (adaptune.serve.bundle) on JSONL, one line per input.

Input lines are JSON objects holding the task's text fields, under the names the task's data uses:
for each text its canonical name (`text_a`, `text_b`), its Hugging Face column (`sentence`;
`sentence1`/`sentence2`; `question`/`sentence`; `sms`) or its publisher's column (`#1 String`,
`text`, ...), as adaptune/data/tasks.py declares them. An `id`, if given, is echoed. Every line is
checked before the model loads; a bad one is an error naming the file and line.

Output lines, in input order: `line` (1-based), `id` where given, and for classification `label`
(its name), `label_id`, `scores` (softmax probability per label) and `logits`; for regression
(STS-B) `score`. Texts are stripped and tokenized as the runs' data was (truncated to the run's
max_length), and batched as evaluation batches them, in the precision the run was scored in (the
manifest's `precision`, from its record's device: bf16 under autocast for a GPU's run or a CPU's with
native bf16, else float32; `--precision` overrides it). What equals what, and how exactly:
  float32   a run alone, scored in float32 on a CPU: its bundle's predictions equal its own evaluation
            bit for bit (tests/test_bundle.py).
  bf16      a run alone, scored in bf16: the same bf16 operators on the same batches, so the same
            scores (tests/test_bf16_precision.py); a run trained in a fused group was scored in the
            group's one pass (each batch repeated once per run), whose bf16 matmuls may round otherwise:
            its bundle's predictions may differ from that pass by bf16 rounding, and a bf16 run predicted
            in float32 (`--precision float32`) too (bench/bf16_gap.py measures both).
On a CPU without native bf16 a bf16 run's predictions are emulated: the same numbers, many times slower.

Extractive question answering (SQuAD) is not served: it needs sliding windows over the context and
answer post-processing (adaptune.data.squad), which this command does not wire up; `bundle` refuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from adaptune.core.errors import UserError
from adaptune.data.tasks import Task, get_task

BATCH_SIZE = 32  # as evaluation on a CPU (adaptune.train.evaluate.EVAL_BATCH_SIZE)
PRECISIONS = ("float32", "bf16")
RUN_PRECISION = "run"  # --precision's default: the precision the bundled run was scored in


class PredictInputError(UserError, ValueError):
    """An input file that cannot be served: unreadable, bad JSON or a missing text field (file and line named)."""


def accepted_fields(task: Task) -> list[tuple[str, ...]]:
    """Per text of the task, the field names an input line may use for it, preferred first."""
    names = []
    for position, canonical in enumerate(task.text_fields):
        candidates = [columns[position] for columns in (task.source.hub_text_columns, task.source.text_columns) if len(columns) > position]
        names.append(tuple(dict.fromkeys([*candidates, canonical])))
    return names


def fields_table() -> str:
    """The README's table of predict's input fields, per task it serves, from the registry (accepted_fields): the
    README block between FIELDS_MARKERS is this text (tests/test_tasks.py holds it)."""
    from adaptune.data.tasks import TASKS

    lines = ["| task | text field(s): any one name per text |", "|---|---|"]
    for task in TASKS.values():
        if task.kind in ("classification", "regression") and task.trained_as is None:
            texts = [" or ".join(f"`{name}`" for name in names) for names in accepted_fields(task)]
            lines.append(f"| {task.name} | {'; then '.join(texts)} |")
    return "\n".join(lines)


FIELDS_MARKERS = ("<!-- predict fields: adaptune.serve.predict.fields_table -->", "<!-- end predict fields -->")


def read_inputs(path: str | os.PathLike[str], task: Task) -> list[dict[str, Any]]:
    """Every non-blank line as {"line", "texts", "id"?}, all checked before anything is predicted."""
    fields = accepted_fields(task)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise PredictInputError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    inputs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise PredictInputError(f"{path} line {number}: not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(data, dict):
            raise PredictInputError(f"{path} line {number}: expected a JSON object with {_field_text(fields)}, got {type(data).__name__}")
        texts = []
        for names in fields:
            found = next((name for name in names if name in data), None)
            if found is None:
                others = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
                raise PredictInputError(f"{path} line {number}: missing field {names[0]!r}{others} for task {task.name}; "
                                        f"a {task.name} line holds {_field_text(fields)}")
            if not isinstance(data[found], str):
                raise PredictInputError(f"{path} line {number}: field {found!r} must be a string, got {type(data[found]).__name__}")
            texts.append(data[found].strip())  # as the data readers strip every text
        inputs.append({"line": number, "texts": texts, **({"id": data["id"]} if "id" in data else {})})
    if not inputs:
        raise PredictInputError(f"{path} holds no input line: give one JSON object per line with {_field_text(fields)}")
    return inputs


def predict(bundle_dir: str | os.PathLike[str], task_name: str, inputs: list[dict[str, Any]], batch_size: int = BATCH_SIZE,
            precision: str = RUN_PRECISION) -> list[dict[str, Any]]:
    """One output record per input (read_inputs' records), in order, computed in `precision` (default: the run's)."""
    from adaptune.serve.bundle import bundled_task

    checkpoint, entry, _ = bundled_task(bundle_dir, task_name)
    return _predict_task(bundle_dir, checkpoint, entry, inputs, batch_size, precision)


def bundled_precision(entry: dict[str, Any], asked: str = RUN_PRECISION) -> str:
    """The precision to predict a bundled task in: `asked`, or for "run" the one its run was scored in (a bundle
    made before the manifest said so: float32, what predict computed in then)."""
    if asked not in (RUN_PRECISION, *PRECISIONS):
        raise PredictInputError(f"unknown precision {asked!r}: use {RUN_PRECISION} (the run's own), {' or '.join(PRECISIONS)}")
    return (entry.get("precision") or "float32") if asked == RUN_PRECISION else asked


def _predict_task(bundle_dir: str | os.PathLike[str], checkpoint: Path, entry: dict[str, Any], inputs: list[dict[str, Any]],
                  batch_size: int, precision: str = RUN_PRECISION) -> list[dict[str, Any]]:
    """predict() for a task bundled_task has already found and checked (its tensors hashed once)."""
    from adaptune.model.backbone import load_tokenizer
    from adaptune.model.checkpoint import load_task_checkpoint
    from adaptune.serve.bundle import BACKBONE_DIR

    backbone = str(Path(bundle_dir) / BACKBONE_DIR)
    model, _, _ = load_task_checkpoint(checkpoint, backbone=backbone)
    tokenizer = load_tokenizer(backbone)
    logits = predict_logits(model, tokenizer, [item["texts"] for item in inputs], entry["max_length"], batch_size,
                            bundled_precision(entry, precision))
    return [_output(item, row, entry) for item, row in zip(inputs, logits, strict=True)]


def predict_logits(model: Any, tokenizer: Any, texts: list[list[str]], max_length: int, batch_size: int = BATCH_SIZE,
                   precision: str = "float32") -> Any:
    """Logits (n x num_labels float32 numpy array) in input order, batched as evaluation batches, computed in
    `precision`: "bf16" under autocast, as the trainer's evaluation computes them where its device autocasts."""
    import dataclasses

    import numpy as np
    import torch

    from adaptune.core.devices import pick_device
    from adaptune.data.batching import evaluation_batches, iterate_batches, make_collator

    if precision not in PRECISIONS:
        raise PredictInputError(f"unknown precision {precision!r}: use {' or '.join(PRECISIONS)}")
    device = pick_device(cpu_precision="float32")  # the device only: the precision is the run's, set here
    device = dataclasses.replace(device, autocast_dtype=torch.bfloat16 if precision == "bf16" else None)
    model.to(device.torch_device).eval()
    second = [pair[1] for pair in texts] if len(texts[0]) == 2 else None
    encoded = tokenizer([pair[0] for pair in texts], second, truncation=True, max_length=max_length)
    rows = [{name: encoded[name][i] for name in encoded} for i in range(len(texts))]
    batches = evaluation_batches([len(row["input_ids"]) for row in rows], batch_size)
    out: list[Any] = [None] * len(rows)
    with device.no_grad(), device.autocast():
        for indices, batch in zip(batches, iterate_batches(rows, batches, make_collator(tokenizer), device.torch_device), strict=True):
            values = model(**batch).logits.float().cpu().numpy()
            for position, index in enumerate(indices):
                out[index] = values[position]
    return np.stack(out)


def _output(item: dict[str, Any], logits: Any, entry: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    record: dict[str, Any] = {"line": item["line"], **({"id": item["id"]} if "id" in item else {})}
    if entry["task_kind"] == "regression":
        return {**record, "score": float(logits[0])}
    label_id = int(np.argmax(logits))
    shifted = np.exp(logits.astype(np.float64) - logits.max())
    probabilities = shifted / shifted.sum()
    labels = entry.get("labels") or [str(i) for i in range(len(logits))]
    return {**record, "label": labels[label_id], "label_id": label_id,
            "scores": {label: float(p) for label, p in zip(labels, probabilities, strict=True)},
            "logits": [float(value) for value in logits]}


def _field_text(fields: list[tuple[str, ...]]) -> str:
    return " and ".join(repr(names[0]) for names in fields)


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="a bundle directory (python -m adaptune bundle)")
    parser.add_argument("--task", required=True, help="a task in the bundle")
    parser.add_argument("--input", required=True, help="JSONL: one JSON object per line with the task's text fields")
    parser.add_argument("--output", default=None, help="JSONL to write (default: stdout)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="inputs per forward pass")
    parser.add_argument("--precision", default=RUN_PRECISION, choices=(RUN_PRECISION, *PRECISIONS),
                        help="compute in: run (default: the precision the bundled run was scored in, the manifest's), float32 or bf16")


def predict_from_args(args: argparse.Namespace) -> int:
    from adaptune.serve.bundle import bundled_task

    checkpoint, entry, _ = bundled_task(args.bundle, args.task)  # an unknown task is named before the input is read
    if args.batch_size < 1:
        raise PredictInputError(f"--batch-size must be >= 1, got {args.batch_size}")
    inputs = read_inputs(args.input, get_task(args.task))
    started = time.perf_counter()
    outputs = _predict_task(args.bundle, checkpoint, entry, inputs, args.batch_size, args.precision)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as handle:
            _write(outputs, handle)
        print(f"{len(outputs)} {args.task} predictions ({entry['method_label']}, run {entry['run_id']}, "
              f"{bundled_precision(entry, args.precision)}) -> {args.output} "
              f"in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    else:
        _write(outputs, sys.stdout)
    return 0


def _write(outputs: list[dict[str, Any]], handle: TextIO) -> None:
    for record in outputs:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
