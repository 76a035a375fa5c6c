"""When a run saves its resume state (adaptune.train.state) at an epoch's end: often enough that a preempted
run loses little, never so often that saving costs much of its time, and never after its last epoch.

- After the last epoch nothing is saved: the run's checkpoint and record follow at once and a finished run's
  state is removed, so that state was written (and, on a bucket store, uploaded) only to be deleted.
- Between epochs, a state is saved once the attempt has gone on for at least `every_s` seconds
  ($ADAPTUNE_STATE_EVERY_S, STATE_EVERY_S unless set) and SAVE_COST_MULTIPLE times the last save's own time
  since it last saved (or started). So a preempted run loses at most that much and an epoch, and saving takes
  at most about 1/SAVE_COST_MULTIPLE of its time. A save's time grows with the state: a BERT-base adapter run's
  is tens of MB, a whole BERT-large's gigabytes (background_uploads), against epochs of a few seconds for a small
  task's fused group on a GPU (figures: bench/LOG.md, `make bench-states`).
- `every_s` 0 saves at every epoch's end, as every run did before this rule.
A fused group decides once for all its runs, which then stand at one step and resume as one group again.
`checkpoint_every_steps` saves where it says, within epochs, as before; such a save counts as the last one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from adaptune.core import environment

STATE_EVERY_S_ENV = "ADAPTUNE_STATE_EVERY_S"
STATE_EVERY_S = environment.DEFAULTS.state_every_s  # 60
SAVE_COST_MULTIPLE = 20


def state_every_s() -> float:
    """$ADAPTUNE_STATE_EVERY_S (seconds, >= 0), else STATE_EVERY_S; one line saying what is wrong otherwise."""
    return environment.settings().state_every_s


class StateSaves:
    """One attempt's state saves, for a run alone or for every run of a fused group at once."""

    def __init__(self, every_s: float | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.every_s = state_every_s() if every_s is None else every_s
        self.clock = clock
        self.last_saved = clock()  # the attempt's start, until it saves
        self.last_cost_s = 0.0

    def due_at_epoch_end(self, last_epoch: bool) -> bool:
        """Whether the epoch that just ended saves the state (the module docstring says when)."""
        if last_epoch:
            return False
        if self.every_s == 0:
            return True
        return self.clock() - self.last_saved >= max(self.every_s, SAVE_COST_MULTIPLE * self.last_cost_s)

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Around one save (a group's: all its runs'): its time is the next decision's cost."""
        started = self.clock()
        yield
        self.last_saved = self.clock()
        self.last_cost_s = self.last_saved - started
