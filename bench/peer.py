"""`make bench-peer`: a small sweep through `pipelines run` against the loop a user writes instead, side by side in one
call on the same rows in the same order; JSON out.

    python -m bench.peer --out bench/peer.json [--repeats 2] [--methods adapters,lora]

The work (issue 80's): SST-2, the 1,000 training rows `max_train_examples: 1000` picks, batch 32, max length 128 with
dynamic padding, 2 epochs, AdamW (weight decay 0.01), clipping 1.0, 10% warmup then linear decay, learning rates
{3e-4, 1e-3} x seeds {0, 1}, in the precision this CPU multiplies natively for every system (bf16 with avx512_bf16 or
AMX, else float32: adaptune.core.devices.resolved_cpu_precision), scored on SST-2's 872-row dev set (the test split).
Houlsby adapters of size 64 against AdapterHub's `adapters` + Trainer (in .venv-adapters), LoRA r=8 on query and value
against peft + Trainer; each peer at Trainer's defaults and with group_by_length=True (bench/peer_trainer.py), the
project at its defaults (a fresh run store each time: nothing reused). Systems alternate within each repeat, so
drifting load hits all alike. Per system: wall seconds, training and evaluation seconds, the seconds outside the runs,
peak RSS of the process tree, every run's scores, and the training steps' share of that precision's matmul rate measured
in the same call (FLOPs on real tokens, the embeddings counted as lookups). Not a test: no pass/fail here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch

REPO = Path(__file__).resolve().parents[1]
ADAPTERS_PYTHON = REPO / ".venv-adapters" / "bin" / "python"
TASK, TRAIN_ROWS, EPOCHS, BATCH, MAX_LENGTH = "sst2", 1000, 2, 32, 128
RATES, SEEDS = (3e-4, 1e-3), (0, 1)
METHODS = {"adapters": {"name": "adapters", "size": 64}, "lora": {"name": "lora", "r": 8}}
PEERS = {"adapters": "adapterhub", "lora": "peft"}


def sweep_file(folder: Path, method: str, precision: str) -> Path:
    """The sweep `pipelines run` reads: the work above, as a user would write it."""
    text = {"adapters": "adapters:64", "lora": "lora:8"}[method]
    path = folder / f"peer_{method}.yaml"
    path.write_text(
        f"name: peer_{method}\nbackbone: all-MiniLM-L6-v2\naccelerator: {{family: cpu, cpu_precision: {precision}}}\nretries: 0\n"
        f"max_train_examples: {TRAIN_ROWS}\nsweeps:\n  - tasks: [{TASK}]\n    methods: [\"{text}\"]\n"
        f"    learning_rates: [{', '.join(map(str, RATES))}]\n    epochs: [{EPOCHS}]\n    seeds: [{', '.join(map(str, SEEDS))}]\n"
        f"    batch_size: {BATCH}\n    max_length: {MAX_LENGTH}\n")
    return path


def task_rows() -> tuple[dict[str, list[Any]], dict[str, list[Any]], int]:
    """The rows the project trains and scores on: its seeded 1,000-row subset of the training split (after the
    validation holdout) and the test split (SST-2's dev.tsv); and the real tokens of an epoch."""
    from adaptune.data.batching import column_values, subsample
    from adaptune.data.loading import load_task_splits
    from adaptune.data.tasks import get_task
    from adaptune.model.backbone import load_tokenizer

    splits = load_task_splits(get_task(TASK), None, splits=("train", "test")).splits
    train, test = subsample(splits["train"], TRAIN_ROWS), splits["test"]
    texts = column_values(train, "text_a")
    tokens = sum(len(ids) for ids in load_tokenizer(None)(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"])
    return ({"texts": texts, "labels": column_values(train, "label")},
            {"texts": column_values(test, "text_a"), "labels": column_values(test, "label")}, tokens)


def flops_per_token(method: str) -> float:
    """Training FLOPs per real token of the method's model (bench.step_cost's rule; attention's L x L products, a few
    percent at SST-2's 13 tokens a row, left out)."""
    from adaptune.model.backbone import load_model
    from adaptune.model.methods import apply_method, method_from_dict
    from bench.step_cost import matmul_flops_per_token

    return matmul_flops_per_token(apply_method(load_model(None, "classification", 2), method_from_dict(METHODS[method])))


def matmul_tflops(threads: int, precision: str, size: int = 4096, repeats: int = 5) -> float:
    """This CPU's matmul rate in `precision` on `threads` threads: the best of a few size^3 products."""
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best / 1e12


def _timed(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


class PeakRss:
    """The largest summed RSS of a process and its children, sampled every 0.1 s while it runs."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.peak, self.root = 0, psutil.Process(process.pid)
        self.thread = threading.Thread(target=self._sample, args=(process,), daemon=True)
        self.thread.start()

    def _sample(self, process: subprocess.Popen[bytes]) -> None:
        while process.poll() is None:
            try:
                tree = [self.root, *self.root.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)


def timed_command(command: list[str], environment: dict[str, str], log: Path, cwd: Path = REPO) -> tuple[float, float]:
    """Run a command to its end: (wall seconds, peak RSS in GB); its output into `log`."""
    with log.open("wb") as handle:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=handle, stderr=subprocess.STDOUT)
        rss = PeakRss(process)
        if process.wait() != 0:
            raise RuntimeError(f"{' '.join(command)} failed: see {log}")
        wall = time.perf_counter() - started
    rss.thread.join()
    return wall, rss.peak / 1e9


def project_run(method: str, folder: Path, environment: dict[str, str], precision: str, root: Path = REPO) -> dict[str, Any]:
    """The sweep through `pipelines run` at the project's defaults, in a fresh run store; `root`: the checkout whose
    `pipelines run` it is (another commit's, to time a change side by side)."""
    out = Path(tempfile.mkdtemp(dir=folder))
    wall, rss = timed_command([sys.executable, "-m", "pipelines", "run", str(sweep_file(folder, method, precision)), "--out", str(out)],
                              {**environment, "PYTHONPATH": str(root)}, out / "log.txt", cwd=root)
    records = [json.loads(path.read_text()) for path in sorted((out / "store" / "runs").glob("*/record.json"))]
    # A fused group's runs each carry the group's phase seconds: count a group's once.
    shared = lambda phase: sum(r["time_s"][phase] / r.get("group_size", 1) for r in records)  # noqa: E731
    in_runs = sum(r["wall_time_s"] / r.get("group_size", 1) for r in records)
    return {"wall_s": wall, "peak_rss_gb": rss, "train_s": shared("steps"), "evaluation_s": shared("evaluation"),
            "setup_s": shared("setup") + shared("saving"), "outside_runs_s": wall - in_runs,
            # what a plan prices (adaptune.sweep.throughput.record_rate): training rows x epochs over the runs' own seconds
            "examples_per_s_in_runs": sum(r["split_sizes"]["train"] * r["epochs"] for r in records) / in_runs,
            # each run: its curve rows every epoch before the last, then the whole validation and test splits once
            "rows_scored": sum((EPOCHS - 1) * (r.get("curve_rows") or r["split_sizes"]["validation"])
                               + r["split_sizes"]["validation"] + r["split_sizes"]["test"] for r in records),
            "group_sizes": sorted({r.get("group_size", 1) for r in records}), "threads": _threads_line(out / "log.txt"),
            "runs": [{"lr": r["lr"], "seed": r["seed"], "test_accuracy": r["test_metrics"]["accuracy"],
                      "val_accuracy": r["val_metrics"]["accuracy"], "status": r["status"]} for r in records]}


def _threads_line(log: Path) -> str | None:
    return next((line.strip() for line in log.read_text().splitlines() if line.startswith("threads:")), None)


def peer_run(method: str, group_by_length: bool, train: dict[str, Any], test: dict[str, Any], folder: Path,
             environment: dict[str, str], precision: str) -> dict[str, Any]:
    """The same runs through Trainer and the peer library, one after another in one process."""
    from adaptune.model.backbone import resolve_backbone

    library = PEERS[method]
    request = {"library": library, "method": METHODS[method], "backbone": resolve_backbone(None), "num_labels": 2,
               "pooling_file": str(REPO / "adaptune" / "serve" / "export_pooling.py"), "train": train, "eval": test,
               "runs": [{"lr": lr, "seed": seed} for lr in RATES for seed in SEEDS], "epochs": EPOCHS, "batch_size": BATCH,
               "max_length": MAX_LENGTH, "group_by_length": group_by_length, "bf16": precision == "bf16"}
    work = Path(tempfile.mkdtemp(dir=folder))
    (work / "request.json").write_text(json.dumps(request))
    python = str(ADAPTERS_PYTHON) if library == "adapterhub" else sys.executable
    wall, rss = timed_command([python, str(REPO / "bench" / "peer_trainer.py"), str(work / "request.json"), str(work / "result.json")],
                              environment, work / "log.txt")
    result = json.loads((work / "result.json").read_text())
    runs = result["runs"]
    return {"wall_s": wall, "peak_rss_gb": rss, "train_s": sum(r["train_s"] for r in runs),
            "evaluation_s": sum(r["predict_s"] for r in runs), "rows_scored": sum(r["eval_rows"] for r in runs),
            "outside_runs_s": wall - sum(r["train_s"] + r["predict_s"] for r in runs), "versions": result["versions"],
            "runs": [{"lr": r["lr"], "seed": r["seed"], "test_accuracy": r["accuracy"], "trained_params": r["trained_params"]}
                     for r in runs]}


def calibration_entry(method: str, project_rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """What `make plan` prices this CPU's runs by (adaptune.sweep.cpu_calibration): the project's fastest round."""
    return {"task": TASK, "backbone": "all-MiniLM-L6-v2", "method": METHODS[method], "max_length": MAX_LENGTH,
            "group_size": max(size for r in project_rounds for size in r["group_sizes"]),
            "examples_per_s": max(r["examples_per_s_in_runs"] for r in project_rounds)}


def summary(rounds: list[dict[str, Any]], tokens_trained: float, tflops: float) -> dict[str, Any]:
    """Min and median of each figure over the repeats; the steps' share of the matmul rate from the fastest steps."""
    figures = ("wall_s", "train_s", "evaluation_s", "outside_runs_s", "peak_rss_gb")
    entry: dict[str, Any] = {name: {"min": min(r[name] for r in rounds), "median": statistics.median(r[name] for r in rounds)}
                             for name in figures if name in rounds[0]}
    entry["steps_share_of_matmul"] = tokens_trained / entry["train_s"]["min"] / 1e12 / tflops
    entry["rounds"] = rounds
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "peer.json")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", default="adapters,lora")
    parser.add_argument("--systems", help="only the systems whose names contain this text (e.g. group_by_length)")
    parser.add_argument("--baseline-root", type=Path, help="another checkout of the project (an earlier commit), timed beside")
    args = parser.parse_args(argv)
    if not ADAPTERS_PYTHON.exists():
        subprocess.run(["bash", str(REPO / "tests" / "adapterhub" / "make_env.sh")], check=True)
    cores = len(os.sched_getaffinity(0))
    # The peers use every core, as a user's Trainer does; the project takes its own rule (pipelines.local_threads).
    environment = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    environment.update(PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    peer_environment = {**environment, "OMP_NUM_THREADS": str(cores)}
    train, test, epoch_tokens = task_rows()
    from adaptune.core.devices import resolved_cpu_precision

    precision = resolved_cpu_precision("auto")
    tflops = matmul_tflops(cores, precision)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cores": cores, "torch": torch.__version__,
        "precision": precision, "matmul_tflops": tflops, "work": {"task": TASK, "train_rows": TRAIN_ROWS, "real_tokens_per_epoch": epoch_tokens,
                                               "epochs": EPOCHS, "batch_size": BATCH, "max_length": MAX_LENGTH,
                                               "learning_rates": RATES, "seeds": SEEDS, "scored_on": "SST-2 dev (872 rows)"},
        "methods": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as scratch:
        folder = Path(scratch)
        for method in args.methods.split(","):
            systems = {"pipelines run": lambda m=method: project_run(m, folder, environment, precision),
                       f"{PEERS[method]} + Trainer": lambda m=method: peer_run(m, False, train, test, folder, peer_environment, precision),
                       f"{PEERS[method]} + Trainer, group_by_length": lambda m=method: peer_run(m, True, train, test, folder,
                                                                                                 peer_environment, precision)}
            if args.baseline_root:
                commit = subprocess.run(["git", "-C", str(args.baseline_root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()
                systems[f"pipelines run @{commit}"] = lambda m=method: project_run(m, folder, environment, precision, args.baseline_root)
            if args.systems:
                systems = {name: run for name, run in systems.items() if args.systems in name}
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
            for repeat in range(args.repeats):
                for name, run in systems.items():
                    rounds[name].append(run())
                    print(f"{method} {repeat + 1}/{args.repeats} {name}: {rounds[name][-1]['wall_s']:.1f} s", flush=True)
                    results["methods"][method] = {"rounds_so_far": rounds}  # kept if the call is stopped
                    args.out.write_text(json.dumps(results, indent=1) + "\n")
            tokens_trained = epoch_tokens * EPOCHS * len(RATES) * len(SEEDS) * flops_per_token(method)
            entry = {name: summary(runs, tokens_trained, tflops) for name, runs in rounds.items()}
            peers = [v["wall_s"]["min"] for k, v in entry.items() if k.startswith(PEERS[method])]
            ratio = min(peers) / entry["pipelines run"]["wall_s"]["min"] if peers and "pipelines run" in entry else None
            results["methods"][method] = {"systems": entry, "peer_best_over_project_wall": ratio}
            if "pipelines run" in entry:
                results["methods"][method]["calibration"] = calibration_entry(method, entry["pipelines run"]["rounds"])
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({m: v["peer_best_over_project_wall"] for m, v in results["methods"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
