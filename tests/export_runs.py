"""Tiny real runs for the export tests (tests/test_export.py, tests/adapterhub/): one per method on the embedded
MiniLM, small enough for seconds each and large enough not to collapse to one class, and what to compare an export's
logits with: adaptune's own prediction from the run's checkpoint on the rows the run was scored on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from adaptune.data.batching import subsample
from adaptune.data.loading import load_task_data
from adaptune.data.tasks import get_task
from adaptune.model.backbone import load_tokenizer
from adaptune.model.checkpoint import load_task_checkpoint
from adaptune.serve.predict import predict_logits
from adaptune.train.config import TrainConfig
from adaptune.train.loop import train_and_evaluate

SMALL = dict(epochs=2, max_length=64, max_train_examples=128, max_eval_examples=64, batch_size=8, experiment="test_export")
# method label -> (method dict, learning rate): every one scored "ok" (not degenerate) on SST-2 with SMALL.
METHODS = {
    "adapters8": ({"name": "adapters", "size": 8}, 3e-3),
    "pfeiffer8": ({"name": "pfeiffer", "size": 8}, 3e-3),
    "lora8": ({"name": "lora", "r": 8}, 3e-3),
    "ia3": ({"name": "ia3"}, 3e-2),
    "full": ({"name": "full"}, 1e-4),
    "top_k1": ({"name": "top_k", "k": 1}, 1e-3),
    "layernorm": ({"name": "layernorm"}, 3e-3),
    "head": ({"name": "head"}, 3e-3),
}


def config(label: str, task: str = "sst2", seed: int = 0) -> TrainConfig:
    method, lr = METHODS[label]
    return TrainConfig(task=task, seed=seed, method=method, lr=lr, **SMALL)


def train_store(root: Path, cache: Path, data_dir: Path, configs: list[TrainConfig]) -> dict[str, dict]:
    """A run store (root/runs/<run_id>/) of the configs; their records by run id."""
    records = {}
    for run in configs:
        record = train_and_evaluate(run, data_dir=data_dir, out_dir=root / "runs" / run.run_id, cache_dir=cache, progress=False)
        assert record["status"] == "ok", (run.run_id, record["status"], record["reason"])
        records[run.run_id] = record
    return records


def validation_rows(task: str, data_dir: Path) -> tuple[list[list[str]], list[float]]:
    """The validation rows the runs were scored on: their texts as predict takes them ([text] or [text_a, text_b]
    each) and their labels."""
    rows = subsample(load_task_data(task, data_dir, splits=("validation",))["validation"], SMALL["max_eval_examples"])
    texts = [[row["text_a"], row["text_b"]] if get_task(task).is_pair else [row["text_a"]] for row in rows]
    return texts, list(rows["label"])


def project_logits(root: Path, run_id: str, texts: list[list[str]]) -> np.ndarray:
    """adaptune's own logits: the run's checkpoint rebuilt (load_task_checkpoint) and predicted as the bundle predicts."""
    model, _, info = load_task_checkpoint(root / "runs" / run_id / "checkpoint")
    max_length = info["metadata"]["config"]["max_length"]
    return predict_logits(model, load_tokenizer(info["backbone"]), texts, max_length)


def bert_with_a_trained_pooler(out: Path) -> Path:
    """A tiny random BERT (2 layers, d=64) whose pooler looks trained (a nonzero bias), with MiniLM's tokenizer: the
    layout of the paper's BERTs, whose pre-trained pooler adaptune keeps (no hub here to fetch one)."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from adaptune.model.backbone import embedded_backbone_path

    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128))
    with torch.no_grad():
        model.pooler.dense.bias.normal_(0, 0.1)
    model.save_pretrained(out)
    tokenizer = Path(str(embedded_backbone_path()))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer / name).is_file():
            shutil.copyfile(tokenizer / name, out / name)
    return out
