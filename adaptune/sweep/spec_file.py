"""Experiments as data: a spec round-trips through a dict, JSON and YAML; sweep files are read here."""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any

from adaptune.sweep.spec import ACCELERATORS, CPU, DEFAULTS, PAPER_EPOCHS, Ablation, Accelerator, ExperimentSpec, SpecError, Sweep

SPEC_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def spec_to_dict(spec: ExperimentSpec) -> dict[str, Any]:
    """Plain data (lists, strings, numbers): methods in their short form ("adapters:64,init_std=0.01")."""
    from adaptune.train.config import method_text

    data = dataclasses.asdict(spec)
    data["sweeps"] = [
        {**sweep, "methods": [method_text(m) for m in sweep["methods"]]} for sweep in data["sweeps"]
    ]
    if spec.ablation is not None:
        data["ablation"]["method"] = method_text(spec.ablation.method)
    for field in ("node_selector", "step_settings"):
        data["accelerator"][field] = [list(pair) for pair in getattr(spec.accelerator, field)]
    return _lists(data)


def spec_to_json(spec: ExperimentSpec) -> str:
    """Compact JSON: the pipeline parameter every component re-plans from (a few KB for paper_full)."""
    import json

    return json.dumps(spec_to_dict(spec), separators=(",", ":"), sort_keys=True)


def spec_from_dict(data: dict[str, Any]) -> ExperimentSpec:
    """The inverse of spec_to_dict; also reads hand-written files: methods as strings or dicts, the
    accelerator as a preset name ("h100", "cpu", ...) or a dict, omitted fields from DEFAULTS."""
    if not isinstance(data, dict):
        raise SpecError(f"an experiment spec is a mapping of fields, got {type(data).__name__}")
    fields = _fields_of(ExperimentSpec, data, "experiment")
    if "name" not in fields or "sweeps" not in fields:
        raise SpecError("an experiment spec needs at least 'name' and 'sweeps'")
    if "description" not in fields:
        fields["description"] = f"sweep file {fields['name']}"
    if not isinstance(fields["sweeps"], list | tuple):
        raise SpecError("'sweeps' must be a list of sweep blocks")
    fields["sweeps"] = tuple(_sweep_from_dict(sweep, index) for index, sweep in enumerate(fields["sweeps"]))
    if "accelerator" in fields:
        fields["accelerator"] = _accelerator_from(fields["accelerator"])
    if "tasks_left_out" in fields:
        fields["tasks_left_out"] = tuple(str(line) for line in fields["tasks_left_out"] or ())
    if fields.get("ablation") is not None:
        ablation = _fields_of(Ablation, fields["ablation"], "ablation")
        ablation["tasks"] = tuple(ablation.get("tasks", ()))
        ablation["method"] = _method_dict(ablation.get("method"), "ablation")
        fields["ablation"] = Ablation(**ablation)
    return dataclasses.replace(DEFAULTS, **fields)


def load_spec_file(path: str | os.PathLike[str]) -> ExperimentSpec:
    """An experiment from a YAML or JSON sweep file (same fields as ExperimentSpec)."""
    import json

    import yaml

    path = Path(path)
    if not path.is_file():
        raise SpecError(f"sweep file {path} not found; give a named experiment or a .yaml/.json file")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}") from None
    try:
        return spec_from_dict(data)
    except SpecError as error:
        raise SpecError(f"{path}: {error}") from None


def _sweep_from_dict(data: Any, index: int) -> Sweep:
    fields = _fields_of(Sweep, data, f"sweep {index}")
    for required in ("tasks", "methods", "learning_rates"):
        if required not in fields:
            raise SpecError(f"sweep {index} needs '{required}'")
    kinds = {"tasks": str, "learning_rates": float, "seeds": int, "epochs": int}
    for name, kind in kinds.items():
        if name in fields and not (name == "epochs" and fields[name] == PAPER_EPOCHS):
            values = fields[name] if isinstance(fields[name], list | tuple) else [fields[name]]
            fields[name] = tuple(_typed(value, kind, f"sweep {index}: {name}") for value in values)
    fields["methods"] = tuple(_method_dict(m, f"sweep {index}") for m in fields["methods"])
    return Sweep(**fields)


def _typed(value: Any, kind: type, where: str) -> Any:
    """YAML reads 1e-4 as a string (it wants 1.0e-4): accept numbers written either way."""
    if kind is str:
        return str(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {value!r} is not a number") from None
    if kind is int:
        if not number.is_integer():
            raise SpecError(f"{where}: {value!r} is not a whole number")
        return int(number)
    return number


def _method_dict(method: Any, where: str) -> dict[str, Any]:
    if isinstance(method, dict):
        return dict(method)
    if isinstance(method, str):
        from adaptune.model.methods import parse_method  # imports torch; only when a file names methods as text

        try:
            return parse_method(method).to_dict()
        except (TypeError, ValueError) as error:
            raise SpecError(f"{where}: method {method!r}: {error}") from None
    raise SpecError(f"{where}: a method is a string like 'adapters:64' or a mapping, got {method!r}")


def _accelerator_from(value: Any) -> Accelerator:
    if isinstance(value, str):
        if value not in ACCELERATORS:
            raise SpecError(f"unknown accelerator {value!r}; presets: {', '.join(ACCELERATORS)} (or a mapping of Accelerator fields)")
        return ACCELERATORS[value]
    if isinstance(value, dict) and "runs_per_device" in value:  # runs side by side in processes: the option left
        if value["runs_per_device"] != 1:
            raise SpecError(f"accelerator runs_per_device={value['runs_per_device']!r}: runs side by side in processes left the "
                            "code (on an H100 four were no faster than one at a time, bench/LOG.md); remove the field")
        value = {key: item for key, item in value.items() if key != "runs_per_device"}
    fields = _fields_of(Accelerator, value, "accelerator")
    fields["node_selector"] = tuple(tuple(pair) for pair in fields.get("node_selector", ()))
    fields["tolerations"] = tuple(fields.get("tolerations", ()))
    settings = fields.get("step_settings", ())  # a hand-written file may give a mapping: {ADAPTUNE_COMPILE: step_graphs}
    fields["step_settings"] = tuple(tuple(pair) for pair in (settings.items() if isinstance(settings, dict) else settings))
    if "runs_per_group" in fields and "float32_runs_per_group" not in fields:
        fields["float32_runs_per_group"] = None  # a group size the file sets is meant in every precision
    # A CPU's omitted fields are the CPU preset's (its measured group sizes); other families' have several presets.
    return dataclasses.replace(CPU if fields.get("family", "cpu") == "cpu" else Accelerator(), **fields)


def _fields_of(cls: type, data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SpecError(f"{where} must be a mapping of fields, got {data!r}")
    known = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        hints = [f"{key} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(key, known, n=1)) else key for key in unknown]
        raise SpecError(f"{where}: unknown field(s) {', '.join(hints)}; known: {', '.join(known)}")
    return dict(data)


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _lists(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(item) for item in value]
    return value
