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
