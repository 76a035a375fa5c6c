"""How far apart bf16 leaves what float32 keeps equal: a fused group's runs against the same runs alone, and a
bundle's predictions against its run's recorded score, on a small real task, in each CPU precision.

    .venv/bin/python bench/bf16_gap.py [--task mrpc] [--train-rows 300] [--eval-rows 200] [--methods head,...] [--out gap.json]

Needs a CPU with native bf16 (avx512_bf16 or AMX; elsewhere bf16 is emulated, many times slower, and never the
default). Per method, 2 learning rates x 2 seeds train as one fused group and one by one alone, in bf16 and in
float32; then each run's checkpoint predicts its validation rows as a bundle does (adaptune.serve.predict), in
bf16 and in float32, scored against the run's recorded validation score. Prints one JSON object: per precision and
method the largest |fused - alone| of the validation and test scores (points) and of the final epoch's training
loss, and the largest |predicted - recorded| validation score (points) of the alone and the fused runs predicted in
each precision. tests/test_bf16_precision.py holds the bf16 path to the tolerances this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METHODS = {  # each at rates it learns at in a few hundred rows
    "adapters16": ({"name": "adapters", "size": 16}, (1e-3, 3e-3)),
    "layernorm": ({"name": "layernorm"}, (3e-3, 1e-2)),
    "head": ({"name": "head"}, (3e-3, 1e-2)),
}


@contextmanager
def cpu_precision(precision: str) -> Iterator[None]:
    """Pin the CPU precision of the runs trained inside (as an experiment's cpu_precision does)."""
    from adaptune.core.precision import CPU_BF16_ENV, cpu_bf16_env_value

    before = os.environ.get(CPU_BF16_ENV)
    os.environ[CPU_BF16_ENV] = cpu_bf16_env_value(precision)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CPU_BF16_ENV, None)
        else:
            os.environ[CPU_BF16_ENV] = before


def configs(task: str, method: dict[str, Any], lrs: tuple[float, ...], train_rows: int, eval_rows: int, epochs: int) -> list[Any]:
    from adaptune.train.config import TrainConfig

    return [TrainConfig(task=task, method=method, lr=lr, seed=seed, epochs=epochs, max_length=64, batch_size=16,
                        max_train_examples=train_rows, max_eval_examples=eval_rows, experiment="bf16_gap")
            for lr in lrs for seed in (0, 1)]


def validation_texts(task: str, eval_rows: int, data_dir: str | None) -> tuple[list[list[str]], list[Any]]:
    """The validation rows a run with max_eval_examples=eval_rows was scored on: texts and labels, in order."""
    from adaptune.data.batching import subsample
    from adaptune.data.loading import load_task_data

    rows = subsample(load_task_data(task, data_dir)["validation"], eval_rows)
    texts = [[row["text_a"]] + ([row["text_b"]] if row.get("text_b") is not None else []) for row in rows]
    return texts, list(rows["label"])


def predicted_score(record: dict[str, Any], texts: list[list[str]], labels: list[Any], precision: str) -> float:
    """The run's validation score from its checkpoint's predictions, as a bundle predicts (points)."""
    from adaptune.data.tasks import get_task
    from adaptune.model.backbone import load_tokenizer
    from adaptune.model.checkpoint import load_task_checkpoint
    from adaptune.serve.predict import predict_logits
    from adaptune.train.metrics import compute_metrics

    model, _, _ = load_task_checkpoint(record["checkpoint_dir"])
    logits = predict_logits(model, load_tokenizer(record["backbone"]), texts, record["config"]["max_length"], precision=precision)
    task = get_task(record["task"])
    predictions = logits[:, 0] if task.kind == "regression" else logits.argmax(axis=1)
    return 100.0 * compute_metrics(task, list(predictions), labels)[record["primary_metric"]]


def measure(task: str = "mrpc", train_rows: int = 300, eval_rows: int = 200, epochs: int = 2, data_dir: str | None = None,
            methods: dict[str, tuple[dict[str, Any], tuple[float, ...]]] = METHODS, precisions: tuple[str, ...] = ("bf16", "float32"),
            out_dir: str | None = None) -> dict[str, Any]:
    from adaptune.train.group_loop import train_group
    from adaptune.train.loop import train_and_evaluate

    texts, labels = validation_texts(task, eval_rows, data_dir)
    result: dict[str, Any] = {"task": task, "train_rows": train_rows, "eval_rows": eval_rows, "epochs": epochs, "runs_per_group": 4}
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        for precision in precisions:
            with cpu_precision(precision):
                for label, (method, lrs) in methods.items():
                    runs = configs(task, method, lrs, train_rows, eval_rows, epochs)
                    root = Path(tmp) / precision / label
                    fused = train_group(runs, [root / "fused" / run.run_id for run in runs], data_dir=data_dir)
                    alone = [train_and_evaluate(run, data_dir=data_dir, out_dir=root / "alone" / run.run_id, progress=False) for run in runs]

                    def gap(read: Any, fused: list[dict] = fused, alone: list[dict] = alone) -> float:
                        return max(abs(read(f) - read(a)) for f, a in zip(fused, alone, strict=True))

                    entry = {
                        "devices": sorted({record["device"] for record in fused + alone}),
                        "val_points": gap(lambda r: 100.0 * r["val_metrics"][r["primary_metric"]]),
                        "test_points": gap(lambda r: 100.0 * r["test_metrics"][r["primary_metric"]]),
                        "final_train_loss": gap(lambda r: r["curve"][-1]["train_loss"]),
                        "val_scores_alone": [round(100.0 * r["val_metrics"][r["primary_metric"]], 2) for r in alone],
                    }
                    for side, records in (("alone", alone), ("fused", fused)):
                        for predicted_in in ("bf16", "float32"):
                            entry[f"predicted_{predicted_in}_vs_record_{side}_points"] = max(
                                abs(predicted_score(r, texts, labels, predicted_in) - 100.0 * r["val_metrics"][r["primary_metric"]])
                                for r in records)
                    result.setdefault(precision, {})[label] = {key: round(value, 4) if isinstance(value, float) else value
                                                              for key, value in entry.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from adaptune.core.devices import native_cpu_bf16

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="mrpc")
    parser.add_argument("--train-rows", type=int, default=300)
    parser.add_argument("--eval-rows", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"a comma-separated subset of {', '.join(METHODS)}")
    parser.add_argument("--precisions", default="bf16,float32", help="the training precisions, comma-separated")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        print(f"error: unknown method(s) {', '.join(sorted(unknown))}; known: {', '.join(METHODS)}", file=sys.stderr)
        return 2
    if not native_cpu_bf16():
        print("error: this CPU has no native bf16 (avx512_bf16 or AMX): bf16 would be emulated, and is never the default here",
              file=sys.stderr)
        return 2
    result = measure(args.task, args.train_rows, args.eval_rows, args.epochs, args.data_dir,
                     methods={name: METHODS[name] for name in args.methods.split(",")}, precisions=tuple(args.precisions.split(",")))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
