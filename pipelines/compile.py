"""Compile every named experiment: pipeline.yaml (paper_full) and pipelines/compiled/<name>.yaml.

Compilation is deterministic: the same code and the same image settings (ADAPTUNE_REGISTRY,
ADAPTUNE_IMAGE_TAG) give byte-identical YAML, so a test can tell when the checked-in files are stale.
"""

from __future__ import annotations

from pathlib import Path

from kfp import compiler

from adaptune.sweep.experiments import EXPERIMENTS, get_experiment
from adaptune.sweep.plan import plan
from pipelines.reproduction import build_pipeline

REPO_ROOT = Path(__file__).resolve().parents[1]
MAIN_EXPERIMENT = "paper_full"  # pipeline.yaml at the repo root
COMPILED_DIR = Path("pipelines") / "compiled"


def compile_experiment(name: str, package_path: str | Path, target: str = "vertex") -> Path:
    """Validate the experiment's plan, then compile its DAG to package_path."""
    spec = get_experiment(name)
    plan(spec)  # a bad grid fails here, before any YAML is written
    package_path = Path(package_path)
    package_path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(spec, target=target), str(package_path))
    return package_path


def compile_all(root: str | Path = REPO_ROOT) -> list[Path]:
    """Write <root>/pipeline.yaml and <root>/pipelines/compiled/<name>.yaml for every experiment."""
    root = Path(root)
    written = [compile_experiment(MAIN_EXPERIMENT, root / "pipeline.yaml")]
    written += [compile_experiment(name, root / COMPILED_DIR / f"{name}.yaml") for name in EXPERIMENTS]
    return written
