"""The GCS emulator (bench.stand_ins.gcs_emulator: fake-gcs-server on the loopback) as the tests use it: the `gcs` and
`bucket` fixtures, and `gcs_emulator()`, which skips the test, saying why, where the server cannot run here.

Usage:
    from tests.gcs_emulator import gcs  # noqa: F401  (the fixture)
    def test_x(gcs): fsspec.core.url_to_fs(gcs.url("runs"))
or  with gcs_emulator("my-bucket") as emulator: ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.stand_ins import gcs_emulator as emulator
from bench.stand_ins.flaky_proxy import FlakyProxy, Rule
from bench.stand_ins.gcs_emulator import DEFAULT_BUCKET, EmulatorUnavailable, GcsEmulator


@contextlib.contextmanager
def gcs_emulator(bucket: str = DEFAULT_BUCKET, log_dir: str | os.PathLike[str] | None = None,
                 preload: str | os.PathLike[str] | None = None) -> Iterator[GcsEmulator]:
    """bench.stand_ins.gcs_emulator.gcs_emulator; the test is skipped where fake-gcs-server cannot run here."""
    with contextlib.ExitStack() as stack:
        try:
            running = stack.enter_context(emulator.gcs_emulator(bucket, log_dir, preload))
        except EmulatorUnavailable as reason:
            pytest.skip(str(reason))
        yield running


@contextlib.contextmanager
def flaky_gcs_emulator(rule: Rule, log_dir: str | os.PathLike[str] | None = None) -> Iterator[tuple[GcsEmulator, FlakyProxy]]:
    """gcs_emulator() behind a FlakyProxy (bench.stand_ins.flaky_proxy) failing the requests `rule` picks: this process's
    clients reach the emulator through the proxy while it is active (STORAGE_EMULATOR_HOST, put back on exit)."""
    with gcs_emulator(log_dir=log_dir) as running, FlakyProxy(running.endpoint, rule) as proxy:
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint  # gcsfs reads it on every request (_location())
        yield running, proxy


@pytest.fixture
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """A fresh emulator per test, bucket "adaptune-test"; its log is kept under pytest's basetemp
    (a folder of its own, so a test's tmp_path holds only what the test wrote)."""
    with gcs_emulator(log_dir=tmp_path_factory.mktemp("gcs-emulator")) as emulator:
        yield emulator


@pytest.fixture(params=["memory", "gcs"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A bucket store root, each test on both: memory:// (fsspec's in-memory filesystem, its own prefix per test),
    or gs:// on a fresh emulator."""
    if request.param == "memory":
        yield f"memory://adaptune-bucket/{tmp_path.name}"
        return
    with gcs_emulator(log_dir=tmp_path) as emulator:
        yield emulator.url("store")
