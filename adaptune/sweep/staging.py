"""Stage an experiment's backbone weights in the run store once, so pods never download them.

Without this, every shard downloads its backbone from the Hugging Face hub into the image's empty
cache: for glue_full, 180 shards x 1.34 GB of BERT-large; and pods without egress cannot train at all.
`make stage-models PIPELINE=glue_full` copies each hub backbone the plan uses (config, safetensors
weights, tokenizer files: not the PyTorch .bin, TF, Flax or ONNX copies the hub repos also hold) to
`<run store>/models/<name>/`, where train_shard and ablate_runs load it (adaptune.sweep.shard_runner).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adaptune.core.errors import UserError
from adaptune.model.backbone import EMBEDDED_BACKBONE_NAMES
from adaptune.sweep.plan import plan
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.store import MODELS_DIR, STAGED_MARKER, RunStore

# What from_pretrained needs of a BERT checkpoint; the rest of a hub repo is other frameworks' copies.
WEIGHT_PATTERNS = ("config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                   "vocab.txt", "special_tokens_map.json")


class StagingError(UserError, RuntimeError):
    """A backbone cannot be staged; the message names it and what to pass instead."""


def hub_backbones(spec: ExperimentSpec) -> list[str]:
    """The backbones of the plan that come from the hub (not the embedded MiniLM, not a local path)."""
    names = dict.fromkeys(run.backbone for run in plan(spec).runs)
    return [name for name in names if name not in EMBEDDED_BACKBONE_NAMES and not Path(name).expanduser().exists()]


def stage_models(spec: ExperimentSpec, store: RunStore, sources: Mapping[str, str | os.PathLike[str]] | None = None,
                 force: bool = False) -> list[dict[str, Any]]:
    """Stage every hub backbone of `spec` (see module doc); returns one line of facts per backbone.

    `sources` maps a backbone name to a local directory holding it (written by save_pretrained); any
    other backbone is downloaded from the hub (huggingface_hub.snapshot_download, weights only)."""
    sources = dict(sources or {})
    unknown = sorted(set(sources) - set(hub_backbones(spec)))
    if unknown:
        raise StagingError(f"{unknown} are not hub backbones of experiment {spec.name!r}: it uses {hub_backbones(spec) or 'none'}")
    staged = []
    for name in hub_backbones(spec):
        marker = store.files.read_json(MODELS_DIR, name, STAGED_MARKER)
        if marker is not None and not force:
            staged.append({"name": name, "bytes": marker["bytes"], "action": "already staged", "where": store.files.url(MODELS_DIR, name)})
            continue
        source = Path(sources[name]) if name in sources else _download(name)
        marker = store.stage_backbone(name, source)
        staged.append({"name": name, "bytes": marker["bytes"], "action": f"staged from {source}", "where": store.files.url(MODELS_DIR, name)})
    return staged


def _download(name: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=list(WEIGHT_PATTERNS)))
    except Exception as error:  # noqa: BLE001 -- offline, unknown repo, auth: one line that says what to do
        raise StagingError(f"cannot download backbone {name!r} from the Hugging Face hub ({type(error).__name__}: "
                           f"{str(error).splitlines()[0] if str(error) else ''}); pass --from {name}=DIR, a directory "
                           "written by save_pretrained") from None
