"""AdapterHub exports loaded by AdapterHub's own `adapters` 1.3 (in .venv-adapters: it needs transformers 4.57) as the
model card says: AutoAdapterModel, the folder's mean-pooling head registered, load_adapter, the LayerNorms loaded;
its logits are adaptune's own on the rows each run was scored on. Houlsby and Pfeiffer adapters on SST-2, and
Houlsby on RTE (sentence pairs); and on a BERT whose pooler was trained, AdapterHub's standard head. Run with `make test-adapterhub`
(`pytest -n 0 -m adapterhub tests/adapterhub`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from adaptune.cli import main
from adaptune.model.backbone import embedded_backbone_path, load_tokenizer
from adaptune.train.config import TrainConfig
from adaptune.train.loop import train_and_evaluate
from tests.export_runs import SMALL, bert_with_a_trained_pooler, config, project_logits, train_store, validation_rows

pytestmark = [pytest.mark.adapterhub, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
VENV_PYTHON = Path(os.environ.get("ADAPTERHUB_VENV", HERE.parents[1] / ".venv-adapters")) / "bin" / "python"
# float32 on a CPU, as tests/test_export.py: adapters 1.3 computes adaptune's adapter with the same operators.
# Measured: 1.1e-6 (SST-2 Houlsby), 6.0e-7 (SST-2 Pfeiffer), 0 (RTE Houlsby), 3.0e-8 (the BERT), 64 rows each: the
# check batches in input order, adaptune by length: other padding, so other summation shapes.
LOGIT_TOLERANCE = 1e-5
CASES = [("adapters8", "sst2"), ("pfeiffer8", "sst2"), ("adapters8", "rte")]


@pytest.fixture(scope="module")
def adapters_python() -> Path:
    """The python of .venv-adapters, made on first use."""
    ready = VENV_PYTHON.is_file() and subprocess.run([str(VENV_PYTHON), "-c", "import adapters"], capture_output=True).returncode == 0
    if not ready:
        subprocess.run(["bash", str(HERE / "make_env.sh")], check=True)
    return VENV_PYTHON


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("store")
    train_store(root, tmp_path_factory.mktemp("cache"), shared_data_dir, [config(label, task) for label, task in CASES])
    return root


@pytest.mark.parametrize(("label", "task"), CASES, ids=[f"{label}-{task}" for label, task in CASES])
def test_adapterhub_loads_the_export_and_gives_the_runs_logits(adapters_python, store, shared_data_dir, tmp_path, label, task) -> None:
    assert main(["export", "--runs-root", str(store), "--out", str(tmp_path / "out"), "--method", label, "--tasks", task,
                 "--data-dir", str(shared_data_dir)]) == 0
    head = json.loads((tmp_path / "out" / task / "head_config.json").read_text())["config"]
    assert (head["head_type"], head["use_pooler"]) == ("adaptune_mean_pooling_classification", False)  # MiniLM: the mean
    check_logits(adapters_python, store, tmp_path / "out" / task, str(embedded_backbone_path()), task, shared_data_dir, tmp_path, label)


def test_a_bert_with_a_trained_pooler_gets_adapterhubs_standard_head(adapters_python, shared_data_dir, tmp_path) -> None:
    """BERT's pooler was pre-trained: adaptune keeps it frozen, so AdapterHub's classification head on the pooler
    (use_pooler) is the run's head, and the folder needs no mean_pooling.py."""
    backbone = str(bert_with_a_trained_pooler(tmp_path / "bert"))
    run = TrainConfig(task="sst2", seed=0, method={"name": "adapters", "size": 8}, lr=3e-3, backbone=backbone, **SMALL)
    root = tmp_path / "store"
    train_and_evaluate(run, data_dir=shared_data_dir, out_dir=root / "runs" / run.run_id, cache_dir=tmp_path / "cache", progress=False)
    # --run-id: this random BERT learns little in 32 steps (a degenerate run is exported by name, whatever its status)
    assert main(["export", "--runs-root", str(root), "--out", str(tmp_path / "out"), "--run-id", run.run_id]) == 0
    folder = tmp_path / "out" / "sst2"
    head = json.loads((folder / "head_config.json").read_text())["config"]
    assert (head["head_type"], head["use_pooler"]) == ("classification", True) and not (folder / "mean_pooling.py").exists()
    check_logits(adapters_python, root, folder, backbone, "sst2", shared_data_dir, tmp_path, "adapters8 (BERT, pooler)")


def check_logits(adapters_python: Path, store: Path, folder: Path, backbone: str, task: str, data_dir: Path, tmp_path: Path,
                 label: str) -> None:
    """The folder loaded by adapters 1.3 (adapterhub_logits.py) gives the run's logits on its validation rows."""
    info = json.loads((folder / "export.json").read_text())
    texts, _ = validation_rows(task, data_dir)
    request, result = tmp_path / "request.json", tmp_path / "result.json"
    request.write_text(json.dumps({"folder": str(folder), "backbone": backbone, "texts": texts,
                                   "max_length": info["max_length"], "batch_size": 32}))
    done = subprocess.run([str(adapters_python), str(HERE / "adapterhub_logits.py"), str(request), str(result)],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(result.read_text())
    assert (loaded["adapters_version"], loaded["transformers_version"][:5]) == ("1.3.0", "4.57.")
    assert loaded["adapter_name"] == task and loaded["active_head"] == task and loaded["config_is_adapters_own"]
    assert loaded["loading_info"] == {"missing_keys": [], "unexpected_keys": []} and loaded["layer_norms_unexpected"] == []
    tokenizer = load_tokenizer(backbone)  # the same token ids in both libraries' tokenizers
    assert loaded["input_ids"] == [tokenizer(*pair, truncation=True, max_length=info["max_length"])["input_ids"] for pair in texts]

    ours = project_logits(store, info["run_id"], texts)
    largest = float(np.abs(np.array(loaded["logits"]) - ours).max())
    without_layer_norms = float(np.abs(np.array(loaded["adapter_only_logits"]) - ours).max())
    print(f"{label} {task}: largest |logit difference| {largest:.3g} over {len(texts)} rows; "
          f"{without_layer_norms:.3g} with the adapter alone (no layer_norms.safetensors)")
    assert largest <= LOGIT_TOLERANCE
    assert without_layer_norms > 100 * LOGIT_TOLERANCE  # the card's LayerNorm step is needed, not decoration
