"""Submission: settings from env or adaptune.toml, one message for what is missing, and the real
aiplatform request sent to a fake Vertex AI endpoint on loopback (no cloud, no credentials)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptune.core.environment import SettingError
from pipelines.submit import ENV_VARS, SubmitSettings, load_settings, submit, submit_vertex


def test_missing_settings_are_named_in_one_message(tmp_path: Path) -> None:
    settings = load_settings(env={"ADAPTUNE_PROJECT": "p"}, config_path=tmp_path / "absent.toml")
    with pytest.raises(SettingError) as error:
        submit_vertex("smoke", settings)
    message = str(error.value)
    for var in ("ADAPTUNE_REGION", "ADAPTUNE_PIPELINE_ROOT", "ADAPTUNE_SERVICE_ACCOUNT"):
        assert var in message
    assert "ADAPTUNE_PROJECT" not in message and "KFP_HOST" in message


def test_settings_come_from_env_over_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "adaptune.toml"
    config.write_text('[submit]\nproject = "from-file"\nregion = "europe-west4"\nregistry = "eu.gcr.io/x"\n')
    settings = load_settings(env={"ADAPTUNE_PROJECT": "from-env"}, config_path=config)
    assert (settings.project, settings.region, settings.registry) == ("from-env", "europe-west4", "eu.gcr.io/x")
    config.write_text('[submit]\nprojekt = "typo"\n')
    with pytest.raises(SettingError, match="unknown key.*projekt"):
        load_settings(env={}, config_path=config)


class _FakeVertex(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "body": body, "authorization": self.headers.get("Authorization")})
        reply = {**body, "name": self.path.split("?")[0].lstrip("/").removeprefix("v1/") + "/fake-job-1",
                 "state": "PIPELINE_STATE_PENDING"}
        self._send(reply)

    def do_GET(self) -> None:  # noqa: N802
        self._send({"name": self.path.lstrip("/").removeprefix("v1/"), "state": "PIPELINE_STATE_RUNNING"})

    def _send(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_vertex() -> Iterator[str]:
    _FakeVertex.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeVertex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _jobs_created() -> int:
    return sum("pipelineJobs" in request["path"] for request in _FakeVertex.requests)


@pytest.fixture
def vertex_experiments(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """PipelineJob.submit(experiment=...)'s calls to the Vertex AI Metadata service, recorded instead of sent
    (as the bucket check is): Experiment.get_or_create, and the Experiment's _log_experiment_loggable that
    adds the job's pipeline run to it; each with the number of jobs created on the fake endpoint by then."""
    from google.cloud.aiplatform.metadata import experiment_resources

    events: list[tuple[Any, ...]] = []

    class FakeExperiment:  # what PipelineJob reads of the Experiment that Metadata returns
        def __init__(self, name: str, project: str, location: str) -> None:
            self.name = name
            self._metadata_context = type("Context", (), {"_project_tuple": (project, None), "location": location})()

        def _log_experiment_loggable(self, loggable: Any) -> None:
            events.append(("add run", self.name, loggable.resource_name, _jobs_created()))

    def get_or_create(cls: Any, experiment_name: str, *, project: str | None = None, location: str | None = None,
                      credentials: Any = None, description: str | None = None) -> FakeExperiment:
        events.append(("get_or_create", experiment_name, project, location, _jobs_created()))
        return FakeExperiment(experiment_name, project, location)

    monkeypatch.setattr(experiment_resources.Experiment, "get_or_create", classmethod(get_or_create))
    return events


def test_vertex_submission_sends_the_compiled_pipeline(fake_vertex: str, vertex_experiments: list[tuple[Any, ...]],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth.credentials import AnonymousCredentials

    secret = "-----BEGIN PRIVATE KEY-----fake"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS_JSON", secret)  # must never reach the request
    # PipelineJob.submit first checks (or creates) the pipeline root's bucket through the Storage and
    # Resource Manager APIs, which retry for minutes offline; record that call instead.
    from google.cloud.aiplatform.utils import gcs_utils

    buckets: list[str] = []
    monkeypatch.setattr(gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
                        lambda output_artifacts_gcs_dir, **_: buckets.append(output_artifacts_gcs_dir))
    settings = SubmitSettings(
        project="proj-1", region="us-central1", pipeline_root="gs://bucket/root",
        service_account="runner@proj-1.iam.gserviceaccount.com", registry="us-docker.pkg.dev/proj-1/repo",
        image_tag="7.7.7", data_dir="/gcs/bucket/data",
    )
    submit_vertex("smoke", settings, credentials=AnonymousCredentials(), api_endpoint=fake_vertex, api_transport="rest")

    assert buckets == ["gs://bucket/root"]
    assert [event[:2] for event in vertex_experiments] == [("get_or_create", "adaptune-smoke")] * 2 + [("add run", "adaptune-smoke")]
    (request,) = [r for r in _FakeVertex.requests if "pipelineJobs" in r["path"]]
    assert request["path"].startswith("/v1/projects/proj-1/locations/us-central1/pipelineJobs")
    body = request["body"]
    assert body["displayName"].startswith("adaptune-smoke-")
    assert body["serviceAccount"] == settings.service_account
    assert body["runtimeConfig"]["gcsOutputDirectory"] == "gs://bucket/root"
    # The run store defaults to a folder beside the pipeline root; the spec is the compiled default.
    assert body["runtimeConfig"]["parameterValues"] == {
        "data_dir": "/gcs/bucket/data", "runs_root": "gs://bucket/root/adaptune-runs", "retry_failed": False, "retry_unreadable": False,
        "retrain_stale": False,
    }
    spec = body["pipelineSpec"]
    assert spec["pipelineInfo"]["name"] == "adaptune-smoke"
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {"us-docker.pkg.dev/proj-1/repo/adaptune-cpu:7.7.7"}
    text = json.dumps(body)
    assert secret not in text and "Bearer" not in text and request["authorization"] is None
    assert settings.service_account not in json.dumps(spec)  # the identity is a request field, not in the spec


def test_no_credential_or_setting_lands_in_a_compiled_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.compile import compile_experiment

    values = {var: f"secret-{var.lower()}" for var in ENV_VARS.values() if var not in ("ADAPTUNE_REGISTRY", "ADAPTUNE_IMAGE_TAG")}
    values.update(GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "key.json"), KFP_TOKEN="secret-token")
    for var, value in values.items():
        monkeypatch.setenv(var, value)
    for target in ("vertex", "kfp"):
        text = compile_experiment("glue_full", tmp_path / f"{target}.yaml", target=target).read_text()
        leaked = [var for var, value in values.items() if value in text]
        assert not leaked, f"{target}: {leaked}"


def test_kfp_host_submits_a_kfp_target_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import kfp

    calls: dict[str, Any] = {}

    class RecordingClient:
        def __init__(self, host: str) -> None:
            calls["host"] = host

        def create_run_from_pipeline_package(self, package: str, **kwargs: Any) -> Any:
            calls["package"] = Path(package).read_text()
            calls.update(kwargs)
            return type("Run", (), {"run_id": "run-1"})()

    monkeypatch.setattr(kfp, "Client", RecordingClient)
    monkeypatch.chdir(tmp_path)  # no adaptune.toml here: settings come from the environment alone
    env = {"KFP_HOST": "http://127.0.0.1:1", "ADAPTUNE_RUNS_ROOT": "gs://b/runs"}
    with pytest.raises(SettingError, match="ADAPTUNE_REGISTRY"):  # the placeholder registry is never submitted
        submit("glue_full", env=env)
    line = submit("glue_full", env={**env, "ADAPTUNE_REGISTRY": "us-docker.pkg.dev/p/r"})
    assert line == "submitted glue_full to http://127.0.0.1:1: run run-1"
    assert calls["host"] == "http://127.0.0.1:1" and calls["enable_caching"] is None
    assert calls["arguments"] == {"data_dir": "", "runs_root": "gs://b/runs", "retry_failed": False, "retrain_stale": False, "retry_unreadable": False}
    assert calls["run_name"].startswith("adaptune-glue-full-")
    assert "nodeSelector" in calls["package"] and "nvidia.com/gpu" in calls["package"]


def test_a_submission_without_a_run_store_says_where_to_set_one() -> None:
    with pytest.raises(SettingError, match="ADAPTUNE_RUNS_ROOT"):
        SubmitSettings().resolved_runs_root()
    assert SubmitSettings(pipeline_root="gs://b/root/").resolved_runs_root() == "gs://b/root/adaptune-runs"
    assert SubmitSettings(pipeline_root="gs://b/root", runs_root="gs://c/store").resolved_runs_root() == "gs://c/store"



def test_vertex_experiment_names_follow_the_experiment_and_vertex_ais_rule(tmp_path: Path) -> None:
    from pipelines.submit import VERTEX_EXPERIMENT_NAME, vertex_experiment_name

    assert vertex_experiment_name("glue_full") == "adaptune-glue-full"
    assert vertex_experiment_name("Paper_Full.v2") == "adaptune-paper-full-v2"
    assert len(vertex_experiment_name("x" * 300)) == 128
    for name in ("smoke", "glue_full", "paper_full", "Paper_Full.v2", "x" * 300):
        assert VERTEX_EXPERIMENT_NAME.fullmatch(vertex_experiment_name(name))
    assert SubmitSettings().resolved_vertex_experiment("glue_full") == "adaptune-glue-full"
    config = tmp_path / "adaptune.toml"
    config.write_text('[submit]\nvertex_experiment = "from-file"\n')
    assert load_settings(env={}, config_path=config).resolved_vertex_experiment("glue_full") == "from-file"
    assert load_settings(env={"ADAPTUNE_VERTEX_EXPERIMENT": "from-env"}, config_path=config).vertex_experiment == "from-env"
    with pytest.raises(SettingError, match="ADAPTUNE_VERTEX_EXPERIMENT.*adaptune-glue-full"):
        SubmitSettings(vertex_experiment="Glue_Full").resolved_vertex_experiment("glue_full")


def test_a_vertex_submission_joins_the_experiment_named_after_it_its_job_otherwise_unchanged(
        fake_vertex: str, vertex_experiments: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Successive submissions of glue_full sit side by side in the Vertex AI Experiment "adaptune-glue-full",
    with the aggregate's metrics. PipelineJob.submit(experiment=...) gets or creates the Experiment through the
    Vertex AI Metadata service before it creates the job (so a refused Experiment creates no job), and adds the
    job's pipeline run to it after; the Experiment then shows the run's parameters and the system.Metrics
    artifacts it logged (https://cloud.google.com/vertex-ai/docs/pipelines/log-metrics-experiments;
    https://cloud.google.com/python/docs/reference/aiplatform/latest/google.cloud.aiplatform.PipelineJob#google_cloud_aiplatform_PipelineJob_submit).

    Offline, as tests/test_cloud_rehearsal.py builds the job payload: the Metadata calls are recorded instead of
    sent (the `vertex_experiments` fixture), the job creation goes to the fake endpoint, and its body is compared
    with the same submission without an Experiment."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform
    from google.cloud.aiplatform.utils import gcs_utils

    import pipelines.submit as submit_module

    monkeypatch.setattr(gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist", lambda **_: None)
    monkeypatch.setattr(submit_module, "display_name", lambda name: f"adaptune-{name}-fixed")  # the bodies compare
    events = vertex_experiments
    settings = SubmitSettings(project="proj-1", region="us-central1", pipeline_root="gs://bucket/root",
                              service_account="runner@proj-1.iam.gserviceaccount.com", registry="us-docker.pkg.dev/proj-1/repo")
    connection = {"credentials": AnonymousCredentials(), "api_endpoint": fake_vertex, "api_transport": "rest"}

    job = submit_vertex("glue_full", settings, **connection)

    (created,) = [r for r in _FakeVertex.requests if "pipelineJobs" in r["path"]]  # nothing else reached Vertex AI
    assert len(_FakeVertex.requests) == 1
    assert events == [
        ("get_or_create", "adaptune-glue-full", "proj-1", "us-central1", 0),  # checked before the job exists
        ("get_or_create", "adaptune-glue-full", "proj-1", "us-central1", 1),
        ("add run", "adaptune-glue-full", job.resource_name, 1),  # the created job's run joins the Experiment
    ]
    assert job.resource_name.startswith("projects/proj-1/locations/us-central1/pipelineJobs/")

    # The same submission without an Experiment sends the same job: attaching it changes no field of the payload.
    submit_without = aiplatform.PipelineJob.submit
    monkeypatch.setattr(aiplatform.PipelineJob, "submit",
                        lambda self, experiment=None, **kwargs: submit_without(self, **kwargs))
    events.clear()
    submit_vertex("glue_full", settings, **connection)
    assert events == []
    plain = [r for r in _FakeVertex.requests if "pipelineJobs" in r["path"]][1]
    assert created["body"] == plain["body"]
    assert created["path"].split("?")[0] == plain["path"].split("?")[0]

    # What the Experiment shows of each run: its parameters and the aggregate's sweep_summary, a system.Metrics
    # artifact (run counts, accelerator-hours, each method's GLUE mean; see adaptune/sweep/console_metrics.py).
    spec = created["body"]["pipelineSpec"]
    outputs = spec["components"]["comp-aggregate"]["outputDefinitions"]["artifacts"]
    assert outputs["sweep_summary"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert set(created["body"]["runtimeConfig"]["parameterValues"]) == {"data_dir", "runs_root", "retry_failed", "retrain_stale", "retry_unreadable"}
