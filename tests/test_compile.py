"""The checked-in pipeline.yaml and pipelines/compiled/*.yaml match what the code compiles today."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptune.sweep.experiments import EXPERIMENTS
from pipelines.compile import COMPILED_DIR, REPO_ROOT, compile_all


@pytest.fixture(autouse=True)
def default_images(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checked-in specs use the default registry and tag (components/images.py).
    monkeypatch.delenv("ADAPTUNE_REGISTRY", raising=False)
    monkeypatch.delenv("ADAPTUNE_IMAGE_TAG", raising=False)


def test_checked_in_specs_are_up_to_date_and_compilation_is_deterministic(tmp_path: Path) -> None:
    written = compile_all(tmp_path)
    assert {p.relative_to(tmp_path) for p in written} == {Path("pipeline.yaml")} | {
        COMPILED_DIR / f"{name}.yaml" for name in EXPERIMENTS
    }
    stale = [
        str(path.relative_to(tmp_path))
        for path in written
        if not (REPO_ROOT / path.relative_to(tmp_path)).is_file()
        or (REPO_ROOT / path.relative_to(tmp_path)).read_bytes() != path.read_bytes()
    ]
    assert not stale, f"stale compiled specs {stale}: run `make compile` and commit them"
    # pipeline.yaml is the compiled paper_full.
    assert (tmp_path / "pipeline.yaml").read_bytes() == (tmp_path / COMPILED_DIR / "paper_full.yaml").read_bytes()


def _train_env(name: str) -> list[dict]:
    import yaml

    compiled = next(yaml.safe_load_all((REPO_ROOT / COMPILED_DIR / f"{name}.yaml").read_text()))
    return compiled["deploymentSpec"]["executors"]["exec-train-shard"]["container"].get("env", [])


def test_an_experiment_that_pins_its_cpu_precision_carries_it_and_auto_leaves_it_to_the_machine() -> None:
    """glue_local was begun in float32 and stays so on a CPU with native bf16; bf16_local is bf16; the rest
    ("auto") set nothing, so the machine's $ADAPTUNE_CPU_BF16 or its CPU decides (adaptune.core.devices)."""
    assert {"name": "ADAPTUNE_CPU_BF16", "value": "0"} in _train_env("glue_local")
    assert {"name": "ADAPTUNE_CPU_BF16", "value": "0"} in _train_env("peft_local")  # shares glue_local's runs
    assert {"name": "ADAPTUNE_CPU_BF16", "value": "1"} in _train_env("bf16_local")
    assert not [env for env in _train_env("smoke") if env["name"] == "ADAPTUNE_CPU_BF16"]


def test_an_accelerators_step_settings_reach_its_training_tasks_and_nothing_else_sets_them() -> None:
    """The H100 preset trains as measured fastest (bench/gpu.json "h100_2026_11_27_levers", "h100_2026_11_28"): its
    tasks carry the step settings; a CPU experiment's carry none, so a local run keeps the defaults."""
    from adaptune.sweep.spec import H100

    assert EXPERIMENTS["glue_full"].accelerator == H100
    env = {item["name"]: item["value"] for item in _train_env("glue_full")}
    assert {name: env.get(name) for name, _ in H100.step_settings} == dict(H100.step_settings)
    assert dict(H100.step_settings) == {"ADAPTUNE_COMPILE": "step_graphs", "ADAPTUNE_DROPOUT_MASKS": "counter",
                                        "ADAPTUNE_ATTENTION": "kernel", "ADAPTUNE_LAYER_NORM": "kernel", "ADAPTUNE_DROPOUT": "kernel"}
    assert not {item["name"] for item in _train_env("smoke")} & set(dict(H100.step_settings))
