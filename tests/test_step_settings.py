"""Step settings (adaptune.core.step_settings): read from the environment, checked, pinned by a preset."""

from __future__ import annotations

import pytest

from adaptune.core.step_settings import (ATTENTION_ENV, BRANCH_SUMS_ENV, COMPILE_ENV, DROPOUT_MASKS_ENV, STEP_SETTINGS, checked_value,
                                         step_setting)
from adaptune.sweep.experiments import spec_from_dict, spec_to_json
from adaptune.sweep.plan import PlanError, plan

SWEEP = {"name": "tiny", "sweeps": [{"tasks": ["rte"], "methods": ["adapters:size=8"], "learning_rates": [1e-3], "epochs": [1], "seeds": [0]}]}


def test_each_setting_defaults_to_its_first_value_and_a_misspelt_one_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in STEP_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert [step_setting(name) for name in (COMPILE_ENV, DROPOUT_MASKS_ENV, ATTENTION_ENV)] == ["eager", "generator", "eager"]
    monkeypatch.setenv(ATTENTION_ENV, "kernel")
    assert step_setting(ATTENTION_ENV) == "kernel"
    monkeypatch.setenv(COMPILE_ENV, "step-graphs")
    with pytest.raises(ValueError, match="^ADAPTUNE_COMPILE='step-graphs' is not a compile mode: use one of eager, compiled, graphs, "):
        step_setting(COMPILE_ENV)
    with pytest.raises(ValueError, match="^ADAPTUNE_COMPILED is not a step setting"):
        checked_value("ADAPTUNE_COMPILED", "eager")


def test_the_trainers_modes_are_the_settings_values() -> None:
    from adaptune.model.attention_kernel import ATTENTION_MODES
    from adaptune.model.branch_sums import BRANCH_SUMS_MODES
    from adaptune.model.run_dropout import MASK_SCHEMES
    from adaptune.train.compiling import COMPILE_MODES

    assert tuple(COMPILE_MODES) == STEP_SETTINGS[COMPILE_ENV][1]
    assert MASK_SCHEMES == STEP_SETTINGS[DROPOUT_MASKS_ENV][1] and ATTENTION_MODES == STEP_SETTINGS[ATTENTION_ENV][1]
    assert BRANCH_SUMS_MODES == STEP_SETTINGS[BRANCH_SUMS_ENV][1]


def test_a_sweep_file_may_pin_step_settings_as_a_mapping_and_a_wrong_one_fails_at_planning() -> None:
    spec = spec_from_dict({**SWEEP, "accelerator": {"family": "gpu", "type": "NVIDIA_L4", "count": 1,
                                                    "step_settings": {COMPILE_ENV: "step_graphs", DROPOUT_MASKS_ENV: "counter"}}})
    assert spec.accelerator.step_settings == ((COMPILE_ENV, "step_graphs"), (DROPOUT_MASKS_ENV, "counter"))
    assert spec_from_dict(__import__("json").loads(spec_to_json(spec))).accelerator == spec.accelerator
    assert len(plan(spec).runs) == 1
    wrong = spec_from_dict({**SWEEP, "accelerator": {"step_settings": {ATTENTION_ENV: "flash"}}})
    with pytest.raises(PlanError, match="accelerator step_settings: ADAPTUNE_ATTENTION='flash' is not an attention mode"):
        plan(wrong)


def test_a_shard_run_by_hand_trains_with_its_accelerators_settings_unless_the_environment_says_otherwise(
        tmp_path, shared_data_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import os

    from adaptune.sweep.experiments import Sweep, get_experiment
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.store import RunStore

    for name in STEP_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ATTENTION_ENV, "eager")  # the user's own variable wins over the accelerator's
    base = get_experiment("smoke")
    spec = dataclasses.replace(
        base, name="settings_test", ablation=None, max_train_examples=16, max_eval_examples=8,
        accelerator=dataclasses.replace(base.accelerator, step_settings=((DROPOUT_MASKS_ENV, "counter"), (ATTENTION_ENV, "kernel"))),
        sweeps=(Sweep(tasks=("mrpc",), methods=({"name": "layernorm"},), learning_rates=(1e-3,), epochs=(1,), seeds=(0,), max_length=32),),
    )
    (shard,) = plan(spec).shards
    store = RunStore(str(tmp_path / "store"))
    assert run_shard(spec, shard.id, store, data_dir=shared_data_dir, group_size=1) == {"ok": 1}
    record = store.record(shard.runs[0].run_id)
    assert (record["dropout_masks"], record["attention"]) == ("counter", "eager")  # "kernel", had the accelerator's applied
    assert DROPOUT_MASKS_ENV not in os.environ and os.environ[ATTENTION_ENV] == "eager"  # restored after the shard
