"""The tokenization cache: a task's datasets tokenized once, keyed by the content of the data and the tokenizer."""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from adaptune.core import environment
from adaptune.core.files import write_json
from adaptune.data.sources import quiet_datasets
from adaptune.data.tasks import Task, get_task

CACHE_DIR_ENV = "ADAPTUNE_CACHE_DIR"
TOKENIZED_FORMAT_VERSION = 1  # bump when tokenize_task's output changes, to invalidate old caches


def default_cache_dir() -> Path:
    """$ADAPTUNE_CACHE_DIR, empty or unset ~/.cache/adaptune: one rule with the status cache's."""
    return environment.cache_dir()


def dataset_fingerprint(dataset_dict: datasets.DatasetDict) -> str:
    """A content hash of every split (its features, and the Arrow IPC bytes of its rows in one record batch,
    without the schema's metadata, where datasets keeps a fingerprint of how the table was made), so equal
    data gives an equal cache key however it was selected or chunked."""
    digest = hashlib.sha256()
    for split in sorted(dataset_dict):
        dataset = dataset_dict[split]
        table = dataset.with_format(None).data.table
        if dataset._indices is not None:  # a select()ed view: the rows it shows, taken in Arrow (flatten_indices
            table = table.take(dataset._indices.column(0))  # rewrote them row by row: 9 s for SST-2's, every run)
        table = table.combine_chunks().replace_schema_metadata(None)
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        features = json.dumps(dataset.features.to_dict(), sort_keys=True)
        digest.update(split.encode() + b"\0" + features.encode() + b"\0" + sink.getvalue())
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of what decides token ids: the fast tokenizer's full JSON (vocab, normaliser), else the vocab."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Truncation/padding state changes with every call (it records the last max_length): not content.
        state = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
        content = json.dumps(state, sort_keys=True)
    else:
        content = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(f"{type(tokenizer).__name__}\0{content}".encode()).hexdigest()


def tokenization_key(task: Task | str, dataset_dict: datasets.DatasetDict, tokenizer: Any, max_length: int) -> str:
    task = get_task(task)
    parts = [task.name, dataset_fingerprint(dataset_dict), tokenizer_fingerprint(tokenizer), str(max_length),
             str(TOKENIZED_FORMAT_VERSION)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@quiet_datasets()
def tokenize_task(task: Task | str, dataset_dict: datasets.DatasetDict, tokenizer: Any, max_length: int = 128,
                  cache_dir: str | os.PathLike[str] | None = None) -> datasets.DatasetDict:
    """input_ids, attention_mask, token_type_ids (if the tokenizer gives them), labels; unpadded.

    Cached under <cache_dir>/tokenized/, the key hashing the data content, the tokenizer's content and
    max_length: a task is tokenized once and reused by every run (and across processes). Each writer
    saves into a directory of its own, then publishes it by writing the small file <task>-<key>.json
    last: no directory is ever renamed (Cloud Storage FUSE refuses that: adaptune/sweep/store.py), and a
    reader never sees half a cache. Two racing writers both finish; the later marker wins.
    """
    task = get_task(task)
    if task.kind == "span":
        raise ValueError("squad is tokenized with sliding windows by adaptune.data.squad.prepare_features, not tokenize_task")
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    name = f"{task.name}-{tokenization_key(task, dataset_dict, tokenizer, max_length)}"
    published = _published_cache(cache_root / "tokenized", name)
    if published is not None:
        return datasets.load_from_disk(str(published))

    def encode(batch: dict[str, list]) -> dict[str, list]:
        second = batch["text_b"] if task.is_pair else None
        encoded = tokenizer(batch["text_a"], second, truncation=True, max_length=max_length)
        return {**encoded, "labels": batch["label"]}

    tokenized = dataset_dict.map(encode, batched=True, batch_size=1000,
                                 remove_columns=["text_a", "text_b", "label"], desc=f"tokenize {task.name}")
    tokenized = tokenized.cast_column("labels", next(iter(dataset_dict.values())).features["label"])
    own = cache_root / "tokenized" / f"{name}.{uuid.uuid4().hex[:12]}"
    tokenized.save_to_disk(str(own))
    write_json(cache_root / "tokenized" / f"{name}.json", {"dir": own.name})
    return datasets.load_from_disk(str(own))


def _published_cache(tokenized_root: Path, name: str) -> Path | None:
    """The directory the marker <name>.json points to, if it is whole; a cache written before markers
    (<name>/dataset_dict.json) is still read."""
    marker = tokenized_root / f"{name}.json"
    if marker.is_file():
        target = tokenized_root / json.loads(marker.read_text())["dir"]
        if (target / "dataset_dict.json").is_file():
            return target
    legacy = tokenized_root / name
    return legacy if (legacy / "dataset_dict.json").is_file() else None
