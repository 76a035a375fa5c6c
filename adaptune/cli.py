"""`python -m adaptune <command>`: the library from a shell, no kfp needed.

A command's module (and so torch) is imported only when that command runs, so `adaptune tasks`
and `adaptune --help` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

# Commands whose arguments and handler live in the module that does the work:
# name -> (help, module, function adding the arguments, handler).
MODULE_COMMANDS = {
    "train": ("train and evaluate one run", "adaptune.train", "add_train_arguments", "train_from_args"),
    "ablate": (
        "Figure 6: evaluate a trained adapter checkpoint with layer spans switched off",
        "adaptune.ablation",
        "add_ablate_arguments",
        "ablate_from_args",
    ),
    "health": ("reports the device this environment sees", "adaptune.healthcheck", "add_health_arguments", "health_from_args"),
}


def _tasks(args: argparse.Namespace) -> int:
    from adaptune.tasks import format_task_table

    print(format_task_table(data_dir=args.data_dir))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from adaptune.data import prepare

    summary = prepare(args.task, data_dir=args.data_dir, tokenizer_name=args.backbone, cache_dir=args.cache_dir)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from adaptune.experiments import get_experiment
    from adaptune.plan import plan

    print(plan(get_experiment(args.experiment)).summary())
    return 0


def _report(args: argparse.Namespace) -> int:
    from adaptune.report import build_report

    print(f"report: {build_report(Path(args.results), Path(args.out))}")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the chosen `command`'s module is imported to declare its arguments."""
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

    plan = commands.add_parser("plan", help="expand a named experiment into runs, with a cost estimate; runs nothing")
    plan.add_argument("experiment")
    plan.set_defaults(handler=_plan)

    report = commands.add_parser("report", help="tables, figures and report.md from a results directory")
    report.add_argument("results", help="directory holding runs.parquet (and curves/ablation)")
    report.add_argument("--out", required=True)
    report.set_defaults(handler=_report)

    for name, (help_text, module_name, add_arguments, handler) in MODULE_COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            getattr(module, add_arguments)(sub)
            sub.set_defaults(handler=getattr(module, handler))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
