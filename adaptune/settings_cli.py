"""`python -m adaptune settings`: every ADAPTUNE_* variable (adaptune.core.environment), its value in this
environment and where that value comes from, so that what a run will use can be seen before it runs."""

from __future__ import annotations

import argparse

from adaptune.core import environment


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    from adaptune.sweep.spec import ACCELERATORS

    parser.add_argument("--preset", choices=sorted(ACCELERATORS), default=None,
                        help="an accelerator preset: the values it pins (where the environment leaves them unset) show as 'preset'")
    parser.add_argument("--markdown", action="store_true", help="print docs/settings.md's table of settings (variable, default, meaning) instead")


def preset_values(name: str) -> dict[str, str]:
    """What accelerator preset `name` pins, as variables: its step settings, its group and device sharing, and its
    CPU precision where it pins one."""
    from adaptune.core.precision import CPU_BF16_ENV, cpu_bf16_env_value
    from adaptune.sweep.device_sharing import RUNS_PER_GROUP_ENV
    from adaptune.sweep.spec import ACCELERATORS

    accelerator = ACCELERATORS[name]
    values = {RUNS_PER_GROUP_ENV: str(accelerator.runs_per_group),
              **dict(accelerator.step_settings)}
    if accelerator.cpu_precision != "auto":
        values[CPU_BF16_ENV] = cpu_bf16_env_value(accelerator.cpu_precision)
    return values


def format_rows(rows: list[tuple[str, str, str]]) -> str:
    meanings = {name: variable.meaning for name, variable in environment.VARIABLES.items()}
    table = [("variable", "value", "source", "meaning"), *((name, value or "-", source, meanings[name]) for name, value, source in rows)]
    widths = [max(len(row[column]) for row in table) for column in range(3)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3] for row in table)


def settings_from_args(args: argparse.Namespace) -> int:
    if args.markdown:
        print(environment.markdown_table())
        return 0
    environment.check()  # one line for a misspelt name or a bad value (adaptune.cli checks first, too)
    preset = preset_values(args.preset) if args.preset else None
    print(format_rows(environment.rows(preset=preset)))
    return 0
