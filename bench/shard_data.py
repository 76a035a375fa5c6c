"""The data work of an accelerator task, before and after the data-preparation step (bench/shard_data.json).

For each shard of the named experiments, the seconds its runs spend getting their data, run after run as the
shard runs them, on a fresh pod (its own empty tokenization cache, nothing parsed yet):
- `from_mirror`: each run reads its task from the publishers' files, splits and tokenizes (what every shard did);
- `from_prepared`: each run reads the prepared folder (adaptune.sweep.data_prep), the store on this disk;
- `from_prepared_bucket`: the same with the store on a GCS API emulator, the shard's tasks downloaded first.
Beside each, how often a run read a source file (or the hub) and tokenized: both 0 is the goal. And the
preparation step's own seconds per task, once per experiment.

    python -m bench.shard_data [--experiments smoke cpu_small] [--out bench/shard_data.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from adaptune.data import loading, splits
from adaptune.data.sources import resolve_data_dir
from adaptune.data.tasks import get_task, scored_companions
from adaptune.model.backbone import load_tokenizer
from adaptune.sweep.data_prep import prepare_plan_data, readable_data_dir
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import Plan, Shard, plan
from adaptune.sweep.store import RunStore
from adaptune.train import run_data
from bench.stand_ins.gcs_emulator import gcs_emulator


@contextlib.contextmanager
def counted() -> Iterator[Counter[str]]:
    """Counts of source reads (a mirror's file or the hub) and tokenizations while inside."""
    calls: Counter[str] = Counter()
    read, tokenize = splits.source_records, run_data.tokenize_task

    def counting_read(*args: Any, **kwargs: Any) -> Any:
        calls["source_reads"] += 1
        return read(*args, **kwargs)

    def counting_tokenize(*args: Any, **kwargs: Any) -> Any:
        calls["tokenizations"] += 1
        return tokenize(*args, **kwargs)

    splits.source_records, run_data.tokenize_task = counting_read, counting_tokenize  # type: ignore[assignment]
    try:
        yield calls
    finally:
        splits.source_records, run_data.tokenize_task = read, tokenize  # type: ignore[assignment]


def shard_data_seconds(shard: Shard, data_dir: Any, cache_dir: Path) -> dict[str, Any]:
    """Seconds the shard's runs spend on their data, in order, from nothing parsed and an empty cache."""
    loading._LOADED.clear()  # a fresh pod has parsed nothing
    tokenizers: dict[str, Any] = {}
    data_s = 0.0  # the data calls alone, not the tokenizers' loading
    started = time.perf_counter()
    with counted() as calls:
        for run in shard.runs:
            if run.backbone not in tokenizers:
                tokenizers[run.backbone] = load_tokenizer(run.backbone)
            tokenizer = tokenizers[run.backbone]
            clock = time.perf_counter()
            run_data.prepare_run_data(get_task(run.task), tokenizer, run.max_length, run.doc_stride, run.max_train_examples,
                                      run.max_eval_examples, data_dir=data_dir, cache_dir=cache_dir)
            for companion in scored_companions(run.task):
                run_data.prepare_run_data(get_task(companion), tokenizer, run.max_length, run.doc_stride, None,
                                          run.max_eval_examples, data_dir=data_dir, cache_dir=cache_dir, with_train=False,
                                          eval_only=("test",))
            data_s += time.perf_counter() - clock
    return {"seconds": round(data_s, 3), "wall_s": round(time.perf_counter() - started, 3),
            "source_reads": calls["source_reads"], "tokenizations": calls["tokenizations"]}


def measure(planned: Plan, mirror: Path, scratch: Path) -> dict[str, Any]:
    local = RunStore(scratch / "store")
    prepared = prepare_plan_data(planned, local, mirror)
    result: dict[str, Any] = {"preparation": [{"task": entry.task, "seconds": round(entry.seconds, 3), "rows": entry.rows}
                                              for entry in prepared.tasks], "shards": []}
    with gcs_emulator(log_dir=scratch) as emulator:
        bucket = RunStore(emulator.url("store"))
        bucket_url = prepare_plan_data(planned, bucket, mirror).url
        for index, shard in enumerate(planned.shards):
            tasks = {name for run in shard.runs for name in (run.task, *scored_companions(run.task))}
            row: dict[str, Any] = {"shard": shard.id, "runs": len(shard.runs)}
            row["from_mirror"] = shard_data_seconds(shard, mirror, scratch / f"cache-{index}")
            row["from_prepared"] = shard_data_seconds(shard, readable_data_dir(local, prepared.url, tasks), scratch / "unused")
            clock = time.perf_counter()
            pod_copy = readable_data_dir(bucket, bucket_url, tasks, scratch=scratch / f"pod-{index}")
            download_s = time.perf_counter() - clock
            row["from_prepared_bucket"] = {**shard_data_seconds(shard, pod_copy, scratch / "unused"), "download_s": round(download_s, 3)}
            result["shards"].append(row)
            print(json.dumps(row), flush=True)
    return result


def _cpu_model() -> str:
    """This machine's CPU as /proc/cpuinfo names it, and whether it has avx512_bf16 (sessions differ)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "unknown")
    return f"{model}{', avx512_bf16' if 'avx512_bf16' in info else ''}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", nargs="+", default=["smoke", "cpu_small"])
    parser.add_argument("--data-dir", default=None, help="the data mirror (default: found as the project finds one)")
    parser.add_argument("--out", default="bench/shard_data.json")
    args = parser.parse_args(argv)
    mirror = resolve_data_dir(args.data_dir)
    if mirror is None:
        parser.error("no data mirror found: pass --data-dir")
    started = time.perf_counter()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu_model(), "experiments": {}}
    for name in args.experiments:
        with tempfile.TemporaryDirectory(prefix="adaptune-bench-") as scratch:
            results["experiments"][name] = measure(plan(get_experiment(name)), mirror, Path(scratch))
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
