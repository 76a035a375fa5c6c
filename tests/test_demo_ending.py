"""`make demo` ends with its result: the methods table and where the files are, without kfp.local's warnings about
what a local run does not use (the warnings come from kfp's own functions, called as kfp.local calls them)."""

from __future__ import annotations

import warnings
from pathlib import Path

from kfp.local.orchestrator.task_executor import _warn_local_only_noops
from kfp.local.subprocess_task_handler import SubprocessTaskHandler
from kfp.pipeline_spec import pipeline_spec_pb2

from pipelines.__main__ import result_summary
from pipelines.log_filter import without_local_runner_warnings

METHODS_TABLE = """| task | metric (split, rows) | majority class | Full fine-tuning | Adapters | LayerNorm only |
| --- | --- | --- | --- | --- | --- |
| mrpc | f1 (dev, 128) | 80.4 | 82.4 (lr 0.0002, 1 seed) | 82.9 (lr 0.003, 1 seed) | 81.7 (lr 0.003, 1 seed) |"""


def _kfp_local_warnings() -> None:
    """What kfp.local warns for each of the demo's tasks: the image named for the cloud, and its CPU and memory limits."""
    SubprocessTaskHandler.validate_image(None, "us-docker.pkg.dev/your-project/adaptune/adaptune-cpu:0.2.0")  # type: ignore[arg-type]
    container = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec()
    container.resources.cpu_limit = 2
    container.resources.memory_limit = 8
    _warn_local_only_noops("train-shard", pipeline_spec_pb2.PipelineTaskSpec(), container)


def test_kfp_locals_warnings_about_the_cloud_image_and_limits_are_left_out_and_others_kept() -> None:
    with warnings.catch_warnings(record=True) as unfiltered:
        warnings.simplefilter("always")
        _kfp_local_warnings()
    assert len(unfiltered) == 2  # kfp still warns so: else the filter below would pass for nothing
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with without_local_runner_warnings():
            _kfp_local_warnings()
            warnings.warn("a warning of our own", UserWarning, stacklevel=1)
    assert [str(warning.message) for warning in shown] == ["a warning of our own"]


def test_a_finished_run_ends_with_its_methods_table_then_its_files(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    (out / "tables").mkdir(parents=True)
    (out / "tables" / "methods.md").write_text(METHODS_TABLE + "\n")
    (out / "store").mkdir()
    paths = {name: out / name for name in ("runs.parquet", "report.md", "tables")}
    for name in ("runs.parquet", "report.md"):
        (out / name).write_text("")
    lines = result_summary(paths, out).splitlines()
    table_at = lines.index(METHODS_TABLE.splitlines()[0])
    assert lines[table_at:table_at + 3] == METHODS_TABLE.splitlines()
    files_at = lines.index(f"Files in {out}/:")
    assert files_at > table_at and [line.split()[0] for line in lines[files_at + 1:]] == ["report.md", "runs.parquet", "tables/", "store/"]
