"""Submission settings that are wrong say what is wrong: a malformed [submit] table, a non-string
value, a $ADAPTUNE_CONFIG that points nowhere; an unknown experiment is named before any setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptune.core.environment import SettingError
from adaptune.sweep.experiments import UnknownExperimentError
from pipelines.submit import load_settings, submit


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "adaptune.toml"
    path.write_text(text)
    return path


def test_submit_as_a_string_is_a_malformed_table_not_unknown_keys(tmp_path: Path) -> None:
    with pytest.raises(SettingError) as error:
        load_settings(env={}, config_path=_config(tmp_path, 'submit = "x"\n'))
    message = str(error.value)
    assert "must be a table" in message and "[submit]" in message
    assert "unknown key" not in message and "['x']" not in message
    assert "\n" not in message


@pytest.mark.parametrize("line, shown", [("project = 5", "5 (int)"), ("region = true", "True (bool)"),
                                         ('image_tag = ["a"]', "['a'] (list)"), ("data_dir = 1.5", "1.5 (float)")])
def test_non_string_values_are_refused_naming_the_key(tmp_path: Path, line: str, shown: str) -> None:
    key = line.split(" =")[0]
    with pytest.raises(SettingError) as error:
        load_settings(env={}, config_path=_config(tmp_path, f"[submit]\n{line}\n"))
    message = str(error.value)
    assert f"[submit] {key} must be a string" in message and shown in message


def test_a_missing_adaptune_config_file_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "elsewhere" / "adaptune.toml"
    with pytest.raises(SettingError, match=f"ADAPTUNE_CONFIG={missing} is not a file"):
        load_settings(env={"ADAPTUNE_CONFIG": str(missing)})
    # An existing file named by $ADAPTUNE_CONFIG is read; ./adaptune.toml stays optional.
    named = _config(tmp_path, '[submit]\nproject = "p"\n')
    assert load_settings(env={"ADAPTUNE_CONFIG": str(named)}).project == "p"
    named.unlink()
    assert load_settings(env={}).project is None


def test_unknown_experiment_is_reported_before_missing_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    broken_settings = {"ADAPTUNE_CONFIG": str(tmp_path / "absent.toml")}
    with pytest.raises(UnknownExperimentError, match="smok"):
        submit("smok", env=broken_settings)
    with pytest.raises(SettingError):  # a known experiment gets as far as the settings
        submit("smoke", env=broken_settings)
