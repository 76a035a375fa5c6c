"""The project on XLA's CPU device (torch_xla over PJRT, PJRT_DEVICE=CPU): the TPU's lazy tensors, tracing,
compilation and mark_step, with the CPU as the device. `make test-xla` runs these in the TPU image's environment
(.venv-xla: torch and torch_xla at containers/tpu's pins); `make test` leaves them out (marker `xla`).

Semantics relied on (torch_xla 2.9, https://docs.pytorch.org/xla/master/learn/pytorch-on-xla-devices.html): a graph is
traced lazily and compiled once per distinct graph (shapes included), cached in the process; `mark_step` cuts and runs
it; the CompileTime metric counts compilations (torch_xla.debug.metrics).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch_xla = pytest.importorskip("torch_xla", reason="the XLA tests run in the TPU image's environment: make test-xla")

from adaptune.core import environment  # noqa: E402
from adaptune.data.tasks import get_task  # noqa: E402
from adaptune.serve.bundle import create_bundle  # noqa: E402
from adaptune.serve.predict import predict, read_inputs  # noqa: E402
from adaptune.serve.selection import select_runs, store_runs  # noqa: E402
from adaptune.sweep.store import RunStore  # noqa: E402
from bench.xla import METHOD_RATES, TASK, graphs, xla_spec, xla_sweep  # noqa: E402

pytestmark = pytest.mark.xla
REPO = Path(__file__).resolve().parents[2]
# XLA runs autocast to bf16, as on a TPU; the CPU beside them computes in float32 (bench/xla.json has the figures).
EPOCH_LOSS = 0.02  # measured up to 0.004
ROWS_APART = 4  # of 64 validation or test rows; measured up to 3
PROBABILITY = 0.02  # a bundle's class probabilities, bf16 on XLA against bf16 on the CPU, for the same weights
# A fused group against its runs alone, both on XLA in bf16: epoch losses measured up to 9e-4 apart (SMS spam, 2 runs);
# a group that trains nothing stays 0.2 or more above its runs alone by the second epoch.
FUSED_LOSS = 0.01


@pytest.fixture(scope="module")
def xla_runs(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("xla")
    return root, xla_sweep(xla_spec(), root, shared_data_dir, "xla")


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> list[dict[str, Any]]:
    return xla_sweep(xla_spec(), tmp_path_factory.mktemp("cpu"), shared_data_dir, "cpu")


def test_every_method_trains_evaluates_and_saves_on_the_xla_device(xla_runs: tuple[Path, list[dict[str, Any]]]) -> None:
    _, records = xla_runs
    assert [record["method"]["name"] for record in records] == [method["name"] for method, _ in METHOD_RATES]
    for record in records:
        assert record["status"] in ("ok", "degenerate"), (record["run_id"], record.get("reason"))
        assert record["device"] == "xla:CPU" and record["dropout_masks"] == "counter", record["run_id"]
        assert all(math.isfinite(point["train_loss"]) for point in record["curve"])
        assert record["val_metrics"]["accuracy"] is not None and record["test_metrics"]["accuracy"] is not None
        checkpoint = Path(record["checkpoint_dir"])
        assert (checkpoint / "task.safetensors").stat().st_size > 0, record["run_id"]


def test_after_its_first_epoch_a_run_compiles_nothing(xla_runs: tuple[Path, list[dict[str, Any]]]) -> None:
    """One length bucket (64 tokens, the pad multiple) and full batches: each run's graphs are compiled in its first
    epoch, a handful, and none after; runs after the first reuse what they share (the evaluation's forward)."""
    _, records = xla_runs
    for record in records:
        first, *later = graphs(record)
        assert later and all(epoch == {"steps": 0, "epoch_end": 0} for epoch in later), (record["run_id"], graphs(record))
        assert first["steps"] + first["epoch_end"] <= 8, (record["run_id"], first)
    assert graphs(records[0])[0]["steps"] >= 1  # the first run compiled its step: the counter counts


def test_xla_runs_train_as_the_cpus_to_the_rounding_of_their_precisions(xla_runs: tuple[Path, list[dict[str, Any]]],
                                                                         cpu_runs: list[dict[str, Any]]) -> None:
    """XLA autocasts to bf16 (as on a TPU), the CPU beside it computes in float32: the same run's epoch losses stay
    within bf16's rounding of each other (measured up to 0.004 apart), and its scores within a few of the split's 64
    rows, which 16 steps in two precisions part by (measured up to 3 rows: the head alone, whose probe sits near chance
    on SST-2 at this size). A device path that breaks training or evaluation lands far outside both."""
    _, records = xla_runs
    for xla, cpu in zip(records, cpu_runs, strict=True):
        assert cpu["device"] == "cpu" and xla["run_id"] == cpu["run_id"]
        for xla_point, cpu_point in zip(xla["curve"], cpu["curve"], strict=True):
            assert xla_point["train_loss"] == pytest.approx(cpu_point["train_loss"], abs=EPOCH_LOSS), (xla["curve"], cpu["curve"])
        for split, rows in (("val_metrics", "validation"), ("test_metrics", "test")):
            rows_apart = abs(xla[split]["accuracy"] - cpu[split]["accuracy"]) * xla["split_sizes"][rows]
            assert rows_apart <= ROWS_APART + 1e-9, (xla["run_id"], split, xla[split], cpu[split])


def test_a_bundle_of_xla_runs_predicts_on_xla_as_on_the_cpu(xla_runs: tuple[Path, list[dict[str, Any]]], tmp_path: Path,
                                                             shared_data_dir: Path) -> None:
    """The bundle predicts in its run's precision (bf16 for an XLA run) on either device: the same weights give the same
    labels, and probabilities within bf16's rounding."""
    root, _ = xla_runs
    store = RunStore(str(root))
    chosen = select_runs(store_runs(store), "adapters", None, None, where=store.root)
    manifest = create_bundle(tmp_path / "bundle", chosen, store, "adapters")
    assert manifest["tasks"][TASK]["precision"] == "bf16"
    sentences = [line.split("\t")[0] for line in (shared_data_dir / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:33]]
    examples = tmp_path / "sst2.jsonl"
    examples.write_text("".join(json.dumps({"sentence": sentence}) + "\n" for sentence in sentences))
    inputs = read_inputs(examples, get_task(TASK))
    outputs = {}
    for device in ("xla", "cpu"):
        with environment.patch(device=device):
            outputs[device] = predict(tmp_path / "bundle", TASK, inputs)
    for on_xla, on_cpu in zip(outputs["xla"], outputs["cpu"], strict=True):
        assert on_xla["scores"] == pytest.approx(on_cpu["scores"], abs=PROBABILITY), json.dumps([on_xla, on_cpu])
        if max(on_cpu["scores"].values()) > 0.5 + PROBABILITY:  # not a tie within the rounding
            assert on_xla["label"] == on_cpu["label"], json.dumps([on_xla, on_cpu])


def test_a_fused_group_on_xla_trains_as_its_runs_alone(tmp_path: Path, shared_data_dir: Path) -> None:
    """The group's stacks must keep handing each run its gradient after the move to the device: on XLA nn.Module.to
    makes new Parameter objects (run_groups.move_group_model). Without it the group trained nothing: its losses stayed
    where they started while its runs alone learned."""
    pair = xla_spec(methods=METHOD_RATES[1:2], seeds=(0, 1))
    alone = xla_sweep(pair, tmp_path / "alone", shared_data_dir, "xla", group_size=1)
    fused = xla_sweep(pair, tmp_path / "fused", shared_data_dir, "xla", group_size=2)
    for one, grouped in zip(alone, fused, strict=True):
        assert grouped["group_size"] == 2 and one["group_size"] == 1, (one["run_id"], grouped["group_size"])
        assert one["curve"][-1]["train_loss"] < one["curve"][0]["train_loss"] - 0.05, one["curve"]  # alone, it learns
        for one_point, grouped_point in zip(one["curve"], grouped["curve"], strict=True):
            assert grouped_point["train_loss"] == pytest.approx(one_point["train_loss"], abs=FUSED_LOSS), (one["curve"], grouped["curve"])
        assert graphs(grouped)[1] == {"steps": 0, "epoch_end": 0}
