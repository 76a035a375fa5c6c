"""`python -m adaptune <command>`: the library from a shell, no kfp needed.

Each subcommand's module is imported only when it runs, so `adaptune tasks` starts fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _tasks(args: argparse.Namespace) -> int:
    from adaptune.tasks import format_task_table

    print(format_task_table(data_dir=args.data_dir))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from adaptune.data import prepare

    summary = prepare(args.task, data_dir=args.data_dir, tokenizer_name=args.backbone, cache_dir=args.cache_dir)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def _train(args: argparse.Namespace) -> int:
    from adaptune.train import train_from_args

    return train_from_args(args)


def _ablate(args: argparse.Namespace) -> int:
    from adaptune.ablation import ablate_from_args

    return ablate_from_args(args)


def _plan(args: argparse.Namespace) -> int:
    from adaptune.experiments import get_experiment
    from adaptune.plan import plan

    print(plan(get_experiment(args.experiment)).summary())
    return 0


def _report(args: argparse.Namespace) -> int:
    from adaptune.report import build_report

    print(f"report: {build_report(Path(args.results), Path(args.out))}")
    return 0


def _health(args: argparse.Namespace) -> int:
    from adaptune.healthcheck import health_from_args

    return health_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    from adaptune.config import DEFAULT_BACKBONE

    parser = argparse.ArgumentParser(prog="adaptune", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    tasks = commands.add_parser("tasks", help="list every task with its source and metrics")
    tasks.add_argument("--data-dir", default=None, help="local mirror in the publishers' layout (default: found automatically)")
    tasks.set_defaults(handler=_tasks)

    prepare = commands.add_parser("prepare", help="load, split and tokenize one task (cached)")
    prepare.add_argument("--task", required=True)
    prepare.add_argument("--data-dir", default=None)
    prepare.add_argument("--backbone", default=DEFAULT_BACKBONE)
    prepare.add_argument("--cache-dir", default=None)
    prepare.set_defaults(handler=_prepare)

    train = commands.add_parser("train", help="train and evaluate one run")
    from adaptune.train import add_train_arguments

    add_train_arguments(train)
    train.set_defaults(handler=_train)

    ablate = commands.add_parser("ablate", help="Figure 6: evaluate a trained adapter checkpoint with layer spans switched off")
    from adaptune.ablation import add_ablate_arguments

    add_ablate_arguments(ablate)
    ablate.set_defaults(handler=_ablate)

    plan = commands.add_parser("plan", help="expand a named experiment into runs, with a cost estimate; runs nothing")
    plan.add_argument("experiment")
    plan.set_defaults(handler=_plan)

    report = commands.add_parser("report", help="tables, figures and report.md from a results directory")
    report.add_argument("results", help="directory holding runs.parquet (and curves/ablation)")
    report.add_argument("--out", required=True)
    report.set_defaults(handler=_report)

    health = commands.add_parser("health", help="import check: reports the device this environment sees")
    from adaptune.healthcheck import add_health_arguments

    add_health_arguments(health)
    health.set_defaults(handler=_health)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
