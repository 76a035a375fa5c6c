"""The data-preparation step: every task a plan uses read once, checked, split and tokenized into the run store,
before any accelerator is asked for; then `localize_prepared` gives a shard (or the report) what it reads.

Layout under the store (adaptune.data.prepared says what each folder holds):

    prepared/<task>-<fingerprint>/   one task's data; the fingerprint hashes its source (the files' sha256, or
                                     the hub id), its split scheme and the folder format: the same data gives
                                     the same folder, so a resubmission, or another experiment, reuses it
    prepared/plan-<fingerprint>/     PREPARED.json: the plan's tasks' folders (a run's data dir)

Whatever must appear whole is written after the files it names, each writer's files under names of its own
(a uuid). The markers that name them (TASK.json, tokenized/<name>.json, PREPARED.json) are create-only writes
(StoreFiles.create_exclusive: O_EXCL, or GCS's ifGenerationMatch=0), so the first writer to finish its upload
names its own complete set and no marker ever changes after: a later writer removes its own files and takes the
first one's. A reader reads a marker, then only what it names; a writer killed mid-upload named nothing, so its
files are never read (the next writer to win removes them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import datasets

from adaptune.core.errors import UserError
from adaptune.data.batching import column_values
from adaptune.data.checksums import KNOWN_MD5
from adaptune.data.loading import load_task_splits
from adaptune.data.prepared import (
    FORMAT_VERSION,
    PLAN_MARKER,
    RAW_DIR,
    TASK_MARKER,
    TOKENIZED_DIR,
    PreparedData,
    tokenized_name,
    write_plan,
    write_task,
    write_tokenized,
)
from adaptune.data.sources import hub_hint, quiet_datasets, resolve_data_dir
from adaptune.data.splits import TaskData
from adaptune.data.squad import prepare_features
from adaptune.data.tasks import Task, data_scheme, get_task, scored_companions
from adaptune.data.token_cache import tokenize_task
from adaptune.sweep.data_check import DataPreparationError, data_file_problem
from adaptune.sweep.machine import use_staged_backbones
from adaptune.sweep.plan import Plan
from adaptune.sweep.store import DATA_MIRROR_DIR, RunStore
from adaptune.sweep.store_files import UnreadableFileError
from adaptune.train.provenance import data_files_sha256

PREPARED_DIR = "prepared"


@dataclasses.dataclass(frozen=True, order=True)
class Tokenization:
    """One way a task is tokenized for the plan's runs: a backbone's tokenizer at a max length (SQuAD's windows also
    at a doc stride)."""

    backbone: str
    max_length: int
    doc_stride: int | None = None

    @property
    def label(self) -> str:
        return f"{self.backbone}@{self.max_length}" + (f"/{self.doc_stride}" if self.doc_stride is not None else "")


def data_needs(planned: Plan) -> dict[str, set[Tokenization]]:
    """Each task the plan's runs read (MNLI-mm with MNLI), with the tokenizations they read it in."""
    needs: dict[str, set[Tokenization]] = {}
    for run in planned.runs:
        task = get_task(run.task)
        stride = run.doc_stride if task.kind == "span" else None
        for name in (task.name, *scored_companions(task.name)):
            needs.setdefault(name, set()).add(Tokenization(run.backbone, run.max_length, stride))
    return needs


@dataclasses.dataclass
class PreparedTask:
    task: str
    folder: str  # under prepared/
    action: str  # "prepared" or "reused"
    rows: dict[str, int]
    source: str
    seconds: float
    tokenized: list[str]  # "backbone@max_length: prepared|reused"
    definition: str = ""  # whether its file name and columns were checked on a real file before this step
    checksum: str = ""  # whether its files' checksums are known (data.checksums), else only recorded here


@dataclasses.dataclass
class PreparedPlan:
    url: str  # the plan's folder: a run's data dir
    tasks: list[PreparedTask]

    def markdown(self) -> str:
        """The table the Vertex AI console shows for the step."""
        lines = ["| task | source | definition | checksum | train | validation | test | action | tokenized | seconds |",
                 "|---|---|---|---|---:|---:|---:|---|---|---:|"]
        for entry in self.tasks:
            rows = [str(entry.rows.get(split, "")) for split in ("train", "validation", "test")]
            lines.append(f"| {entry.task} | {entry.source} | {entry.definition} | {entry.checksum} | {' | '.join(rows)} | {entry.action} "
                         f"| {'; '.join(entry.tokenized) or '-'} | {entry.seconds:.1f} |")
        return "\n".join([f"Prepared data: `{self.url}`", "", *lines, ""])


def prepare_plan_data(planned: Plan, store: RunStore, data_dir: Path | None) -> PreparedPlan:
    """Prepare every task of the plan from `data_dir` (a mirror; None: the hub) into the store; returns where the plan's
    prepared folder is. Every task is checked; any problem raises DataPreparationError naming each task's, after the
    tasks without one are prepared."""
    store.require_writable()
    needs = data_needs(planned)
    use_staged_backbones(store, sorted({way.backbone for ways in needs.values() for way in ways}))
    problems: dict[str, str] = {}
    prepared: list[PreparedTask] = []
    for name in sorted(needs):
        task = get_task(name)
        started = time.perf_counter()
        try:
            entry = _prepare_task(task, needs[name], store, data_dir)
        except UserError as error:  # what the user can fix: one line for the task
            problems[task.name] = str(error)
            continue
        entry.seconds = time.perf_counter() - started
        prepared.append(entry)
        print(f"data {entry.task}: {entry.action} ({_rows_text(entry.rows)}) in {entry.seconds:.1f} s", flush=True)
    if problems:
        store.files.write_json(problems, PREPARED_DIR, problems_name(planned))  # what `pipelines run` shows its user
        raise DataPreparationError.of_tasks(problems)
    store.files.remove(PREPARED_DIR, problems_name(planned))
    folders = {entry.task: f"../{entry.folder}" for entry in prepared}
    plan_folder = f"plan-{_digest(folders)}"
    if store.files.read_json(PREPARED_DIR, plan_folder, PLAN_MARKER) is None:
        with tempfile.TemporaryDirectory(prefix="adaptune-prepare-") as scratch:
            write_plan(Path(scratch), folders, {"needs": {task: sorted(way.label for way in ways) for task, ways in needs.items()}})
            # the same plan gives the same bytes: whichever writer creates it, it names the same folders
            store.files.create_exclusive((Path(scratch) / PLAN_MARKER).read_bytes(), PREPARED_DIR, plan_folder, PLAN_MARKER)
    return PreparedPlan(url=store.files.url(PREPARED_DIR, plan_folder), tasks=prepared)


def _prepare_task(task: Task, ways: set[Tokenization], store: RunStore, data_dir: Path | None) -> PreparedTask:
    _check_files(task, data_dir)
    provenance = data_files_sha256(task.name, str(data_dir) if data_dir else None)
    folder = f"{task.name}-{_digest({'task': task.name, 'data': provenance, 'scheme': data_scheme(task), 'format': FORMAT_VERSION})}"
    info = store.files.read_json(PREPARED_DIR, folder, TASK_MARKER)
    loaded: TaskData | None = None
    action = "reused"
    with tempfile.TemporaryDirectory(prefix="adaptune-prepare-") as scratch:
        local = Path(scratch)
        if info is None:
            loaded = load_task_splits(task, data_dir)
            info = {"task": task.name, "provenance": provenance, **_checked_facts(task, loaded)}
            raw = f"{RAW_DIR}-{_writer_id()}"
            write_task(local, loaded, info, raw_dir=raw)
            if _publish(store, local, folder, marker=TASK_MARKER, own=raw, siblings=f"{RAW_DIR}-"):
                action = "prepared"
            else:  # another writer finished first: its set is the task's
                info = store.files.read_json(PREPARED_DIR, folder, TASK_MARKER) or info
        tokenized = []
        for way in sorted(ways):
            tokenized.append(f"{way.label}: " + _prepare_tokenized(task, way, store, folder, loaded, local))
    return PreparedTask(task=task.name, folder=folder, action=action, rows=info["rows"], source=_source_text(provenance),
                        seconds=0.0, tokenized=tokenized, definition=_definition_text(task), checksum=_checksum_text(task, provenance))


def _definition_text(task: Task) -> str:
    if task.source.verified:
        return "checked on a real file before"
    return "never read before (declared from the publisher's docs); read here, rows checked against Table 3"


def _checksum_text(task: Task, provenance: dict[str, Any]) -> str:
    """Per mirror file: its md5 known and matched, or unknown (its sha256 recorded in TASK.json only)."""
    if provenance.get("source") == "hub":
        return "hub copy (no file checksum)"
    known = [rel in KNOWN_MD5 for _, rel in task.source.files if rel in provenance.get("files", {})]
    if known and all(known):
        return "md5 known, matches"
    return "not known: sha256 recorded in TASK.json only" if not any(known) else "partly known: the others' sha256 in TASK.json only"


def _prepare_tokenized(task: Task, way: Tokenization, store: RunStore, folder: str, loaded: TaskData | None, local: Path) -> str:
    from adaptune.model.backbone import load_tokenizer

    tokenizer = load_tokenizer(way.backbone)
    name = tokenized_name(tokenizer, way.max_length, way.doc_stride)
    if store.files.read_json(PREPARED_DIR, folder, TOKENIZED_DIR, f"{name}.json") is not None:
        return "reused"
    if loaded is None:  # the task's splits were prepared before, for another backbone or length
        with store.files.local_copy(PREPARED_DIR, folder) as task_folder:
            raw = PreparedData(task_folder.parent, {task.name: task_folder.name}).task_data(task).splits
            tokenized = _tokenize(task, raw, tokenizer, way, local / "cache")
    else:
        tokenized = _tokenize(task, loaded.splits, tokenizer, way, local / "cache")
    own = f"{name}-{_writer_id()}"
    marker = write_tokenized(local / "tokenized-out", tokenized, name, way.label, folder_name=own)
    won = _publish(store, local / "tokenized-out", folder, marker=f"{TOKENIZED_DIR}/{marker}", own=f"{TOKENIZED_DIR}/{own}",
                   siblings=f"{TOKENIZED_DIR}/{name}-")
    return "prepared" if won else "reused"


@quiet_datasets()
def _tokenize(task: Task, raw: datasets.DatasetDict, tokenizer: Any, way: Tokenization, cache: Path) -> datasets.DatasetDict:
    """Whole splits as a run reads them: token ids (and labels); SQuAD's windows, each with its question's id and
    offsets (a run takes the windows of the questions it samples: adaptune.train.run_data)."""
    if way.doc_stride is None:
        return tokenize_task(task, raw, tokenizer, way.max_length, cache_dir=cache)
    options = {"tokenizer": tokenizer, "max_length": way.max_length, "doc_stride": way.doc_stride, "for_evaluation": True}
    return datasets.DatasetDict({split: examples.map(prepare_features, batched=True, remove_columns=examples.column_names,
                                                     fn_kwargs=options) for split, examples in raw.items()})


def _check_files(task: Task, data_dir: Path | None) -> None:
    """The task's files are in the mirror (SQuAD: its dev file at least), each the copy the project checked."""
    if problem := data_file_problem(task, data_dir):
        raise DataPreparationError(problem)


def _checked_facts(task: Task, loaded: TaskData) -> dict[str, Any]:
    """Rows and label counts per split, checked: every class in the training split, rows as the paper's Table 3."""
    rows = {split: len(rows) for split, rows in loaded.splits.items()}
    labels: dict[str, dict[str, int]] = {}
    if task.kind == "classification":
        for split, dataset in loaded.splits.items():
            names = dataset.features["label"].names
            counts = Counter(column_values(dataset, "label"))
            labels[split] = {names[i]: counts.get(i, 0) for i in range(len(names))}
        absent = [name for name, count in labels.get("train", {}).items() if count == 0]
        if absent:
            raise DataPreparationError(f"no training row has the label(s) {absent}: the file is not the task's whole data; "
                                       f"get the complete file: {hub_hint(task)}")
    if task.paper_sizes is not None and set(rows) == {"train", "validation", "test"}:
        got = (rows["train"], rows["validation"], rows["test"])
        if got != task.paper_sizes:
            raise DataPreparationError(f"splits of {'/'.join(map(str, got))} rows, not the paper's {'/'.join(map(str, task.paper_sizes))} "
                                       f"(Table 3): the file is not the copy the paper used; {hub_hint(task)}")
    return {"rows": rows, "labels": labels}


def _publish(store: RunStore, local: Path, folder: str, marker: str, own: str, siblings: str) -> bool:
    """Every file under `local` into prepared/<folder>/, then `marker` (naming `own`, this writer's folder) by one
    create-only write. True where ours is the marker: the folders beside ours (`siblings`: their names' start) are
    then another writer's that lost or died mid-upload, and go. False where another writer's marker was first: our
    folder goes, theirs stands."""
    files = sorted(path.relative_to(local).as_posix() for path in local.rglob("*") if path.is_file())
    for relative in (name for name in files if name != marker and not name.startswith("cache/")):
        store.files.put_file(local / relative, PREPARED_DIR, folder, *relative.split("/"))
    won = store.files.create_exclusive((local / marker).read_bytes(), PREPARED_DIR, folder, *marker.split("/"))
    where, _, start = siblings.rpartition("/")
    writers = re.compile(re.escape(start) + "[0-9a-f]{12}")  # the folders of this marker's writers: <start><their uuid>
    for name in store.files.names(PREPARED_DIR, folder, *filter(None, [where])):
        path = f"{where}/{name}" if where else name
        if writers.fullmatch(name) and (path != own) == won:
            store.files.remove(PREPARED_DIR, folder, *path.split("/"))
    return won


def localize_prepared(store: RunStore, url: str, tasks: set[str], scratch: Path | None = None) -> Path:
    """A local folder a run can read `url` (a plan's prepared folder in `store`) from: the folder itself where the store
    is a local directory, else the plan's marker and the named tasks' folders downloaded into `scratch` (a pod's disk:
    datasets memory-maps them, read at random, which a bucket mount serves slowly)."""
    parts = _store_parts(store, url)
    if store.files.is_local and not store.files.is_bucket_mount:
        return Path(store.files.path(*parts))
    manifest = store.files.read_json(*parts, PLAN_MARKER)
    if manifest is None:
        raise DataPreparationError(f"{url} holds no {PLAN_MARKER}: pass the folder the data-preparation step wrote")
    root = Path(scratch or tempfile.mkdtemp(prefix="adaptune-data-"))
    local_plan = root / PREPARED_DIR / parts[-1]
    local_plan.mkdir(parents=True, exist_ok=True)
    for task in sorted(tasks):
        folder = manifest["tasks"][get_task(task).name].removeprefix("../")
        target = root / PREPARED_DIR / folder
        if not (target / TASK_MARKER).is_file():
            _download_named(store, folder, target)
    (local_plan / PLAN_MARKER).write_text(json.dumps(manifest))
    return local_plan


def _download_named(store: RunStore, folder: str, target: Path) -> None:
    """A task's folder as its markers name it: TASK.json's raw splits, each tokenized marker's folder, then the markers
    (TASK.json last: where it is, the copy is whole). Markers never change once written, so this is one writer's
    complete set, whatever other writers upload beside it meanwhile."""
    info = store.files.read_json(PREPARED_DIR, folder, TASK_MARKER)
    if info is None:
        raise DataPreparationError(f"{store.files.url(PREPARED_DIR, folder)} holds no {TASK_MARKER}: run the pipeline again, "
                                   "its data-preparation step prepares the task")
    store.files.download(store.files.path(PREPARED_DIR, folder, info["raw"]), target / info["raw"])
    markers = {}
    for name in store.files.names(PREPARED_DIR, folder, TOKENIZED_DIR):
        if name.endswith(".json") and (marker := store.files.read_json(PREPARED_DIR, folder, TOKENIZED_DIR, name)) is not None:
            store.files.download(store.files.path(PREPARED_DIR, folder, TOKENIZED_DIR, marker["dir"]), target / TOKENIZED_DIR / marker["dir"])
            markers[name] = marker
    for name, marker in markers.items():
        (target / TOKENIZED_DIR / name).write_text(json.dumps(marker))
    (target / TASK_MARKER).write_text(json.dumps(info))


def is_prepared_url(store: RunStore, data_dir: Any) -> bool:
    return bool(data_dir) and str(data_dir).startswith(store.files.url(PREPARED_DIR) + "/")


def readable_data_dir(store: RunStore, data_dir: Any, tasks: set[str] | None = None, scratch: Path | None = None) -> Any:
    """What a step reads its data from: the prepared folder of `tasks` (all the plan's where None) made local where
    `data_dir` is one in the store; else `data_dir` as given (a mirror; None: found, or the hub)."""
    if not is_prepared_url(store, data_dir):
        return data_dir or None
    if tasks is None:
        tasks = set((store.files.read_json(*_store_parts(store, str(data_dir)), PLAN_MARKER) or {"tasks": {}})["tasks"])
    return localize_prepared(store, str(data_dir), tasks, scratch)


def source_data_dir(store: RunStore, data_dir: str, tasks: set[str], scratch: Path | None = None) -> Path | None:
    """The preparation step's source: the pipeline's data_dir (a mirror, or "hub"); empty: the mirror staged in the run
    store (make stage-data), read in place where the store is a folder (this machine, Vertex AI's /gcs mount), else its
    files of `tasks` downloaded into `scratch`; with none staged, a mirror found as adaptune.data.sources.resolve_data_dir
    finds one, else the hub."""
    if data_dir:
        return resolve_data_dir(data_dir)
    staged = store.data_mirror()
    if staged is not None:
        return staged if staged.is_dir() else resolve_data_dir(None)
    files = [rel for task in sorted(tasks) for _, rel in get_task(task).source.files]
    present = [rel for rel in files if store.files.version(DATA_MIRROR_DIR, *rel.split("/")) is not None]
    if not present:
        return resolve_data_dir(None)
    root = Path(scratch or tempfile.mkdtemp(prefix="adaptune-mirror-"))
    for rel in present:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        store.files.get_file(root / rel, DATA_MIRROR_DIR, *rel.split("/"))
    return root


def _store_parts(store: RunStore, url: str) -> list[str]:
    """A URL under the store (StoreFiles.url) as the parts StoreFiles takes."""
    return url.removeprefix(store.files.url() + "/").split("/")


def _writer_id() -> str:
    """What makes one writer's folder names its own (12 hex digits, as _publish matches them)."""
    return uuid.uuid4().hex[:12]


def problems_name(planned: Plan) -> str:
    """The file under prepared/ where the step leaves what it found wrong with the plan's data ({task: line}), named
    by what the plan reads: `pipelines run` (pipelines.local) shows it as the step's one line per task."""
    return f"problems-{_digest({task: sorted(way.label for way in ways) for task, ways in data_needs(planned).items()})}.json"


def preparation_problems(planned: Plan, store: RunStore) -> dict[str, str]:
    """What the plan's last data preparation in `store` found wrong ({task: one line}); empty where nothing."""
    try:
        found = store.files.read_json(PREPARED_DIR, problems_name(planned))
    except UnreadableFileError:
        return {}
    return found if isinstance(found, dict) else {}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _source_text(provenance: dict[str, Any]) -> str:
    if provenance.get("source") == "hub":
        return f"hub {provenance.get('dataset')}" + (f"/{provenance['config']}" if provenance.get("config") else "")
    return "mirror " + ", ".join(sorted(provenance.get("files", {})))


def _rows_text(rows: dict[str, int]) -> str:
    return ", ".join(f"{split} {count}" for split, count in rows.items())
