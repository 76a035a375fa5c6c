"""The formats a trained run leaves the project in, one per method (`python -m adaptune export`, adaptune.serve.export):

  adapterhub    adapters, pfeiffer     AdapterHub's `adapters` library (1.3): model.load_adapter(folder)
                                       (adaptune.serve.export_adapterhub)
  peft          lora, ia3              Hugging Face peft: PeftModel.from_pretrained(base, folder), written by peft's
                                       own save_pretrained
  transformers  full, top_k,           what the method trained, as model.safetensors under the transformers model's
                layernorm, head        parameter names, loaded onto the backbone with load_state_dict (LOADING.md;
                                       `load_exported` here does it)

Each writer fills a folder with its library's files and says how to load them; export.py maps methods to writers
(FORMATS: a method missing there is refused in one line, never skipped) and adds the model card, export.json and
CHECKSUMS.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from adaptune.core.errors import UserError
from adaptune.data.tasks import Task
from adaptune.model.backbone import load_model, quiet_transformers
from adaptune.model.checkpoint import WEIGHTS_FILE
from adaptune.serve.file_digests import copy_file

EXPORT_FILE = "export.json"  # what was exported and how to rebuild it, for load_exported and the AdapterHub check
POOLING_FILE = "mean_pooling.py"  # adaptune/serve/export_pooling.py, copied where the run pooled by mean
TENSORS_FILE = "model.safetensors"
LOADING_FILE = "LOADING.md"
EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # the hub's name of the embedded backbone


class ExportError(UserError, ValueError):
    """A run that cannot be exported as asked; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class ExportedRun:
    """One selected run, rebuilt from its checkpoint: what every format writer reads."""

    run: dict[str, Any]  # its runs.parquet row (adaptune.report.results.run_row)
    task: Task
    model: PreTrainedModel  # rebuilt by load_task_checkpoint: the backbone, the method applied, the trained tensors loaded
    method: Any  # the method config
    checkpoint: Path  # the run's checkpoint directory (task.safetensors, task.json), local while the export writes
    backbone_path: str  # what from_pretrained loaded the backbone from
    base_model: str  # the backbone's name on the Hugging Face hub, for the loading code and the card
    labels: list[str] | None  # class names in label order (None: regression, or names unknown)
    mean_pooling: bool  # the run classified the masked mean of the last hidden states (export_pooling.py)
    precision: str  # float32 or bf16: what the run was trained and scored in

    @property
    def num_labels(self) -> int:
        num_labels = self.model.config.num_labels
        assert num_labels is not None  # load_model's models all label their outputs
        return int(num_labels)

    @property
    def max_length(self) -> int:
        return int(json.loads(self.run["config_json"]).get("max_length", 128))

    @property
    def trained_names(self) -> list[str]:
        return [name for name, parameter in self.model.named_parameters() if parameter.requires_grad]


@dataclasses.dataclass(frozen=True)
class WrittenFormat:
    """What a writer put in the folder, for the card and export.json."""

    format: str  # adapterhub | peft | transformers
    library_name: str  # the hub's library_name
    files: dict[str, str]  # file name -> what it holds
    loading: str  # Markdown: how to load the folder, and how exactly it reproduces the run
    tags: tuple[str, ...] = ()
    details: dict[str, Any] = dataclasses.field(default_factory=dict)  # added to export.json


Writer = Callable[[ExportedRun, Path], WrittenFormat]


def load_code(run: ExportedRun, model_lines: list[str], imports: list[str], transformers: tuple[str, ...] = ()) -> str:
    """A Python block that loads the folder (model_lines build `model`, with `imports` and these transformers names)
    and computes logits for one input."""
    texts = '["first sentence"], ["second sentence"]' if run.task.is_pair else '["a sentence"]'
    pooling = ["sys.path.insert(0, folder)  # this folder's mean_pooling.py: the run classified the mean, not the pooler"]
    return "\n".join([
        "```python",
        *(["import sys", ""] if run.mean_pooling else []),
        "import torch",
        *imports,
        f"from transformers import {', '.join(sorted({*transformers, 'AutoTokenizer'}))}",
        "",
        f'folder = "path/to/{run.task.name}"  # this folder',
        *(pooling if run.mean_pooling else []),
        *model_lines,
        "model.eval()",
        f'tokenizer = AutoTokenizer.from_pretrained("{run.base_model}")',
        f"batch = tokenizer({texts}, truncation=True, max_length={run.max_length}, padding=True, return_tensors=\"pt\")",
        "with torch.no_grad():",
        "    logits = model(**batch).logits",
        "```",
    ])


def head_kwargs(run: ExportedRun) -> str:
    """from_pretrained's arguments for the task head (regression: one output, MSE loss)."""
    if run.task.kind == "regression":
        return 'num_labels=1, problem_type="regression"'
    return f"num_labels={run.num_labels}"


# --- peft (lora, ia3) -------------------------------------------------------------------------------------------


def write_peft(run: ExportedRun, folder: Path) -> WrittenFormat:
    """peft's own save_pretrained, of a PeftModel holding the run's tensors: adapter_config.json (peft's record of the
    config the run injected, task type SEQ_CLS so the head is saved as modules_to_save) and adapter_model.safetensors."""
    from peft import get_peft_model

    injected = getattr(run.model, "peft_config", {}).get("default")
    if injected is None:
        raise ExportError(f"run {run.run['run_id']} ({run.run['method_label']}): its model holds no peft config to export")
    config = copy.deepcopy(injected)
    config.task_type = "SEQ_CLS"  # PeftModelForSequenceClassification: the task head is saved and loaded with it
    base = load_model(run.backbone_path, run.task.kind, num_labels=run.num_labels)
    base.name_or_path = run.base_model  # what get_peft_model records as base_model_name_or_path: the hub's name, not this disk's
    with warnings.catch_warnings():  # peft's notes on transformers' deprecations: nothing the user can act on
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(base, config)
    trained = dict(run.model.named_parameters())
    targets = {name: _peft_name(name, run) for name in run.trained_names}
    trainable = {name for name, parameter in peft_model.named_parameters() if parameter.requires_grad}
    if set(targets.values()) != trainable:
        raise ExportError(f"run {run.run['run_id']}: peft's {type(peft_model).__name__} trains {len(trainable)} tensors, the run "
                          f"{len(targets)}; unmatched: {sorted(trainable ^ set(targets.values()))[:4]}")
    for name, target in targets.items():
        peft_model.get_parameter(target).data.copy_(trained[name].data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model.save_pretrained(str(folder))  # peft's card README.md is replaced by the export's own
    model_lines = [
        f'base = AutoModelForSequenceClassification.from_pretrained("{run.base_model}", {head_kwargs(run)})',
        *(["from mean_pooling import use_mean_pooling", "use_mean_pooling(base)"] if run.mean_pooling else []),
        "model = PeftModel.from_pretrained(base, folder)",
    ]
    code = load_code(run, model_lines, ["from peft import PeftModel"], ("AutoModelForSequenceClassification",))
    return WrittenFormat(
        format="peft", library_name="peft", tags=("peft", config.peft_type.value.lower()),
        files={"adapter_config.json": f"peft's {type(config).__name__}, task type SEQ_CLS (the task head is one of its modules_to_save)",
               "adapter_model.safetensors": f"the {run.method.name} tensors and the task head, as peft saves them"},
        loading=code,
    )


def _peft_name(name: str, run: ExportedRun) -> str:
    """The PeftModel's name of a tensor the run trained: peft's own layers keep theirs under base_model.model; the task
    head is trained as peft's modules_to_save copy."""
    head = name.split(".", 1)[0]
    if head in {module_name for module_name, module in run.model.named_children() if module is not run.model.base_model}:
        return f"base_model.model.{head}.modules_to_save.default.{name.split('.', 1)[1]}"
    return f"base_model.model.{name}"


# --- transformers: the changed tensors (full, top_k, layernorm, head) ---------------------------------------------


def write_tensors(run: ExportedRun, folder: Path) -> WrittenFormat:
    """The run's task.safetensors, byte for byte: every tensor the method trained, under the transformers model's names."""
    copy_file(run.checkpoint / WEIGHTS_FILE, folder / TENSORS_FILE)
    model_lines = [
        f'model = AutoModelForSequenceClassification.from_pretrained("{run.base_model}", {head_kwargs(run)})',
        *(["from mean_pooling import use_mean_pooling", "use_mean_pooling(model)"] if run.mean_pooling else []),
        f'missing, unexpected = model.load_state_dict(load_file(f"{{folder}}/{TENSORS_FILE}"), strict=False)',
        "assert not unexpected, unexpected  # every tensor has its place; the missing ones are the backbone's, unchanged",
    ]
    code = load_code(run, model_lines, ["from safetensors.torch import load_file"], ("AutoModelForSequenceClassification",))
    whole = " (all of the model but the pooler, which it never used)" if run.method.name == "full" and run.mean_pooling else ""
    loading = "\n\n".join([
        f"No adapter library has a format for `{run.run['method_label']}`: `{TENSORS_FILE}` holds the {len(run.trained_names)} "
        f"tensors the method trained{whole}, under the names of transformers' `AutoModelForSequenceClassification`. "
        "Load the backbone, then these tensors over it; every other tensor stays the backbone's:",
        code,
        "adaptune's `adaptune.serve.export_formats.load_exported(folder)` does the same.",
    ])
    (folder / LOADING_FILE).write_text(f"# Loading {run.task.name} ({run.run['method_label']})\n\n{loading}\n", encoding="utf-8")
    return WrittenFormat(
        format="transformers", library_name="transformers", tags=("transformers",),
        files={TENSORS_FILE: f"the {len(run.trained_names)} tensors {run.run['method_label']} trained",
               LOADING_FILE: "how to load them onto the backbone"},
        loading=loading,
    )


# --- loading an export back (the tests' check; LOADING.md's code) -------------------------------------------------


def read_export_info(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(folder) / EXPORT_FILE
    if not path.is_file():
        raise ExportError(f"{folder} is not an export folder: no {EXPORT_FILE} (make one with python -m adaptune export)")
    info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return info


def load_exported(folder: str | os.PathLike[str], backbone: str | None = None) -> nn.Module:
    """A peft or transformers export loaded as its card says, with the libraries only (transformers' from_pretrained,
    the folder's own mean_pooling.py, peft's PeftModel.from_pretrained or load_state_dict), in eval mode.
    `backbone` stands in for the hub name (a local copy). AdapterHub exports need the adapters library
    (tests/adapterhub/adapterhub_logits.py)."""
    folder = Path(folder)
    info = read_export_info(folder)
    if info["format"] not in ("peft", "transformers"):
        raise ExportError(f"{folder} holds a {info['format']} export: load it with its library (its README.md says how)")
    head = {"num_labels": 1, "problem_type": "regression"} if info["task_kind"] == "regression" else {"num_labels": info["num_labels"]}
    with quiet_transformers():
        model = AutoModelForSequenceClassification.from_pretrained(backbone or info["base_model"], **head)
    if info["pooling"] == "mean":
        _folder_pooling(folder).use_mean_pooling(model)
    if info["format"] == "peft":
        from peft import PeftModel

        with warnings.catch_warnings():  # transformers' deprecation notes on what peft calls
            warnings.simplefilter("ignore", FutureWarning)
            return PeftModel.from_pretrained(model, str(folder)).eval()
    tensors = load_file(str(folder / TENSORS_FILE))
    _, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected:
        raise ExportError(f"{folder / TENSORS_FILE} holds tensors the backbone's model lacks: {unexpected[:4]}")
    return model.eval()


def _folder_pooling(folder: Path) -> Any:
    """The folder's own mean_pooling.py (what a user imports), not adaptune's."""
    spec = importlib.util.spec_from_file_location(f"mean_pooling_{abs(hash(str(folder)))}", folder / POOLING_FILE)
    if spec is None or spec.loader is None:
        raise ExportError(f"{folder / POOLING_FILE} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
