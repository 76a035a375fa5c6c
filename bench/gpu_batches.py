"""bench-gpu's batches: real GLUE training rows tokenized with BERT's uncased vocabulary, length-grouped and padded as
training pads them (and the same rows padded to 128, to 384, to SQuAD's own lengths or to fixed lengths), and the
scales they feed (the paper's BERT-base and -large, or a rehearsal's tiny BERT)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adaptune.core.devices import Device
from bench.squad_lengths import batches_at_lengths, read_padded_lengths

BATCH_SIZE = 32
MAX_LENGTH = 128
SQUAD_LENGTH = 384  # the paper's SQuAD windows (max_length 384, doc stride 128)
SQUAD_LENGTHS_FILE = ".devcarry/squad_lengths.json"  # make gpu-carry
TASKS = ("cola", "sst2", "mrpc", "rte")
BATCHES_PER_TASK = 16
CUDA_PAD_MULTIPLE = 8  # adaptune.core.devices.Device.pad_multiple on a GPU
SAMPLE_ROWS = 8192  # per task: a seeded random sample, many length-grouped mega-batches of 50 batches


@dataclass(frozen=True)
class Scale:
    """The backbones' shapes and how many real rows feed them: the paper's, or a rehearsal's."""

    configs: dict[str, dict[str, int]]
    sample_rows: int
    batches_per_task: int
    shard_train_rows: int | None = None  # None: the option's value


CONFIGS = {
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "bert-large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
}
FULL_SCALE = Scale(CONFIGS, SAMPLE_ROWS, BATCHES_PER_TASK)
# Every part on this machine (the CPU too) in a minute or two: a check that the benchmark runs before a
# lent GPU's minutes go to it; its figures measure nothing.
# 12 layers, as BERT-base: every top_k depth a part asks for exists.
_TINY = {"hidden_size": 32, "num_hidden_layers": 12, "num_attention_heads": 2, "intermediate_size": 64}
REHEARSAL = Scale({name: _TINY for name in CONFIGS}, sample_rows=256, batches_per_task=2, shard_train_rows=32)
Batch = dict[str, torch.Tensor]


def cached_batches(cache: str | None, data_dir: str | None, tokenizer_name: str | None, device: Device, scale: Scale = FULL_SCALE,
                   pad_multiple: int | None = None, squad_lengths: str | None = None) -> dict[str, list[Batch]]:
    """real_batches, kept in `cache` (a torch file) when one is named: the same batches for every call; and
    "padded_384", the padded rows padded on to SQuAD's 384 tokens, and where the file `squad_lengths` is,
    "squad_lengths", the padded rows cut or padded to SQuAD's own batch lengths (bench.squad_lengths;
    both made on loading, never cached)."""
    if cache and Path(cache).is_file():
        batch_sets = {name: [{k: v.to(device.torch_device) for k, v in b.items()} for b in batches]
                      for name, batches in torch.load(cache, weights_only=True).items()}
    else:
        batch_sets = real_batches(data_dir, tokenizer_name, device, scale, pad_multiple)
        if cache:
            torch.save({name: [{k: v.cpu() for k, v in b.items()} for b in batches] for name, batches in batch_sets.items()}, cache)
    padded_lengths = read_padded_lengths(squad_lengths) if squad_lengths else None
    squad = {"squad_lengths": batches_at_lengths(batch_sets["padded_128"], padded_lengths)} if padded_lengths else {}
    return {**batch_sets, "padded_384": padded_on(batch_sets["padded_128"], SQUAD_LENGTH), **squad}


def fixed_length_sets(names: Sequence[str], batch_sets: dict[str, list[Batch]]) -> dict[str, list[Batch]]:
    """The `tokens_<L>` batch sets named: every step of padded_128's rows cut or padded to L tokens, every position
    attended, so that a step's time can be read against its tokens alone (a device-bound step grows with them)."""
    wanted = [name for name in names if re.fullmatch(r"tokens_\d+", name)]
    if not wanted or "padded_128" not in batch_sets:
        return {}
    return {name: batches_at_lengths(batch_sets["padded_128"], [int(name.removeprefix("tokens_"))]) for name in wanted}


def padded_on(batches: list[Batch], length: int) -> list[Batch]:
    """The batches padded with zeros (BERT's [PAD] id, no attention, segment 0) to `length` tokens: at 384, SQuAD's
    longest step (its windows are mostly far shorter: `squad_lengths`) on the same real rows, for its speed and memory."""
    return [{name: torch.nn.functional.pad(tensor, (0, length - tensor.shape[1])) if tensor.dim() == 2 else tensor
             for name, tensor in batch.items()} for batch in batches]


def real_batches(data_dir: str | None, tokenizer_name: str | None, device: Device, scale: Scale = FULL_SCALE,
                 pad_multiple: int | None = None) -> dict[str, list[Batch]]:
    """Length-grouped, dynamically padded batches of real training rows (as training draws them, to the
    device's pad multiple or `pad_multiple`), and the same rows padded to MAX_LENGTH."""
    from datasets import DatasetDict

    from adaptune.core.backbones import DEFAULT_BACKBONE
    from adaptune.data.batching import epoch_batches, make_collator, model_rows, subsample
    from adaptune.data.loading import load_task_data
    from adaptune.data.tasks import get_task
    from adaptune.data.token_cache import tokenize_task
    from adaptune.model.backbone import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_name or DEFAULT_BACKBONE)
    dynamic = make_collator(tokenizer, pad_to_multiple_of=pad_multiple or device.pad_multiple)
    padded = make_collator(tokenizer, pad_to_length=MAX_LENGTH)
    grouped, fixed = [], []
    generator = torch.Generator().manual_seed(0)
    for name in TASKS:
        task = get_task(name)
        raw = subsample(load_task_data(task, data_dir, splits=("train",))["train"], scale.sample_rows)
        rows = model_rows(tokenize_task(task, DatasetDict(train=raw), tokenizer, MAX_LENGTH, None)["train"])
        order = epoch_batches([len(row["input_ids"]) for row in rows], BATCH_SIZE, seed=0, epoch=0)
        order = [b for b in order if len(b) == BATCH_SIZE]
        for index in torch.randperm(len(order), generator=generator)[: scale.batches_per_task].tolist():
            chosen = [rows[i] for i in order[index]]
            grouped.append(dynamic(chosen))
            fixed.append(padded(chosen))
        log(f"{name}: {len(rows)} rows tokenized")
    move = lambda batches: [{k: v.to(device.torch_device) for k, v in b.items()} for b in batches]  # noqa: E731
    return {"length_grouped": move(grouped), "padded_128": move(fixed)}


def describe(batches: list[Batch]) -> dict[str, Any]:
    computed = sum(b["input_ids"].numel() for b in batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    return {"count": len(batches), "tasks": list(TASKS), "real_tokens": real, "computed_tokens": computed,
            "mean_padded_length": round(computed / len(batches) / BATCH_SIZE, 1)}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
