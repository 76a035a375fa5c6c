"""The Parquet results store: runs, learning curves and ablations, one file each.

The schemas are declared once below (and documented column by column in analysis/SCHEMA.md).
Every write checks its rows against the schema and names the bad column; writes are atomic
(temp file + os.replace) and append to what is already there, deduplicated by run id with the
newest write winning, so a resubmitted sweep never duplicates runs.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from adaptune.core.errors import UserError
from adaptune.core.files import atomic_write
from adaptune.fused.settings import RECORDED_SETTINGS
from adaptune.train.phase_times import PHASES
from adaptune.train.record import degenerate_reason, with_companions

RUNS_FILE = "runs.parquet"
CURVES_FILE = "curves.parquet"
ABLATION_FILE = "ablation.parquet"
STATUSES = ("ok", "failed", "degenerate")

RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("experiment", pa.string()),
        pa.field("task", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),  # method name: full, adapters, top_k, layernorm
        pa.field("method_label", pa.string()),  # adapters64, top_k3, ...
        pa.field("adapter_size", pa.int64()),
        pa.field("top_k", pa.int64()),
        pa.field("init_std", pa.float64()),
        pa.field("lr", pa.float64()),
        pa.field("epochs", pa.int64()),
        pa.field("seed", pa.int64()),
        pa.field("backbone", pa.string()),
        pa.field("trained_params", pa.int64()),
        pa.field("total_params", pa.int64()),
        pa.field("trained_percent", pa.float64()),
        pa.field("primary_metric", pa.string()),
        pa.field("best_epoch", pa.int64()),
        pa.field("val_score", pa.float64()),  # primary metric at the final epoch (the run's result), validation split
        pa.field("test_score", pa.float64()),  # same epoch, test split; null where no labelled test split
        pa.field("val_metrics", pa.string()),  # JSON object {metric name: value}
        pa.field("test_metrics", pa.string()),  # JSON object {metric name: value}
        pa.field("status", pa.string(), nullable=False),
        pa.field("reason", pa.string()),
        pa.field("wall_time_s", pa.float64()),
        pa.field("group_size", pa.int64()),  # runs that shared its steps (a fused group); its result is the same
        pa.field("probe", pa.bool_()),  # trained as a probe on features computed once (the head alone: adaptune.train.probe)
        # where the wall time went (the record's time_s: adaptune.train.phase_times); a fused group's, as wall_time_s
        *(pa.field(f"{phase}_s", pa.float64()) for phase in PHASES),
        pa.field("train_examples_per_s", pa.float64()),
        pa.field("device", pa.string()),
        pa.field("checkpoint_dir", pa.string()),
        pa.field("data_split", pa.string()),  # "standard", or a named stand-in (e.g. squad_dev_standin): not the paper's split
        pa.field("split_note", pa.string()),  # what a stand-in split is (null for "standard")
        pa.field("data_scheme", pa.string()),  # how the task's splits were cut (adaptune.data.tasks.DATA_SCHEMES)
        pa.field("code_version", pa.string()),  # the code that trained the run (git describe, or the image's)
        pa.field("provenance_json", pa.string()),  # JSON: packages, device (GPU, driver, CUDA), data files' sha256
        pa.field("step_settings_json", pa.string()),  # JSON: how its steps were computed (step_settings.RECORDED_SETTINGS)
        pa.field("train_rows", pa.int64()),  # examples each split was used with (after subsampling)
        pa.field("val_rows", pa.int64()),
        pa.field("test_rows", pa.int64()),
        pa.field("method_json", pa.string(), nullable=False),
        pa.field("config_json", pa.string(), nullable=False),
        pa.field("written_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

CURVES_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("step", pa.int64()),
        pa.field("train_loss", pa.float64()),
        pa.field("metric", pa.string()),  # validation metric name; null when the epoch had no evaluation
        pa.field("value", pa.float64()),
    ]
)

ABLATION_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("first_layer", pa.int64(), nullable=False),
        pa.field("last_layer", pa.int64(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("baseline_value", pa.float64()),
        pa.field("relative_change", pa.float64()),
    ]
)

# Columns added after runs.parquet files were first written: an older file lacking them reads with nulls.
ADDED_RUN_COLUMNS = ("data_split", "split_note", "train_rows", "val_rows", "test_rows", "data_scheme", "code_version",
                     "provenance_json", "step_settings_json")

# Keys a run record must carry even when the run failed (ARCHITECTURE.md, "The run record").
REQUIRED_RECORD_KEYS = ("run_id", "task", "method", "lr", "epochs", "seed", "backbone", "config", "status")


class SchemaError(UserError, ValueError):
    """A row does not fit the declared schema; the message names the file, column and run."""


class ResultsReadError(UserError, ValueError):
    """runs.parquet cannot be read (truncated, corrupt, not Parquet); the one-line message names the file."""


class ResultsWarning(UserWarning):
    """An optional results file (curves, ablation) could not be read and was left out."""


def run_row(record: dict[str, Any], written_at: dt.datetime | None = None) -> dict[str, Any]:
    """Flatten one run record (train.train_and_evaluate's dict) into a runs.parquet row."""
    _check_record(record)
    return {**_what_ran(record), **_how_it_ran(record, written_at)}


def _check_record(record: dict[str, Any]) -> None:
    """The keys every record carries, a known status and a method dict: a SchemaError naming the run otherwise."""
    run_id = record.get("run_id", "<no run_id>")
    missing = [key for key in REQUIRED_RECORD_KEYS if key not in record]
    if missing:
        raise SchemaError(
            f"run record {run_id!r} lacks key(s) {missing}; a run record needs {list(REQUIRED_RECORD_KEYS)} "
            "(see ARCHITECTURE.md, 'The run record')"
        )
    if record["status"] not in STATUSES:
        raise SchemaError(f"runs.parquet column 'status': run {run_id!r} has {record['status']!r}; allowed: {STATUSES}")
    method = record["method"]
    if not isinstance(method, dict) or "name" not in method:
        raise SchemaError(f"runs.parquet column 'method': run {run_id!r} needs a method dict with 'name', got {method!r}")


def _what_ran(record: dict[str, Any]) -> dict[str, Any]:
    """The row's columns from the run's identity to its scores, status and reason."""
    method = record["method"]
    val_metrics = record.get("val_metrics") or {}
    test_metrics = record.get("test_metrics") or {}
    primary = record.get("primary_metric")
    trained, total = record.get("trained_params"), record.get("total_params")
    # Re-derived by the rule the run book applies (train.record.DEGENERATE_RULE): a record kept before a split's
    # one-class predictions counted reads as the rule says now.
    status, reason = record["status"], record.get("reason")
    if status == "ok" and (one_class := degenerate_reason(record)):
        status, reason = "degenerate", one_class
    return {
        "run_id": record["run_id"],
        "experiment": record.get("experiment"),
        "task": record["task"],
        "method": method["name"],
        "method_label": record.get("method_label"),
        "adapter_size": method.get("size") if method["name"] == "adapters" else None,
        "top_k": method.get("k") if method["name"] == "top_k" else None,
        "init_std": method.get("init_std"),
        "lr": record["lr"],
        "epochs": record["epochs"],
        "seed": record["seed"],
        "backbone": record["backbone"],
        "trained_params": trained,
        "total_params": total,
        "trained_percent": 100.0 * trained / total if trained is not None and total and _is_number(trained) and _is_number(total) else None,
        "primary_metric": primary,
        "best_epoch": record.get("best_epoch"),
        "val_score": val_metrics.get(primary) if primary else None,
        "test_score": test_metrics.get(primary) if primary else None,
        "val_metrics": json.dumps(val_metrics, sort_keys=True),
        "test_metrics": json.dumps(test_metrics, sort_keys=True),
        "status": status,
        "reason": reason,
    }


def _how_it_ran(record: dict[str, Any], written_at: dt.datetime | None) -> dict[str, Any]:
    """The row's columns from the run's times and device to its data, provenance, settings and config."""
    sizes = record.get("split_sizes") or {}
    return {
        "wall_time_s": record.get("wall_time_s"),
        "group_size": record.get("group_size"),
        "probe": "probe" in record,
        **{f"{phase}_s": (record.get("time_s") or {}).get(phase) for phase in PHASES},
        "train_examples_per_s": record.get("train_examples_per_s"),
        "device": record.get("device"),
        "checkpoint_dir": None if record.get("checkpoint_dir") is None else str(record["checkpoint_dir"]),
        "data_split": record.get("data_split"),
        "split_note": record.get("split_note"),
        "data_scheme": record.get("data_scheme"),
        "code_version": (record.get("provenance") or {}).get("code_version"),
        "provenance_json": json.dumps(record.get("provenance") or {}, sort_keys=True),
        "step_settings_json": json.dumps({name: record[name] for name in RECORDED_SETTINGS if name in record}, sort_keys=True),
        "train_rows": sizes.get("train"),
        "val_rows": sizes.get("validation"),
        "test_rows": sizes.get("test"),
        "method_json": json.dumps(record["method"], sort_keys=True),
        "config_json": json.dumps(record["config"], sort_keys=True, default=str),
        "written_at": written_at or dt.datetime.now(dt.timezone.utc),
    }


def run_precision(device: str | None) -> str | None:
    """The precision a run was trained and scored in, from its record's `device` (adaptune.core.devices): "bf16"
    under autocast (a GPU, a TPU, or "cpu:bf16", a CPU with native bf16), "float32" on a CPU without; None unrecorded."""
    if not isinstance(device, str) or not device:
        return None
    return "float32" if device == "cpu" else "bf16"


def curve_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (epoch, validation metric) of a run's learning curve."""
    rows = []
    for point in record.get("curve") or []:
        base = {
            "run_id": record["run_id"],
            "epoch": point.get("epoch"),
            "step": point.get("step"),
            "train_loss": point.get("train_loss"),
        }
        metrics = point.get("val_metrics") or {}
        if not metrics:
            rows.append({**base, "metric": None, "value": None})
        rows.extend({**base, "metric": name, "value": value} for name, value in sorted(metrics.items()))
    return rows


def write_runs(records: Iterable[dict[str, Any]], out_dir: str | Path) -> Path:
    """Append run records to out_dir/runs.parquet (newest row per run_id wins)."""
    now = dt.datetime.now(dt.timezone.utc)
    rows = [run_row(row, written_at=now) for record in records for row in with_companions(record)]
    return _append(Path(out_dir) / RUNS_FILE, RUNS_SCHEMA, rows, key=("run_id",))


def write_curves(records: Iterable[dict[str, Any]], out_dir: str | Path) -> Path:
    """Append the learning curves of run records; a re-run's curve replaces its old one whole."""
    records = list(records)
    rows = [row for record in records for row in curve_rows(record)]
    replaced = {record["run_id"] for record in records}
    return _append(Path(out_dir) / CURVES_FILE, CURVES_SCHEMA, rows, key=("run_id", "epoch", "metric"), replace_runs=replaced)


def write_ablation(rows: Iterable[dict[str, Any]], out_dir: str | Path) -> Path:
    """Append ablation rows (ablation.ablate's dicts); a re-ablated run replaces its old rows whole."""
    rows = [dict(row) for row in rows]
    replaced = {str(row["run_id"]) for row in rows if row.get("run_id") is not None}
    key = ("run_id", "first_layer", "last_layer", "metric")
    return _append(Path(out_dir) / ABLATION_FILE, ABLATION_SCHEMA, rows, key=key, replace_runs=replaced)


def write_results(
    records: Sequence[dict[str, Any]], out_dir: str | Path, ablation: Sequence[dict[str, Any]] = ()
) -> dict[str, Path]:
    """Write runs, curves and (when given) ablation rows; returns {table name: path}."""
    out_dir = Path(out_dir)
    paths = {"runs": write_runs(records, out_dir), "curves": write_curves(records, out_dir)}
    if ablation:
        paths["ablation"] = write_ablation(ablation, out_dir)
    return paths


def read_results(results_dir: str | Path) -> dict[str, pd.DataFrame]:
    """{"runs", "curves", "ablation"} as DataFrames; a table never written comes back empty.

    An unreadable runs.parquet raises ResultsReadError naming it; an unreadable curves or ablation
    file (corrupt, or of another schema) is left out with a ResultsWarning naming it, so that the
    runs can still be reported.
    """
    results_dir = Path(results_dir)
    runs_path = results_dir / RUNS_FILE
    if not runs_path.is_file():
        raise FileNotFoundError(
            f"no {RUNS_FILE} in {results_dir}: point at the directory the pipeline's aggregate step wrote "
            "(or write one with adaptune.report.results.write_results)"
        )
    frames = {}
    for name, file_name, schema in (
        ("runs", RUNS_FILE, RUNS_SCHEMA),
        ("curves", CURVES_FILE, CURVES_SCHEMA),
        ("ablation", ABLATION_FILE, ABLATION_SCHEMA),
    ):
        path = results_dir / file_name
        try:
            table = _read_checked(path, schema)
        except (pa.ArrowException, OSError, SchemaError) as error:
            if name == "runs" and isinstance(error, SchemaError):
                raise
            problem = f"{path} cannot be read ({_one_line(error)})"
            if name == "runs":
                raise ResultsReadError(
                    f"{problem}: it is truncated or not Parquet; rewrite it from the run records (python -m pipelines run ...) "
                    "or restore it from a copy"
                ) from None
            warnings.warn(f"{problem}; going on without the {name} (figures that need them are skipped)", ResultsWarning, stacklevel=2)
            table = schema.empty_table()
        frames[name] = table.to_pandas()
    return frames


def _one_line(error: BaseException) -> str:
    from adaptune.train.record import one_line_reason

    return one_line_reason(error, limit=300)


def metrics_table(runs: pd.DataFrame, split: str = "val") -> pd.DataFrame:
    """The JSON metric column of a split ("val" or "test") spread into one column per metric name."""
    column = f"{split}_metrics"
    if column not in runs:
        raise KeyError(f"runs has no column {column!r}; split must be 'val' or 'test'")
    parsed = [json.loads(text) if isinstance(text, str) else {} for text in runs[column]]
    return pd.DataFrame(parsed, index=runs.index).add_prefix(f"{split}_")


def _read_checked(path: Path, schema: pa.Schema) -> pa.Table:
    if not path.is_file():
        return schema.empty_table()
    table = pq.read_table(path)
    if schema is RUNS_SCHEMA:
        for name in ADDED_RUN_COLUMNS:
            if name not in table.column_names:
                table = table.append_column(schema.field(name), pa.nulls(len(table), schema.field(name).type))
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise SchemaError(f"{path} lacks column(s) {missing}: it was written by another schema version; rewrite it")
    return table.select(schema.names).cast(schema)


def _append(
    path: Path,
    schema: pa.Schema,
    rows: list[dict[str, Any]],
    key: tuple[str, ...],
    replace_runs: set[str] | None = None,
) -> Path:
    new_table = _checked_table(rows, schema, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    old_rows = _read_checked(path, schema).to_pylist()
    if replace_runs:
        old_rows = [row for row in old_rows if row["run_id"] not in replace_runs]
    # Plain dict dedupe: later rows (this write, and later rows within it) overwrite earlier ones.
    merged = {tuple(row[k] for k in key): row for row in old_rows + new_table.to_pylist()}
    table = pa.Table.from_pylist(list(merged.values()), schema=schema)
    atomic_write(path, lambda temporary: pq.write_table(table, temporary))
    return path


def _checked_table(rows: list[dict[str, Any]], schema: pa.Schema, file_name: str) -> pa.Table:
    """Build an Arrow table column by column so that a type error names its column and run."""
    for row in rows:
        unknown = sorted(set(row) - set(schema.names))
        if unknown:
            raise SchemaError(f"{file_name}: run {row.get('run_id')!r} has unknown column(s) {unknown}; known: {schema.names}")
    arrays = []
    for field in schema:
        values = [_none_if_nan(row.get(field.name)) for row in rows]
        if pa.types.is_integer(field.type):
            values = [_whole_int(value, field.name, row, file_name) for row, value in zip(rows, values)]
        if not field.nullable:
            for row, value in zip(rows, values):
                if value is None:
                    raise SchemaError(
                        f"{file_name} column {field.name!r}: run {row.get('run_id')!r} has no value; the column may not be null"
                    )
        try:
            arrays.append(pa.array(values, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as error:
            bad_row, bad_value = _first_bad(rows, values, field.type)
            raise SchemaError(
                f"{file_name} column {field.name!r}: expected {field.type}, run {bad_row.get('run_id')!r} has "
                f"{bad_value!r} ({type(bad_value).__name__}); fix the record that produced it ({error})"
            ) from error
    return pa.Table.from_arrays(arrays, schema=schema)


def _first_bad(rows: list[dict[str, Any]], values: list[Any], arrow_type: pa.DataType) -> tuple[dict[str, Any], Any]:
    for row, value in zip(rows, values):
        try:
            pa.array([value], type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return row, value
    return {}, None


def _whole_int(value: Any, column: str, row: dict[str, Any], file_name: str) -> Any:
    # KFP hands ints inside dicts back as floats (3.0); accept those, but never truncate 3.5 silently.
    if isinstance(value, float):
        if not value.is_integer():
            raise SchemaError(
                f"{file_name} column {column!r}: expected an integer, run {row.get('run_id')!r} has {value!r}"
            )
        return int(value)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _none_if_nan(value: Any) -> Any:
    # NaN metrics (e.g. a diverged run) are stored as null so that min/max/mean skip them.
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def locate_results(path: str | Path) -> Path:
    """The directory holding runs.parquet: `path` itself, or the one directory below it that does.

    The notebooks take a pipeline's output directory; its Parquet may sit one or more levels down.
    """
    path = Path(path)
    if (path / RUNS_FILE).is_file():
        return path
    found = sorted(candidate.parent for candidate in path.rglob(RUNS_FILE)) if path.is_dir() else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise FileNotFoundError(
            f"no {RUNS_FILE} in or under {path}: run the pipeline (make demo) or set ADAPTUNE_RESULTS to a results directory"
        )
    raise FileNotFoundError(f"several results directories under {path}: {[str(f) for f in found]}; name one of them")
