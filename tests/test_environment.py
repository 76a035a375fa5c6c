"""The registry of ADAPTUNE_* variables (adaptune.core.environment): one yes/no dialect, one line for a bad value
or an unknown name, `python -m adaptune settings`, docs/settings.md's table, and no module reading one around it."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptune.core import environment
from adaptune.core.environment import VARIABLES, SettingError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _clean_environment(**settings: str) -> dict[str, str]:
    """This process's environment without any ADAPTUNE_* variable, plus `settings`."""
    kept = {name: value for name, value in os.environ.items() if not name.startswith(environment.PREFIX)}
    return {**kept, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **settings}


def _run(*args: str, **settings: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=_clean_environment(**settings),
                          cwd=REPO_ROOT, timeout=300)


@pytest.mark.parametrize(("raw", "expected"), [
    ("1", True), ("true", True), ("True", True), ("YES", True), ("on", True), (" On ", True),
    ("0", False), ("false", False), ("False", False), ("no", False), ("off", False), ("OFF", False),
])
def test_every_flag_speaks_one_yes_no_dialect(raw: str, expected: bool, capsys: pytest.CaptureFixture[str]) -> None:
    from adaptune.core.precision import cpu_precision_setting
    from adaptune.train.epoch_log import report_epoch

    for name, variable in VARIABLES.items():
        if variable.kind == "flag":
            assert environment.parse(name, raw) is expected
    with environment.patch(cpu_bf16=raw):  # a choice with auto, then the same yes and no
        assert cpu_precision_setting() == ("bf16" if expected else "float32")
    with environment.patch(epoch_lines=raw):  # "False" used to leave the lines on
        report_epoch("run", 3, "accuracy", {"epoch": 1, "train_loss": 0.5, "val_metrics": {"accuracy": 0.5}}, 1)
    assert ("run epoch 1/3" in capsys.readouterr().err) is expected


def test_unset_or_empty_takes_the_default() -> None:
    assert environment.read("ADAPTUNE_EPOCH_LINES", {}) is True
    assert environment.read("ADAPTUNE_DEBUG", {"ADAPTUNE_DEBUG": " "}) is False
    assert environment.read("ADAPTUNE_CPU_BF16", {}) == "auto"
    assert environment.read("ADAPTUNE_RUNS_PER_GROUP", {}) is None  # the accelerator preset's
    assert environment.read("ADAPTUNE_STATE_EVERY_S", {"ADAPTUNE_STATE_EVERY_S": ""}) == 60.0
    assert environment.given("ADAPTUNE_PROJECT", {"ADAPTUNE_PROJECT": ""}) is None


def test_the_registry_defaults_are_the_ones_the_code_falls_back_to() -> None:
    from adaptune.sweep.lease import DEFAULT_LEASE_SECONDS, lease_seconds
    from adaptune.sweep.retry import DEFAULT_BACKOFF_S, RetryPolicy
    from adaptune.train.state_saves import STATE_EVERY_S, state_every_s
    from components.images import image_for

    assert (DEFAULT_LEASE_SECONDS, DEFAULT_BACKOFF_S, STATE_EVERY_S) == (900.0, 30.0, 60.0)
    # None: unset; empty: the default, as for every variable
    backoff_s = lambda failures: RetryPolicy.with_counts().backoff_s(failures)  # noqa: E731
    with environment.patch(lease_seconds=None, retry_backoff_s=None, state_every_s=None, registry=None, image_tag=""):
        assert (lease_seconds(), backoff_s(1), state_every_s()) == (900.0, 30.0, 60.0)
        assert image_for("cpu") == "us-docker.pkg.dev/your-project/adaptune/adaptune-cpu:0.2.0"


@pytest.mark.parametrize(("name", "raw"), [
    ("ADAPTUNE_EPOCH_LINES", "maybe"), ("ADAPTUNE_DEBUG", "2"), ("ADAPTUNE_CPU_BF16", "bf16"), ("ADAPTUNE_DEVICE", "gpu"),
    ("ADAPTUNE_COMPILE", "graphs"), ("ADAPTUNE_RUNS_PER_GROUP", "0"), ("ADAPTUNE_RUNS_PER_GROUP", "two"),
    ("ADAPTUNE_STATE_EVERY_S", "-1"), ("ADAPTUNE_STATE_EVERY_S", "nan"), ("ADAPTUNE_LEASE_SECONDS", "soon"),
    ("ADAPTUNE_RETRY_BACKOFF_S", "inf"),
])
def test_a_bad_value_is_one_line_naming_the_variable_and_what_it_takes(name: str, raw: str) -> None:
    with pytest.raises(SettingError) as raised:
        environment.parse(name, raw)
    line = str(raised.value)
    assert line.startswith(f"{name}={raw!r} is not valid: use {VARIABLES[name].takes()}") and "\n" not in line
    with pytest.raises(SettingError, match=f"^{name}="):
        environment.check({name: raw})


def test_the_modules_read_their_variables_through_the_registry() -> None:
    """Each reader refuses a bad value with the registry's line (no reader of its own with another dialect)."""
    from adaptune.core.devices import pick_device
    from adaptune.sweep.device_sharing import runs_per_group
    from adaptune.sweep.lease import lease_seconds
    from adaptune.sweep.retry import RetryPolicy
    from adaptune.sweep.spec import ACCELERATORS
    from adaptune.train.state_saves import state_every_s

    backoff_s = lambda failures: RetryPolicy.with_counts().backoff_s(failures)  # noqa: E731
    for name, read in (("ADAPTUNE_DEVICE", pick_device), ("ADAPTUNE_LEASE_SECONDS", lease_seconds),
                       ("ADAPTUNE_RETRY_BACKOFF_S", lambda: backoff_s(1)), ("ADAPTUNE_STATE_EVERY_S", state_every_s),
                       ("ADAPTUNE_RUNS_PER_GROUP", lambda: runs_per_group(ACCELERATORS["h100"]))):
        with environment.patch(**{environment.attribute(name): "x"}), pytest.raises(SettingError, match=f"^{name}='x' is not valid"):
            read()
    with environment.patch(runs_per_group=4):
        assert runs_per_group(ACCELERATORS["h100"]) == 4
    with environment.patch(runs_per_group=None):
        assert runs_per_group(ACCELERATORS["h100"]) == ACCELERATORS["h100"].runs_per_group


def test_an_unknown_variable_is_named_with_the_closest_known_one() -> None:
    assert environment.unknown({"ADAPTUNE_COMPLIE": "step_graphs", "PATH": "/bin", "ADAPTUNE_COMPILE": "eager"}) == [
        "ADAPTUNE_COMPLIE is not a setting adaptune knows: did you mean ADAPTUNE_COMPILE?"]
    assert environment.unknown({"ADAPTUNE_EPOCH_LINE": "0"})[0].endswith("did you mean ADAPTUNE_EPOCH_LINES?")
    # Nothing close: no guess (the shared prefix does not count as closeness).
    assert environment.unknown({"ADAPTUNE_XYZZY": "1"}) == [
        "ADAPTUNE_XYZZY is not a setting adaptune knows: `python -m adaptune settings` lists the known ones"]
    with pytest.raises(SettingError, match="^ADAPTUNE_COMPLIE is not a setting adaptune knows"):
        environment.check({"ADAPTUNE_COMPLIE": "step_graphs"})
    environment.check({"ADAPTUNE_COMPILE": "step_graphs", "PATH": "/bin"})


def test_the_cache_dir_has_one_rule_for_the_data_and_the_status_cache(tmp_path: Path) -> None:
    from adaptune.data.token_cache import default_cache_dir
    from adaptune.sweep.status_cache import cache_path
    from adaptune.sweep.store import RunStore

    default = Path.home() / ".cache" / "adaptune"
    for value, expected in (("", default), ("~/elsewhere", Path.home() / "elsewhere"), (str(tmp_path), tmp_path)):
        with environment.patch(cache_dir=value):  # empty used to mean the current directory for the data
            assert default_cache_dir() == expected
            assert cache_path(RunStore(tmp_path / "store")).parent == expected / "record-summaries"


def test_settings_are_typed_attributes_named_after_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert list(environment.ATTRIBUTES)[:2] == ["compile", "dropout_masks"] and "results_a" in environment.ATTRIBUTES
    assert all(VARIABLES[f"ADAPTUNE_{name.upper()}"] is variable for name, variable in environment.ATTRIBUTES.items())
    settings = environment.Settings({"ADAPTUNE_LEASE_SECONDS": "12", "ADAPTUNE_EPOCH_LINES": "off", "ADAPTUNE_DEVICE": "CPU"})
    assert (settings.lease_seconds, settings.epoch_lines, settings.device, settings.runs_per_group) == (12.0, False, "cpu", None)
    assert environment.DEFAULTS.image_tag == "0.2.0" and environment.DEFAULTS.state_every_s == 60.0
    with pytest.raises(AttributeError, match="'devcie' is not a setting: did you mean 'device'"):
        settings.devcie  # noqa: B018
    with pytest.raises(AttributeError, match="read-only"):
        settings.device = "cuda"  # type: ignore[misc]
    with pytest.raises(SettingError, match="^ADAPTUNE_DEBUG='2' is not valid"):  # a bad value: its line where it is read
        environment.Settings({"ADAPTUNE_DEBUG": "2"}).debug  # noqa: B018
    monkeypatch.setenv("ADAPTUNE_LEASE_SECONDS", "7")
    assert environment.settings() is environment.settings() and environment.settings().lease_seconds == 7.0
    monkeypatch.setenv("ADAPTUNE_LEASE_SECONDS", "8")  # this process's environment changed: read again
    assert environment.settings().lease_seconds == 8.0 and environment.read("ADAPTUNE_LEASE_SECONDS") == 8.0


def test_patch_changes_settings_for_the_block_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTUNE_DEVICE", "cpu")
    monkeypatch.delenv("ADAPTUNE_STATE_EVERY_S", raising=False)
    with environment.patch(device=None, state_every_s=0, epoch_lines=False, cache_dir=Path("/c")) as patched:
        assert patched is environment.settings()
        assert (patched.device, patched.state_every_s, patched.epoch_lines, patched.cache_dir) == ("", 0.0, False, "/c")
        with environment.patch(device="xla"):
            assert environment.settings().device == "xla" and environment.settings().epoch_lines is False
        assert environment.settings().device == "" and os.environ["ADAPTUNE_DEVICE"] == "cpu"  # the environment untouched
        assert environment.given("ADAPTUNE_STATE_EVERY_S") == 0.0 and environment.given("ADAPTUNE_DEVICE") is None
    assert environment.settings().device == "cpu" and environment.settings().state_every_s == 60.0
    with pytest.raises(AttributeError, match="did you mean 'device'"), environment.patch(devcie="cpu"):
        pass

    @environment.patch(epoch_lines="off")
    def decorated() -> bool:
        return environment.settings().epoch_lines
    assert decorated() is False


def test_applied_sets_the_variables_for_the_block_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTUNE_IMAGE_TAG", "before")
    monkeypatch.delenv("ADAPTUNE_REGISTRY", raising=False)
    with environment.applied({"ADAPTUNE_IMAGE_TAG": "during", "ADAPTUNE_REGISTRY": "r"}):
        assert (os.environ["ADAPTUNE_IMAGE_TAG"], os.environ["ADAPTUNE_REGISTRY"]) == ("during", "r")
    assert os.environ["ADAPTUNE_IMAGE_TAG"] == "before" and "ADAPTUNE_REGISTRY" not in os.environ
    with pytest.raises(SettingError):
        with environment.applied({"ADAPTUNE_DEBUG": "perhaps"}):
            pass


def test_every_reader_named_exists() -> None:
    for variable in VARIABLES.values():
        for reader in variable.read_by.split(", "):
            if reader.split(".")[0] in ("adaptune", "components", "pipelines"):
                assert importlib.util.find_spec(reader) is not None, (variable.name, reader)
            else:
                assert (REPO_ROOT / reader).exists(), (variable.name, reader)


def test_the_settings_table_is_the_registry() -> None:
    readme = (REPO_ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    start = readme.index("<!-- settings table: python -m adaptune settings --markdown -->\n")
    table = readme[readme.index("\n", start) + 1:readme.index("\n<!-- end of settings table -->", start)]
    assert table == environment.markdown_table(), "docs/settings.md's table is stale: python -m adaptune settings --markdown"
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert [row[0].strip("| `") for row in rows] == list(VARIABLES)  # each once, in the registry's order
    assert {row[0].strip("| `"): row[1].strip("`") for row in rows} == {name: v.default for name, v in VARIABLES.items()}


def test_settings_lists_every_variable_with_its_value_and_source() -> None:
    done = _run("adaptune", "settings", "--preset", "h100", ADAPTUNE_EPOCH_LINES="off", ADAPTUNE_CPU_BF16="0",
                ADAPTUNE_COMPILE="eager")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["variable", "value", "source"]
    found = {line.split()[0]: line.split()[1:3] for line in lines[1:]}
    assert list(found) == list(VARIABLES)
    assert found["ADAPTUNE_EPOCH_LINES"] == ["off", "environment"]
    assert found["ADAPTUNE_COMPILE"] == ["eager", "environment"]  # the environment wins over the preset
    assert found["ADAPTUNE_ATTENTION"] == ["kernel", "preset"] and found["ADAPTUNE_RUNS_PER_GROUP"] == ["8", "preset"]
    assert found["ADAPTUNE_DEBUG"] == ["0", "default"] and found["ADAPTUNE_DEVICE"] == ["-", "default"]
    assert all(source in ("default", "environment", "preset") for _, source in found.values())


def test_settings_refuses_an_unknown_variable_or_a_bad_value_in_one_line() -> None:
    for settings, line in (({"ADAPTUNE_COMPLIE": "step_graphs"}, "ADAPTUNE_COMPLIE is not a setting adaptune knows: "
                                                                 "did you mean ADAPTUNE_COMPILE?"),
                           ({"ADAPTUNE_EPOCH_LINES": "maybe"}, "ADAPTUNE_EPOCH_LINES='maybe' is not valid: use 1/true/yes/on")):
        done = _run("adaptune", "settings", **settings)
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(f"adaptune settings: error: {line}")


def test_pipelines_refuses_an_unknown_variable_or_a_bad_value_before_anything_runs() -> None:
    done = _run("pipelines", "plan", "smoke", ADAPTUNE_COMPLIE="step_graphs")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "error: ADAPTUNE_COMPLIE is not a setting adaptune knows: did you mean ADAPTUNE_COMPILE?\n"
    done = _run("pipelines", "plan", "smoke", ADAPTUNE_RUNS_PER_GROUP="0")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: ADAPTUNE_RUNS_PER_GROUP='0' is not valid: use a whole number >= 1")
    assert len(done.stderr.splitlines()) == 1


# Files that may still read an ADAPTUNE_* variable from os.environ themselves. Pass-throughs copy variables into a
# child's environment without reading their meaning.
ALLOWED_READERS = {
    "adaptune/core/environment.py",  # the registry itself
    "pipelines/container_runner.py",  # passes variables through to the containers
    "pipelines/local.py",  # sets the components' environment
    "adaptune/fused/settings.py",  # reads its variables as one object, each through environment.parse
}


def _constants(paths: list[Path]) -> set[str]:
    """Module-level names bound to an "ADAPTUNE_..." string anywhere (a module reads another's constant too)."""
    names = set()
    for path in paths:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                    and node.value.value.startswith(environment.PREFIX)):
                names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names


def _environment_reads(tree: ast.AST, constants: set[str]) -> list[int]:
    """Lines reading os.environ (or a mapping named env/environ) at an ADAPTUNE_* name: .get, [], in, os.getenv."""
    def is_setting(key: ast.AST) -> bool:
        if isinstance(key, ast.Constant):
            return isinstance(key.value, str) and key.value.startswith(environment.PREFIX)
        return (key.id if isinstance(key, ast.Name) else key.attr if isinstance(key, ast.Attribute) else None) in constants

    def is_environ(node: ast.AST) -> bool:
        return ast.unparse(node).split(".")[-1] in ("environ", "env")

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and is_setting(node.args[0]) and isinstance(node.func, ast.Attribute):
            if (node.func.attr == "get" and is_environ(node.func.value)) or ast.unparse(node.func) == "os.getenv":
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value) and is_setting(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and is_setting(node.left) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if any(is_environ(right) for right in node.comparators):
                lines.append(node.lineno)
    return sorted(lines)


def test_no_module_reads_an_adaptune_variable_around_the_registry() -> None:
    paths = sorted(path for package in ("adaptune", "components", "pipelines") for path in (REPO_ROOT / package).rglob("*.py"))
    constants = _constants(paths)
    found = {}
    for path in paths:
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative not in ALLOWED_READERS:
            lines = _environment_reads(ast.parse(path.read_text(encoding="utf-8")), constants)
            if lines:
                found[relative] = lines
    assert not found, f"read these through adaptune.core.environment.read: {found}"
    assert all((REPO_ROOT / relative).is_file() for relative in ALLOWED_READERS)


def test_the_reader_check_sees_the_usual_ways_of_reading() -> None:
    source = '''
import os
NAME_ENV = "ADAPTUNE_X"
a = os.environ.get("ADAPTUNE_X")
b = os.environ[NAME_ENV]
c = NAME_ENV in os.environ
d = os.getenv(NAME_ENV)
e = env.get(module.NAME_ENV)
os.environ["ADAPTUNE_X"] = "1"
f = os.environ.get("HOME")
'''
    assert _environment_reads(ast.parse(source), {"NAME_ENV"}) == [4, 5, 6, 7, 8]


def test_a_setting_that_has_left_says_so_rather_than_guessing() -> None:
    assert environment.unknown({"ADAPTUNE_RESIDUAL": "autocast"}) == [
        "ADAPTUNE_RESIDUAL is a setting that has left (no measurement showed it paying; bench/LOG.md): unset it"]


def test_every_setting_the_code_reads_by_attribute_is_declared() -> None:
    """`settings().<name>` is resolved at run time; read here from the source, a misspelt or undeclared name fails
    before any run takes the path that reads it."""
    repo = Path(__file__).resolve().parents[1]
    read = set()
    for path in [*repo.glob("adaptune/**/*.py"), *repo.glob("pipelines/**/*.py"), *repo.glob("components/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                    and node.value.func.attr == "settings" and not node.value.args):
                read.add((node.attr, path.relative_to(repo).as_posix()))
    assert len(read) >= 10  # the reads this scan must see (device, data_dir, lease_seconds, ...)
    assert [(name, where) for name, where in sorted(read) if name not in environment.ATTRIBUTES and name != "environ"] == []
