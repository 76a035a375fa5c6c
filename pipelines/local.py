"""Run an experiment's DAG on this machine with kfp.local, in this environment, and gather its outputs.

The SubprocessRunner runs each component as a subprocess of this Python (use_venv=False), so the
components import the working tree's adaptune. Runs live in the run store (<out>/store by
default); the final Parquet files, tables, figures and report are copied from the pipeline root to
the output directory.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from adaptune.sweep.data_check import DataPreparationError, check_local_data
from adaptune.sweep.data_prep import PREPARED_DIR, preparation_problems, problems_name
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import Plan, plan
from adaptune.sweep.retrain import RetrainPolicy
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.store import RunStore
from adaptune.sweep.store_files import UnreadableFileError
from components.images import image_for
from pipelines.local_threads import CoreShare
from pipelines.log_filter import without_executor_inputs, without_local_runner_warnings
from pipelines.reproduction import build_pipeline

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT_FILES = ("runs.parquet", "curves.parquet", "ablation.parquet")
RUNNERS = ("subprocess", "docker")


def run_local(
    name: str,
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    runs_root: str | None = None,
    policy: RetrainPolicy = RetrainPolicy(),
    runner: str = "subprocess",
    check_data: bool = True,
) -> dict[str, Path]:
    """Plan (validate), run the DAG with kfp.local, and copy the outputs into out_dir; returns their paths.

    `name` is a named experiment or a sweep file. The run store defaults to <out_dir>/store: run
    the same command again and finished runs are reused, interrupted ones resume. `runner`:
    "subprocess" (this environment) or "docker" (the images `image_for` names, through kfp.local's
    DockerRunner: see pipelines/container_runner.py). `policy`: which runs the store holds are trained again.
    What the user can fix is refused in one line before the DAG starts (a UserError): a run store that is a file
    or cannot be written, a record there that cannot be read (unless the policy retrains such runs), a data file that
    is missing, lacks a column or is not the copy the project checked (one line per task). What only the DAG's
    data-preparation step finds (rows that are not the paper's, a label no training row has) ends the run the same
    way, one line per task (DataPreparationError), not in kfp's traceback.
    """
    if runner not in RUNNERS:
        raise ValueError(f"unknown runner {runner!r}; expected one of {RUNNERS}")
    from kfp import local

    from adaptune.data.sources import resolve_data_dir

    spec = get_experiment(name, data_dir)  # an experiment of the tasks with data: those this data source holds
    planned = plan(spec)
    out_dir = Path(out_dir).resolve()
    store = _checked_store(planned, runs_root or out_dir / "store", policy)
    threads = CoreShare.for_plan(planned)  # a thread count the machine cannot hold is refused here
    print(planned.summary(), flush=True)
    root = resolve_data_dir(data_dir)
    if check_data:  # off only for dry runs of a DAG's shape with a stand-in trainer ($ADAPTUNE_TRAINER)
        check_local_data(planned, root)  # a missing file fails here, before a single run starts
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"data: {root if root else 'the Hugging Face hub (no local mirror found)'}", flush=True)
    print(f"run store: {store.root}", flush=True)
    print(threads.line(), flush=True)

    pipeline_root = out_dir / "kfp_root"
    local.init(runner=_task_runner(runner, spec, pipeline_root, store, root), pipeline_root=str(pipeline_root))
    # kfp.local indents a task's log by swapping builtins.print (logging_utils.indented_print); two
    # ParallelFor tasks at once can leave the swapped one in place: put the real print back afterwards.
    real_print = builtins.print
    store.files.remove(PREPARED_DIR, problems_name(planned))  # an earlier run's: what this run's step finds is written anew
    try:
        quiet = without_local_runner_warnings() if runner == "subprocess" else contextlib.nullcontext()
        with without_executor_inputs(), quiet:  # kfp prints each task's whole input JSON; the rest of its log stays
            run = build_pipeline(spec, threads=threads)(runs_root=store.root, data_dir=str(root) if root else "", **policy.as_flags())
    except RuntimeError:  # kfp.local: "Pipeline ... finished with status FAILURE"; the step's log above has its detail
        problems = preparation_problems(planned, store)
        if problems:
            raise DataPreparationError.of_tasks(problems) from None
        raise
    finally:
        builtins.print = real_print
    return collect_outputs(Path(run.outputs["results"].path), Path(run.outputs["report"].path), out_dir)


def _task_runner(runner: str, spec: ExperimentSpec, pipeline_root: Path, store: RunStore, data_root: Path | None) -> Any:
    """kfp.local's runner for the components, this process's environment set for the subprocesses it starts."""
    from kfp import local

    # The components run as subprocesses: they must import this working tree's packages.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # each component's threads: pipelines.local_threads
    if runner == "docker":
        from pipelines.container_runner import docker_runner

        task_runner = docker_runner(spec, pipeline_root, store, data_root)
        print(f"runner: docker, images {', '.join(sorted({image_for('cpu'), image_for(spec.accelerator.family)}))}", flush=True)
        return task_runner
    return local.SubprocessRunner(use_venv=False)


def _checked_store(planned: Plan, runs_root: str | Path, policy: RetrainPolicy) -> RunStore:
    """The checks every shard would make, made once: a root that is a file (or unwritable) would fail every task, each
    retried by kfp.local; a record that cannot be read would end the run at the aggregate, inside kfp's traceback."""
    store = RunStore(runs_root).require_writable()
    if not policy.unreadable:
        refuse_unreadable_records(planned, store)
    return store


def refuse_unreadable_records(planned: Plan, store: RunStore) -> None:
    """One line naming a planned run's record that cannot be read, and what to do, before anything runs: the shards
    would leave such a run alone and the aggregate refuse the sweep (UnreadableFileError, a UserError)."""
    unreadable: dict[str, str] = {}
    store.records([run.run_id for run in planned.runs], unreadable=unreadable)
    if unreadable:
        reason = next(iter(unreadable.values()))
        more = f" ({len(unreadable) - 1} more of the {len(planned.runs)} planned runs' records cannot be read either)" if len(unreadable) > 1 else ""
        raise UnreadableFileError(f"{reason}{more}: train the run again with --retry-unreadable (RETRY_UNREADABLE=1), "
                                  "which keeps the file aside")


def collect_outputs(results_dir: Path, report_dir: Path, out_dir: Path) -> dict[str, Path]:
    """Copy the Parquet files and the report (report.md, tables/, figures/) into out_dir; the report's results line
    then names out_dir, where its user finds them, not kfp.local's internal folder."""
    from adaptune.report.markdown import name_results_folder

    paths: dict[str, Path] = {}
    for name in RESULT_FILES:
        if (results_dir / name).is_file():
            paths[name] = Path(shutil.copyfile(results_dir / name, out_dir / name))
    for entry in sorted(report_dir.iterdir()):
        target = out_dir / entry.name
        if entry.is_dir():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(entry, target)
        else:
            shutil.copyfile(entry, target)
        paths[entry.name] = target
    if "report.md" in paths:
        name_results_folder(paths["report.md"], out_dir)
    return paths
