"""Run by the .venv-adapters python (adapters 1.3, transformers 4.57; no adaptune): load an AdapterHub export as its
model card says, and write the logits it gives for the given texts as JSON.

    adapterhub_logits.py REQUEST.json RESULT.json

REQUEST: {"folder", "backbone" (a local copy of the base model), "texts" ([[a], ...] or [[a, b], ...]), "max_length",
"batch_size"}. RESULT: "logits" (adapter, head and the run's LayerNorms), "adapter_only_logits" (the same before the
LayerNorms are loaded: what load_adapter alone gives), "input_ids" (unpadded, per text), "loading_info" (load_adapter's
missing and unexpected keys), "layer_norms_unexpected", "config_is_adapters_own" (the folder's adapter config equals
what adapters 1.3 rebuilds from it), and the library versions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import adapters
import torch
import transformers
from adapters import AutoAdapterModel
from adapters.configuration import AdapterConfig
from safetensors.torch import load_file
from transformers import AutoTokenizer


def logits_of(model, tokenizer, texts, max_length, batch_size):
    rows = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        second = [pair[1] for pair in chunk] if len(chunk[0]) == 2 else None
        batch = tokenizer([pair[0] for pair in chunk], second, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        with torch.inference_mode():
            rows.extend(model(**batch).logits.float().tolist())
    return rows


def main(request_path: str, result_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    folder = Path(request["folder"])
    info = json.loads((folder / "export.json").read_text())
    torch.set_num_threads(1)
    model = AutoAdapterModel.from_pretrained(request["backbone"])
    if info["pooling"] == "mean":  # the folder's own file, as the card says
        sys.path.insert(0, str(folder))
        from mean_pooling import register_adapterhub_head

        register_adapterhub_head(model)
    loading_info: dict = {}
    name = model.load_adapter(str(folder), set_active=True, loading_info=loading_info)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(request["backbone"])
    texts, max_length, batch_size = request["texts"], request["max_length"], request["batch_size"]
    adapter_only = logits_of(model, tokenizer, texts, max_length, batch_size)
    _, unexpected = model.load_state_dict(load_file(str(folder / info["layer_norms"])), strict=False)
    logits = logits_of(model, tokenizer, texts, max_length, batch_size)
    saved = json.loads((folder / "adapter_config.json").read_text())["config"]
    ids = [tokenizer(*pair, truncation=True, max_length=max_length)["input_ids"] for pair in texts]
    Path(result_path).write_text(json.dumps({
        "adapter_name": name, "active": str(model.active_adapters), "active_head": model.active_head,
        "logits": logits, "adapter_only_logits": adapter_only, "input_ids": ids,
        "loading_info": {key: list(value) for key, value in loading_info.items()}, "layer_norms_unexpected": list(unexpected),
        "config_is_adapters_own": AdapterConfig.load(saved).to_dict() == saved,
        "adapters_version": adapters.__version__, "transformers_version": transformers.__version__,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:3])
