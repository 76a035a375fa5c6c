"""Every ADAPTUNE_* environment variable, declared once: its name, kind, default, meaning and reader.

One parser for all of them (one yes/no dialect), so a bad value is one line naming the variable and the
values it takes, and an ADAPTUNE_* variable nobody declared is named with the closest known one: a typo never
silently does nothing. Code reads them as typed attributes of one object, `settings()` (`settings().device`,
each attribute the variable's name without the prefix, lowercase), built from the environment on first use;
entry points pass typed values down from it (adaptune.fused.settings.StepSettings for how a step computes), and
tests change them with `patch(device="cpu")`. Torch-free and import-free below the rest, like torch._inductor.config:
a table of typed settings that code reads and tests patch. A child process's environment, or any given mapping,
is read by name (read, given, Settings(environ)).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from adaptune.core.errors import UserError

PREFIX = "ADAPTUNE_"
Kind = Literal["choice", "flag", "count", "seconds", "text"]
YES, NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")  # the one yes/no dialect, any case


class SettingError(UserError, ValueError):
    """A variable's value the registry refuses, or a variable it does not know: one line."""


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    kind: Kind
    default: str  # the value an unset or empty variable takes, as it would be written ("" for none)
    meaning: str
    read_by: str  # the module that reads it (through this registry)
    values: tuple[str, ...] = ()  # a choice's values

    def takes(self) -> str:
        """The values it takes, in words."""
        if self.kind == "choice":
            named = ", ".join(value for value in self.values if value)
            return f"one of {named}" + (", or leave it unset" if "" in self.values else "")
        return {"flag": "1/true/yes/on or 0/false/no/off", "count": "a whole number >= 1",
                "seconds": "a number of seconds >= 0", "text": "any text"}[self.kind]


def _choice(name: str, values: tuple[str, ...], meaning: str, read_by: str) -> Variable:
    return Variable(name, "choice", values[0], meaning, read_by, values)


# How a training step computes (adaptune.fused.settings.StepSettings holds them; an accelerator preset pins some).
STEP_VARIABLES = (
    _choice("ADAPTUNE_COMPILE", ("eager", "step_graphs"),
            "a training step eager, or replayed as CUDA graphs (needs counter dropout masks)", "adaptune.fused.settings"),
    _choice("ADAPTUNE_DROPOUT_MASKS", ("generator", "counter"),
            "how each run draws its dropout masks: its own torch.Generator, or a counter hash keyed by seed, step and site",
            "adaptune.fused.settings"),
    _choice("ADAPTUNE_ATTENTION", ("eager", "kernel"),
            "a group's attention with dropout: torch's operators, or one Triton kernel (needs counter masks)", "adaptune.fused.settings"),
    _choice("ADAPTUNE_LAYER_NORM", ("torch", "kernel"),
            "a group's trained LayerNorms: torch's operators, or one Triton kernel for all runs", "adaptune.fused.settings"),
    _choice("ADAPTUNE_DROPOUT", ("mask", "kernel"),
            "hidden-state dropout: a mask tensor, or drawn and applied in one Triton kernel (needs counter masks)",
            "adaptune.fused.settings"),
)

VARIABLES: dict[str, Variable] = {variable.name: variable for variable in (
    *STEP_VARIABLES,
    Variable("ADAPTUNE_CPU_BF16", "choice", "auto",
             "the frozen backbone's precision on a CPU: auto (bf16 where the CPU has it natively), 1 (bf16) or 0 (float32)",
             "adaptune.core.precision", ("auto", *YES, *NO)),
    _choice("ADAPTUNE_DEVICE", ("", "cuda", "xla", "tpu", "cpu"),
            "the device to train on (empty: CUDA, else TPU, else CPU; tpu is xla); a named one that is absent is an error",
            "adaptune.core.devices"),
    Variable("ADAPTUNE_RUNS_PER_GROUP", "count", "",
             "runs fused into one forward pass (empty: the accelerator preset's runs_per_group)", "adaptune.sweep.device_sharing"),
    Variable("ADAPTUNE_STATE_EVERY_S", "seconds", "60",
             "the fewest seconds between a run's resume-state saves at epoch ends (0: at every epoch's end)",
             "adaptune.train.state_saves"),
    Variable("ADAPTUNE_LEASE_SECONDS", "seconds", "900",
             "how long a run's lease in the run store lasts unrenewed before another attempt may take the run",
             "adaptune.sweep.lease"),
    Variable("ADAPTUNE_RETRY_BACKOFF_S", "seconds", "30",
             "the first wait before a run that failed transiently is tried again (doubled each time, at most 600)",
             "adaptune.sweep.retry"),
    Variable("ADAPTUNE_EPOCH_LINES", "flag", "1", "print one line per epoch on stderr", "adaptune.train.epoch_log"),
    Variable("ADAPTUNE_DEBUG", "flag", "0", "print the full traceback with an error's one line", "adaptune.cli"),
    Variable("ADAPTUNE_DATA_DIR", "text", "",
             "the local data mirror ('hub' for the Hugging Face hub; empty: the first shared/data found, else the hub)",
             "adaptune.data.sources"),
    Variable("ADAPTUNE_CACHE_DIR", "text", "~/.cache/adaptune",
             "where tokenized datasets and the status cache are kept", "adaptune.data.token_cache, adaptune.sweep.status_cache"),
    Variable("ADAPTUNE_TRAINER", "text", "",
             "module:function replacing the trainer (train_and_evaluate's signature): dry runs of a DAG's shape",
             "adaptune.sweep.machine"),
    Variable("ADAPTUNE_CODE_VERSION", "text", "", "the code version records name (the images set it; empty: git describe)",
             "adaptune.train.provenance"),
    Variable("ADAPTUNE_IMAGE", "text", "", "the image a pipeline task runs in, for its records' provenance (set by the pipeline)",
             "adaptune.train.provenance"),
    Variable("ADAPTUNE_PAPER_REFERENCE", "text", "", "the paper's reference figures (empty: analysis/paper_reference.json)",
             "adaptune.report.reference"),
    Variable("ADAPTUNE_RUNS_ROOT", "text", "", "the run store a submission and its status and report read (gs:// or a path)",
             "pipelines.submit"),
    Variable("ADAPTUNE_PROJECT", "text", "", "the Google Cloud project (Vertex AI)", "pipelines.submit"),
    Variable("ADAPTUNE_REGION", "text", "", "the Vertex AI region, e.g. us-central1", "pipelines.submit"),
    Variable("ADAPTUNE_PIPELINE_ROOT", "text", "", "the gs:// path for the pipeline's artifacts", "pipelines.submit"),
    Variable("ADAPTUNE_SERVICE_ACCOUNT", "text", "", "the service account the pipeline runs as", "pipelines.submit"),
    Variable("ADAPTUNE_DATA_DIR_REMOTE", "text", "", "the mirror a submission's data step reads (empty: the run store's staged one, else the hub)",
             "pipelines.submit"),
    Variable("ADAPTUNE_VERTEX_EXPERIMENT", "text", "", "the Vertex AI Experiment a submission joins (empty: adaptune-<name>)",
             "pipelines.submit"),
    Variable("ADAPTUNE_CONFIG", "text", "", "a TOML file with a [submit] table (empty: ./adaptune.toml)", "pipelines.submit"),
    Variable("ADAPTUNE_REGISTRY", "text", "us-docker.pkg.dev/your-project/adaptune", "the registry the images are pushed to and pulled from",
             "components.images"),
    Variable("ADAPTUNE_IMAGE_TAG", "text", "0.2.0", "the images' tag", "components.images"),
    Variable("ADAPTUNE_TORCH_INDEX_URL", "text", "", "a mirror of PyTorch's CPU wheel index for the image builds", "containers/Makefile"),
    Variable("ADAPTUNE_DOCKER_BUILD_FLAGS", "text", "", "extra flags for every docker build", "containers/Makefile"),
    Variable("ADAPTUNE_RESULTS", "text", "../outputs/smoke",
             "the results analysis/results.ipynb reads: a results directory (runs.parquet) or a run store (runs/)", "analysis"),
    Variable("ADAPTUNE_RESULTS_A", "text", "measured/glue_local",
             "side a of analysis/compare_sweeps.ipynb: a results directory or a run store (relative to analysis/)", "analysis"),
    Variable("ADAPTUNE_RESULTS_B", "text", "measured/bf16_local",
             "side b of analysis/compare_sweeps.ipynb: a results directory or a run store (relative to analysis/)", "analysis"),
    Variable("ADAPTUNE_FIGURES", "text", "", "where analysis/results.ipynb writes its figures (empty: a temporary directory)",
             "analysis"),
    Variable("ADAPTUNE_CONTAINER_TESTS", "flag", "1", "run the tests that need a container engine where one is found", "tests"),
    Variable("ADAPTUNE_TEST_RUNS_DIR", "text", "", "where the tests keep the real runs they train once (empty: pytest's temporary directory)",
             "tests"),
)}


def parse(name: str, raw: str | None) -> Any:
    """The typed value of variable `name` written as `raw` (None or empty: its default), or one SettingError line."""
    variable = VARIABLES.get(name)
    if variable is None:
        raise SettingError(unknown_line(name))
    text = (raw or "").strip() or variable.default
    if variable.kind == "choice":
        value = text.lower() if name == "ADAPTUNE_CPU_BF16" or name == "ADAPTUNE_DEVICE" else text
        if value in variable.values:
            return value
    elif variable.kind == "flag":
        if text.lower() in YES + NO:
            return text.lower() in YES
    elif variable.kind == "count":
        if text == "":
            return None
        if text.isdigit() and int(text) >= 1:
            return int(text)
    elif variable.kind == "seconds":
        if text == "":
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if seconds >= 0 and seconds != float("inf"):
            return seconds
    else:
        return text
    raise SettingError(f"{name}={raw!r} is not valid: use {variable.takes()} ({variable.meaning})")


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """Variable `name`'s typed value in `environ` (None: this process's settings(), patches included). By name, for
    a table of names or another process's environment; code reads its own settings as settings().<attribute>."""
    if environ is None:
        return getattr(settings(), attribute(name)) if name in VARIABLES else parse(name, None)
    return parse(name, environ.get(name))


def given(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """Variable `name`'s typed value where `environ` sets it (not empty), else None: for a caller with a fallback of its own."""
    raw = (settings().environ if environ is None else environ).get(name)
    return parse(name, raw) if (raw or "").strip() else None


def attribute(name: str) -> str:
    """The Settings attribute of variable `name`: the name without the prefix, lowercase (ADAPTUNE_DEVICE: device)."""
    return name.removeprefix(PREFIX).lower()


# Each Settings attribute, the variable it reads: derived from the declarations above, so a setting is declared once.
ATTRIBUTES: dict[str, Variable] = {attribute(name): variable for name, variable in VARIABLES.items()}


class Settings:
    """Every declared variable as a typed attribute (`settings().device`, `.lease_seconds`, `.epoch_lines`), read
    from one environment. An attribute is parsed when first read (a bad value is its one SettingError line there,
    as where read() meets it) and kept. Frozen: a test changes a setting with patch(), never by assigning."""

    __slots__ = ("_raw", "_values")

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        object.__setattr__(self, "_raw", {name: environ[name] for name in VARIABLES if name in environ})
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        variable = ATTRIBUTES.get(name)
        if variable is None:
            closest = difflib.get_close_matches(name, ATTRIBUTES, n=1, cutoff=0.6)
            raise AttributeError(f"{name!r} is not a setting" + (f": did you mean {closest[0]!r}?" if closest else ""))
        values = self._values
        if name not in values:
            values[name] = parse(variable.name, self._raw.get(variable.name))
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Settings are read-only: environment.patch({name}=...) changes one for a block")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *ATTRIBUTES]

    def __repr__(self) -> str:
        return f"Settings({self._raw!r})"

    @property
    def environ(self) -> dict[str, str]:
        """The declared variables these settings were read from, as an environment holds them (unset ones absent)."""
        return dict(self._raw)


DEFAULTS = Settings({})  # every setting at its declared default
_built: tuple[tuple[str | None, ...], Settings] | None = None  # this process's settings and the variables they were read from
_patches: list[dict[str, str]] = []  # the patch() blocks in force, innermost last


def settings() -> Settings:
    """This process's settings: built from its environment on first use and passed around as one object, then
    kept while its ADAPTUNE_* variables stay as they were (a block of applied(), or a test's, rebuilds it once)."""
    global _built
    raw = {name: os.environ[name] for name in VARIABLES if name in os.environ}
    for patched in _patches:
        raw.update(patched)
    key = tuple(raw.get(name) for name in VARIABLES)
    if _built is None or _built[0] != key:
        _built = (key, Settings(raw))
    return _built[1]


def _as_text(value: Any) -> str:
    """A patched value as the environment would write it: a flag's 1/0, None as unset, a path or number as text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return "" if value is None else str(value)


@contextlib.contextmanager
def patch(**values: Any) -> Iterator[Settings]:
    """Settings changed for the block (or the decorated test), by attribute: `with patch(device="cpu", epoch_lines=False):`.
    A value is taken as the environment's text would be (a bad one is the same one line where it is read), None
    as unset. This process's settings() only: a child process reads its own environment, so set variables for one."""
    for name in values:
        if name not in ATTRIBUTES:
            getattr(DEFAULTS, name)  # the unknown name's one line
    _patches.append({ATTRIBUTES[name].name: _as_text(value) for name, value in values.items()})
    try:
        yield settings()
    finally:
        _patches.pop()


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$ADAPTUNE_CACHE_DIR expanded; unset or empty: ~/.cache/adaptune (tokenized data and status summaries alike)."""
    return Path((settings() if environ is None else Settings(environ)).cache_dir).expanduser()


@contextlib.contextmanager
def applied(values: Mapping[str, str]) -> Iterator[None]:
    """These variables set in this process's environment for the block, each restored (or unset) after."""
    for name in values:
        parse(name, values[name])
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Settings that left because no measurement showed them paying (bench/LOG.md, "the options that left").
REMOVED = ("ADAPTUNE_RESIDUAL", "ADAPTUNE_BRANCH_SUMS", "ADAPTUNE_PROJECTIONS", "ADAPTUNE_GRAPH_WARMUP", "ADAPTUNE_WHOLE_MODEL_RUNS_PER_GROUP",
           "ADAPTUNE_RUNS_PER_DEVICE", "ADAPTUNE_TEST_INDUCTOR")


def unknown_line(name: str) -> str:
    if name in REMOVED:
        return f"{name} is a setting that has left (no measurement showed it paying; bench/LOG.md): unset it"
    # Matched without the prefix every name shares, which would make any two names look alike.
    suffixes = {known.removeprefix(PREFIX): known for known in VARIABLES}
    closest = difflib.get_close_matches(name.removeprefix(PREFIX), suffixes, n=1, cutoff=0.6)
    hint = f": did you mean {suffixes[closest[0]]}?" if closest else ": `python -m adaptune settings` lists the known ones"
    return f"{name} is not a setting adaptune knows{hint}"


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for each ADAPTUNE_* variable set in `environ` that the registry does not declare."""
    environ = os.environ if environ is None else environ
    return [unknown_line(name) for name in sorted(environ) if name.startswith(PREFIX) and name not in VARIABLES]


def check(environ: Mapping[str, str] | None = None, names: tuple[str, ...] | None = None) -> None:
    """Refuse, with one line, the first unknown ADAPTUNE_* variable or bad value among `names` (all when None)."""
    environ = os.environ if environ is None else environ
    lines = unknown(environ)
    if lines:
        raise SettingError(lines[0])
    for name in names or VARIABLES:
        read(name, environ)


def rows(environ: Mapping[str, str] | None = None, preset: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(name, value, where it came from: default, environment or preset) for every declared variable."""
    environ = os.environ if environ is None else environ
    found = []
    for name, variable in VARIABLES.items():
        if (environ.get(name) or "").strip():
            found.append((name, environ[name].strip(), "environment"))
        elif preset and name in preset:
            found.append((name, preset[name], "preset"))
        else:
            found.append((name, variable.default, "default"))
    return found


def markdown_table() -> str:
    """docs/settings.md's table of settings (tests/test_environment.py holds the file to it)."""
    lines = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for variable in VARIABLES.values():
        default = f"`{variable.default}`" if variable.default else ""
        lines.append(f"| `{variable.name}` | {default} | {variable.meaning} |")
    return "\n".join(lines)
