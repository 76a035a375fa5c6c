"""When a run saves its resume state (adaptune.train.state_saves): never after its last epoch, between epochs as
often as the interval and the save's own cost allow, and for a fused group's runs at once. Real data (MRPC from
../shared/data), the embedded backbone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from adaptune.train.config import TrainConfig
from adaptune.train.group_loop import train_group
from adaptune.train.loop import train_and_evaluate
from adaptune.train.state_saves import SAVE_COST_MULTIPLE, STATE_EVERY_S_ENV, StateSaves, state_every_s

SMALL = dict(task="mrpc", epochs=3, max_length=48, max_train_examples=32, max_eval_examples=16, batch_size=16,
             method={"name": "adapters", "size": 8})


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_state_after_the_last_epoch_and_between_epochs_only_once_the_interval_has_passed() -> None:
    clock = _Clock()
    saves = StateSaves(every_s=60, clock=clock)
    clock.now = 59.0
    assert not saves.due_at_epoch_end(last_epoch=False)
    clock.now = 60.0
    assert saves.due_at_epoch_end(last_epoch=False)
    assert not saves.due_at_epoch_end(last_epoch=True)  # however long since the last save
    assert StateSaves(every_s=0, clock=clock).due_at_epoch_end(last_epoch=False)
    assert not StateSaves(every_s=0, clock=clock).due_at_epoch_end(last_epoch=True)


def test_a_costly_save_spaces_the_next_ones_out_by_its_multiple() -> None:
    clock = _Clock()
    saves = StateSaves(every_s=60, clock=clock)
    clock.now = 100.0
    with saves.saving():
        clock.now = 110.0  # a 10 s save: the next waits 20 x 10 s, not 60 s
    clock.now = 110.0 + 60
    assert not saves.due_at_epoch_end(last_epoch=False)
    clock.now = 110.0 + SAVE_COST_MULTIPLE * 10
    assert saves.due_at_epoch_end(last_epoch=False)


def test_a_malformed_interval_fails_in_one_line_that_says_what_to_set(tmp_path: Path, shared_data_dir: Path,
                                                                       patch_settings: Callable[..., object]) -> None:
    message = rf"^{STATE_EVERY_S_ENV}='.*' is not valid: use a number of seconds >= 0 \(.*0: at every epoch's end"
    for value in ("-1", "soon", "nan"):
        patch_settings(state_every_s=value)
        with pytest.raises(ValueError, match=message):
            state_every_s()
    with pytest.raises(ValueError, match=message):  # a run stops there, before it loads or trains anything
        train_and_evaluate(TrainConfig(lr=1e-3, seed=0, **SMALL), data_dir=shared_data_dir, out_dir=tmp_path, progress=False)
    assert not any(tmp_path.iterdir())
    patch_settings(state_every_s="0")
    assert state_every_s() == 0


def _counting(counts: list[int], index: int):
    def saved() -> None:
        counts[index] += 1
    return saved


@pytest.mark.parametrize("every_s, saves_per_run", [("0", 2), ("", 0)])
def test_a_run_alone_saves_between_epochs_only(tmp_path: Path, shared_data_dir: Path, patch_settings: Callable[..., object],
                                               every_s: str, saves_per_run: int) -> None:
    """3 epochs of seconds: at every epoch's end but the last with interval 0; none under the default minute."""
    patch_settings(state_every_s=every_s)
    counts = [0]
    record = train_and_evaluate(TrainConfig(lr=1e-3, seed=0, **SMALL), data_dir=shared_data_dir, out_dir=tmp_path,
                                progress=False, on_state_saved=_counting(counts, 0))
    assert record["status"] != "failed" and len(record["curve"]) == 3
    assert counts == [saves_per_run]


@pytest.mark.parametrize("every_s, saves_per_run", [("0", 2), ("", 0)])
def test_a_groups_runs_save_together(tmp_path: Path, shared_data_dir: Path, patch_settings: Callable[..., object],
                                     every_s: str, saves_per_run: int) -> None:
    patch_settings(state_every_s=every_s)
    counts = [0, 0]
    runs = [TrainConfig(lr=1e-3, seed=0, **SMALL), TrainConfig(lr=3e-4, seed=1, **SMALL)]
    records = train_group(runs, [tmp_path / "a", tmp_path / "b"], data_dir=shared_data_dir,
                          on_state_saved=[_counting(counts, 0), _counting(counts, 1)])
    assert all(record["status"] != "failed" for record in records)
    assert counts == [saves_per_run, saves_per_run]
