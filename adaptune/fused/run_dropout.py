"""Dropout whose masks come from each run's own seed, so a run's result does not depend on which runs
shared its forward pass (adaptune.fused.run_groups), nor on whether it trained alone.

Two ways to draw them (`ADAPTUNE_DROPOUT_MASKS`, recorded in each run's state; a resumed run keeps its own):
- "generator" (the default): each run's own `torch.Generator`, one draw per run per dropout site, in
  the run's own shape (below). k runs cost k random-number kernels and k copies per site.
- "counter": a mask bit is a keyed hash of (the run's seed, how many masks the run has drawn, the
  position's coordinates in the run's own block), counter-based as Philox is (Salmon et al., SC 2011),
  so one set of elementwise operators draws every run's mask at once, whatever k, and no padding or
  block size can move a run's bits. Written with plain integer tensor operators so that it runs on
  any device and torch.compile can fuse it into one kernel; no library offers a keyed elementwise
  hash, and torch's generators take one seed per call. With `ADAPTUNE_DROPOUT=kernel`, a hidden-state
  site's mask is drawn and applied in one Triton kernel instead (adaptune.fused.kernels.dropout: the same bits,
  checked on an H100). Compiled (torch.compile's Triton code) the hash drew other bits on an H100
  (fused_counter_keep_mask), so compiled layers' masks are not known to be these there.

Every dropout of a training model (the embeddings', each sublayer's, the attention probabilities',
the classifier's, LoRA's) becomes a `RunDropout`. It draws run i's mask from run i's own
`torch.Generator`, in the shape run i's batch has when it trains alone: its real rows, padded to its
own longest row. A group pads every run's rows to a common length and block size; the mask is drawn
at the run's own shape and laid into the top-left of its block (what lies outside is padding, which
no real position reads). The same run, step and site thus get the same mask in any group.

The attention probabilities' dropout lives inside transformers' attention function, which draws from
the global generator; `RUN_DROPOUT_ATTENTION` is an attention function (registered with transformers'
AttentionInterface) that applies the layer's RunDropout there instead, and uses SDPA where no dropout
applies (evaluation).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

from adaptune.core.environment import SettingError
from adaptune.fused.kernels import attention as attention_kernel
from adaptune.fused.kernels import dropout as dropout_kernel
from adaptune.fused.kernels.counter_coordinates import COORDINATE_BITS, keep_threshold
from adaptune.fused.settings import DROPOUT_MASKS_ENV, VALUES, StepSettings

RUN_DROPOUT_ATTENTION = "adaptune_run_dropout"
MASK_SCHEMES = VALUES["dropout_masks"]
# Each run's dropout stream is its own generator, apart from the data-order streams
# (batching.epoch_batches seeds seed * 1_000_003 + epoch, with epoch < 1_000_002).
_DROPOUT_STREAM = 1_000_002


_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1
_SIGN = -(1 << 31)  # the top bit of an int32 word
_COUNTER_STATE_TAG = 0x5EED  # a counter stream's saved state: [tag, draws]


def dropout_generator(seed: int, device: torch.device) -> torch.Generator:
    if device.type == "xla":  # torch_xla has no device generator ("XLA device type not an accelerator")
        raise SettingError(f"{DROPOUT_MASKS_ENV}=generator cannot draw on an XLA device (torch_xla has no device generator): "
                           f"set {DROPOUT_MASKS_ENV}=counter, as the TPU preset does")
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + _DROPOUT_STREAM)


def saved_scheme(state: torch.Tensor | None) -> str | None:
    """The scheme a saved stream state (a stream's get_state()) belongs to; None for none saved."""
    if state is None:
        return None
    if state.dtype == torch.int64 and state.numel() == 2 and int(state[0]) == _COUNTER_STATE_TAG:
        return "counter"
    return "generator"


class CounterStream:
    """A run's counter-based mask stream: two 32-bit keys from its seed, and how many masks it has
    drawn (its whole state: a resumed run continues from its count). Once a RunRandomness holds it,
    the count lives on the device (no host sync per draw) and is read back only to be saved."""

    def __init__(self, seed: int) -> None:
        mixed = _splitmix64(seed * 1_000_003 + _DROPOUT_STREAM)
        self.keys = (mixed & _M32, mixed >> 32)
        self._draws = 0
        self._held: tuple[RunRandomness, int] | None = None

    @property
    def draws(self) -> int:
        if self._held is None:
            return self._draws
        randomness, index = self._held
        return int(randomness.draws[index])

    def get_state(self) -> torch.Tensor:
        return torch.tensor([_COUNTER_STATE_TAG, self.draws], dtype=torch.int64)

    def set_state(self, state: torch.Tensor) -> None:
        if saved_scheme(state) != "counter":
            raise ValueError("this saved dropout state was drawn by a generator, not a counter stream")
        self._draws = int(state[1])
        if self._held is not None:
            randomness, index = self._held
            randomness.draws[index] = self._draws


def dropout_stream(seed: int, device: torch.device, scheme: str) -> torch.Generator | CounterStream:
    """A run's dropout stream in `scheme` ("generator" or "counter")."""
    if scheme == "counter":
        return CounterStream(seed)
    return dropout_generator(seed, device)


def counter_keep_mask(keys: torch.Tensor, draws: torch.Tensor, shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """Every run's keep-mask for one dropout site at once: bool, `shape` = (runs, *block). Position c of
    run i is kept iff hash(keys[i], draws[i], c) >= p * 2^32, with c the position's coordinates in the
    run's block (row, token, feature, ...): the same bits for the same run, draw and position in any
    block. `keys`: (runs, 2) 32-bit words and `draws`: (runs,), int64 or int32 on the mask's device.

    Computed in int32, whose products wrap modulo 2^32 on every backend torch has (two's complement): the
    words of the unsigned 32-bit definition, held as signed. Half the bytes of an int64 form and, on a GPU,
    no emulated 64-bit multiplies; tests/fused/test_run_dropout.py holds the definition this must equal."""
    own = tuple(shape[1:])
    widths = COORDINATE_BITS.get(len(own))
    if widths is None or any(size > 1 << width for size, width in zip(own, widths, strict=True)):
        raise ValueError(f"counter dropout masks take blocks of rank 1-4 whose axes fit {widths or COORDINATE_BITS} bits; "
                         f"got {own}: use {DROPOUT_MASKS_ENV}=generator")
    threshold = keep_threshold(p)
    if threshold > _M32:  # p = 1: no 32-bit word reaches it
        return torch.zeros(shape, dtype=torch.bool, device=keys.device)
    device, dims = keys.device, len(own)
    index, shift = None, 32
    for axis, (size, width) in enumerate(zip(own, widths, strict=True)):
        shift -= width
        term = (torch.arange(size, device=device, dtype=torch.int32) << shift).view(size, *([1] * (dims - axis - 1)))
        index = term if index is None else index + term
    assert index is not None  # the block has 1-4 axes (checked above)
    per_run = (-1, *([1] * dims))
    keys, draws = _as_int32(keys), _as_int32(draws)
    first = (keys[:, 0] ^ _mix32(draws)).view(per_run)
    second = (keys[:, 1] ^ _mix32(draws ^ 0x5BD1E995)).view(per_run)
    bits = _mix32(_mix32(index.unsqueeze(0) ^ first) ^ second)
    # unsigned bits >= threshold, in signed int32: flipping the top bit maps unsigned order onto signed order
    return (bits ^ _SIGN) >= _signed32(threshold ^ (1 << 31))


@functools.cache
def fused_counter_keep_mask() -> Callable[..., torch.Tensor]:
    """counter_keep_mask as one kernel (torch.compile), the mask's shape given as a meta tensor's, whose sizes
    compile as symbols: (keys, draws, like, p) -> mask. Training no longer draws masks with it: on the CPU it
    draws counter_keep_mask's bits (tests/fused/test_run_dropout.py), but on an H100 it drew others at a training
    step's inputs (bench/LOG.md, "Step graphs' constants"), while the dropout kernel (adaptune.fused.kernels.dropout)
    and the eager operators agreed bit for bit. Kept
    for bench-gpu's check (bench/gpu_fused.py), which tells the next GPU call whether that changes."""
    return torch.compile(_keep_mask_like, dynamic=True)


def _keep_mask_like(keys: torch.Tensor, draws: torch.Tensor, like: torch.Tensor, p: float) -> torch.Tensor:
    return counter_keep_mask(keys, draws, like.shape, p)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply) on int32 words: products wrap modulo 2^32, and the
    `& 0xFFFF` makes each arithmetic shift a logical one."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x45D9F3B
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x45D9F3B
    return x ^ ((x >> 16) & 0xFFFF)


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    """The low 32 bits of int64 values as int32 words (brought into int32's range first: no narrowing
    cast of an out-of-range value, whose result C++ leaves to the implementation)."""
    if words.dtype == torch.int32:
        return words
    return (((words + (1 << 31)) & _M32) - (1 << 31)).to(torch.int32)


def _signed32(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


def _splitmix64(value: int) -> int:
    z = (value + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


@dataclasses.dataclass
class RowLayout:
    """How a step's rows split into runs: k blocks of `block_rows` rows; run i's first `rows[i]` rows
    are real and its own longest row is `lengths[i]` tokens (after the collator's rounding)."""

    block_rows: int
    rows: list[int]
    lengths: list[int]


class RunRandomness(nn.Module):
    """What every RunDropout of one model shares: each run's stream (all generators or all counter
    streams), and the current step's layout (None: the rows are one block per run, at their full
    shape, as when a run trains alone; counter masks need no layout). A module, so that the counter
    streams' keys and counts (buffers, not saved with the model) move with the model to its device.

    Counter masks: each dropout site of the model has an ordinal (RunDropout.site), and a training
    forward pass draws mask `base + site` at it, where `base` is each run's count before the pass;
    `advance()` (the model's forward pre-hook, use_run_dropout) moves the counts on by the number of
    sites, before the pass. Those are the numbers a count advanced at each draw gave, since the sites are
    numbered in the order a BERT forward pass reaches them. Nothing is written during the forward pass, so
    a compiled layer's backward may draw a mask again from the counts (instead of keeping it, one byte
    per element) and find them as they were."""

    # Counter streams' buffers (_hold): each run's two key words, its count, and the counts before this pass.
    keys: torch.Tensor
    draws: torch.Tensor
    base: torch.Tensor

    def __init__(self, streams: list[torch.Generator | CounterStream], settings: StepSettings = StepSettings()) -> None:
        super().__init__()
        schemes = {"counter" if isinstance(stream, CounterStream) else "generator" for stream in streams}
        if len(schemes) != 1:
            raise ValueError("the runs of a group must draw their dropout masks with one scheme")
        self.scheme = schemes.pop()
        # Where the kernels draw the masks themselves: only with counter streams (StepSettings.for_masks).
        settings = settings.for_masks(self.scheme)
        self.attention_kernel, self.dropout_kernel = settings.attention == "kernel", settings.dropout == "kernel"
        self.layout: RowLayout | None = None
        self.sites = 0
        self._drawn: set[int] = set()  # sites drawn since the last advance (checked eagerly)
        self._hold(streams, device=None)

    def add_site(self) -> int:
        """A new dropout site's ordinal."""
        self.sites += 1
        return self.sites - 1

    def advance(self) -> None:
        """Start a training forward pass: every run's count moves past the masks of the pass before."""
        self._drawn.clear()
        if self.scheme == "counter":
            self.base.copy_(_as_int32(self.draws))
            self.draws.add_(self.sites)

    def _hold(self, streams: list[torch.Generator | CounterStream], device: torch.device | None) -> None:
        self.streams = streams
        if self.scheme != "counter":
            return
        counters: list[CounterStream] = streams  # type: ignore[assignment]
        draws = [stream.draws for stream in counters]
        keys = [[_signed32(key) for key in stream.keys] for stream in counters]  # as counter_keep_mask reads them
        self.register_buffer("keys", torch.tensor(keys, dtype=torch.int32, device=device), persistent=False)
        self.register_buffer("draws", torch.tensor(draws, dtype=torch.int64, device=device), persistent=False)
        # The counts before this pass (advance) as the hash reads them, int32 words: one conversion a pass, not one a site.
        self.register_buffer("base", _as_int32(self.draws), persistent=False)
        for index, stream in enumerate(counters):
            stream._held = (self, index)

    def site_draws(self, site: int, ordinal: torch.Tensor) -> torch.Tensor:
        """Each run's draw number at a counter site in this forward pass (`base + site`), checked eagerly
        to be the site's only draw of the pass."""
        if not torch.compiler.is_compiling():
            if site in self._drawn:
                raise RuntimeError(f"dropout site {site} drew a second mask in one forward pass: call advance() before each "
                                   "training forward (use_run_dropout's model does), and reach each site once per pass")
            self._drawn.add(site)
        return self.base + ordinal

    def keep(self, indices: list[int]) -> None:
        kept = [self.streams[i] for i in indices]
        if self.scheme == "counter":
            for stream in self.streams:  # each keeps its count; a run that left no longer reads this module's
                stream._draws, stream._held = stream.draws, None  # type: ignore[union-attr]
        self._hold(kept, self.draws.device if self.scheme == "counter" else None)

    def counter_mask(self, shape: torch.Size, p: float, site: int, ordinal: torch.Tensor) -> torch.Tensor:
        """Every run's mask for one site (counter_keep_mask): draw `base + site`, the site's ordinal also
        given as a tensor (`ordinal`), so that one compiled layer serves every layer's sites."""
        draws = self.site_draws(site, ordinal)
        # Eager operators on a GPU too: the compiled form drew other bits than these on an H100 at a training step's
        # inputs, where the dropout kernel drew these exactly (bench/LOG.md, "Step graphs' constants").
        return counter_keep_mask(self.keys, draws, shape, p)


class RunDropout(nn.Module):
    """nn.Dropout with per-run masks (module docstring). Inputs: (rows, features) after pooling,
    (rows, tokens, features) in the sublayers, (rows, heads, tokens, tokens) for attention."""

    ordinal: torch.Tensor  # a buffer: the site's ordinal

    def __init__(self, p: float, randomness: RunRandomness) -> None:
        super().__init__()
        self.p = p
        self.randomness = randomness
        self.site = randomness.add_site() if p > 0 else -1
        self.register_buffer("ordinal", torch.tensor(self.site, dtype=torch.int32), persistent=False)  # a graph input, not a constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        randomness = self.randomness
        blocks = x.reshape(len(randomness.streams), -1, *x.shape[1:])
        if randomness.scheme == "counter":
            if randomness.dropout_kernel and dropout_kernel.kernel_applies(blocks, self.p):  # drawn and applied in one kernel, no mask kept
                draws = randomness.site_draws(self.site, self.ordinal)
                return dropout_kernel.run_dropout(blocks, randomness.keys, draws, keep_threshold(self.p), self.p).reshape(x.shape)
            return (blocks * randomness.counter_mask(blocks.shape, self.p, self.site, self.ordinal)).reshape(x.shape) / (1 - self.p)
        layout, block = randomness.layout, tuple(blocks.shape[1:])
        owns = [block if layout is None else _own_shape(blocks.shape[1:], layout.rows[run], layout.lengths[run])
                for run in range(len(randomness.streams))]
        # A run that fills its block draws its mask in place; one with padding draws at its own shape (the
        # same bits as alone) into a copy that lands in its region, its padding kept whole (one fill for all).
        mask = blocks.new_ones(blocks.shape) if any(own != block for own in owns) else torch.empty_like(blocks)
        generators = cast(list[torch.Generator], randomness.streams)  # not "counter": every stream is a generator
        for run, (generator, own) in enumerate(zip(generators, owns, strict=True)):
            if own == block:
                mask[run].bernoulli_(1 - self.p, generator=generator)
            else:
                region = tuple(slice(0, size) for size in own)
                mask[run][region] = torch.empty(own, device=x.device, dtype=x.dtype).bernoulli_(1 - self.p, generator=generator)
        return (blocks * mask).reshape(x.shape) / (1 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _own_shape(block_shape: torch.Size, rows: int, length: int) -> tuple[int, ...]:
    """A run's own shape within its block: its real rows, and its own length on the token axes."""
    if len(block_shape) == 4:  # attention probabilities: rows, heads, queries, keys
        return (rows, block_shape[1], length, length)
    if len(block_shape) == 3:  # rows, tokens, features
        return (rows, length, block_shape[2])
    return (rows, *block_shape[1:])


def use_run_dropout(model: nn.Module, streams: list[torch.Generator | CounterStream],
                    settings: StepSettings = StepSettings()) -> RunRandomness:
    """Replace every nn.Dropout of the model by a RunDropout drawing from `streams` (one per run: all
    generators or all counter streams), and route attention through RUN_DROPOUT_ATTENTION; in place. The
    kernels `settings` ask for draw counter masks where they apply. Returns the shared RunRandomness."""
    randomness = RunRandomness(streams, settings)
    # Depth first, in module order: the order a BERT forward pass reaches them (embeddings, each layer's
    # attention probabilities, attention output and output, the head's), which numbers their sites.
    dropouts = [(name, module) for name, module in model.named_modules(remove_duplicate=False) if isinstance(module, nn.Dropout)]
    for name, dropout in dropouts:
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, RunDropout(dropout.p, randomness).train(dropout.training))
    _set_attention(model)
    model.register_forward_pre_hook(functools.partial(_advance_before_training, randomness))
    return randomness


@torch.compiler.disable  # outside any compiled graph: the counts change between passes, never within one
def _advance_before_training(randomness: RunRandomness, model: nn.Module, args: Any) -> None:
    if model.training:
        randomness.advance()


def _set_attention(model: nn.Module) -> None:
    if RUN_DROPOUT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(RUN_DROPOUT_ATTENTION, run_dropout_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(RUN_DROPOUT_ATTENTION, additive_mask)
    assert isinstance(model, PreTrainedModel), f"{type(model).__name__}: only a transformers model takes an attention implementation"
    model.set_attn_implementation(RUN_DROPOUT_ATTENTION)


def additive_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers' eager (additive) mask, which both branches of run_dropout_attention read, built even
    where no row has padding: deciding to skip it reads the padding mask on the host (a device sync per
    forward pass, and no CUDA graph can hold one); a mask of zeros changes no score."""
    return eager_mask(**{**kwargs, "allow_is_bidirectional_skip": False})


def run_dropout_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                          stacked_projections: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' eager attention with the layer's RunDropout on the probabilities; SDPA without dropout.
    `stacked_projections`: the one tensor query, key and value are views of (frozen_projections), for the kernel."""
    site = getattr(module, "dropout", None)
    if dropout == 0.0 or not isinstance(site, RunDropout):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    scaling = scaling if scaling is not None else query.size(-1) ** -0.5
    randomness = site.randomness
    if randomness.scheme == "counter" and site.training and randomness.attention_kernel and attention_kernel.kernel_applies(query, key, value, site.p,
                                                                                              len(randomness.streams)):
        draws, threshold = randomness.site_draws(site.site, site.ordinal), keep_threshold(site.p)
        if stacked_projections is not None:  # frozen_projections' one matmul: the kernel takes it whole, its gradient too
            return attention_kernel.run_dropout_attention_stacked(stacked_projections, query.shape[1], attention_mask, randomness.keys,
                                                                  draws, threshold, site.p, scaling), None
        return attention_kernel.run_dropout_attention(query, key, value, attention_mask, randomness.keys, draws, threshold,
                                                      site.p, scaling), None
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probabilities = site(nn.functional.softmax(scores, dim=-1))
    return torch.matmul(probabilities, value).transpose(1, 2).contiguous(), probabilities
