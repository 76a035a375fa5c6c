"""Which captured graph a step-graph step replays (adaptune.fused.step_graphs): its own shape's, or, for a shape
that comes rarely, a longer one's with the token axis padded up. The replay itself needs a GPU (`make bench-gpu`);
that padding moves no run's result is tests/test_fused_groups.py's."""

from __future__ import annotations

import torch

from adaptune.core.devices import Device
from adaptune.fused.run_dropout import CounterStream, RunRandomness
from adaptune.fused.step_graphs import PAD_UP_STEPS, GraphedFusedStep, key_length, longer_captured, pad_to_bucket, shape_key


def _key(rows: int, length: int, label_rows: int | None = None) -> tuple:
    inputs = {name: torch.zeros(rows, length, dtype=torch.long) for name in ("input_ids", "attention_mask", "token_type_ids")}
    return shape_key(inputs, torch.zeros(label_rows or rows))


def test_a_step_replays_the_shortest_longer_graph_with_its_rows_and_labels() -> None:
    captured = [_key(64, 128), _key(64, 96), _key(64, 32), _key(2, 128), _key(64, 128, label_rows=32)]
    assert longer_captured(_key(64, 64), captured) == _key(64, 96)
    assert longer_captured(_key(64, 96), captured) == _key(64, 128)
    assert longer_captured(_key(64, 128), captured) is None  # nothing longer
    assert longer_captured(_key(4, 64), captured) is None  # other rows: an epoch's short last step
    assert key_length(_key(64, 96)) == 96


def test_a_rare_shape_pads_up_for_its_first_steps_then_gets_its_own_graph() -> None:
    cpu = Device(kind="cpu", torch_device=torch.device("cpu"), name="cpu", autocast_dtype=None)
    step = GraphedFusedStep(model=None, randomness=RunRandomness([CounterStream(0)]), kind="classification", device=cpu,
                            losses=None)
    assert not step.capturing_allowed and step.longer_graph_to_replay(_key(64, 64)) is None  # a CPU replays nothing
    step.capturing_allowed = True
    step.graphs = {_key(64, 128): object()}  # a graph captured at 128 tokens
    assert step.longer_graph_to_replay(_key(64, 128)) is None  # its own
    assert [step.longer_graph_to_replay(_key(64, 64)) for _ in range(PAD_UP_STEPS + 1)] == [_key(64, 128)] * PAD_UP_STEPS + [None]
    assert step.longer_graph_to_replay(_key(64, 96)) == _key(64, 128)  # each shape counts its own
    assert step.counts()["padded_up_steps"] == PAD_UP_STEPS + 1


def test_the_token_axis_pads_to_the_bucket_with_masked_zeros() -> None:
    inputs = {"input_ids": torch.ones(2, 40, dtype=torch.long), "attention_mask": torch.ones(2, 40, dtype=torch.long)}
    padded = pad_to_bucket(inputs, 32)
    assert padded["input_ids"].shape == (2, 64) and padded["attention_mask"][:, 40:].eq(0).all()
    assert pad_to_bucket(padded, 32)["input_ids"].shape == (2, 64)
