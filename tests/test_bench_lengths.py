"""bench-gpu's `squad_lengths` and `tokens_<L>` steps (bench.squad_lengths), and each task's padded row length
(bench.task_lengths): SQuAD's batch lengths written from the real SQuAD files (../shared/data) through the
trainer's own features and batching, and steps built at them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.squad_lengths import batches_at_lengths, read_padded_lengths, write_squad_lengths


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
    steps = batches_at_lengths(batches, padded)
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


def test_tokens_sets_hold_every_step_at_their_length() -> None:
    from bench.gpu_batches import fixed_length_sets

    padded = [{"input_ids": torch.ones(32, 128, dtype=torch.long), "attention_mask": torch.zeros(32, 128, dtype=torch.long),
               "labels": torch.zeros(32, dtype=torch.long)} for _ in range(6)]
    sets = fixed_length_sets(["length_grouped", "tokens_40", "tokens_200"], {"padded_128": padded})
    assert set(sets) == {"tokens_40", "tokens_200"}
    for name, length in (("tokens_40", 40), ("tokens_200", 200)):
        assert len(sets[name]) == 6
        assert all(step["input_ids"].shape == (32, length) and bool(step["attention_mask"].all()) for step in sets[name])
    assert fixed_length_sets(["tokens_40"], {}) == {}


def test_each_tasks_rows_are_padded_as_a_run_batches_them(shared_data_dir: Path) -> None:
    from bench.task_lengths import task_lengths

    lengths = task_lengths("smoke", str(shared_data_dir))  # MRPC and SMS spam at 64 tokens
    assert set(lengths["tasks"]) == {"mrpc", "sms_spam"} and lengths["missing"] == {}
    for row in lengths["tasks"].values():
        assert row["max_length"] == 64
        assert row["mean_length"] <= row["mean_padded_length"] <= 64  # padded up to a batch's longest, at most max_length
        assert row["mean_padded_length"] - row["mean_length"] < 16  # length-grouped: little padding
    assert lengths["tasks"]["mrpc"]["mean_length"] > lengths["tasks"]["sms_spam"]["mean_length"]  # sentence pairs against texts
