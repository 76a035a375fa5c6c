"""SQuAD steps at the lengths a run trains them at, for bench-gpu's `squad_lengths` batch set.

A SQuAD run's features are windows of at most 384 tokens (stride 128), and its batches are length-grouped and
padded only to their longest row: most windows are far shorter than 384 (a context averages a few hundred words),
so `padded_384` (every step at 384 tokens) is SQuAD's longest step, not its typical one. `make gpu-carry` writes
one epoch's padded batch lengths, from the local SQuAD files through the trainer's own feature and batching code
(`write_squad_lengths`), and bench-gpu builds steps of those lengths (`batches_at_lengths`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

Batch = dict[str, torch.Tensor]


def write_squad_lengths(path: str | Path, data_dir: str | None, tokenizer_name: str | None, pad_multiple: int) -> dict[str, Any]:
    """squad_lengths into `path` (JSON); returns what it wrote."""
    written = squad_lengths(data_dir, tokenizer_name, pad_multiple)
    Path(path).write_text(json.dumps(written) + "\n")
    return written


def squad_lengths(data_dir: str | None, tokenizer_name: str | None, pad_multiple: int, max_length: int = 384,
                  doc_stride: int = 128, batch_size: int = 32) -> dict[str, Any]:
    """One epoch's padded batch lengths of a SQuAD run (seed 0), with the tokens a feature is padded to on average
    (adaptune.sweep.cost.MEAN_PADDED_LENGTH)."""
    from adaptune.data.tasks import get_task
    from adaptune.model.backbone import load_tokenizer
    from adaptune.train.config import TrainConfig
    from adaptune.train.loop import prepare_data

    config = TrainConfig(task="squad", method={"name": "adapters", "size": 64}, max_length=max_length, doc_stride=doc_stride,
                         batch_size=batch_size)
    data, _ = prepare_data(config, get_task("squad"), load_tokenizer(tokenizer_name or config.backbone), data_dir, None)
    lengths = [len(row["input_ids"]) for row in data.train_rows]
    padded, mean_padded = padded_batch_lengths(lengths, batch_size, pad_multiple)
    return {"data_split": data.data_split, "split_note": data.split_note, "features": len(lengths), "max_length": max_length,
            "doc_stride": doc_stride, "batch_size": batch_size, "pad_multiple": pad_multiple,
            "mean_feature_length": round(sum(lengths) / len(lengths), 1), "mean_padded_length": round(mean_padded, 1),
            "padded_lengths": padded}


def padded_batch_lengths(lengths: list[int], batch_size: int, pad_multiple: int) -> tuple[list[int], float]:
    """Rows of these lengths in one epoch's training batches (adaptune.data.batching.epoch_batches, seed 0), each
    batch padded to its longest row rounded up to `pad_multiple`: each batch's padded length, and the tokens a row
    is padded to on average."""
    from adaptune.data.batching import epoch_batches

    batches = epoch_batches(lengths, batch_size, 0, 0)
    padded = [-(-max(lengths[i] for i in batch) // pad_multiple) * pad_multiple for batch in batches]
    return padded, sum(length * len(batch) for length, batch in zip(padded, batches, strict=True)) / len(lengths)


def batches_at_lengths(batches: list[Batch], padded_lengths: list[int], seed: int = 0) -> list[Batch]:
    """`batches` cut or padded, one each, to lengths spread evenly over `padded_lengths`' distribution (its
    quantiles, so their mean is the distribution's: SQuAD's, or one length for bench-gpu's `tokens_<L>`), in a
    seeded order as training meets them; every position attended (a SQuAD window is real tokens up to its
    batch's longest, near enough in a length-grouped batch)."""
    ordered = sorted(padded_lengths)
    count = len(batches)
    chosen = [ordered[min(len(ordered) - 1, (2 * index + 1) * len(ordered) // (2 * count))] for index in range(count)]
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    return [_resized(batch, chosen[position]) for batch, position in zip(batches, order, strict=True)]


def _resized(batch: Batch, length: int) -> Batch:
    resized = {}
    for name, tensor in batch.items():
        if tensor.dim() == 2:
            tensor = tensor[:, :length] if tensor.shape[1] >= length else torch.nn.functional.pad(tensor, (0, length - tensor.shape[1]))
            if name == "attention_mask":
                tensor = torch.ones_like(tensor)
        resized[name] = tensor
    return resized


def read_padded_lengths(path: str | Path) -> list[int] | None:
    """The padded lengths write_squad_lengths wrote, or None where there is no such file."""
    path = Path(path)
    return json.loads(path.read_text())["padded_lengths"] if path.is_file() else None
