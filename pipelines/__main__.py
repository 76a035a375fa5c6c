"""`python -m pipelines run | plan | show | status | report | compare | tensorboard | compile | submit | stage-models | stage-data`
(what the Makefile calls)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptune.sweep.retrain import RetrainPolicy

# This machine's `make bench-peer` result: a CPU plan's table price is scaled by it (adaptune.sweep.cpu_calibration).
BENCH_PEER_JSON = Path(__file__).resolve().parents[1] / "bench" / "peer.json"


def _run(args: argparse.Namespace) -> int:
    from pipelines.local import run_local

    started = time.perf_counter()
    paths = run_local(args.name, args.out, data_dir=args.data_dir, runs_root=args.runs_root, policy=_retrain_policy(args), runner=args.runner)
    print(f"\n{args.name} finished in {time.perf_counter() - started:.0f} s.")
    print(result_summary(paths, Path(args.out)))
    return 0


def result_summary(paths: dict[str, Path], out: Path) -> str:
    """What a finished local run ends with: its methods table, then where its files are (paths as the user named
    the output folder)."""
    lines = []
    methods = paths.get("tables", out / "tables") / "methods.md"
    if methods.is_file():
        lines += ["", "Methods (each one's configuration selected on validation, scored on a split selection never saw):",
                  methods.read_text(encoding="utf-8").strip()]
    files = [("report.md", "the report: the paper's tables and claims beside these runs"),
             ("runs.parquet", "one row per run (columns: analysis/SCHEMA.md)"),
             ("curves.parquet", "each run's scores by epoch"),
             ("ablation.parquet", "the layer-span ablation"),
             ("tables", "each table as Markdown and Parquet"),
             ("figures", "Figures 3-7, PNG and PDF")]
    shown = [(name, what) for name, what in files if name in paths]
    if shown:
        lines += ["", f"Files in {out}/:"]
        width = max(len(name) + 1 for name, _ in shown)
        lines += [f"  {(name + '/' if paths[name].is_dir() else name).ljust(width)}  {what}" for name, what in shown]
    store = out / "store"
    if store.is_dir():
        what = "the run store: the runs and their prepared data; run the same command again and both are reused"
        lines.append(f"  {'store/'.ljust(width if shown else 6)}  {what}")
    return "\n".join(lines)


def _plan(args: argparse.Namespace) -> int:
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan
    from adaptune.sweep.throughput import measure_on, set_aside_on

    spec = get_experiment(args.name)
    measured = set_aside = None
    if args.runs_root:  # the store's own records calibrate the estimate (every record there, not only this grid's)
        from adaptune.sweep.status_cache import store_summaries

        records = list(store_summaries(_store_for(args.name, args.runs_root, Path())).values())
        measured, set_aside = measure_on(records, spec.accelerator), set_aside_on(records, spec.accelerator)
    calibration = None
    if spec.accelerator.label == "cpu":  # the table's CPU row is another machine's: this one's benchmark scales it
        from adaptune.sweep.cpu_calibration import calibration_from_bench, this_cpu

        calibration = calibration_from_bench(BENCH_PEER_JSON, spec, this_cpu(spec.accelerator.cpu_precision))
    print(plan(spec, measured, set_aside, calibration).summary())
    if not args.runs_root:
        print("(pass --runs-root, or RUNS_ROOT= to make, to estimate from the throughput a run store's records measured)")
    return 0


def _status(args: argparse.Namespace) -> int:
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.status import sweep_status
    from adaptune.sweep.status_text import format_status

    spec = get_experiment(args.name)
    started = time.perf_counter()
    status = sweep_status(spec, _store_for(args.name, args.runs_root, Path("outputs") / _stem(args.name)))
    print(format_status(status))
    print(f"\n(read in {time.perf_counter() - started:.1f} s)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from adaptune.report import build_report
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.fan_in import aggregate_sweep

    out = Path(args.out or Path("outputs") / _stem(args.name))
    summary = aggregate_sweep(get_experiment(args.name, args.data_dir), _store_for(args.name, args.runs_root, out), out, partial=True)
    report = build_report(out, out, data_dir=args.data_dir)
    share = "all" if summary["runs"] == summary["planned"] else "partial:"
    print(f"{share} {summary['runs']:,} of {summary['planned']:,} runs ({summary['ok']} ok, {summary['degenerate']} degenerate, "
          f"{summary['failed']} failed); Parquet, tables, figures and {report} in {out}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """The runs two stores both hold, run by run (adaptune.report.compare.paired_runs) and summed up."""
    from adaptune.report.compare import paired_markdown, paired_runs, paired_summary, summary_markdown
    from adaptune.serve.selection import SelectionError, store_runs
    from adaptune.sweep.store import RunStore

    sides = []
    for root in (args.runs_a, args.runs_b):
        try:
            sides.append(store_runs(RunStore(root)))  # its current records as runs.parquet rows
        except SelectionError:  # none at all
            print(f"error: {root} holds no run records: nothing to compare", file=sys.stderr)
            return 2
    pairs = paired_runs(*sides)
    if pairs.empty:
        print(f"error: {args.runs_a} and {args.runs_b} share no run id: nothing to compare", file=sys.stderr)
        return 2
    summary = paired_summary(pairs)
    print(paired_markdown(pairs))
    print()
    print(summary_markdown(summary))
    print(f"\n{len(pairs)} runs in both (b minus a, percent points; intervals: {len(pairs)} pairs resampled)")
    changed = pairs["settings_changed"].dropna()
    if (changed != "").any():
        print("step settings that differ: " + "; ".join(f"{what} ({count} runs)" for what, count in changed[changed != ""].value_counts().items()))
    if len(changed) < len(pairs):
        print(f"{len(pairs) - len(changed)} runs with a side whose record predates the step settings (what differs there is not known)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        pairs.to_parquet(out / "paired_runs.parquet", index=False)
        summary.to_parquet(out / "paired_summary.parquet", index=False)
        print(f"paired_runs.parquet and paired_summary.parquet in {out}")
    return 0


def _tensorboard(args: argparse.Namespace) -> int:
    """Build the sweep's TensorBoard view (adaptune.sweep.tensorboard_view) and serve it, unless --no-serve."""
    import subprocess

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.tensorboard_view import SweepView

    out = Path(args.out or Path("outputs") / _stem(args.name))
    view = SweepView(get_experiment(args.name), _store_for(args.name, args.runs_root, out), out / "tensorboard", curves=not args.summaries_only)
    started = time.perf_counter()
    with_events = view.build()
    how = "linked to the store (live)" if view.store.files.is_local else f"copied from {view.store.root}, refreshed every {args.refresh_s:g} s"
    print(f"{view.view_dir}: {len(view.runs):,} planned runs, {with_events:,} with events so far, {how} "
          f"({time.perf_counter() - started:.1f} s)", flush=True)
    if args.no_serve:
        return 0
    host = ["--bind_all"] if args.bind_all else ["--host", "localhost"]  # a sweep's results stay on this machine unless asked
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(view.view_dir), "--port", str(args.port), *host]
    where = "every network interface" if args.bind_all else "this machine only"
    print(f"serving http://localhost:{args.port}/ to {where} (HParams: http://localhost:{args.port}/#hparams); Ctrl-C stops",
          flush=True)
    server = subprocess.Popen(command)
    with _stopped_by_sigterm():
        try:
            if not view.store.files.is_local:
                view.keep_mirroring(args.refresh_s, until=lambda: server.poll() is not None)
            return server.wait()
        except (KeyboardInterrupt, _Terminated) as stop:
            _stop_child(server)
            return 128 + signal.SIGTERM if isinstance(stop, _Terminated) else 0


class _Terminated(Exception):
    """SIGTERM arrived (kill, timeout, a supervisor): stop as on Ctrl-C, the child with the command."""


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    def terminated(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_child(child: Any, wait_s: float = 10.0) -> None:
    import subprocess

    child.terminate()
    try:
        child.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _stem(name: str) -> str:
    """The output folder of an experiment: its name, or a sweep file's name without the extension (as the Makefile)."""
    return Path(name).stem if name.endswith((".yaml", ".yml", ".json")) else name


def _store_for(name: str, runs_root: str | None, local_out: Path) -> Any:
    """The run store to read: --runs-root; else the submission's ($ADAPTUNE_RUNS_ROOT, adaptune.toml); else
    the local one `make run` wrote (<local_out>/store, local_out being outputs/<name>)."""
    from adaptune.core.environment import SettingError
    from adaptune.sweep.store import RunStore
    from pipelines.submit import load_settings

    if runs_root:
        return RunStore(runs_root).require_existing()
    settings = load_settings()
    if settings.runs_root or settings.pipeline_root:
        return RunStore(settings.resolved_runs_root()).require_existing()
    local = local_out / "store"
    if local.is_dir():
        return RunStore(local)
    raise SettingError(f"no run store for {name!r}: pass --runs-root DIR or gs://bucket/prefix (make ... RUNS_ROOT=...), "
                        f"set $ADAPTUNE_RUNS_ROOT, or run it locally first (make run writes {local})")


def _show(args: argparse.Namespace) -> int:
    """An experiment as a sweep file (YAML), to start one's own from."""
    import yaml

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.spec_file import spec_to_dict

    print(yaml.safe_dump(spec_to_dict(get_experiment(args.name)), sort_keys=False), end="")
    return 0


def _compile(args: argparse.Namespace) -> int:
    from pipelines.compile import compile_all

    for path in compile_all(*([args.root] if args.root else [])):
        print(f"wrote {path}")
    return 0


def _submit(args: argparse.Namespace) -> int:
    """The settings checked once (pipelines.submit.prepare_submission), then what the submission needs from outside
    (pipelines.submit_checks), then send it; a credential or network error on the way is one line (exit 2), not the
    client libraries' traceback."""
    from adaptune.core.environment import SettingError
    from pipelines import submit_checks
    from pipelines.submit import prepare_submission, send

    submission = prepare_submission(args.name)
    if submission.host:
        submit_checks.check_kfp_host(submission.host)
    else:
        submit_checks.check_credentials()
        submit_checks.check_vertex_endpoint(submission.settings.region or "")
        submit_checks.check_buckets(submission.settings)
    try:
        print(send(submission, _retrain_policy(args)))
    except Exception as error:
        line = submit_checks.explain(error, submission.target)
        if line is None:
            raise
        raise SettingError(line) from None
    return 0


def _stage_models(args: argparse.Namespace) -> int:
    from adaptune.core.environment import SettingError
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.staging import stage_models
    from adaptune.sweep.store import RunStore
    from pipelines.submit import load_settings

    sources = {}
    for item in args.sources:
        name, separator, path = item.partition("=")
        if not separator or not name or not path:
            raise SettingError(f"--from {item!r}: write --from BACKBONE=DIR, e.g. --from bert-large-uncased=/models/bert-large")
        sources[name] = path
    root = args.runs_root or load_settings().resolved_runs_root()
    staged = stage_models(get_experiment(args.name), RunStore(root), sources, force=args.force)  # a StagingError is a UserError
    for line in staged:
        print(f"{line['name']}: {line['action']} -> {line['where']} ({line['bytes'] / 1e9:.2f} GB)")
    if not staged:
        print(f"{args.name} uses no hub backbone: nothing to stage")
    return 0


def _stage_data(args: argparse.Namespace) -> int:
    """Each file as it is staged, then where the mirror is and how a run names it; what could not be staged is the
    DataStagingError's lines (a UserError: exit 2), after the rest is staged."""
    from adaptune.sweep.data_staging import mirror_hint, stage_data
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.store import RunStore
    from pipelines.submit import load_settings

    def show(line: dict[str, Any]) -> None:
        print(f"{line['task']}: {line['file']}: {line['action']} ({line['bytes'] / 1e6:.1f} MB) -> {line['where']}", flush=True)

    store = RunStore(args.runs_root or load_settings().resolved_runs_root()).require_writable()
    started = time.perf_counter()
    staged = stage_data(get_experiment(args.name, args.from_dir), store, args.from_dir, force=args.force, on_file=show)
    print(f"{len({line['file'] for line in staged})} files in {time.perf_counter() - started:.1f} s. {mirror_hint(store)}")
    return 0


def _add_retrain_flags(parser: argparse.ArgumentParser) -> None:
    """The retrain policy's options (adaptune.sweep.retrain.RetrainPolicy), as `run` and `submit` take them."""
    parser.add_argument("--retry-failed", action="store_true", help="train again the runs whose record says failed")
    parser.add_argument("--retrain-stale", action="store_true", help="train again the runs whose record is from another data scheme")
    parser.add_argument("--retry-unreadable", action="store_true",
                        help="train again the runs whose record cannot be read (each file kept aside)")


def _retrain_policy(args: argparse.Namespace) -> RetrainPolicy:
    """The RetrainPolicy a command's options ask for, built once where the command starts."""
    from adaptune.sweep.retrain import RetrainPolicy

    return RetrainPolicy(failed=args.retry_failed, stale=args.retrain_stale, unreadable=args.retry_unreadable)


RUNS_ROOT_HELP = ("the run store (default: $ADAPTUNE_RUNS_ROOT or adaptune.toml's, as submit uses; else outputs/<name>/store, "
                  "where make run keeps it)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = _named(commands, "run", "run an experiment's DAG locally with kfp.local")
    run.add_argument("--out", required=True, help="where the Parquet, tables, figures and report land")
    run.add_argument("--data-dir", default=None, help="local data mirror (default: shared/data found next to the tree, else the hub)")
    run.add_argument("--runs-root", default=None, help="the run store (default: OUT/store); finished runs there are reused")
    _add_retrain_flags(run)
    run.add_argument("--runner", choices=("subprocess", "docker"), default="subprocess",
                     help="subprocess: components in this environment; docker: in the project's images (image_for), "
                          "through kfp.local's DockerRunner (build them first: make -C containers build-cpu)")
    run.set_defaults(handler=_run)
    plan = _named(commands, "plan", "the grid, a line 'N runs' and an accelerator-hour estimate; runs nothing")
    plan.add_argument("--runs-root", default=None,
                      help="a run store whose records' measured throughput replaces the published table where it applies")
    plan.set_defaults(handler=_plan)
    status = _named(commands, "status", "where a sweep stands, from its run store: finished, failed, in progress, cost, ETA")
    status.add_argument("--runs-root", default=None, help=RUNS_ROOT_HELP)
    status.set_defaults(handler=_status)
    report = _named(commands, "report", "aggregate what the run store holds now and render the report (partial while the sweep runs)")
    report.add_argument("--runs-root", default=None, help=RUNS_ROOT_HELP)
    report.add_argument("--out", default=None, help="where the Parquet, tables, figures and report.md land (default: outputs/<name>)")
    report.add_argument("--data-dir", default=None, help="local data mirror, for the majority-class baselines (default: shared/data found next to the tree)")
    report.set_defaults(handler=_report)
    _add_store_commands(commands)
    return parser


def _add_store_commands(commands: Any) -> None:
    """The commands besides a sweep's run, plan, status and report: compare, tensorboard, show, compile, submit, stage-models,
    stage-data."""
    compare = commands.add_parser("compare", help="the runs two stores both hold (same run id), run by run: status, scores, speed")
    compare.add_argument("runs_a", help="a run store (a directory or gs://bucket/prefix)")
    compare.add_argument("runs_b", help="another; deltas are b minus a")
    compare.add_argument("--out", default=None, help="also write paired_runs.parquet and paired_summary.parquet here")
    compare.set_defaults(handler=_compare)
    board = _named(commands, "tensorboard", "serve one sweep's runs in TensorBoard: curves, and the HParams table of the whole grid")
    board.add_argument("--runs-root", default=None, help=RUNS_ROOT_HELP)
    board.add_argument("--out", default=None, help="where the view is built, as <out>/tensorboard (default: outputs/<name>)")
    board.add_argument("--port", type=int, default=6006)
    board.add_argument("--refresh-s", type=float, default=60.0, help="a bucket store: how often the view copies new event files")
    board.add_argument("--summaries-only", action="store_true", help="each run's HParams session and scores, not its curve (loads faster)")
    board.add_argument("--no-serve", action="store_true", help="build the view and stop")
    board.add_argument("--bind-all", action="store_true",
                       help="serve on every network interface (default: localhost only, as a sweep's results are private)")
    board.set_defaults(handler=_tensorboard)
    show = _named(commands, "show", "print an experiment as a sweep file (YAML), to start your own from")
    show.set_defaults(handler=_show)
    compile_ = commands.add_parser("compile", help="write pipeline.yaml and pipelines/compiled/<name>.yaml")
    compile_.add_argument("--root", default=None, help="directory to write under (default: the repository root)")
    compile_.set_defaults(handler=_compile)
    submit = _named(commands, "submit", "submit to Vertex AI Pipelines, or to $KFP_HOST when set")
    _add_retrain_flags(submit)
    submit.set_defaults(handler=_submit)
    stage = _named(commands, "stage-models", "copy the experiment's hub backbones into the run store once (pods load them from there)")
    stage.add_argument("--runs-root", default=None, help="the run store (default: the submission's, $ADAPTUNE_RUNS_ROOT / adaptune.toml)")
    stage.add_argument("--from", dest="sources", action="append", default=[], metavar="BACKBONE=DIR",
                       help="a local save_pretrained directory to stage for BACKBONE instead of downloading it (repeatable)")
    stage.add_argument("--force", action="store_true", help="stage again even where a copy is already staged")
    stage.set_defaults(handler=_stage_models)
    data = _named(commands, "stage-data", "copy the data files the experiment's tasks read into the run store's data/ mirror, "
                  "each checked (md5, read as its task reads it)")
    data.add_argument("--runs-root", default=None, help="the run store (default: the submission's, $ADAPTUNE_RUNS_ROOT / adaptune.toml)")
    data.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                      help="a local folder of the publishers' files in the mirror's layout (glue/RTE/train.tsv, extra/...)")
    data.add_argument("--force", action="store_true", help="copy again even where the same file is already staged")
    data.set_defaults(handler=_stage_data)


def _named(commands: Any, verb: str, help: str) -> argparse.ArgumentParser:
    """A command that takes an experiment's name (or a sweep file) first."""
    command: argparse.ArgumentParser = commands.add_parser(verb, help=help)
    command.add_argument("name", help="a named experiment or a sweep file (.yaml/.json)")
    return command


def main(argv: list[str] | None = None) -> int:
    """Run a command; what the user can fix (adaptune.core.errors.UserError: a setting, an experiment, a spec, a run
    store, a record, the container engine) is one line on stderr, exit status 2."""
    from adaptune.core.environment import check
    from adaptune.core.errors import EXIT_USER_ERROR, UserError

    args = build_parser().parse_args(argv)
    try:
        check()  # a misspelt ADAPTUNE_* name or a bad value, before anything runs
        return args.handler(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
