"""train_and_evaluate on real data with the embedded backbone: it learns, resumes exactly, fails cleanly."""

from __future__ import annotations

import argparse
import gc
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from adaptune.data.batching import subsample  # noqa: E402
from adaptune.data.loading import load_task_data  # noqa: E402
from adaptune.data.squad import check_window  # noqa: E402
from adaptune.train import loop as train_module  # noqa: E402
from adaptune.train.checks import ConfigError  # noqa: E402
from adaptune.train.cli import add_train_arguments, config_from_args  # noqa: E402
from adaptune.train.config import TrainConfig  # noqa: E402
from adaptune.train.event_log import CURVE_FILE, read_events  # noqa: E402
from adaptune.train.loop import train_and_evaluate  # noqa: E402
from adaptune.train.state import STATE_FILE  # noqa: E402

pytestmark = pytest.mark.slow
SST2_RUN_GROUP = pytest.mark.xdist_group("sst2_run")  # the tests that read `sst2_run`: one worker trains it once

# A few hundred real SST-2 sentences: 8 steps per epoch, 3 epochs, a state save every 3 steps.
SST2_RUN = TrainConfig(
    task="sst2",
    method={"name": "adapters", "size": 64},
    lr=3e-3,
    epochs=3,
    max_length=64,
    max_train_examples=256,
    max_eval_examples=160,
    checkpoint_every_steps=3,
)


class Interrupted(Exception):
    """Stands in for a preemption in the middle of an epoch."""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path, cache_dir: Path) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("sst2_run")
    return train_and_evaluate(SST2_RUN, data_dir=shared_data_dir, out_dir=out, cache_dir=cache_dir, progress=False), out


@SST2_RUN_GROUP
def test_short_real_run_learns_and_writes_record_and_checkpoint(sst2_run: tuple[dict, Path], shared_data_dir: Path) -> None:
    record, out = sst2_run
    assert record["status"] == "ok", record["reason"]
    validation = subsample(load_task_data("sst2", shared_data_dir)["validation"], SST2_RUN.max_eval_examples)
    majority = Counter(validation["label"]).most_common(1)[0][1] / len(validation)
    assert record["val_metrics"]["accuracy"] > majority + 0.1

    assert json.loads((out / "record.json").read_text()) == record
    assert (out / "checkpoint" / "task.safetensors").is_file()
    assert not (out / STATE_FILE).exists(), "a finished run drops its resume state"
    assert [point["epoch"] for point in record["curve"]] == [1, 2, 3]
    assert [point["step"] for point in record["curve"]] == [8, 16, 24]
    # The run's result is the final epoch's (the official code evaluates the final model); the best
    # epoch on validation is kept beside it, and the curve holds every epoch.
    assert record["val_metrics"] == record["curve"][-1]["val_metrics"]
    best = max(record["curve"], key=lambda point: point["val_metrics"]["accuracy"])
    assert record["best_epoch"] == best["epoch"]
    checkpoint_info = json.loads((out / "checkpoint" / "task.json").read_text())
    assert checkpoint_info["metadata"]["epoch"] == 3 and checkpoint_info["metadata"]["best_epoch"] == record["best_epoch"]
    # Adapters (m=64) + every LayerNorm + the head on MiniLM-L6 (DESIGN.md's count).
    assert record["trained_params"] == 605_954 and record["total_params"] > 20_000_000
    # GLUE's test split is dev.tsv, scored with the final model; the sizes used are recorded.
    assert set(record["test_metrics"]) == {"accuracy"}
    assert record["split_sizes"] == {"train": SST2_RUN.max_train_examples, "validation": SST2_RUN.max_eval_examples,
                                     "test": SST2_RUN.max_eval_examples}
    assert record["primary_metric"] == "accuracy" and record["device"] == "cpu"
    assert record["train_examples_per_s"] > 0 and record["wall_time_s"] > 0

    # TensorBoard's own loader reads the run's event files back to the record's numbers.
    assert [step for step, _ in _scalars(out, "loss/train")] == list(range(1, 25))  # every step once
    assert dict(_scalars(out, "validation/accuracy")) == pytest.approx(
        {point["step"]: point["val_metrics"]["accuracy"] for point in record["curve"]})
    assert dict(_scalars(out, "score/validation")) == pytest.approx({24: record["val_metrics"]["accuracy"]})
    assert dict(_scalars(out, "score/test")) == pytest.approx({24: record["test_metrics"]["accuracy"]})
    assert _scalars(out, "score/trained_params") == [(24, record["trained_params"])]
    assert dict(_scalars(out, "score/test_accuracy")) == pytest.approx({24: record["test_metrics"]["accuracy"]})
    assert _scalars(out, "lr/train")[-1][1] == 0.0  # the linear decay ends at zero


def _scalars(out: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


@SST2_RUN_GROUP
def test_interrupted_run_resumes_to_the_same_result(sst2_run: tuple[dict, Path], tmp_path: Path, shared_data_dir: Path, cache_dir: Path) -> None:
    uninterrupted, _ = sst2_run

    def preempt_at_step_11(step: int) -> None:
        if step == 11:  # mid epoch 2; the last saved state is step 9 (the epoch-1 end state came at 8)
            raise Interrupted

    with pytest.raises(Interrupted):
        train_and_evaluate(SST2_RUN, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=cache_dir, progress=False, step_callback=preempt_at_step_11)
    assert (tmp_path / STATE_FILE).is_file() and not (tmp_path / "record.json").exists()
    gc.collect()  # the killed attempt's event file flushed, as a preempted pod's last upload may have it
    assert max(event.step for event in read_events(tmp_path / "tensorboard" / CURVE_FILE)) == 11  # logged past the saved step 9

    steps_after_restart: list[int] = []
    resumed = train_and_evaluate(
        SST2_RUN, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=cache_dir, progress=False, step_callback=steps_after_restart.append
    )
    assert steps_after_restart == list(range(10, 25)), "the restart resumes after the last saved step"
    for key in ("status", "best_epoch", "val_metrics", "trained_params"):
        assert resumed[key] == uninterrupted[key], key
    assert resumed["curve"] == uninterrupted["curve"]  # identical losses and metrics at every epoch
    # The resumed run's event file holds each step once (steps 10 and 11 of the killed attempt dropped), with the same losses.
    resumed_losses = _scalars(tmp_path, "loss/train")
    assert [step for step, _ in resumed_losses] == list(range(1, 25))
    assert dict(resumed_losses) == pytest.approx(dict(_scalars(sst2_run[1], "loss/train")), rel=1e-5)


def test_nan_inducing_learning_rate_gives_failed_record(tmp_path: Path, shared_data_dir: Path, cache_dir: Path) -> None:
    # A finite but absurd rate (an infinite one is refused before training): the second step's loss is NaN.
    config = TrainConfig(task="sst2", method={"name": "full"}, lr=1e30, epochs=1, max_length=32, max_train_examples=64, max_eval_examples=32)
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=cache_dir, progress=False)
    assert record["status"] == "failed"
    assert "non-finite" in record["reason"] and "learning rate" in record["reason"]
    assert record["val_metrics"] == {} and record["best_epoch"] is None
    assert json.loads((tmp_path / "record.json").read_text())["status"] == "failed"


def test_out_of_memory_is_raised_for_the_shard_runner_to_retry(
    tmp_path: Path, shared_data_dir: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CPU cannot run out of accelerator memory on demand: the step raises what CUDA would.
    def step_out_of_memory(*args: object, **kwargs: object) -> float:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train_module.SoloSteps, "step", step_out_of_memory)
    config = TrainConfig(task="sst2", method={"name": "full"}, epochs=1, max_length=32, max_train_examples=32, max_eval_examples=32)
    with pytest.raises(torch.OutOfMemoryError):  # transient on a shared device: adaptune.sweep.shard_runner retries it
        train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "record.json").exists()  # no record: the next attempt trains the run


def test_collapsed_predictions_give_a_complete_degenerate_record(tmp_path: Path, shared_data_dir: Path, cache_dir: Path) -> None:
    # max_length=2 leaves every sentence as [CLS] [SEP]: identical inputs, so one predicted class.
    config = TrainConfig(task="sst2", method={"name": "layernorm"}, lr=1e-3, epochs=1, max_length=2, max_train_examples=32, max_eval_examples=64)
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=cache_dir, progress=False)
    assert record["status"] == "degenerate"
    assert "all one class on validation and test" in record["reason"]
    assert record["predicted_classes"] == {"validation": 1, "test": 1}
    assert record["best_epoch"] == 1 and 0 < record["val_metrics"]["accuracy"] < 1
    assert (tmp_path / "checkpoint" / "task.safetensors").is_file()


def test_cli_flags_build_the_run_config() -> None:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--task", "rte", "--adapter-size", "8", "--init-std", "1e-3", "--lr", "1e-4", "--epochs", "20", "--seed", "2"])
    config = config_from_args(args)
    assert config.method == {"name": "adapters", "size": 8, "init_std": 1e-3, "nonlinearity": "gelu"}
    assert (config.task, config.lr, config.epochs, config.seed) == ("rte", 1e-4, 20, 2)
    assert config_from_args(parser.parse_args(["--task", "rte", "--method", "top_k:3"])).method == {"name": "top_k", "k": 3}
    with pytest.raises(ConfigError, match="one of --method"):
        config_from_args(parser.parse_args(["--task", "rte", "--method", "full", "--top-k", "2"]))

    # Unset lengths are the task's standard: 384-token windows with stride 128 for SQuAD, 128 tokens for GLUE.
    squad = config_from_args(parser.parse_args(["--task", "squad"]))
    assert (squad.max_length, squad.doc_stride) == (384, 128)
    check_window(squad.max_length, squad.doc_stride)  # the default SQuAD run no longer fails its window check
    assert (config.max_length, config.doc_stride) == (128, TrainConfig.doc_stride)
    explicit = config_from_args(parser.parse_args(["--task", "squad", "--max-length", "192", "--doc-stride", "64"]))
    assert (explicit.max_length, explicit.doc_stride) == (192, 64)
    assert config_from_args(parser.parse_args(["--task", "rte", "--max-length", "256"])).max_length == 256


def test_the_progress_bar_shows_the_last_finished_epochs_validation_score() -> None:
    from adaptune.train.epochs import last_validation as _last_validation

    assert _last_validation([], "accuracy") == {}  # nothing before the first epoch ends
    curve = [{"epoch": 1, "val_metrics": {"accuracy": 0.5}}, {"epoch": 2, "val_metrics": {"accuracy": 0.90625, "f1": 0.1}}]
    assert _last_validation(curve, "accuracy") == {"val_accuracy": "0.9062"}
    assert _last_validation([{"epoch": 1, "val_metrics": {"matthews_correlation": None}}], "matthews_correlation") == {}


def test_a_device_with_a_queue_reads_losses_every_few_steps_and_still_fails_a_diverged_run_at_its_step(
    tmp_path: Path, shared_data_dir: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a GPU the guard reads the steps' losses every SYNC_EVERY_STEPS steps; here every 4, on the CPU.
    class EveryFourSteps(train_module.FiniteGuard):
        def __init__(self, device: object) -> None:
            super().__init__(device, every=4)

    monkeypatch.setattr(train_module, "FiniteGuard", EveryFourSteps)
    config = TrainConfig(task="sst2", method={"name": "full"}, lr=1e30, epochs=1, max_length=32, max_train_examples=64, max_eval_examples=32)
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=cache_dir, progress=False)
    assert record["status"] == "failed"
    assert "non-finite training loss (nan) at step 2 " in record["reason"]  # the step it diverged at, not the step it was read


def test_the_finite_guard_sums_losses_between_reads_and_reads_every_step_only_on_the_cpu() -> None:
    from adaptune.core.devices import Device

    gpu_like = Device("cuda", torch.device("cpu"), "cuda:test", torch.bfloat16)  # only its kind matters to the guard
    assert train_module.FiniteGuard(gpu_like).every == train_module.SYNC_EVERY_STEPS > 1
    assert train_module.FiniteGuard(Device("cpu", torch.device("cpu"), "cpu", None)).every == 1
    guard = train_module.FiniteGuard(gpu_like, every=3)
    for loss in (1.0, 2.0):
        guard.add((torch.tensor(loss), torch.tensor(0.5)))
    assert not guard.due()
    guard.add((torch.tensor(3.0), torch.tensor(0.5)))
    assert guard.due() and guard.collect(first_step=1) == (6.0, 3) and guard.last_loss == 3.0
    guard.add((torch.tensor(1.0), torch.tensor(float("inf"))))
    with pytest.raises(train_module.RunFailed, match="non-finite gradient norm .* at step 4"):
        guard.collect(first_step=4)


def test_frozen_matmuls_stored_in_bf16_give_the_logits_autocast_gives() -> None:
    from adaptune.model.backbone import load_model
    from adaptune.model.methods import apply_method, method_from_dict

    torch.manual_seed(0)
    model = load_model(None, "classification", num_labels=2)
    apply_method(model, method_from_dict({"name": "adapters", "size": 64}))
    model.eval()
    batch = {"input_ids": torch.randint(1000, 5000, (4, 16)), "attention_mask": torch.ones(4, 16, dtype=torch.long)}
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(**batch).logits
        train_module.keep_frozen_matmuls_in(model, torch.bfloat16)
        after = model(**batch).logits
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert {m.weight.dtype for m in linears if not m.weight.requires_grad} == {torch.bfloat16}
    assert {m.weight.dtype for m in linears if m.weight.requires_grad} == {torch.float32}  # adapters and head still train in fp32
    assert torch.equal(before, after)  # autocast casts a float32 weight to exactly these bf16 values


@SST2_RUN_GROUP
def test_cpu_bf16_is_the_default_only_where_native_refused_where_emulated_and_named_in_the_record(
    sst2_run: tuple[dict, Path], tmp_path: Path, shared_data_dir: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
    patch_settings: Callable[..., object],
) -> None:
    from adaptune.core import devices

    float32_record, _ = sst2_run
    assert float32_record["device"] == "cpu"  # the suite pins float32 (conftest): its tolerances are float32's
    patch_settings(cpu_bf16="maybe")
    with pytest.raises(ValueError, match="ADAPTUNE_CPU_BF16='maybe' is not valid: use one of auto, "):
        devices.pick_device()
    # Unset (or auto): bf16 where the CPU multiplies it natively, float32 where it would emulate it.
    for unset_or_auto in (None, "auto"):
        if unset_or_auto is None:
            patch_settings(cpu_bf16=None)
        else:
            patch_settings(cpu_bf16=unset_or_auto)
        for native, expected in ((False, None), (True, torch.bfloat16)):
            monkeypatch.setattr(devices, "native_cpu_bf16", lambda native=native: native)
            assert devices.pick_device().autocast_dtype is expected
    # Pinned: float32 even where bf16 is native; bf16 refused, in one line, on an AVX2-only CPU, which
    # emulates bf16 matmuls (17x slower than float32, measured).
    patch_settings(cpu_bf16="0")
    assert devices.pick_device().autocast_dtype is None and devices.pick_device(cpu_precision="bf16").name == "cpu:bf16"
    patch_settings(cpu_bf16="1")
    monkeypatch.setattr(devices, "native_cpu_bf16", lambda: False)
    with pytest.raises(RuntimeError, match="has no native bf16 .* use auto or float32"):
        devices.pick_device()
    assert devices.pick_device(cpu_precision="float32").name == "cpu"

    # With native bf16 (avx512_bf16 or AMX): the frozen matmuls are stored in bf16 and the record says so.
    # A few steps only, since the CPU running the test may be one that emulates bf16.
    monkeypatch.setattr(devices, "native_cpu_bf16", lambda: True)
    assert devices.pick_device().autocast_dtype is torch.bfloat16
    cast_to: list[torch.dtype] = []
    cast = train_module.keep_frozen_matmuls_in
    monkeypatch.setattr(train_module, "keep_frozen_matmuls_in", lambda model, dtype: cast_to.append(dtype) or cast(model, dtype))
    tiny = TrainConfig(task="sst2", method={"name": "adapters", "size": 8}, lr=3e-3, epochs=1, max_length=16, max_train_examples=32,
                       max_eval_examples=16, batch_size=16)
    record = train_and_evaluate(tiny, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=cache_dir, progress=False)
    assert record["status"] in ("ok", "degenerate") and record["device"] == "cpu:bf16" and cast_to == [torch.bfloat16]
    assert all(value is None or 0.0 <= value <= 1.0 for value in record["val_metrics"].values())
