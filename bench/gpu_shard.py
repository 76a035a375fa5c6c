"""bench-gpu's sweep throughput: one realistic shard trained one run at a time and fused g runs per group on the one GPU
through the real trainer (run_shard), runs finished per hour, where each attempt's seconds went, and how far each result
moved."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from adaptune.train import phase_times
from bench.gpu_batches import CONFIGS, log


def shard_throughput(data_dir: str | None, tokenizer_dir: str, one_at_a_time: bool, work: Path, size: str = "bert-base",
                     max_train_examples: int | None = None, group_sizes: Sequence[int] = (),
                     on_attempt: Callable[[dict[str, Any]], None] | None = None, config: dict[str, int] | None = None,
                     tasks: Sequence[str] = ("rte",), methods: Sequence[dict[str, Any]] = ({"name": "adapters", "size": 64},),
                     host_profile: int = 0) -> dict[str, Any]:
    """Runs finished per hour on one realistic shard (by default BERT-base adapters m=64 on RTE; `tasks` x
    `methods` as the plan shards them, a shard per task, trained in turn) at the paper's three adapter learning rates x 3
    seeds, 3 epochs, more seeds where a group needs more runs; randomly initialised, which is all speed needs),
    trained one at a time, then fused g runs per group, each into its own run store; and how far each fused run's result
    moved (float reduction order differs). `host_profile` > 0: each attempt under cProfile, its that many heaviest functions kept
    (heaviest_functions)."""
    import cProfile
    import dataclasses
    import shutil
    from collections import Counter

    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.core.paper_grids import GLUE_LRS
    from adaptune.sweep.plan import plan
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.spec import DEFAULTS, H100, Sweep
    from adaptune.sweep.store import RunStore
    from adaptune.train.config import method_label

    seeds = max(3, math.ceil(max(group_sizes, default=0) / len(GLUE_LRS)))
    backbone = work / "bert-base-random"
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(**(config or CONFIGS[size]))).bert.save_pretrained(backbone)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copy(Path(tokenizer_dir) / name, backbone / name)
    spec = dataclasses.replace(
        DEFAULTS, name="gpu_shard_bench", backbone=str(backbone), accelerator=H100, shard_size=len(GLUE_LRS) * seeds, max_train_examples=max_train_examples,
        sweeps=(Sweep(tasks=tuple(tasks), methods=tuple(methods), learning_rates=GLUE_LRS, epochs=(3,), seeds=tuple(range(seeds))),),
    )
    shards = plan(spec).shards  # a shard per task: trained one after another, as one pod would take them
    runs = [run for shard in shards for run in shard.runs]
    labels = ", ".join(method_label(method) for method in methods)
    results: dict[str, Any] = {"shard": f"{len(runs)} runs: {size} (random init) {labels} on {', '.join(tasks)}, lr {GLUE_LRS}, "
                                          f"3 epochs, {seeds} seeds, {max_train_examples or 'all'} training rows per run"
                                          + (f", {len(shards)} shards in turn" if len(shards) > 1 else "")}
    records = {}
    attempts = [("1_at_a_time", 1)] * one_at_a_time + [(f"fused_{group}", group) for group in group_sizes]
    for label, group in attempts:
        store = RunStore(work / f"store-{label}")
        started = time.perf_counter()
        outcomes: Counter[str] = Counter()
        profiler = cProfile.Profile() if host_profile else None
        with profiler or contextlib.nullcontext():
            for shard in shards:
                outcomes += run_shard(spec, shard.id, store, data_dir=data_dir, group_size=group)
        seconds = time.perf_counter() - started
        records[label] = {run.run_id: store.record(run.run_id) for run in runs}
        failures = {run_id: {"reason": record["reason"], "traceback": _traceback_text(work / f"store-{label}", run_id)}
                    for run_id, record in records[label].items() if record["status"] == "failed"}
        by_phase = phase_times.summed(list(records[label].values()))
        results[label] = {"seconds": round(seconds, 1), "runs_per_hour": round(len(runs) / seconds * 3600),
                          "outcomes": dict(outcomes), "failures": failures,
                          # where the attempt's time went (the records' time_s); "other": planning, leases, the store
                          "seconds_by_phase": {**by_phase, "other": round(seconds - sum(by_phase.values()), 1)},
                          "step_graphs": _graph_counts(list(records[label].values()))}
        if profiler is not None:
            results[label]["host_profile"] = heaviest_functions(profiler, host_profile)
        for run_id, failure in failures.items():
            log(f"{run_id} failed: {failure['reason']}\n{failure['traceback'] or ''}")
        log(f"shard, {label}: {seconds:.0f} s, {dict(outcomes)}")
        _compare(results, records, attempts)
        if on_attempt:
            on_attempt(results)
    return results


def heaviest_functions(profiler: Any, count: int) -> dict[str, list[dict[str, Any]]]:
    """A cProfile's `count` heaviest functions by cumulative and by own time (the main thread's; a GPU's kernels are
    in the host calls that wait for them), each as where it is (path from site-packages or the repository), calls and
    seconds."""
    import pstats

    def where(file: str, line: int, name: str) -> str:
        for marker in ("site-packages/", f"{Path.cwd()}/"):
            file = file.split(marker, 1)[-1]
        return f"{file}:{line}({name})" if line else name

    rows = [{"function": where(*key), "calls": calls, "own_s": round(own, 3), "cumulative_s": round(cumulative, 3)}
            for key, (_, calls, own, cumulative, _) in pstats.Stats(profiler).stats.items()]
    return {"by_cumulative": sorted(rows, key=lambda row: -row["cumulative_s"])[:count],
            "by_own": sorted(rows, key=lambda row: -row["own_s"])[:count]}


def _compare(results: dict[str, Any], records: dict[str, dict[str, Any]], attempts: list[tuple[str, int]]) -> None:
    """Each finished attempt against the first: speedup, and how far the test score moved (fused: float reduction order
    differs)."""
    first = attempts[0][0]
    for label, _group in attempts[1:]:
        if label not in records:
            continue
        results[f"speedup_{label}_vs_{first}"] = round(results[first]["seconds"] / results[label]["seconds"], 2)
        changes = [abs(_score(records[label][run_id]) - _score(records[first][run_id])) for run_id in records[first]
                   if _score(records[label][run_id]) is not None and _score(records[first][run_id]) is not None]
        results[f"max_test_score_change_{label}_vs_{first}"] = max(changes, default=None)


def _graph_counts(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The attempt's step-graph counts, each group's once, and the warm-up setting its groups had (a setting, not summed)."""
    counts = phase_times.summed(records, "step_graphs")
    if not counts:
        return None
    counts["warmup"] = sorted({record["step_graphs"]["warmup"] for record in records if record.get("step_graphs")})
    return counts


def _score(record: dict[str, Any]) -> float | None:
    return (record.get("test_metrics") or {}).get(record.get("primary_metric"))


def _traceback_text(store_root: Path, run_id: str) -> str | None:
    """The traceback a failed run left beside its record (adaptune.train.record.save_traceback), if any."""
    path = next(iter(store_root.rglob(f"{run_id}/traceback.txt")), None)
    return path.read_text()[-4000:] if path else None


def embedded_tokenizer_dir() -> str:
    from adaptune.core.backbones import DEFAULT_BACKBONE
    from adaptune.model.backbone import resolve_backbone

    return resolve_backbone(DEFAULT_BACKBONE)
