"""Before a submission reaches out: the credentials, the endpoint and the buckets it needs, each checked in a few
seconds and, where missing or unreachable, named in one line with what to do (a SettingError, exit status 2).

Without these checks a missing credential is a 35-line traceback ending in google.auth's DefaultCredentialsError,
a KFP host on a closed port 107 lines ending in urllib3's MaxRetryError, and an unreachable Vertex AI endpoint
minutes of the SDK's retries. `explain` turns the same errors into one line where they arise later anyway.
"""

from __future__ import annotations

import socket
import urllib.parse
from typing import Any

from adaptune.core.environment import SettingError
from pipelines.submit import ENV_VARS, SubmitSettings

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
CONNECT_TIMEOUT_S = 10.0
LOGIN = "run `gcloud auth application-default login`"


def check_credentials() -> None:
    """Application Default Credentials exist and can be refreshed (what Vertex AI's client will do first)."""
    import google.auth
    import google.auth.exceptions
    import google.auth.transport.requests

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
        credentials.refresh(google.auth.transport.requests.Request())
    except google.auth.exceptions.DefaultCredentialsError:
        raise SettingError(f"no Google Cloud credentials (Application Default Credentials): {LOGIN}, "
                            "or set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file") from None
    except google.auth.exceptions.RefreshError as error:
        raise SettingError(f"the Google Cloud credentials could not be refreshed (expired or revoked: {_first_line(error)}): "
                            f"{LOGIN} again") from None
    except google.auth.exceptions.TransportError as error:
        raise SettingError(f"Google's sign-in service cannot be reached ({_first_line(error)}): check this machine's network "
                            "and proxy settings") from None


def vertex_endpoint(region: str) -> tuple[str, int]:
    """The regional endpoint the Vertex AI SDK calls (google.cloud.aiplatform's default for a location)."""
    return f"{region}-aiplatform.googleapis.com", 443


def check_vertex_endpoint(region: str) -> None:
    host, port = vertex_endpoint(region)
    _check_reachable(host, port, f"the Vertex AI endpoint {host}:{port}",
                     f"check {ENV_VARS['region']} (now {region!r}) and this machine's network")


def check_kfp_host(url: str) -> None:
    parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
    if not parsed.hostname:
        raise SettingError(f"KFP_HOST={url!r} is not a URL: set it to the KFP API's address, e.g. http://localhost:8080")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    _check_reachable(parsed.hostname, port, f"the KFP endpoint {url}",
                     "check KFP_HOST (e.g. `kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80`, then "
                     "KFP_HOST=http://localhost:8080), or unset it to submit to Vertex AI")


def check_buckets(settings: SubmitSettings) -> None:
    """The buckets of the pipeline root and the run store exist (the run store's is never created for you)."""
    import fsspec

    wanted = {"pipeline_root": settings.pipeline_root, "runs_root": settings.resolved_runs_root()}
    for key, url in wanted.items():
        if not url or not url.startswith("gs://"):
            continue
        bucket = url[len("gs://"):].split("/", 1)[0]
        filesystem, _ = fsspec.core.url_to_fs(url)
        if not filesystem.exists(bucket):
            raise SettingError(f"bucket gs://{bucket} ({key} {url}) does not exist: create it "
                                f"(`gcloud storage buckets create gs://{bucket} --location={settings.region or 'REGION'}`) "
                                f"or fix ${ENV_VARS[key]} / `{key}` in adaptune.toml")


def explain(error: BaseException, target: str) -> str | None:
    """One line for a network or credential error raised while submitting to `target`, or None for any other."""
    import google.auth.exceptions

    if isinstance(error, google.auth.exceptions.DefaultCredentialsError):
        return f"no Google Cloud credentials (Application Default Credentials): {LOGIN}"
    if isinstance(error, google.auth.exceptions.RefreshError):
        return f"the Google Cloud credentials could not be refreshed (expired or revoked): {LOGIN} again"
    if _is_connection_error(error):
        return f"{target} cannot be reached ({_first_line(error)}): check the address and this machine's network"
    return None


def _is_connection_error(error: BaseException) -> bool:
    import requests
    import urllib3
    from google.api_core import exceptions as api_exceptions

    return isinstance(error, (urllib3.exceptions.MaxRetryError, urllib3.exceptions.NewConnectionError,
                              requests.exceptions.ConnectionError, api_exceptions.ServiceUnavailable,
                              api_exceptions.RetryError, ConnectionError))


def _check_reachable(host: str, port: int, what: str, todo: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as error:
        raise SettingError(f"{what} cannot be reached ({error.strerror or error}): {todo}") from None


def _first_line(error: Any) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__
