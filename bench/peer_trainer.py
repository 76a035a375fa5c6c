"""The loop a user writes instead of adaptune: Hugging Face's Trainer over AdapterHub's `adapters` or peft, one run after
another, as bench/peer.py times it. Run by that library's own python (adapters 1.3 needs transformers 4.57: it runs in
.venv-adapters; peft runs in .venv); imports no adaptune.

    peer_trainer.py REQUEST.json RESULT.json

REQUEST: {"library": "adapterhub" | "peft", "method": {"name": "adapters", "size": 64} | {"name": "lora", "r": 8},
"backbone" (a local copy), "pooling_file" (adaptune's export_pooling.py: the mean-pooled head adaptune's runs read),
"train": {"texts", "labels"}, "eval": {"texts", "labels"}, "runs": [{"lr", "seed"}], "epochs", "batch_size",
"max_length", "group_by_length", "num_labels"}. RESULT: per run its accuracy on the eval rows, trained parameters,
training and prediction seconds; the library versions.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments, set_seed

# 10% of the steps: transformers 4.57 (AdapterHub's) names it warmup_ratio, 5.x takes a fraction as warmup_steps.
WARMUP = ({"warmup_ratio": 0.1} if "warmup_ratio" in inspect.signature(TrainingArguments.__init__).parameters
          else {"warmup_steps": 0.1})
# Batches of similar lengths: transformers 4.57's group_by_length, 5.x's train_sampling_strategy.
LENGTH_GROUPED = ({"group_by_length": True} if "group_by_length" in inspect.signature(TrainingArguments.__init__).parameters
                  else {"train_sampling_strategy": "group_by_length"})


def pooling_module(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("mean_pooling", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def adapterhub_model(request: dict[str, Any], pooling: Any) -> torch.nn.Module:
    """Houlsby adapters as adaptune's AdapterHub export maps them (double bottleneck, reduction d/size, GELU), every
    LayerNorm trained beside them, AdapterHub's classification head reading the masked mean."""
    from adapters import AutoAdapterModel, DoubleSeqBnConfig

    model = AutoAdapterModel.from_pretrained(request["backbone"])
    pooling.register_adapterhub_head(model)
    hidden = model.config.hidden_size
    config = DoubleSeqBnConfig(reduction_factor=hidden / request["method"]["size"], non_linearity="gelu")
    model.add_adapter("task", config=config)
    model.add_custom_head(pooling.ADAPTERHUB_HEAD_TYPE, "task", num_labels=request["num_labels"], layers=1)
    model.train_adapter("task")
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.requires_grad_(True)
    return model


def peft_model(request: dict[str, Any], pooling: Any) -> torch.nn.Module:
    """LoRA on query and value (alpha = r), the head trained, the masked mean in the pooler's place."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(request["backbone"], num_labels=request["num_labels"])
    pooling.use_mean_pooling(model)
    rank = request["method"]["r"]
    return get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=rank, lora_alpha=rank, lora_dropout=0.0,
                                            target_modules=["query", "value"]))


class Rows(torch.utils.data.Dataset):
    def __init__(self, encodings: dict[str, list[Any]], labels: list[int]) -> None:
        self.encodings, self.labels = encodings, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**{name: values[index] for name, values in self.encodings.items()}, "labels": self.labels[index]}


def main(request_path: str, result_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    pooling = pooling_module(request["pooling_file"])
    tokenizer = AutoTokenizer.from_pretrained(request["backbone"])
    encode = lambda split: Rows(tokenizer(request[split]["texts"], truncation=True, max_length=request["max_length"]),  # noqa: E731
                                request[split]["labels"])
    train, evaluation = encode("train"), encode("eval")
    build = adapterhub_model if request["library"] == "adapterhub" else peft_model
    runs = []
    for run in request["runs"]:
        set_seed(run["seed"])
        model = build(request, pooling)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        with tempfile.TemporaryDirectory() as out:
            arguments = TrainingArguments(
                output_dir=out, use_cpu=True, bf16=request["bf16"], per_device_train_batch_size=request["batch_size"],
                per_device_eval_batch_size=request["batch_size"], num_train_epochs=request["epochs"], learning_rate=run["lr"],
                weight_decay=0.01, **WARMUP, lr_scheduler_type="linear", max_grad_norm=1.0, seed=run["seed"],
                save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
                dataloader_num_workers=0, remove_unused_columns=False, label_names=["labels"], **(LENGTH_GROUPED if request["group_by_length"] else {}),
            )
            trainer = Trainer(model=model, args=arguments, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer))
            started = time.perf_counter()
            trainer.train()
            trained_s = time.perf_counter() - started
            started = time.perf_counter()
            prediction = trainer.predict(evaluation)
            predicted_s = time.perf_counter() - started
        # The labels in the order the predictions came in: with length grouping, Trainer may score rows out of order.
        logits, gold = prediction.predictions, prediction.label_ids
        if isinstance(logits, tuple):  # AdapterHub's heads hand back more than the logits: take the (rows, labels) array
            logits = next(part for part in logits if np.ndim(part) == 2 and len(part) == len(evaluation))
        accuracy = float(np.mean(np.argmax(logits, axis=-1) == np.asarray(gold)))
        runs.append({**run, "accuracy": accuracy, "trained_params": trained, "train_s": trained_s, "predict_s": predicted_s,
                     "eval_rows": len(evaluation)})
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    library = "adapters" if request["library"] == "adapterhub" else "peft"
    versions[library] = importlib.import_module(library).__version__
    Path(result_path).write_text(json.dumps({"runs": runs, "versions": versions, "threads": torch.get_num_threads()}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
