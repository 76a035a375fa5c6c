"""Step settings (adaptune.fused.settings): read from the environment, checked, pinned by a preset."""

from __future__ import annotations

import pytest

from adaptune.core import environment
from adaptune.core.environment import VARIABLES, SettingError
from adaptune.fused.settings import ATTENTION_ENV, COMPILE_ENV, DROPOUT_ENV, DROPOUT_MASKS_ENV, FIELD_VARIABLES, LAYER_NORM_ENV, VALUES, StepSettings
from adaptune.sweep.plan import PlanError, plan
from adaptune.sweep.spec import H100
from adaptune.sweep.spec_file import spec_from_dict, spec_to_json

SWEEP = {"name": "tiny", "sweeps": [{"tasks": ["rte"], "methods": ["adapters:size=8"], "learning_rates": [1e-3], "epochs": [1], "seeds": [0]}]}


def test_each_setting_defaults_to_its_first_value_and_a_misspelt_one_fails_in_one_line() -> None:
    assert StepSettings.from_environment({}) == StepSettings() == StepSettings(*(values[0] for values in VALUES.values()))
    assert StepSettings.from_environment({ATTENTION_ENV: "kernel", DROPOUT_MASKS_ENV: "counter"}).attention == "kernel"
    with pytest.raises(SettingError, match="^ADAPTUNE_COMPILE='step-graphs' is not valid: use one of eager, step_graphs "):
        StepSettings.from_environment({COMPILE_ENV: "step-graphs"})
    with pytest.raises(SettingError, match="^ADAPTUNE_COMPILED is not a step setting"):
        StepSettings.preset([("ADAPTUNE_COMPILED", "eager")])


@pytest.mark.parametrize("field", ["compile", "attention", "dropout"])
def test_what_needs_counter_masks_says_so_in_one_line(field: str) -> None:
    """The dependencies between settings are stated once (settings.NEEDS_COUNTER_MASKS) and each refused alone."""
    value = VALUES[field][1]
    with pytest.raises(SettingError, match=f"^{FIELD_VARIABLES[field]}={value} needs {DROPOUT_MASKS_ENV}=counter "):
        StepSettings(**{field: value})
    assert getattr(StepSettings(dropout_masks="counter", **{field: value}), field) == value


def test_a_run_keeping_generator_masks_falls_back_to_what_they_allow() -> None:
    preset = StepSettings.preset(H100.step_settings)
    assert (preset.compile, preset.attention, preset.dropout, preset.layer_norm) == ("step_graphs", "kernel", "kernel", "kernel")
    kept = preset.for_masks("generator")
    assert (kept.compile, kept.attention, kept.dropout, kept.layer_norm) == ("eager", "eager", "mask", "kernel")
    assert StepSettings().for_masks("counter").dropout_masks == "counter" and preset.for_masks("counter") is preset


def test_the_settings_values_are_the_registrys_and_the_trainers() -> None:
    from adaptune.fused.kernels.attention import ATTENTION_MODES
    from adaptune.fused.kernels.dropout import DROPOUT_MODES
    from adaptune.fused.kernels.layer_norm import LAYER_NORM_MODES
    from adaptune.fused.run_dropout import MASK_SCHEMES

    assert all(VARIABLES[name].values == VALUES[field] for field, name in FIELD_VARIABLES.items())
    assert (MASK_SCHEMES, ATTENTION_MODES, DROPOUT_MODES, LAYER_NORM_MODES) == tuple(VALUES[field] for field in
                                                                                    ("dropout_masks", "attention", "dropout", "layer_norm"))
    assert StepSettings.preset(StepSettings(dropout_masks="counter", dropout="kernel").pinned()).dropout == "kernel"
    assert LAYER_NORM_ENV in FIELD_VARIABLES.values() and DROPOUT_ENV in dict(StepSettings(dropout_masks="counter", dropout="kernel").pinned())


def test_a_sweep_file_may_pin_step_settings_as_a_mapping_and_a_wrong_one_fails_at_planning() -> None:
    spec = spec_from_dict({**SWEEP, "accelerator": {"family": "gpu", "type": "NVIDIA_L4", "count": 1,
                                                    "step_settings": {COMPILE_ENV: "step_graphs", DROPOUT_MASKS_ENV: "counter"}}})
    assert spec.accelerator.step_settings == ((COMPILE_ENV, "step_graphs"), (DROPOUT_MASKS_ENV, "counter"))
    assert spec_from_dict(__import__("json").loads(spec_to_json(spec))).accelerator == spec.accelerator
    assert len(plan(spec).runs) == 1
    wrong = spec_from_dict({**SWEEP, "accelerator": {"step_settings": {ATTENTION_ENV: "flash"}}})
    with pytest.raises(PlanError, match="accelerator step_settings: ADAPTUNE_ATTENTION='flash' is not valid"):
        plan(wrong)
    unmet = spec_from_dict({**SWEEP, "accelerator": {"step_settings": {ATTENTION_ENV: "kernel"}}})
    with pytest.raises(PlanError, match="accelerator step_settings: ADAPTUNE_ATTENTION=kernel needs ADAPTUNE_DROPOUT_MASKS=counter"):
        plan(unmet)


def test_a_bad_step_setting_in_the_environment_fails_at_planning() -> None:
    with environment.patch(compile="foo"), pytest.raises(PlanError, match="step settings: ADAPTUNE_COMPILE='foo' is not valid"):
        plan(spec_from_dict(SWEEP))


def test_a_shard_run_by_hand_trains_with_its_accelerators_settings_unless_the_environment_says_otherwise(
        tmp_path, shared_data_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import os

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.spec import Sweep
    from adaptune.sweep.store import RunStore

    for name in FIELD_VARIABLES.values():
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
    assert DROPOUT_MASKS_ENV not in os.environ and os.environ[ATTENTION_ENV] == "eager"  # the environment left as it was


def test_a_state_saved_under_a_removed_residual_stream_is_refused_in_one_line(tmp_path) -> None:
    """A run that trained part of its steps with the bf16 residual stream cannot go on as float32 and claim one stream."""
    import torch

    from adaptune.core.run_files import STATE_FILE
    from adaptune.train.state import resume_point

    torch.save({"progress": {"global_step": 3}, "rng_dropout": None, "residual": "float32"}, tmp_path / STATE_FILE)
    assert resume_point(tmp_path, StepSettings()) == (3, StepSettings())
    torch.save({"progress": {"global_step": 3}, "rng_dropout": None, "residual": "autocast"}, tmp_path / STATE_FILE)
    with pytest.raises(ValueError, match="saved under ADAPTUNE_RESIDUAL=autocast, an option that has left"):
        resume_point(tmp_path, StepSettings())
