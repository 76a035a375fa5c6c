"""The tasks a claim reads, declared once by kind (and family): the claim's runs are filtered by it and its rule
text names it from the same object, so what a claim says it averages over and what it averages cannot part."""

from __future__ import annotations

import dataclasses

import pandas as pd

from adaptune.data.tasks import UnknownTaskError, get_task

KINDS = ("classification", "regression", "span")
_FAMILIES = {"glue": "GLUE tasks", "extra": "additional tasks of Table 2", None: "tasks"}


@dataclasses.dataclass(frozen=True)
class TaskScope:
    """The task kinds (task registry's `kind`) a claim reads, optionally of one family ("glue", "extra")."""

    kinds: tuple[str, ...]
    family: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if not self.kinds or unknown:
            raise ValueError(f"a claim's scope needs kinds among {KINDS}, got {self.kinds}")

    def reads(self, task: str) -> bool:
        """Whether the claim reads `task`: a registered task of one of these kinds (and this family); an unknown
        name is read by no claim, as its kind cannot be known."""
        try:
            known = get_task(task)
        except UnknownTaskError:
            return False
        return known.kind in self.kinds and (self.family is None or known.family == self.family)

    def keep(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of `frame` (a `task` column) the claim reads."""
        if frame.empty:
            return frame
        read = {task: self.reads(task) for task in frame["task"].astype(str).unique()}
        return frame[frame["task"].astype(str).map(read).astype(bool)]

    @property
    def words(self) -> str:
        """e.g. "classification tasks", "GLUE tasks of kinds classification and regression"."""
        kinds = " and ".join(self.kinds)
        if self.family is None:
            return f"{kinds} tasks"
        return f"{_FAMILIES[self.family]} ({kinds})" if len(self.kinds) == 1 else f"{_FAMILIES[self.family]} of kinds {kinds}"

    @property
    def mixes_metrics(self) -> bool:
        """Whether an average over these kinds mixes metrics of different nature (a correlation with an accuracy)."""
        return len(set(self.kinds)) > 1
