"""`python -m adaptune <command>`: the library from a shell, no kfp needed.

A command's module (and so torch) is imported only when that command runs, so `adaptune tasks`
and `adaptune --help` start fast.

Exit codes: 0 done (a degenerate run included), 1 a run that failed (or an internal error), 2 bad
input. Bad input (an unknown task or method, a malformed data file, a bad number, a missing data dir
or backbone, conflicting flags) is one line on stderr saying what is wrong and what to do; `--debug`
(or ADAPTUNE_DEBUG=1) adds the full traceback. An ADAPTUNE_* variable adaptune does not know, or a bad value
of one it does, is bad input too, refused before any command runs (`adaptune settings` lists them).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
import warnings
from pathlib import Path

from adaptune.core import environment
from adaptune.core.errors import EXIT_USER_ERROR, UserError
from adaptune.train.record import one_line_reason

DEBUG_ENV = "ADAPTUNE_DEBUG"
EXIT_FAILED, EXIT_USAGE = 1, EXIT_USER_ERROR
MESSAGE_LIMIT = 4000  # characters of an error line (an unknown task's line lists every task)
# Bad input, not a bug: one line and exit 2. Every error a user can fix subclasses UserError (adaptune.core.errors,
# which imports nothing: an unknown task need not wait for torch); these builtins are a path the user named.
USER_ERRORS = (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)

# Commands whose arguments and handler live in the module that does the work:
# name -> (help, module, function adding the arguments, handler).
MODULE_COMMANDS = {
    "train": ("train and evaluate one run", "adaptune.train.cli", "add_train_arguments", "train_from_args"),
    "ablate": (
        "Figure 6: evaluate a trained adapter checkpoint with layer spans switched off",
        "adaptune.train.ablation",
        "add_ablate_arguments",
        "ablate_from_args",
    ),
    "health": ("reports the device this environment sees", "adaptune.healthcheck", "add_health_arguments", "health_from_args"),
    "bundle": (
        "one model, many tasks: the backbone once plus each task's selected run, in one directory",
        "adaptune.serve.bundle_cli",
        "add_bundle_arguments",
        "bundle_from_args",
    ),
    "predict": ("serve a bundled task: JSONL in, predictions out", "adaptune.serve.predict", "add_predict_arguments", "predict_from_args"),
    "export": (
        "each selected run as a folder its users load: AdapterHub format (adapters, pfeiffer), peft format (LoRA, (IA)3) or "
        "safetensors (full, top_k, layernorm, head), with a model card",
        "adaptune.serve.export_cli",
        "add_export_arguments",
        "export_from_args",
    ),
    "settings": ("every ADAPTUNE_* variable: its value here and where it comes from (default, environment, preset)",
                 "adaptune.settings_cli", "add_settings_arguments", "settings_from_args"),
}


def _tasks(args: argparse.Namespace) -> int:
    from adaptune.data.task_table import format_task_table

    print(format_task_table(data_dir=args.data_dir))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from adaptune.data.loading import prepare

    summary = prepare(args.task, data_dir=args.data_dir, tokenizer_name=args.backbone, cache_dir=args.cache_dir)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan

    print(plan(get_experiment(args.experiment)).summary())
    return 0


def _render(args: argparse.Namespace) -> int:
    from adaptune.report import build_report

    print(f"report: {build_report(Path(args.results), Path(args.out))}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line: `adaptune train: error: ... (see adaptune train --help)`."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` shows each option's default, unless it has none (None, a flag's False) or its help says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if not action.option_strings or default is None or default is False or default is argparse.SUPPRESS or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the chosen `command`'s module is imported to declare its arguments."""
    from adaptune.core.backbones import DEFAULT_BACKBONE

    debug_help = f"on an error, print the full traceback too (also: {DEBUG_ENV}=1)"
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    parser = _Parser(prog="adaptune", description=__doc__.splitlines()[0], formatter_class=_HelpFormatter)
    parser.add_argument("--debug", action="store_true", help=debug_help)
    commands = parser.add_subparsers(dest="command", required=True)

    def add_command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], formatter_class=_HelpFormatter, help=help)

    tasks = add_command("tasks", help="list every task with its source, metrics, local data, and whether its definition is unverified")
    tasks.add_argument("--data-dir", default=None, help="local mirror in the publishers' layout (default: found automatically)")
    tasks.set_defaults(handler=_tasks)

    prepare = add_command("prepare", help="load, split and tokenize one task (cached)")
    prepare.add_argument("--task", required=True, help="a task name (python -m adaptune tasks lists them)")
    prepare.add_argument("--data-dir", default=None, help="local data mirror, or 'hub' (default: found automatically)")
    prepare.add_argument("--backbone", default=DEFAULT_BACKBONE, help="the tokenizer's backbone: hub id or local directory")
    prepare.add_argument("--cache-dir", default=None, help="tokenization cache (default: $ADAPTUNE_CACHE_DIR or ~/.cache/adaptune)")
    prepare.set_defaults(handler=_prepare)

    plan = add_command("plan", help="expand a named experiment into runs, with a cost estimate; runs nothing")
    plan.add_argument("experiment")
    plan.set_defaults(handler=_plan)

    # Not `report`: `python -m pipelines report` aggregates a run store first; this renders Parquet already written.
    render = add_command("render", help="render report.md, tables and figures from a results directory's Parquet")
    render.add_argument("results", help="directory holding runs.parquet (and curves/ablation)")
    render.add_argument("--out", required=True, help="directory for report.md, tables/ and figures/")
    render.set_defaults(handler=_render)

    for name, (help_text, module_name, add_arguments, handler) in MODULE_COMMANDS.items():
        sub = add_command(name, help=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            getattr(module, add_arguments)(sub)
            sub.set_defaults(handler=getattr(module, handler))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    prog = f"adaptune {command}" if command else "adaptune"
    try:
        environment.check()  # a misspelt name or a bad value, before any command runs
    except environment.SettingError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    debug = "--debug" in argv or environment.settings().debug
    saved_format = warnings.formatwarning
    if not debug:  # our warnings (e.g. an unreadable optional results file) as one line each
        warnings.formatwarning = lambda message, category, *_args, **_kwargs: f"{prog}: warning: {' '.join(str(message).split())}\n"
    try:
        args = build_parser(command).parse_args(argv)
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 (every error ends as one line; --debug adds the traceback)
        if debug:
            traceback.print_exc()
        user_error = is_user_error(error)
        print(error_line(prog, error, user_error), file=sys.stderr)
        return EXIT_USAGE if user_error else EXIT_FAILED
    finally:
        warnings.formatwarning = saved_format


def is_user_error(error: BaseException) -> bool:
    """Bad input rather than a bug: a UserError, or a path the user named that is missing or not allowed."""
    return isinstance(error, USER_ERRORS)


def error_line(prog: str, error: BaseException, user_error: bool | None = None) -> str:
    """The one line printed for an error: its message for bad input, else its type and a pointer to --debug."""
    user_error = is_user_error(error) if user_error is None else user_error
    reason = one_line_reason(error, limit=MESSAGE_LIMIT)
    if user_error:
        return f"{prog}: error: {reason.removeprefix(type(error).__name__ + ': ')}"
    return f"{prog}: internal error: {reason} (rerun with --debug, or {DEBUG_ENV}=1, for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
