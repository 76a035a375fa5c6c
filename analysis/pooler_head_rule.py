"""Measure the head rule on the embedded backbone: frozen untrained pooler vs trained pooler vs mean pooling.

all-MiniLM-L6-v2 was trained with mean pooling; its BERT pooler was never trained. Adapters and
LayerNorm-only keep a pre-trained pooler frozen (the paper, the official code). This script trains
short real runs with the same engine (`adaptune.train.train_and_evaluate`) under three heads:

  frozen   the pooler frozen, as before the rule (the classifier reads a random projection)
  trained  the rule: an untrained pooler is trained as part of the head (what methods.py now does)
  mean     the pooler replaced by masked mean pooling over the tokens, as the backbone was trained

and prints one line per run (task, method, head, seed, validation metrics at the final epoch).

    .venv/bin/python analysis/pooler_head_rule.py --tasks sms_spam cola mrpc rte --out /tmp/pooler_runs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

import adaptune.train as train_module
from adaptune import methods
from adaptune.config import TrainConfig

HEADS = ("frozen", "trained", "mean")


class MeanPooler(nn.Module):
    """Masked mean of the last hidden states; the mask comes from the base model's forward call."""

    def __init__(self) -> None:
        super().__init__()
        self.mask: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mask = self.mask if self.mask is not None else torch.ones(hidden_states.shape[:2], device=hidden_states.device)
        mask = mask.to(hidden_states.dtype).unsqueeze(-1)
        return (hidden_states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def _use_mean_pooling(model: nn.Module) -> None:
    base = model.base_model
    pooler = MeanPooler()
    base.pooler = pooler

    def keep_mask(module: nn.Module, args: tuple, kwargs: dict) -> None:
        pooler.mask = kwargs.get("attention_mask")

    base.register_forward_pre_hook(keep_mask, with_kwargs=True)


def patched_apply(head: str):
    original = methods.apply_method

    def apply(model: nn.Module, cfg):
        original(model, cfg)
        pooler = methods.pooler_module(model)
        if head == "frozen":
            pooler.requires_grad_(False)
        elif head == "mean":
            _use_mean_pooling(model)
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
                    train_module.apply_method = patched_apply(head)
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
