"""The one door for what a user can fix: `UserError`.

An error a user can fix (a bad setting, an unknown experiment or task, a malformed file, a run store
that is a file) subclasses `UserError`, beside its builtin base (`class PlanError(UserError,
ValueError)`), so that code catching the builtin catches it as before. Its message is one line saying
what is wrong and what to do. Each command line (`python -m adaptune`, `python -m pipelines`) catches
`UserError` once and prints that line, exit status 2; any other exception is a bug or a failed run.

Torch-free, and imports nothing: a command line decides an error's kind without importing the module
that raised it.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2  # bad input: one line on stderr saying what is wrong and what to do


class UserError(Exception):
    """Something the user can fix; the message is one line saying what is wrong and what to do."""
