"""bench-gpu's `squad_lengths` steps (adaptune.bench.squad_lengths): SQuAD's padded batch lengths, written from the real
SQuAD files (../shared/data) through the trainer's own features and batching, and steps built at them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from adaptune.bench.squad_lengths import read_padded_lengths, squad_length_batches, write_squad_lengths


def test_squad_steps_come_at_squads_own_batch_lengths(tmp_path: Path, shared_data_dir: Path) -> None:
    written = write_squad_lengths(tmp_path / "lengths.json", str(shared_data_dir), None, pad_multiple=8)
    padded = read_padded_lengths(tmp_path / "lengths.json")
    assert padded == written["padded_lengths"] == json.loads((tmp_path / "lengths.json").read_text())["padded_lengths"]
    assert len(padded) == -(-written["features"] // 32)  # one epoch's batches of 32
    assert all(length % 8 == 0 and length <= 384 for length in padded)
    # Most windows are far shorter than 384: length-grouped batches are padded to their own longest only.
    assert written["mean_feature_length"] < 250 and sum(padded) / len(padded) < 260

    rows = torch.arange(32 * 128).reshape(32, 128)
    batches = [{"input_ids": rows + index, "attention_mask": torch.zeros(32, 128, dtype=torch.long),
                "labels": torch.zeros(32, dtype=torch.long)} for index in range(40)]
    steps = squad_length_batches(batches, padded)
    lengths = [step["input_ids"].shape[1] for step in steps]
    assert sorted(lengths) != lengths  # in training's mixed order, not sorted
    assert abs(sum(lengths) / len(lengths) - sum(padded) / len(padded)) < 8  # the distribution's mean, from its quantiles
    assert set(lengths) <= set(padded)
    for step, batch in zip(steps, batches, strict=True):
        length = step["input_ids"].shape[1]
        assert bool(step["attention_mask"].all())  # every position is a real token of the window
        kept = min(length, 128)
        assert torch.equal(step["input_ids"][:, :kept], batch["input_ids"][:, :kept])
        assert torch.equal(step["labels"], batch["labels"])
    assert read_padded_lengths(tmp_path / "absent.json") is None
