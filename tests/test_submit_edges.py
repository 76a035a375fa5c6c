"""`make submit` at its edges, against fakes: missing or expired credentials (google.auth.default and a refresh,
monkeypatched to raise as google-auth documents: DefaultCredentialsError when none are found, RefreshError when a
refresh is refused), a KFP host or Vertex AI endpoint on a closed loopback port, and a missing bucket in the GCS
emulator (tests/gcs_emulator.py). Each is one line on stderr saying what is wrong and what to do, and exit status 2."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google.auth
import google.auth.exceptions
import pytest

from pipelines import submit_checks
from pipelines.__main__ import main
from tests.gcs_emulator import gcs  # noqa: F401  (the fixture)

SETTINGS = {
    "ADAPTUNE_PROJECT": "proj-1", "ADAPTUNE_REGION": "us-central1", "ADAPTUNE_SERVICE_ACCOUNT": "runner@proj-1.iam.gserviceaccount.com",
    "ADAPTUNE_REGISTRY": "us-docker.pkg.dev/proj-1/adaptune", "ADAPTUNE_PIPELINE_ROOT": "gs://adaptune-test/pipeline-root",
}


@pytest.fixture()
def settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no adaptune.toml of the checkout's
    monkeypatch.delenv("KFP_HOST", raising=False)
    for name, value in SETTINGS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture()
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connecting is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture()
def listening_port() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


class _Credentials:
    def __init__(self, refresh_error: Exception | None = None) -> None:
        self.refresh_error = refresh_error

    def refresh(self, request: Any) -> None:
        if self.refresh_error:
            raise self.refresh_error


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], *starts: str) -> str:
    assert main(["submit", "glue_full"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert any(lines[0][len("error: "):].startswith(start) for start in starts), lines[0]
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_missing_credentials(settings: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def no_credentials(**_: Any) -> Any:
        raise google.auth.exceptions.DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_credentials)
    line = _one_line_exit_2(capsys, "no Google Cloud credentials")
    assert "gcloud auth application-default login" in line


def test_expired_credentials(settings: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    expired = google.auth.exceptions.RefreshError("('invalid_grant: Token has been expired or revoked.', {})")
    monkeypatch.setattr(google.auth, "default", lambda **_: (_Credentials(expired), "proj-1"))
    line = _one_line_exit_2(capsys, "the Google Cloud credentials could not be refreshed")
    assert "invalid_grant" in line and "application-default login` again" in line


def test_an_unreachable_vertex_endpoint(settings: None, monkeypatch: pytest.MonkeyPatch, closed_port: int,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(google.auth, "default", lambda **_: (_Credentials(), "proj-1"))
    monkeypatch.setattr(submit_checks, "vertex_endpoint", lambda region: ("127.0.0.1", closed_port))
    line = _one_line_exit_2(capsys, f"the Vertex AI endpoint 127.0.0.1:{closed_port} cannot be reached")
    assert "ADAPTUNE_REGION" in line


def test_an_unreachable_kfp_host(settings: None, monkeypatch: pytest.MonkeyPatch, closed_port: int,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KFP_HOST", f"http://127.0.0.1:{closed_port}")
    line = _one_line_exit_2(capsys, f"the KFP endpoint http://127.0.0.1:{closed_port} cannot be reached")
    assert "KFP_HOST" in line and "refused" in line.lower()


def test_a_missing_bucket(settings: None, gcs: Any, monkeypatch: pytest.MonkeyPatch, listening_port: int,  # noqa: F811
                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(google.auth, "default", lambda **_: (_Credentials(), "proj-1"))
    monkeypatch.setattr(submit_checks, "vertex_endpoint", lambda region: ("127.0.0.1", listening_port))
    monkeypatch.setenv("ADAPTUNE_PIPELINE_ROOT", f"{gcs.url('pipeline-root')}")  # the emulator's bucket: present
    monkeypatch.setenv("ADAPTUNE_RUNS_ROOT", "gs://no-such-bucket-here/adaptune-runs")
    line = _one_line_exit_2(capsys, "bucket gs://no-such-bucket-here (runs_root gs://no-such-bucket-here/adaptune-runs) does not exist")
    assert "gcloud storage buckets create gs://no-such-bucket-here" in line


def test_present_buckets_pass(settings: None, gcs: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from pipelines.submit import load_settings

    monkeypatch.setenv("ADAPTUNE_PIPELINE_ROOT", gcs.url("pipeline-root"))
    submit_checks.check_buckets(load_settings())  # the runs root defaults beside it, in the same bucket


def test_a_connection_error_while_submitting_is_one_line() -> None:
    import urllib3

    error = urllib3.exceptions.MaxRetryError(None, "/apis/v2beta1/healthz", reason=ConnectionRefusedError(111, "Connection refused"))
    line = submit_checks.explain(error, "the KFP endpoint http://127.0.0.1:9")
    assert line is not None and line.startswith("the KFP endpoint http://127.0.0.1:9 cannot be reached (") and "\n" not in line
    assert submit_checks.explain(ValueError("a bug"), "Vertex AI") is None  # anything else stays a traceback
