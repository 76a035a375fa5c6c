"""Measure the head rule on the embedded backbone: frozen untrained pooler vs trained pooler vs mean pooling.

all-MiniLM-L6-v2 was trained with mean pooling; its BERT pooler was never trained. Adapters and
LayerNorm-only keep a pre-trained pooler frozen (the paper, the official code). This script trains
short real runs with the same engine (`adaptune.train.loop.train_and_evaluate`) under three heads:

  frozen   the checkpoint's pooler, frozen (the project before the rule: the classifier reads a
           random projection)
  trained  the checkpoint's pooler, trained with the head (the first version of the rule)
  mean     masked mean pooling over the tokens, as the backbone was trained (the rule as adopted:
           adaptune.model.backbone.load_model does this for a pooler that was never trained)

and prints one JSON line per run (task, method, head, seed, validation metric at each epoch; the run's
result is the final epoch's).

    .venv/bin/python -m bench.pooler_head_rule --tasks sms_spam cola mrpc rte --out /tmp/pooler_runs
    .venv/bin/python -m bench.pooler_head_rule --tasks sst2 --seeds 0 1 --train-examples 2000 --epochs 2 --out /tmp/pooler_sst2

Measured on 2026-11-22: bench/LOG.md, "2026-11-22: the head rule on the embedded backbone".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

import adaptune.train.loop as train_module
from adaptune.model import backbone, methods
from adaptune.train.config import TrainConfig

HEADS = ("frozen", "trained", "mean")


def patched_load(head: str):
    def load(name, task_kind, num_labels=2):
        return backbone.load_model(name, task_kind, num_labels, mean_pool_untrained=head == "mean")

    return load


def patched_apply(head: str):
    def apply(model: nn.Module, cfg):
        methods.apply_method(model, cfg)
        if head == "trained":
            methods.pooler_module(model).requires_grad_(True)
        return model

    return apply


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", nargs="+", default=["sms_spam", "cola", "mrpc", "rte"])
    parser.add_argument("--methods", nargs="+", default=["adapters", "layernorm"])
    parser.add_argument("--heads", nargs="+", default=list(HEADS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--train-examples", type=int, default=1000)
    parser.add_argument("--eval-examples", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("/tmp/pooler_runs"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    method_dicts = {"adapters": ({"name": "adapters", "size": 64, "init_std": 1e-2}, 1e-3), "layernorm": ({"name": "layernorm"}, 3e-3)}
    for task in args.tasks:
        for method in args.methods:
            method_dict, lr = method_dicts[method]
            for head in args.heads:
                for seed in args.seeds:
                    config = TrainConfig(
                        task=task, method=method_dict, lr=lr, seed=seed, epochs=args.epochs, max_length=args.max_length,
                        max_train_examples=args.train_examples, max_eval_examples=args.eval_examples, experiment="pooler_head_rule",
                    )
                    train_module.load_model, train_module.apply_method = patched_load(head), patched_apply(head)
                    record = train_module.train_and_evaluate(
                        config, out_dir=args.out / head / config.run_id, cache_dir=args.out / "cache", progress=False
                    )
                    line = {
                        "task": task, "method": method, "head": head, "seed": seed, "lr": lr, "status": record["status"],
                        "trained_params": record["trained_params"], "best_epoch": record["best_epoch"],
                        "val_metrics": record["val_metrics"], "test_metrics": record["test_metrics"],
                        "curve": [c["val_metrics"].get(record["primary_metric"]) for c in record["curve"]],
                    }
                    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
