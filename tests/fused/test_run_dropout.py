"""Counter-based dropout masks (adaptune.fused.run_dropout, ADAPTUNE_DROPOUT_MASKS=counter): a run's mask
bits are a pure function of its seed, its draw count and each position's coordinates in its own block.

The masks are deterministic, so these statistics are fixed numbers, not flaky draws: each bound is 5
standard errors of the quantity for independent Bernoulli(0.9) bits (a correlation's standard error is
1/sqrt(n)), far below what a broken hash gives (a reused key or an ignored axis gives 1.0).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from adaptune.core import environment
from adaptune.fused.run_dropout import (
    CounterStream,
    RunDropout,
    RunRandomness,
    additive_mask,
    counter_keep_mask,
    dropout_stream,
    fused_counter_keep_mask,
    saved_scheme,
    use_run_dropout,
)
from adaptune.fused.settings import StepSettings
from bench.counter_scheme import defined_keep_mask as _defined_keep_mask

P = 0.1
ATTENTION = (3, 32, 12, 48, 48)  # runs, rows, heads, queries, keys


def _mask(seeds: tuple[int, ...], draw: int, shape: tuple[int, ...]) -> torch.Tensor:
    keys = torch.tensor([CounterStream(seed).keys for seed in seeds], dtype=torch.int64)
    return counter_keep_mask(keys, torch.full((len(seeds),), draw), shape, P)


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().float(), b.flatten().float()]))[0, 1])


def test_counter_masks_keep_one_minus_p_independently_across_positions_runs_and_draws() -> None:
    mask = _mask((0, 1, 2), 0, ATTENTION)
    assert mask.shape == ATTENTION and mask.dtype == torch.bool
    n = mask[0].numel()
    for run in range(3):
        assert abs(float(mask[run].float().mean()) - (1 - P)) < 5 * math.sqrt(P * (1 - P) / n)
    bound = 5 / math.sqrt(n)
    for axis in range(1, 5):  # neighbours along every axis of the block
        ahead, behind = mask.narrow(axis, 1, ATTENTION[axis] - 1), mask.narrow(axis, 0, ATTENTION[axis] - 1)
        assert abs(_correlation(ahead, behind)) < 5 / math.sqrt(ahead.numel())
    assert abs(_correlation(mask[0], mask[1])) < bound  # seeds 0 and 1
    assert abs(_correlation(mask, _mask((0, 1, 2), 1, ATTENTION))) < 5 / math.sqrt(mask.numel())  # next draw


def test_a_runs_counter_mask_does_not_depend_on_its_block_nor_on_the_other_runs() -> None:
    group = _mask((5, 7, 9), 3, ATTENTION)
    alone = _mask((7,), 3, (1, 20, 12, 30, 30))  # its own rows and length, no padding
    assert torch.equal(alone[0], group[1, :20, :, :30, :30])
    reordered = _mask((9, 7), 3, (2, 32, 12, 48, 48))
    assert torch.equal(reordered[1], group[1])
    hidden = _mask((7,), 3, (1, 20, 30, 384))  # rows, tokens, features
    assert torch.equal(hidden[0, :8, :10], _mask((7,), 3, (1, 8, 10, 384))[0])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.73, 1e-9])
def test_the_masks_are_the_schemes_defined_bits(p: float) -> None:
    """counter_keep_mask draws the definition's bits at every block rank, on rows whose index sets the top
    bit of the 32-bit word and at thresholds above 2^31 (p >= 0.5): where a narrower-integer form would
    go wrong first."""
    keys = torch.tensor([CounterStream(seed).keys for seed in (0, 5, 2**40 + 3)], dtype=torch.int64)
    draws = torch.tensor([0, 7, 2**33 + 1])
    for shape in ((3, 4096), (3, 1500, 40), (3, 2048, 3, 24), (3, 256, 2, 5, 9)):
        mask = counter_keep_mask(keys, draws, shape, p)
        assert torch.equal(mask, _defined_keep_mask(keys, draws, shape, p)), shape
    assert not counter_keep_mask(keys, draws, (3, 8), 1.0).any()


def test_the_one_kernel_form_draws_the_same_bits() -> None:
    """What a GPU draws (torch.compile's inductor, here for the CPU: the same integer operators)."""
    keys = torch.tensor([CounterStream(seed).keys for seed in (5, 7, 9)], dtype=torch.int64)
    draws = torch.tensor([3, 0, 11])
    for shape in (ATTENTION, (3, 32, 40, 384)):
        fused = fused_counter_keep_mask()(keys, draws, torch.empty(shape, device="meta"), P)
        assert torch.equal(fused, counter_keep_mask(keys, draws, shape, P))
    top_bit_rows = (3, 256, 2, 5, 9)  # and a threshold above 2^31: the generated code's int32 words wrap as eager's do
    fused = fused_counter_keep_mask()(keys, draws, torch.empty(top_bit_rows, device="meta"), 0.73)
    assert torch.equal(fused, _defined_keep_mask(keys, draws, top_bit_rows, 0.73))


def test_the_one_kernel_form_draws_the_same_bits_at_a_training_steps_inputs() -> None:
    """The same at what a group's step hands it: int32 draws (`base + site`), counts past 2^31, block shapes one after
    another (dynamic sizes), as `make bench-gpu`'s dropout check asks a GPU (bench.gpu_fused)."""
    from adaptune.core.devices import Device
    from bench.gpu_fused import fused_mask_equals_eager_in_training

    assert fused_mask_equals_eager_in_training(2, Device("cpu", torch.device("cpu"), "cpu", None), 24) == {
        "small_counts": True, "counts_past_2_31": True}


def test_the_attention_mask_is_built_without_asking_whether_a_batch_has_padding() -> None:
    """transformers skips the mask of a batch without padding, which reads the mask on the host (a device sync
    per forward pass, and what no CUDA graph can hold); run_dropout's attention always gets one: zeros there."""
    from transformers.masking_utils import bidirectional_mask_function

    mask = additive_mask(batch_size=2, q_length=5, kv_length=5, mask_function=bidirectional_mask_function,
                         attention_mask=torch.ones(2, 5, dtype=torch.bool), allow_is_bidirectional_skip=True, dtype=torch.float32)
    assert mask is not None and mask.shape == (2, 1, 5, 5) and not mask.any()
    padded = additive_mask(batch_size=1, q_length=3, kv_length=3, mask_function=bidirectional_mask_function,
                           attention_mask=torch.tensor([[True, True, False]]), dtype=torch.float32)
    assert (padded[0, 0, :, 2] < -1e30).all() and not padded[0, 0, :, :2].any()


def test_run_dropout_draws_counter_masks_and_advances_each_runs_count() -> None:
    streams = [CounterStream(0), CounterStream(1)]
    dropout = RunDropout(P, RunRandomness(streams)).train()
    randomness, x = dropout.randomness, torch.ones(2 * 4, 6, 16)
    randomness.advance()  # what use_run_dropout's model does before each training forward pass
    out = dropout(x)
    expected = _mask((0, 1), 0, (2, 4, 6, 16)).reshape(x.shape) / (1 - P)
    assert torch.equal(out, expected)
    assert [stream.draws for stream in streams] == [1, 1]  # counted on the device, read back on demand
    with pytest.raises(RuntimeError, match="dropout site 0 drew a second mask in one forward pass: call advance"):
        dropout(x)  # the same site again before the next pass would repeat its mask
    randomness.advance()
    assert not torch.equal(dropout(x), out)  # the next pass draws another mask
    restored = CounterStream(0)
    restored.set_state(streams[0].get_state())
    assert restored.draws == 2 and saved_scheme(streams[0].get_state()) == "counter"
    streams[1].set_state(torch.tensor([streams[1].get_state()[0], 0]))  # a resumed run's count goes to the device
    randomness.keep([1])  # run 0 left the group: run 1 goes on from its own count
    randomness.advance()
    assert torch.equal(dropout(x[4:]), out[4:]) and streams[1].draws == 1 and streams[0].draws == 2
    assert saved_scheme(torch.Generator().get_state()) == "generator" and saved_scheme(None) is None


def test_a_generator_mask_is_the_runs_own_bits_drawn_in_place_where_the_run_fills_its_block() -> None:
    """Each run draws its mask from its own generator at its own shape, whatever its block: a run as long
    as its block draws straight into it (no copy, no fill: on a GPU each is a kernel launch per run and
    site); a shorter one draws at its own shape and its padding stays unmasked."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from adaptune.fused.run_dropout import RowLayout

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    runs, rows, length, features = 3, 4, 6, 8
    x = torch.ones(runs * rows, length, features)
    for lengths in ((6, 6, 6), (6, 4, 6)):
        alone = [torch.empty(rows, own, features).bernoulli_(1 - P, generator=torch.Generator().manual_seed(seed)) / (1 - P)
                 for seed, own in enumerate(lengths)]
        randomness = RunRandomness([torch.Generator().manual_seed(seed) for seed in range(runs)])
        dropout = RunDropout(P, randomness).train()
        randomness.layout = RowLayout(rows, [rows] * runs, list(lengths))
        with Ops() as ops:
            out = dropout(x).reshape(runs, rows, length, features)
        for run, own in enumerate(lengths):
            assert torch.equal(out[run, :, :own], alone[run])
            assert torch.equal(out[run, :, own:], torch.full_like(out[run, :, own:], 1 / (1 - P)))  # padding: unmasked
        padded = sum(own < length for own in lengths)
        assert ops.names.count("bernoulli_") == runs and ops.names.count("copy_") == padded
        assert ops.names.count("fill_") + ops.names.count("ones") + ops.names.count("new_ones") == (1 if padded else 0)


def test_a_bert_forward_pass_reaches_its_sites_in_order_and_draws_each_runs_next_masks() -> None:
    """The sites are numbered in the order a BERT forward pass reaches them, so pass t of a run draws masks
    t * sites + 0, 1, ... in that order: the numbers a count advanced at every draw gave. Evaluation draws none."""
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    model = BertForSequenceClassification(config)
    streams = [CounterStream(3), CounterStream(8)]
    randomness = use_run_dropout(model, streams)
    reached: list[tuple[RunDropout, torch.Tensor, torch.Tensor]] = []
    for module in model.modules():
        if isinstance(module, RunDropout):
            module.register_forward_hook(lambda module, args, out: reached.append((module, args[0], out)))
    inputs = torch.randint(0, 100, (2 * 2, 5))
    model.train()
    for passed in range(2):
        reached.clear()
        model(input_ids=inputs)
        assert [module.site for module, _, _ in reached] == list(range(8)) and randomness.sites == 8
        for module, x, out in reached:
            blocks = x.reshape(2, -1, *x.shape[1:])
            mask = counter_keep_mask(randomness.keys, torch.full((2,), passed * 8 + module.site), blocks.shape, module.p)
            assert torch.equal(out, (blocks * mask).reshape(x.shape) / (1 - module.p)), module.site
        assert [stream.draws for stream in streams] == [8 * (passed + 1)] * 2
    model.eval()
    model(input_ids=inputs)
    assert [stream.draws for stream in streams] == [16, 16]


def test_the_mask_scheme_is_a_setting_checked_at_once() -> None:
    with environment.patch(dropout_masks=None):
        scheme = StepSettings.from_environment().dropout_masks
    assert scheme == "generator" and isinstance(dropout_stream(0, torch.device("cpu"), scheme), torch.Generator)
    with environment.patch(dropout_masks="counter"):
        assert isinstance(dropout_stream(0, torch.device("cpu"), StepSettings.from_environment().dropout_masks), CounterStream)
    with environment.patch(dropout_masks="philox"), \
            pytest.raises(ValueError, match="ADAPTUNE_DROPOUT_MASKS='philox' is not valid: use one of generator, counter"):
        StepSettings.from_environment()
    with pytest.raises(ValueError, match="one scheme"):
        RunRandomness([CounterStream(0), torch.Generator()])
    with pytest.raises(ValueError, match="ADAPTUNE_DROPOUT_MASKS=generator"):
        _mask((0,), 0, (1, 300, 12, 48, 48))  # 300 rows exceed the attention block's 8 bits
