"""Submit a named experiment to Vertex AI Pipelines, or to a KFP endpoint when KFP_HOST is set.

Settings come from environment variables, else from the [submit] table of a TOML file
(`adaptune.toml` in the current directory, or $ADAPTUNE_CONFIG):

    env var                    toml key          what
    ADAPTUNE_PROJECT           project           Google Cloud project (Vertex AI)
    ADAPTUNE_REGION            region            Vertex AI region, e.g. us-central1
    ADAPTUNE_PIPELINE_ROOT     pipeline_root     gs:// path for the pipeline's artifacts
    ADAPTUNE_SERVICE_ACCOUNT   service_account   the service account the pipeline runs as
    ADAPTUNE_REGISTRY          registry          image registry (components/images.py), optional
    ADAPTUNE_IMAGE_TAG         image_tag         image tag, optional
    ADAPTUNE_DATA_DIR_REMOTE   data_dir          data mirror the data step reads (e.g. /gcs/bucket/data); empty = the run store's staged one
                                                 (make stage-data), else the hub
    ADAPTUNE_RUNS_ROOT         runs_root         the run store (gs://bucket/prefix); default <pipeline_root>/adaptune-runs
    ADAPTUNE_VERTEX_EXPERIMENT vertex_experiment the Vertex AI Experiment the run joins; default adaptune-<name>
                                                 (glue_full -> adaptune-glue-full; see vertex_experiment_name)

Credentials are never read here: Vertex AI uses Application Default Credentials at submit time,
and nothing but the names above reaches the request; the compiled spec holds no setting at all.

Submitting is two steps: `prepare_submission` loads the settings, picks the target (KFP_HOST, else Vertex AI) and
checks everything that needs no network, once, into a `Submission`; `send` compiles and submits a Submission,
checking nothing again. `submit` is the two in turn; `python -m pipelines submit` runs the checks that need the
network (pipelines.submit_checks) between them. A setting that is missing or malformed is one
adaptune.core.environment.SettingError line (a UserError: exit status 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import re
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from adaptune.core import environment
from adaptune.core.environment import SettingError
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.retrain import RetrainPolicy
from pipelines.compile import compile_experiment
from pipelines.reproduction import pipeline_name

CONFIG_FILE = "adaptune.toml"
# setting -> environment variable; the first four are required for Vertex AI.
ENV_VARS = {
    "project": "ADAPTUNE_PROJECT",
    "region": "ADAPTUNE_REGION",
    "pipeline_root": "ADAPTUNE_PIPELINE_ROOT",
    "service_account": "ADAPTUNE_SERVICE_ACCOUNT",
    "registry": "ADAPTUNE_REGISTRY",
    "image_tag": "ADAPTUNE_IMAGE_TAG",
    "data_dir": "ADAPTUNE_DATA_DIR_REMOTE",
    "runs_root": "ADAPTUNE_RUNS_ROOT",
    "vertex_experiment": "ADAPTUNE_VERTEX_EXPERIMENT",
}
REQUIRED_FOR_VERTEX = ("project", "region", "pipeline_root", "service_account")
# A Vertex AI Experiment's name (its metadata context id): lowercase letters, digits and hyphens, at most
# 128, not starting with a hyphen.
VERTEX_EXPERIMENT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")


@dataclasses.dataclass(frozen=True)
class SubmitSettings:
    project: str | None = None
    region: str | None = None
    pipeline_root: str | None = None
    service_account: str | None = None
    registry: str | None = None
    image_tag: str | None = None
    data_dir: str = ""
    runs_root: str | None = None
    vertex_experiment: str | None = None

    def resolved_vertex_experiment(self, name: str) -> str:
        """The Vertex AI Experiment a submission of experiment `name` joins: vertex_experiment, else
        vertex_experiment_name(name). A name Vertex AI would refuse is refused here, before compiling."""
        chosen = self.vertex_experiment or vertex_experiment_name(name)
        if not VERTEX_EXPERIMENT_NAME.fullmatch(chosen):
            raise SettingError(
                f"vertex_experiment {chosen!r} is not a Vertex AI Experiment name (lowercase letters, digits and hyphens, "
                f"at most 128, not starting with a hyphen): set ${ENV_VARS['vertex_experiment']} or `vertex_experiment = ...` "
                f"under [submit] in {CONFIG_FILE}, e.g. {vertex_experiment_name(name)!r}"
            )
        return chosen

    def resolved_runs_root(self) -> str:
        """The run store: runs_root, else a folder beside the pipeline's artifacts. Keep it between
        submissions: it is what makes a resubmission reuse finished runs."""
        if self.runs_root:
            return self.runs_root
        if self.pipeline_root:
            return self.pipeline_root.rstrip("/") + "/adaptune-runs"
        raise SettingError(f"no run store: set ${ENV_VARS['runs_root']} or `runs_root = \"gs://bucket/prefix\"` under [submit] in {CONFIG_FILE}")


def load_settings(env: Mapping[str, str] | None = None, config_path: str | Path | None = None) -> SubmitSettings:
    """Environment variables first, then the [submit] table of the config file (if it exists).

    The file is `config_path`, else $ADAPTUNE_CONFIG (which must exist when set), else ./adaptune.toml
    (optional). Its [submit] table may hold only the keys above, each a string.
    """
    named = environment.given("ADAPTUNE_CONFIG", env)
    if config_path is None and named and not Path(named).is_file():
        raise SettingError(f"$ADAPTUNE_CONFIG={named} is not a file: point it at a TOML file with a [submit] table, or unset it")
    path = Path(config_path or named or CONFIG_FILE)
    from_file: dict[str, Any] = {}
    if path.is_file():
        try:
            from_file = tomllib.loads(path.read_text()).get("submit", {})
        except tomllib.TOMLDecodeError as error:
            raise SettingError(f"{path} is not valid TOML: {error}") from None
        except UnicodeDecodeError:
            raise SettingError(f"{path} is not a UTF-8 text file: write the settings as TOML") from None
        if not isinstance(from_file, dict):
            raise SettingError(
                f"{path}: `submit` must be a table of settings, not submit = {from_file!r}: write a `[submit]` line, "
                'then one `key = "value"` line per setting (e.g. project = "my-project")'
            )
        unknown = sorted(set(from_file) - set(ENV_VARS))
        if unknown:
            raise SettingError(f"{path} [submit] has unknown key(s) {unknown}; known: {sorted(ENV_VARS)}")
        for key, value in from_file.items():
            if not isinstance(value, str):
                raise SettingError(
                    f'{path} [submit] {key} must be a string in quotes ({key} = "..."), not {value!r} ({type(value).__name__})'
                )
    values: dict[str, Any] = {key: environment.given(var, env) or from_file.get(key) for key, var in ENV_VARS.items()}
    values["data_dir"] = values["data_dir"] or ""
    return SubmitSettings(**values)


def require_registry(settings: SubmitSettings) -> None:
    """The images must come from where `make images` pushed them, never the placeholder default."""
    from components.images import DEFAULT_REGISTRY

    if not settings.registry or settings.registry.rstrip("/") == DEFAULT_REGISTRY:
        raise SettingError(f"no image registry: set ${ENV_VARS['registry']} (or `registry = ...` under [submit] in {CONFIG_FILE}) "
                            "to where `make images REGISTRY=...` pushed the images, e.g. us-docker.pkg.dev/PROJECT/adaptune")


def require_vertex_settings(settings: SubmitSettings) -> None:
    missing = [key for key in REQUIRED_FOR_VERTEX if not getattr(settings, key)]
    if missing:
        lines = [f"  {key}: set ${ENV_VARS[key]} or `{key} = ...` under [submit] in {CONFIG_FILE}" for key in missing]
        raise SettingError("missing Vertex AI setting(s):\n" + "\n".join(lines) + "\n(or set KFP_HOST to submit to a KFP endpoint)")


@contextlib.contextmanager
def image_settings(settings: SubmitSettings) -> Iterator[None]:
    """Make components.images.image_for see the configured registry and tag while compiling."""
    chosen = {ENV_VARS["registry"]: settings.registry, ENV_VARS["image_tag"]: settings.image_tag}
    with environment.applied({name: value for name, value in chosen.items() if value}):
        yield


def vertex_experiment_name(name: str) -> str:
    """The Vertex AI Experiment that submissions of experiment `name` join by default, so that successive
    submissions sit side by side: "adaptune-" + the name in lowercase, each character other than a
    letter, digit or hyphen made a hyphen, cut to 128 characters (glue_full -> "adaptune-glue-full")."""
    return ("adaptune-" + re.sub(r"[^a-z0-9-]", "-", name.lower()))[:128]


def display_name(name: str, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{pipeline_name(get_experiment(name))}-{now:%Y%m%d-%H%M%S}"


def pipeline_arguments(settings: SubmitSettings, policy: RetrainPolicy = RetrainPolicy()) -> dict[str, Any]:
    """The run-time parameters of a submission (the spec itself is the compiled default): the policy as the
    pipeline's three flags."""
    return {"data_dir": settings.data_dir, "runs_root": settings.resolved_runs_root(), **policy.as_flags()}


@dataclasses.dataclass(frozen=True)
class Submission:
    """An experiment, the settings it is submitted with and where to: checked (check_submission), so that sending
    it checks nothing again."""

    name: str
    settings: SubmitSettings
    host: str | None = None  # a KFP endpoint; None: Vertex AI
    vertex_experiment: str | None = None  # the Vertex AI Experiment the run joins (Vertex AI only)

    @property
    def target(self) -> str:
        """Where it goes, in words (for the lines that explain a failure on the way)."""
        return f"the KFP endpoint {self.host}" if self.host else "Vertex AI"


def check_submission(name: str, settings: SubmitSettings, host: str | None = None) -> Submission:
    """Every check of the settings a submission needs without the network, in the order a user fixes them: the
    Vertex AI settings (no `host`), the image registry, the Vertex AI Experiment's name, the run store."""
    if not host:
        require_vertex_settings(settings)
    require_registry(settings)
    vertex_experiment = None if host else settings.resolved_vertex_experiment(name)
    settings.resolved_runs_root()
    return Submission(name, settings, host or None, vertex_experiment)


def prepare_submission(name: str, env: Mapping[str, str] | None = None) -> Submission:
    """The settings loaded (load_settings) and checked (check_submission); to KFP_HOST if set, else Vertex AI."""
    env = os.environ if env is None else env
    get_experiment(name)  # before the settings are read: a typo in the name is the first thing to fix
    return check_submission(name, load_settings(env), env.get("KFP_HOST"))


def submit_vertex(name: str, settings: SubmitSettings, credentials: Any = None, api_endpoint: str | None = None,
                  api_transport: str | None = None, policy: RetrainPolicy = RetrainPolicy()) -> Any:
    """check_submission, then send it to Vertex AI (_to_vertex); returns the submitted PipelineJob."""
    return _to_vertex(check_submission(name, settings), policy, credentials, api_endpoint, api_transport)


def _to_vertex(submission: Submission, policy: RetrainPolicy, credentials: Any = None, api_endpoint: str | None = None,
               api_transport: str | None = None) -> Any:
    """Compile and submit to Vertex AI Pipelines; returns the submitted PipelineJob.

    The run joins the Vertex AI Experiment settings.resolved_vertex_experiment(name) (created on first
    use): PipelineJob.submit(experiment=...) gets or creates it before creating the job and adds the
    run to it after, where the console lists every run of the experiment with its parameters and the
    system.Metrics artifacts it logged (the aggregate's `sweep_summary`).
    `credentials`, `api_endpoint` and `api_transport` go to aiplatform.init (tests point them at a
    loopback endpoint); None uses Application Default Credentials and the regional endpoint.
    """
    from google.cloud import aiplatform

    name, settings = submission.name, submission.settings
    init_args: dict[str, Any] = {"project": settings.project, "location": settings.region}
    if credentials is not None:
        init_args["credentials"] = credentials
    if api_endpoint is not None:
        init_args["api_endpoint"] = api_endpoint
    if api_transport is not None:
        init_args["api_transport"] = api_transport
    aiplatform.init(**init_args)
    with tempfile.TemporaryDirectory() as tmp, image_settings(settings):
        package = compile_experiment(name, Path(tmp) / f"{name}.yaml", target="vertex")
        job = aiplatform.PipelineJob(
            display_name=display_name(name),
            template_path=str(package),
            pipeline_root=settings.pipeline_root,
            parameter_values=pipeline_arguments(settings, policy),
            # None keeps each task's compiled choice (all off); True would override them and reuse a stale
            # aggregate and report after --retry-failed. The run store decides which runs to train.
            enable_caching=None,
            project=settings.project,
            location=settings.region,
        )
        job.submit(service_account=settings.service_account, experiment=submission.vertex_experiment)
    return job


def _to_kfp(submission: Submission, policy: RetrainPolicy) -> Any:
    """Compile for a KFP cluster (node selectors, tolerations, timeouts, bounded fan-out) and create a run on its host."""
    import kfp

    name, settings = submission.name, submission.settings
    with tempfile.TemporaryDirectory() as tmp, image_settings(settings):
        package = compile_experiment(name, Path(tmp) / f"{name}.yaml", target="kfp")
        client = kfp.Client(host=submission.host)
        return client.create_run_from_pipeline_package(
            str(package),
            arguments=pipeline_arguments(settings, policy),
            run_name=display_name(name),
            experiment_name="adaptune",
            enable_caching=None,  # keep the compiled choice: caching off on every task
        )


def send(submission: Submission, policy: RetrainPolicy = RetrainPolicy()) -> str:
    """Compile and submit a checked submission, checking nothing again; returns a line to print."""
    if submission.host:
        result = _to_kfp(submission, policy)
        return f"submitted {submission.name} to {submission.host}: run {getattr(result, 'run_id', result)}"
    job = _to_vertex(submission, policy)
    return f"submitted {submission.name} to Vertex AI: {job.resource_name} (Vertex AI Experiment {submission.vertex_experiment})"


def submit(name: str, env: Mapping[str, str] | None = None, policy: RetrainPolicy = RetrainPolicy()) -> str:
    """Submit experiment `name`: to KFP_HOST if set, else Vertex AI (prepare_submission, then send); returns a line to print."""
    return send(prepare_submission(name, env), policy)
