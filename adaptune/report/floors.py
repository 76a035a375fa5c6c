"""One task's floors read both ways, for the notes under the tables: every method below a floor it is shown beside,
and, where a floor beats every trained method, that in words.

The floors are what a table shows beside a task: the majority class, the head alone (the frozen backbone with only
its task head trained; a floor only where it scores above the majority class, else it learned nothing) and, where
measured, the zero-shot similarity. "Below" is strictly below, on the numbers as the table holds them."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

HEAD_NAME = "the head alone"

Scores = Sequence[tuple[str, float | None]]


def floor_sentences(task: str, floors: Scores, trained: Scores, head: float | None = None) -> list[str]:
    """Per floor with a value: "<task>: below <floor> <v>: <method> <score>, ..." and, where every trained method is
    below it, "<task>: <floor> <v> beats every trained method". `floors`: (name, value) as the table names them;
    `trained`: (method name, score) of the trained methods; `head`: the head alone's score, itself measured against the
    other floors and a floor of its own where it clears them."""
    floors = [(name, value) for name, value in floors if _known(value)]
    trained = [(name, score) for name, score in trained if _known(score)]
    if _known(head) and all(head > value for _, value in floors):  # type: ignore[operator]
        floors.append((HEAD_NAME, head))
    sentences = []
    for floor, value in floors:
        compared = [*trained, *([(HEAD_NAME, head)] if _known(head) and floor != HEAD_NAME else [])]
        below = [f"{name} {score:.1f}" for name, score in compared if score < value]  # type: ignore[operator]
        if trained and all(score < value for _, score in trained):  # type: ignore[operator]
            sentences.append(f"{task}: {floor} ({value:.1f}) beats every trained method")
        if below:
            sentences.append(f"{task}: below {floor} ({value:.1f}): {', '.join(below)}")
    return sentences


def floor_note(sentences: list[str]) -> list[str]:
    """The note's lines under a table (a blank line first), or none where no method is below any floor."""
    if not sentences:
        return []
    return ["", "Below a floor on the same split and rows (each floor stated both ways): " + "; ".join(sentences) + "."]


def _known(value: float | None) -> bool:
    return value is not None and not pd.isna(value)
