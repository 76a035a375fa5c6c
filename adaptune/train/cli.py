"""`python -m adaptune train ...`: flags -> TrainConfig, checked before anything is created.

Kept apart from adaptune.train.loop (which imports torch and transformers' training helpers) so that
`train --help` and a mistyped flag answer at once. Order of refusal, cheapest first: conflicting
flags, the task, the numbers, the method, the backbone (config only), the data (read and cached for
the run); only then is the run directory created and the model loaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from adaptune.core.backbones import DEFAULT_BACKBONE
from adaptune.data.squad import DOC_STRIDE as SPAN_DOC_STRIDE
from adaptune.data.squad import MAX_LENGTH as SPAN_MAX_LENGTH
from adaptune.data.tasks import get_task
from adaptune.fused.settings import StepSettings
from adaptune.train.checks import ConfigError, check_train_config, number_problems
from adaptune.train.config import TrainConfig
from adaptune.train.record import record_in_run_dir

DEFAULT_METHOD = "adapters:64"


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, help="a task name (python -m adaptune tasks lists them)")
    parser.add_argument(
        "--method", default=None, help=f"full | layernorm | top_k:K | adapters:M[,init_std=S] (default: {DEFAULT_METHOD})"
    )
    parser.add_argument("--adapter-size", type=int, default=None, help="shorthand for --method adapters:M")
    parser.add_argument("--top-k", type=int, default=None, help="shorthand for --method top_k:K")
    parser.add_argument(
        "--init-std", type=float, default=None, help="adapter weight init std (default: 1e-2 as in the paper; its official code: 1e-3)"
    )
    parser.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate (AdamW, linear warmup and decay)")
    parser.add_argument("--epochs", type=int, default=TrainConfig.epochs, help="training epochs (validation is scored after each)")
    parser.add_argument("--seed", type=int, default=TrainConfig.seed, help="seed of initialisation, batch order and subsets")
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE, help="hub id or local directory (default: %(default)s, embedded: works offline)")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size, help="examples per optimizer step")
    parser.add_argument(
        "--max-length", type=int, default=None,
        help=f"tokens per example (default: the task's standard, {SPAN_MAX_LENGTH} for SQuAD, {TrainConfig.max_length} otherwise)",
    )
    parser.add_argument(
        "--doc-stride", type=int, default=None,
        help=f"SQuAD window overlap in tokens (default: {SPAN_DOC_STRIDE}); keep it below half of --max-length",
    )
    parser.add_argument("--max-train-examples", type=int, default=None, help="seeded subset of the training split (default: all)")
    parser.add_argument("--max-eval-examples", type=int, default=None, help="seeded subset of validation/test (default: all)")
    parser.add_argument(
        "--checkpoint-every-steps", type=int, default=None, help="save the resumable state every N steps (default: at epoch ends only)"
    )
    parser.add_argument("--experiment", default="adhoc", help="experiment name stored with the record")
    parser.add_argument("--data-dir", default=None, help="local data mirror, or 'hub' (default: found automatically)")
    parser.add_argument("--cache-dir", default=None, help="tokenization cache (default: $ADAPTUNE_CACHE_DIR or ~/.cache/adaptune)")
    parser.add_argument("--out", default=None, help="run directory (default: runs/<run_id>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the CLI flags describe; conflicting flags, an unknown task, bad numbers or an
    unknown method raise (ConfigError / UnknownTaskError) before torch is imported where they can."""
    given = [flag for flag, value in (("--method", args.method), ("--adapter-size", args.adapter_size), ("--top-k", args.top_k)) if value is not None]
    if len(given) > 1:
        raise ConfigError(f"give one of --method, --adapter-size, --top-k (got {', '.join(given)})")
    task = get_task(args.task)
    # Unset lengths mean the task's standard: SQuAD's windows are 384 tokens with stride 128, GLUE's 128.
    span = task.kind == "span"
    max_length = args.max_length if args.max_length is not None else (SPAN_MAX_LENGTH if span else TrainConfig.max_length)
    doc_stride = args.doc_stride if args.doc_stride is not None else (SPAN_DOC_STRIDE if span else TrainConfig.doc_stride)
    problems = number_problems(
        lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, max_length=max_length, seed=args.seed,
        max_train_examples=args.max_train_examples, max_eval_examples=args.max_eval_examples,
        checkpoint_every_steps=args.checkpoint_every_steps,
    )
    if problems:
        raise ConfigError("; ".join(problems))
    method_dict = _method_from_flags(args)
    return TrainConfig(
        task=args.task,
        method=method_dict,
        lr=args.lr,
        epochs=args.epochs,
        seed=args.seed,
        backbone=args.backbone,
        batch_size=args.batch_size,
        max_length=max_length,
        doc_stride=doc_stride,
        max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples,
        checkpoint_every_steps=args.checkpoint_every_steps,
        experiment=args.experiment,
    )


def _method_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    from adaptune.model.methods import parse_method  # imports torch: after the cheap checks

    if args.adapter_size is not None:
        flag, text = "--adapter-size", f"adapters:{args.adapter_size}"
    elif args.top_k is not None:
        flag, text = "--top-k", f"top_k:{args.top_k}"
    else:
        flag, text = "--method", args.method or DEFAULT_METHOD
    try:
        method_dict = parse_method(text).to_dict()
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{flag} {text!r}: {error}") from None
    if args.init_std is not None:
        if method_dict["name"] != "adapters":
            raise ConfigError(f"--init-std applies to adapters only, not {method_dict['name']!r}")
        method_dict["init_std"] = args.init_std
        try:
            parse_method(f"adapters:{method_dict['size']},init_std={args.init_std}")
        except ValueError as error:
            raise ConfigError(f"--init-std {args.init_std}: {error}") from None
    return method_dict


def preflight(config: TrainConfig, data_dir: Any = None, out_dir: Any = None) -> dict[str, Any] | None:
    """Everything `train` can refuse before it creates the run directory: the config (task, numbers,
    method, backbone, top_k depth), a foreign record in the out dir, the data dir, the task's files.

    Returns the finished record already in the out dir (nothing to load then), else None. The data
    is read here and cached in this process, so the run does not read it again.
    """
    check_train_config(config)
    out = Path(out_dir) if out_dir is not None else Path("runs") / config.run_id
    finished = record_in_run_dir(out, config.run_id)
    if finished is not None and finished.get("status") != "failed":
        return finished
    from adaptune.data.loading import load_task_data
    from adaptune.data.sources import quiet_datasets, resolve_data_dir

    root = resolve_data_dir(data_dir)
    with quiet_datasets():
        load_task_data(config.task, root)
    return None


def train_from_args(args: argparse.Namespace) -> int:
    """Run `python -m adaptune train`; prints the record; exit code 0 for ok/degenerate, 1 for failed.

    Bad input raises before the run directory exists (adaptune.cli turns it into one line and exit 2).
    """
    settings = StepSettings.from_environment()  # read once: a bad value is one line before anything runs
    config = config_from_args(args)
    record = preflight(config, data_dir=args.data_dir, out_dir=args.out)
    if record is None:
        from adaptune.train.loop import train_and_evaluate

        record = train_and_evaluate(config, data_dir=args.data_dir, out_dir=args.out, cache_dir=args.cache_dir, progress=not args.no_progress,
                                    settings=settings)
    print(json.dumps({k: v for k, v in record.items() if k not in ("config", "curve")}, indent=2, default=str))
    return 1 if record["status"] == "failed" else 0
