"""Fused run groups (adaptune.train.group_loop): each run of a group is the run it would be alone.

Real data (MRPC from ../shared/data), the embedded backbone, small sizes. Tolerance: both paths run in
float32 and differ only in reduction order (a batched matmul for k runs instead of one matmul per run;
LayerNorm's affine applied after normalising instead of fused). Measured over these runs the step
losses agree to about 1e-7 (float32's epsilon is 1.2e-7) and the trained tensors to about 1e-6; AdamW
divides by sqrt(v) and can amplify such noise over steps, so the bound is 1e-4: orders above what
reduction order gives, orders below what a wrong batch, mask, seed or learning rate gives (> 1e-2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import adaptune.fused.step_graphs as step_graphs
import adaptune.train.group_loop as group_loop
import adaptune.train.loop as loop
from adaptune.core.run_files import STATE_FILE
from adaptune.fused.grouping import group_capacity, group_key, trains_whole_model
from adaptune.fused.run_dropout import MASK_SCHEMES
from adaptune.fused.settings import COMPILE_ENV, DROPOUT_MASKS_ENV, StepSettings
from adaptune.fused.step_graphs import STEP_GRAPHS
from adaptune.model.checkpoint import load_task_checkpoint
from adaptune.sweep.run_attempt import form_groups
from adaptune.train.config import TrainConfig
from adaptune.train.group_loop import train_group
from adaptune.train.loop import train_and_evaluate

TOLERANCE = 1e-4
SMALL = dict(task="mrpc", epochs=2, max_length=48, max_train_examples=40, max_eval_examples=24, batch_size=16)


def _config(method: dict[str, Any], lr: float, seed: int, **changes: Any) -> TrainConfig:
    return TrainConfig(method=method, lr=lr, seed=seed, **{**SMALL, **changes})


@pytest.fixture
def step_losses(monkeypatch: pytest.MonkeyPatch) -> list[list[float]]:
    """Every FiniteGuard's step losses, in the order the guards were made (one per run)."""
    histories: list[list[float]] = []
    real_init, real_add = loop.FiniteGuard.__init__, loop.FiniteGuard.add

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.history = []
        histories.append(self.history)

    def add(self: Any, result: Any) -> None:
        self.history.append(float(result[0]))
        real_add(self, result)

    monkeypatch.setattr(loop.FiniteGuard, "__init__", init)
    monkeypatch.setattr(loop.FiniteGuard, "add", add)
    return histories


def _assert_same_run(fused: dict[str, Any], alone: dict[str, Any], fused_losses: list[float], alone_losses: list[float]) -> None:
    assert fused["run_id"] == alone["run_id"] and fused["status"] == alone["status"]
    assert set(fused) == set(alone)  # the same record fields
    assert len(fused_losses) == len(alone_losses) > 0
    assert fused_losses == pytest.approx(alone_losses, abs=TOLERANCE)
    for metric, value in alone["val_metrics"].items():
        assert fused["val_metrics"][metric] == pytest.approx(value, abs=TOLERANCE)
    for metric, value in alone["test_metrics"].items():
        assert fused["test_metrics"][metric] == pytest.approx(value, abs=TOLERANCE)
    assert [point["train_loss"] for point in fused["curve"]] == pytest.approx([point["train_loss"] for point in alone["curve"]], abs=TOLERANCE)
    fused_model, _, _ = load_task_checkpoint(fused["checkpoint_dir"])
    alone_model, _, _ = load_task_checkpoint(alone["checkpoint_dir"])
    assert torch.allclose(_final_outputs(fused_model), _final_outputs(alone_model), atol=TOLERANCE)


def _final_outputs(model: torch.nn.Module) -> torch.Tensor:
    """A trained model's outputs on one sentence pair: its logits, or (a span task) its start and end logits
    up to a constant, all a span's softmax over positions sees. (The span head's bias gets a gradient that
    is zero but for rounding, which AdamW turns into full-size steps: it drifts by the learning rate,
    alone or fused, and shifts every position alike.)"""
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102, 2178, 6251, 102]])
    with torch.no_grad():
        output = model(input_ids=ids)
    if hasattr(output, "logits"):
        return output.logits
    spans = torch.cat([output.start_logits, output.end_logits])
    return spans - spans.mean(dim=1, keepdim=True)


METHODS = {
    "adapters": {"name": "adapters", "size": 8},
    "pfeiffer": {"name": "pfeiffer", "size": 8},
    "layernorm": {"name": "layernorm"},
    "lora": {"name": "lora", "r": 4},
    "ia3": {"name": "ia3"},
    "top_k": {"name": "top_k", "k": 2},  # the top 2 of the embedded backbone's 6 layers, stacked per run
}


# At 3e-3 two whole layers train chaotically on these 40 rows (dev F1 falls to 0.21): there a one-ulp
# change of the head's initial weights alone moves a solo run's final logits by 2.8e-4, as much as
# fusing's reduction order does (2.0e-4), so top_k's runs take rates where noise stays noise.
LEARNING_RATES = {"top_k": (1e-3, 3e-4, 1e-4)}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_run_of_a_group_matches_its_solo_training_step_by_step(method: str, tmp_path: Path, shared_data_dir: Path,
                                                                    without_dropout: None, step_losses: list[list[float]]) -> None:
    # Three learning rates and seeds; MRPC's 40 rows at batch 16 end every epoch on a batch of 8, at a
    # different step per seed: the short blocks are padded and weighted out.
    configs = [_config(METHODS[method], lr, seed) for lr, seed in zip(LEARNING_RATES.get(method, (1e-3, 3e-4, 3e-3)), range(3))]
    assert len({group_key(config) for config in configs}) == 1
    fused = train_group(configs, [tmp_path / "group" / config.run_id for config in configs], data_dir=shared_data_dir)
    fused_losses = list(step_losses)
    alone = [train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "alone" / config.run_id, progress=False)
             for config in configs]
    alone_losses = step_losses[len(fused_losses):]
    assert [record["group_size"] for record in fused] == [3, 3, 3] and [record["group_size"] for record in alone] == [1, 1, 1]
    for index in range(3):
        _assert_same_run(fused[index], alone[index], fused_losses[index], alone_losses[index])
    assert len({round(losses[-1], 6) for losses in fused_losses}) == 3  # the runs really differ


@pytest.mark.parametrize("compile_mode", ["eager", STEP_GRAPHS])
def test_squad_runs_of_a_group_match_their_solo_training(tmp_path: Path, shared_data_dir: Path, without_dropout: None,
                                                         step_losses: list[list[float]], monkeypatch: pytest.MonkeyPatch,
                                                         compile_mode: str) -> None:
    # SQuAD's rows are windows of unequal length, and a span's softmax runs over every position of a run's
    # batch: the positions a longer run's batch adds to a fused step must not reach a run's loss. At 256
    # tokens the runs' windows differ in length within a step (at 96 all are full): unmasked, the losses differ.
    # Under step graphs the step is padded on to a 32-token bucket too, and each run's own token count reaches
    # the loss from its labels (group_loop.SPAN_TARGETS), as a replayed graph takes it.
    monkeypatch.setenv(COMPILE_ENV, compile_mode)
    monkeypatch.setenv(DROPOUT_MASKS_ENV, "counter")
    configs = [_config(METHODS["adapters"], lr, seed, task="squad", epochs=1, max_length=256, doc_stride=64, max_train_examples=12,
                       max_eval_examples=6, batch_size=4) for lr, seed in ((1e-3, 0), (3e-3, 1))]
    assert len({group_key(config) for config in configs}) == 1
    fused = train_group(configs, [tmp_path / "group" / config.run_id for config in configs], data_dir=shared_data_dir)
    fused_losses = list(step_losses)
    alone = [train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "alone" / config.run_id, progress=False)
             for config in configs]
    assert [record["group_size"] for record in fused] == [2, 2]
    for index in range(2):
        _assert_same_run(fused[index], alone[index], fused_losses[index], step_losses[2 + index])
    assert set(fused[0]["val_metrics"]) >= {"exact_match", "f1"}


@pytest.mark.parametrize("masks", MASK_SCHEMES)
def test_with_dropout_a_run_gives_the_same_result_in_any_group_and_alone(masks: str, tmp_path: Path, shared_data_dir: Path,
                                                                          step_losses: list[list[float]],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DROPOUT_MASKS_ENV, masks)
    method = METHODS["adapters"]
    run = _config(method, 1e-3, 0)
    first = train_group([run, _config(method, 3e-4, 1)], [tmp_path / "a" / name for name in ("run", "other")], data_dir=shared_data_dir)
    in_first = step_losses[0]
    second = train_group([_config(method, 3e-3, 5), _config(method, 1e-4, 7), run],
                         [tmp_path / "b" / name for name in ("x", "y", "run")], data_dir=shared_data_dir)
    in_second = step_losses[2 + 2]
    alone = train_and_evaluate(run, data_dir=shared_data_dir, out_dir=tmp_path / "alone", progress=False)
    _assert_same_run(first[0], second[2], in_first, in_second)
    _assert_same_run(first[0], alone, in_first, step_losses[-1])
    assert alone["dropout_masks"] == first[0]["dropout_masks"] == masks


@pytest.mark.parametrize("name", METHODS)
def test_a_group_stepped_for_cuda_graphs_trains_as_it_does_eagerly(name: str, tmp_path: Path, shared_data_dir: Path,
                                                                   step_losses: list[list[float]], monkeypatch: pytest.MonkeyPatch) -> None:
    """ADAPTUNE_COMPILE=step_graphs on a CPU: the step a CUDA graph would hold (inputs padded to a 32-token
    bucket, each run's own AdamW step, the schedule stepped after) with counter masks and dropout on, for every
    groupable method (the H100 preset trains them all so). The capture itself needs a GPU: `make bench-gpu`'s
    step_graphs check compares replays with eager steps."""
    assert_a_group_in_mode_trains_as_eager(STEP_GRAPHS, tmp_path, shared_data_dir, step_losses, monkeypatch, name)


def test_a_step_padded_up_to_a_longer_shapes_graph_trains_as_at_its_own(tmp_path: Path, shared_data_dir: Path,
                                                                        step_losses: list[list[float]],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a group's shorter step replays a longer captured graph, its token axis padded up
    (step_graphs.PAD_UP_STEPS). Every step padded to 128 tokens, where these batches hold at most 48, a group
    trains as the eager group does, step by step: padding moves no run's result."""
    lengths: list[int] = []
    real_pad = step_graphs.pad_to_length

    def pad_to_length(inputs: dict[str, torch.Tensor], length: int) -> dict[str, torch.Tensor]:
        lengths.append(length)
        return real_pad(inputs, length)

    monkeypatch.setattr(step_graphs, "pad_to_length", pad_to_length)
    monkeypatch.setattr(step_graphs.GraphedFusedStep.__init__, "__defaults__", (None, 128, None))  # warmup, bucket, counted_from
    assert_a_group_in_mode_trains_as_eager(STEP_GRAPHS, tmp_path, shared_data_dir, step_losses, monkeypatch)
    assert len(lengths) == 2 * -(-40 // 16) and set(lengths) == {128}  # epochs x batches, every one padded to 128


def assert_a_group_in_mode_trains_as_eager(mode: str, tmp_path: Path, shared_data_dir: Path, step_losses: list[list[float]],
                                           monkeypatch: pytest.MonkeyPatch, name: str = "adapters") -> None:
    """Two runs of method `name` on MRPC with counter masks and dropout on, trained as a group under
    ADAPTUNE_COMPILE=`mode` and as an eager group: the same runs, step by step."""
    monkeypatch.setenv(DROPOUT_MASKS_ENV, "counter")
    method = METHODS[name]
    rates = LEARNING_RATES.get(name, (1e-3, 3e-4))
    runs = [_config(method, rates[0], 0), _config(method, rates[1], 1)]
    monkeypatch.setenv(COMPILE_ENV, mode)
    in_mode = train_group(runs, [tmp_path / mode / name for name in ("a", "b")], data_dir=shared_data_dir)
    monkeypatch.setenv(COMPILE_ENV, "eager")
    eager = train_group(runs, [tmp_path / "eager" / name for name in ("a", "b")], data_dir=shared_data_dir)
    assert [record["compile"] for record in in_mode + eager] == [mode] * 2 + ["eager"] * 2
    for index in range(2):
        _assert_same_run(in_mode[index], eager[index], step_losses[index], step_losses[2 + index])


def test_a_diverging_run_is_recorded_as_failed_and_the_others_go_on(tmp_path: Path, shared_data_dir: Path,
                                                                   step_losses: list[list[float]]) -> None:
    method = METHODS["adapters"]
    diverging, healthy = _config(method, 1e30, 0, epochs=1), _config(method, 1e-3, 1, epochs=1)
    fused = train_group([diverging, healthy], [tmp_path / "g" / "d", tmp_path / "g" / "h"], data_dir=shared_data_dir)
    assert fused[0]["status"] == "failed" and "non-finite" in fused[0]["reason"]
    assert (tmp_path / "g" / "d" / "record.json").is_file()
    alone = train_and_evaluate(healthy, data_dir=shared_data_dir, out_dir=tmp_path / "alone", progress=False)
    _assert_same_run(fused[1], alone, step_losses[1][: len(step_losses[2])], step_losses[2])
    assert len(step_losses[1]) == len(step_losses[2])  # the healthy run took every step


class _Killed(Exception):
    pass


def test_runs_resume_from_their_own_states_alone_or_in_another_group(tmp_path: Path, shared_data_dir: Path) -> None:
    method = METHODS["lora"]
    a, b, c = (_config(method, lr, seed, checkpoint_every_steps=2) for lr, seed in ((1e-3, 0), (3e-3, 1), (3e-4, 2)))
    uninterrupted = train_group([a, b], [tmp_path / "whole" / "a", tmp_path / "whole" / "b"], data_dir=shared_data_dir)

    def kill_at_step_3(step: int) -> None:
        if step == 3:
            raise _Killed

    with pytest.raises(_Killed):
        train_group([a, b], [tmp_path / "a", tmp_path / "b"], data_dir=shared_data_dir, step_callback=kill_at_step_3)
    assert (tmp_path / "a" / STATE_FILE).is_file() and (tmp_path / "b" / STATE_FILE).is_file()
    resumed_a = train_and_evaluate(a, data_dir=shared_data_dir, out_dir=tmp_path / "a", progress=False)  # alone
    resumed_b, fresh_c = train_group([b, c], [tmp_path / "b", tmp_path / "c"], data_dir=shared_data_dir)  # b at step 2, c at 0
    for resumed, whole in ((resumed_a, uninterrupted[0]), (resumed_b, uninterrupted[1])):
        assert resumed["val_metrics"] == pytest.approx(whole["val_metrics"], abs=TOLERANCE)
        assert [p["train_loss"] for p in resumed["curve"]] == pytest.approx([p["train_loss"] for p in whole["curve"]], abs=TOLERANCE)
    assert fresh_c["status"] in ("ok", "degenerate") and len(fresh_c["curve"]) == 2


def test_a_run_resumes_with_the_mask_scheme_it_started_with(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    method = METHODS["adapters"]
    a, b = (_config(method, lr, seed, checkpoint_every_steps=2) for lr, seed in ((1e-3, 0), (3e-3, 1)))
    monkeypatch.setenv(DROPOUT_MASKS_ENV, "counter")
    (whole,) = train_group([a], [tmp_path / "whole"], data_dir=shared_data_dir)

    def kill_at_step_3(step: int) -> None:
        if step == 3:
            raise _Killed

    with pytest.raises(_Killed):
        train_group([a], [tmp_path / "a"], data_dir=shared_data_dir, step_callback=kill_at_step_3)
    monkeypatch.setenv(DROPOUT_MASKS_ENV, "generator")  # the setting changed before the resubmission
    resumed, fresh = train_group([a, b], [tmp_path / "a", tmp_path / "b"], data_dir=shared_data_dir)
    assert (resumed["dropout_masks"], fresh["dropout_masks"]) == ("counter", "generator")
    assert (resumed["group_size"], fresh["group_size"]) == (1, 1)  # different schemes: separate groups
    assert [p["train_loss"] for p in resumed["curve"]] == pytest.approx([p["train_loss"] for p in whole["curve"]], abs=TOLERANCE)
    assert resumed["val_metrics"] == pytest.approx(whole["val_metrics"], abs=TOLERANCE)
    generator = train_and_evaluate(a, data_dir=shared_data_dir, out_dir=tmp_path / "g", progress=False)
    assert generator["curve"][0]["train_loss"] != pytest.approx(whole["curve"][0]["train_loss"], abs=TOLERANCE)  # other masks


def test_group_key_groups_only_runs_that_can_share_a_step() -> None:
    adapters = {"name": "adapters", "size": 64, "init_std": 0.01}
    base = _config(adapters, 3e-4, 0)
    assert group_key(base) == group_key(_config({**adapters, "init_std": 0.001}, 3e-3, 2))  # lr, seed, init std differ
    assert group_key(base) != group_key(_config({**adapters, "size": 8}, 3e-4, 0))  # other shapes
    assert group_key(base) != group_key(_config(adapters, 3e-4, 0, epochs=20))  # other step count
    assert group_key(base) != group_key(_config(adapters, 3e-4, 0, task="rte"))
    assert group_key(_config({"name": "full"}, 3e-4, 0)) == group_key(_config({"name": "full"}, 3e-3, 1))  # whole models stacked
    top_2 = {"name": "top_k", "k": 2}
    assert group_key(_config(top_2, 3e-4, 0)) == group_key(_config(top_2, 3e-3, 1)) != group_key(_config({"name": "top_k", "k": 3}, 3e-4, 0))
    # every layer (of the 6, of BERT-base's 12): the embeddings train too, a whole model stacked per run, one a group
    assert group_key(_config({"name": "top_k", "k": 6}, 3e-4, 0)) != group_key(_config({"name": "full"}, 3e-4, 0))
    assert group_capacity(_config({"name": "top_k", "k": 12}, 3e-4, 0, backbone="bert-base-uncased"), 8) == 1
    assert group_key(_config({"name": "top_k", "k": 11}, 3e-4, 0, backbone="bert-base-uncased")) is not None
    assert group_key(TrainConfig(task="squad", method=adapters)) is not None  # span tasks too
    with pytest.raises(ValueError, match="cannot train as one group"):
        train_group([base, _config({"name": "full"}, 3e-4, 1)], ["x", "y"])


@pytest.mark.parametrize("method", [{"name": "full"}, {"name": "top_k", "k": 6}], ids=["full", "top_k-every-layer"])
def test_a_whole_model_run_trains_as_a_group_of_one_as_it_does_alone(method: dict[str, Any], tmp_path: Path, shared_data_dir: Path,
                                                                     step_losses: list[list[float]]) -> None:
    """Full fine-tuning and top_k over every layer (the embeddings train: GroupedEmbedding) train one a group
    (WHOLE_MODEL_RUNS_PER_GROUP) as a group of one, which the step-graph step replays: step by step the run alone
    (dropout on, its own masks), the same record fields, metrics and checkpoint (a group of one multiplies as the
    solo layers do: observed equal)."""
    assert trains_whole_model(_config(method, 1e-4, 0)) and group_capacity(_config(method, 1e-4, 0), 8) == 1
    config = _config(method, 1e-4, 0)
    (fused,) = train_group([config], [tmp_path / "group" / config.run_id], data_dir=shared_data_dir)
    alone = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "alone" / config.run_id, progress=False)
    assert fused["group_size"] == alone["group_size"] == 1
    _assert_same_run(fused, alone, step_losses[0], step_losses[1])


@pytest.mark.parametrize("method", [{"name": "full"}, {"name": "top_k", "k": 6}], ids=["full", "top_k-every-layer"])
def test_whole_models_stacked_in_a_group_match_their_solo_training_step_by_step(
        method: dict[str, Any], tmp_path: Path, shared_data_dir: Path, without_dropout: None, step_losses: list[list[float]]) -> None:
    """Whole models stacked per run, as HFTA fuses them: every Linear and LayerNorm a batched per-run operator, each
    run's embedding tables looked up for its own rows (positions too, which BERT adds to every row alike). Each of 3
    full fine-tuning runs matches its solo training step by step, as the frozen-backbone methods do (losses,
    metrics, final logits within the tolerance), though no group takes more than one such run until a GPU has
    measured them (WHOLE_MODEL_RUNS_PER_GROUP)."""
    configs = [_config(method, lr, seed) for lr, seed in zip((1e-4, 3e-5, 1e-5), range(3))]
    assert len({group_key(config) for config in configs}) == 1 and None not in {group_key(config) for config in configs}
    fused = train_group(configs, [tmp_path / "group" / config.run_id for config in configs], data_dir=shared_data_dir)
    fused_losses = list(step_losses)
    alone = [train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "alone" / config.run_id, progress=False)
             for config in configs]
    alone_losses = step_losses[len(fused_losses):]
    assert [record["group_size"] for record in fused] == [3, 3, 3]
    for index in range(3):
        _assert_same_run(fused[index], alone[index], fused_losses[index], alone_losses[index])
    assert len({round(losses[-1], 6) for losses in fused_losses}) == 3  # the runs really differ


def test_a_group_takes_fewer_runs_where_a_step_holds_more_tokens() -> None:
    """runs_per_group is measured at batch 32 x 128 tokens: a 256-token step takes half the memory's runs,
    smaller steps no more than runs_per_group, and SQuAD's 384-token steps, which keep an H100 busy alone,
    train alone, in the trainer's own step even where step graphs would take a group of one; the shard
    runner forms groups so."""
    from adaptune.sweep.run_attempt import _graphed_alone

    adapters = {"name": "adapters", "size": 64}
    glue, squad = _config(adapters, 3e-4, 0, max_length=128, batch_size=32), TrainConfig(task="squad", method=adapters, max_length=384)
    long_glue = _config(adapters, 3e-4, 0, max_length=256, batch_size=32)
    assert (group_capacity(glue, 8), group_capacity(long_glue, 8), group_capacity(squad, 8)) == (8, 4, 1)
    assert group_capacity(_config(adapters, 3e-4, 0, max_length=64, batch_size=16), 8) == 8
    squads = [TrainConfig(task="squad", method=adapters, max_length=384, seed=seed) for seed in range(5)]
    assert [len(group) for group in form_groups(squads, 8)] == [1] * 5
    graphed = StepSettings(compile="step_graphs", dropout_masks="counter")
    assert (_graphed_alone(glue, graphed), _graphed_alone(squad, graphed), _graphed_alone(glue, StepSettings())) == (True, False, False)


def test_a_group_size_below_1_fails_at_planning() -> None:
    import dataclasses

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import PlanError, plan
    from adaptune.sweep.spec import CPU

    for field in ("runs_per_group",):
        spec = dataclasses.replace(get_experiment("smoke"), accelerator=dataclasses.replace(CPU, **{field: 0}))
        with pytest.raises(PlanError, match=f"accelerator {field} must be a whole number >= 1, got 0"):
            plan(spec)


def test_a_shard_trains_its_groupable_runs_as_groups_and_each_run_is_published_as_alone(tmp_path: Path, shared_data_dir: Path) -> None:
    import dataclasses

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.spec import Sweep
    from adaptune.sweep.store import RunStore

    spec = dataclasses.replace(
        get_experiment("smoke"), name="group_test", ablation=None, shard_size=5, max_train_examples=32, max_eval_examples=16,
        sweeps=(Sweep(tasks=("mrpc",), methods=({"name": "layernorm"}, {"name": "full"}), learning_rates=(1e-3, 3e-3),
                      epochs=(1,), seeds=(0,), max_length=32),),
    )
    (shard,) = plan(spec).shards
    store = RunStore(str(tmp_path / "store"))
    outcomes = run_shard(spec, shard.id, store, data_dir=shared_data_dir, group_size=4)
    assert sum(outcomes.values()) == 4 and not outcomes["failed"]
    sizes = {run.run_id: store.record(run.run_id)["group_size"] for run in shard.runs}
    assert sorted(sizes.values()) == [1, 1, 2, 2]  # the two layernorm runs shared a group; full fine-tuning trained alone
    assert not list((tmp_path / "store").rglob("lease-*.json"))  # every lease released
    again = run_shard(spec, shard.id, store, data_dir=shared_data_dir, group_size=4)
    assert again == {"reused": 4}


def test_under_step_graphs_a_groupable_run_alone_trains_as_a_group_of_one(tmp_path: Path, shared_data_dir: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.spec import Sweep
    from adaptune.sweep.store import RunStore

    monkeypatch.setenv(DROPOUT_MASKS_ENV, "counter")
    monkeypatch.setenv(COMPILE_ENV, STEP_GRAPHS)
    spec = dataclasses.replace(
        get_experiment("smoke"), name="graphs_alone_test", ablation=None, shard_size=2, max_train_examples=32, max_eval_examples=16,
        sweeps=(Sweep(tasks=("mrpc",), methods=({"name": "layernorm"}, {"name": "full"}), learning_rates=(1e-3,),
                      epochs=(1,), seeds=(0,), max_length=32),),
    )
    (shard,) = plan(spec).shards
    store = RunStore(str(tmp_path / "store"))
    outcomes = run_shard(spec, shard.id, store, data_dir=shared_data_dir, group_size=1)
    assert sum(outcomes.values()) == 2 and not outcomes["failed"]  # 32 rows, one epoch: a run may predict one class
    records = {run.method["name"]: store.record(run.run_id) for run in shard.runs}
    assert (records["layernorm"]["compile"], records["full"]["compile"]) == (STEP_GRAPHS, STEP_GRAPHS)  # full: a group of one
    monkeypatch.setenv(COMPILE_ENV, "eager")
    layernorm = next(run for run in shard.runs if run.method["name"] == "layernorm")
    alone = train_and_evaluate(layernorm, data_dir=shared_data_dir, out_dir=tmp_path / "alone", progress=False)
    assert records["layernorm"]["val_metrics"] == pytest.approx(alone["val_metrics"], abs=TOLERANCE)
    assert [point["train_loss"] for point in records["layernorm"]["curve"]] == pytest.approx(
        [point["train_loss"] for point in alone["curve"]], abs=TOLERANCE)


def test_a_group_that_runs_out_of_memory_trains_as_halves(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Group sizes come from memory measured on other steps: where a group of 4 runs out of memory the
    shard trains it as two groups of 2 (here every group above 2 runs out), and no run is lost."""
    import dataclasses

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.spec import Sweep
    from adaptune.sweep.store import RunStore

    real = group_loop.train_group
    tried: list[int] = []

    def train_group_within_memory(configs: Any, *args: Any, **kwargs: Any) -> Any:
        tried.append(len(configs))
        if len(configs) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(configs, *args, **kwargs)

    monkeypatch.setattr(group_loop, "train_group", train_group_within_memory)
    spec = dataclasses.replace(
        get_experiment("smoke"), name="oom_test", ablation=None, shard_size=4, max_train_examples=16, max_eval_examples=8,
        sweeps=(Sweep(tasks=("mrpc",), methods=({"name": "layernorm"},), learning_rates=(1e-3, 3e-3), epochs=(1,), seeds=(0, 1),
                      max_length=32),),
    )
    (shard,) = plan(spec).shards
    store = RunStore(str(tmp_path / "store"))
    outcomes = run_shard(spec, shard.id, store, data_dir=shared_data_dir, group_size=4)
    assert tried == [4, 2, 2] and sum(outcomes.values()) == 4 and not outcomes["failed"]
    assert [store.record(run.run_id)["group_size"] for run in shard.runs] == [2, 2, 2, 2]


def test_the_whole_run_timing_trains_the_same_runs_fused_and_alone_in_the_precision_it_pins(shared_data_dir: Path,
                                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.fused.time_whole_runs (make bench-bf16's whole runs): each way twice, in ABBA order, the
    runs' scores equal fused and alone (float32), and the caller's precision setting restored afterwards."""
    import os

    from bench.fused import WholeRuns, time_whole_runs

    monkeypatch.setenv("ADAPTUNE_CPU_BF16", "auto")
    timed = time_whole_runs(str(shared_data_dir), 2, WholeRuns(task="mrpc", train_rows=32, eval_rows=16, epochs=1, max_length=32),
                            "float32", repeats=2)
    assert os.environ["ADAPTUNE_CPU_BF16"] == "auto"
    assert timed["runs"] == 2 and timed["precision"] == "float32"
    assert len(timed["group_walls_s"]) == len(timed["alone_walls_s"]) == 2 and timed["speedup"] > 0
    assert timed["largest_test_score_difference"] is not None and timed["largest_test_score_difference"] < 1e-6


def test_a_group_keys_runs_split_into_as_few_groups_as_fit_of_even_sizes() -> None:
    """9 runs at 8 a group train as 5 and 4 (a run alone would pay a whole launch-bound step for itself), 16 as 8
    and 8, 12 at 256 tokens (4 a group) as three 4s; a run no group shares keeps its place, and groups come in
    the order of their first runs."""
    from adaptune.fused.grouping import fused_groups

    adapters = {"name": "adapters", "size": 64}
    nine = [_config(adapters, lr, seed) for lr in (3e-5, 3e-4, 3e-3) for seed in range(3)]
    full = _config({"name": "full"}, 3e-5, 0)
    groups = fused_groups([full, *nine], 8)
    assert [len(group) for group in groups] == [1, 5, 4]
    assert groups[0] == [full] and groups[1] + groups[2] == nine
    sixteen = [_config(adapters, 3e-4, seed) for seed in range(16)]
    assert [len(group) for group in fused_groups(sixteen, 8)] == [8, 8]
    long = [_config(adapters, 3e-4, seed, max_length=256, batch_size=32) for seed in range(12)]
    assert [len(group) for group in fused_groups(long, 8)] == [4, 4, 4]
    layernorm = [_config({"name": "layernorm"}, 3e-4, seed) for seed in range(3)]
    interleaved = [nine[0], layernorm[0], *nine[1:], *layernorm[1:]]
    assert [[config.method["name"] for config in group][0] for group in fused_groups(interleaved, 8)] == ["adapters", "layernorm", "adapters"]
    assert fused_groups(nine, 1) == [[config] for config in nine]


def test_a_trained_position_table_without_position_ids_to_look_up_by_row_is_refused() -> None:
    """BERT's embeddings add one position lookup to every row; stacked per run, each row must look positions up in
    its own run's table, from the module's position_ids. A module that trains such a table without them is refused."""
    from adaptune.fused.run_groups import GroupingError, group_model, trained_tensors

    class Embeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.position_embeddings = torch.nn.Embedding(16, 4)

    model = torch.nn.Sequential()
    model.add_module("embeddings", Embeddings())
    with pytest.raises(GroupingError, match="has no position_ids"):
        group_model(model, [trained_tensors(model)] * 2)
    one = Embeddings()  # a group of one needs no position rows: it looks up as alone
    alone = one.position_embeddings(torch.arange(5))
    assert torch.equal(group_model(one, [trained_tensors(one)]).position_embeddings(torch.arange(5)), alone)


def _regression_group_and_alone(tmp_path: Path, data_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    configs = [_config(METHODS["adapters"], lr, seed, task="stsb") for lr, seed in ((1e-3, 0), (3e-3, 1))]
    assert len({group_key(config) for config in configs}) == 1
    fused = train_group(configs, [tmp_path / "group" / config.run_id for config in configs], data_dir=data_dir)
    alone = [train_and_evaluate(config, data_dir=data_dir, out_dir=tmp_path / "alone" / config.run_id, progress=False)
             for config in configs]
    assert [record["group_size"] for record in fused] == [2, 2]
    assert all(set(record["val_metrics"]) >= {"spearman", "pearson"} for record in fused + alone)
    return fused, alone


def test_float32_regression_runs_of_a_group_match_their_solo_training(tmp_path: Path, stsb_mirror: Path, without_dropout: None,
                                                                      step_losses: list[list[float]]) -> None:
    """STS-B's path (a float label, one output, mean squared error, Spearman and Pearson) in float32: each run of a
    group is its run alone to TOLERANCE, step by step, as the classification runs above."""
    fused, alone = _regression_group_and_alone(tmp_path, stsb_mirror)
    assert fused[0]["device"] == "cpu"
    for index in range(2):
        _assert_same_run(fused[index], alone[index], step_losses[index], step_losses[2 + index])


def test_bf16_regression_runs_of_a_group_stay_within_the_bf16_bound_of_their_runs_alone(
    tmp_path: Path, stsb_mirror: Path, patch_settings: Any
) -> None:
    """The same in bf16 (on a CPU with native bf16; skipped elsewhere): not equal, within tests/test_bf16_precision.py's
    bound, BF16_FUSED_POINTS (2 points of Spearman and Pearson, x100), and its last epoch's loss within 0.05."""
    from adaptune.core.devices import native_cpu_bf16
    from tests.test_bf16_precision import BF16_FUSED_POINTS

    if not native_cpu_bf16():
        pytest.skip("this CPU has no native bf16 (avx512_bf16 or AMX): bf16 is emulated here and never the default")
    patch_settings(cpu_bf16="1")
    fused, alone = _regression_group_and_alone(tmp_path, stsb_mirror)
    for grouped, solo in zip(fused, alone, strict=True):
        assert grouped["device"] == solo["device"] == "cpu:bf16"
        for split in ("val_metrics", "test_metrics"):
            for metric, value in solo[split].items():
                assert abs(100 * (grouped[split][metric] - value)) <= BF16_FUSED_POINTS, (split, metric)
        assert grouped["curve"][-1]["train_loss"] == pytest.approx(solo["curve"][-1]["train_loss"], abs=0.05)
