"""Figure 6 ablation on a real trained adapter checkpoint: no layers off = the trained model, all off = no adapters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from adaptune.core.devices import pick_device  # noqa: E402
from adaptune.data.batching import make_collator  # noqa: E402
from adaptune.data.tasks import get_task  # noqa: E402
from adaptune.model.backbone import load_model, load_tokenizer  # noqa: E402
from adaptune.model.checkpoint import load_task_checkpoint  # noqa: E402
from adaptune.train.ablation import ablate  # noqa: E402
from adaptune.train.config import TrainConfig  # noqa: E402
from adaptune.train.evaluate import evaluate_split  # noqa: E402
from adaptune.train.loop import train_and_evaluate  # noqa: E402
from adaptune.train.run_data import prepare_run_data  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ablation_run")]  # one worker trains `trained` once

RUN = TrainConfig(
    task="sst2", method={"name": "adapters", "size": 32}, lr=3e-3, epochs=2, max_length=48, max_train_examples=128, max_eval_examples=64
)
LAYERS = 6  # MiniLM-L6


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> tuple[dict, list[dict], Path]:
    out = tmp_path_factory.mktemp("ablation_run")
    cache = tmp_path_factory.mktemp("cache")
    record = train_and_evaluate(RUN, data_dir=shared_data_dir, out_dir=out, cache_dir=cache, progress=False)
    assert record["status"] == "ok", record["reason"]
    return record, ablate(out / "checkpoint", data_dir=shared_data_dir, cache_dir=cache), cache


def test_one_record_per_contiguous_span_with_the_run_baseline(trained: tuple[dict, list[dict], Path]) -> None:
    record, rows, _ = trained
    spans = [(row["first_layer"], row["last_layer"]) for row in rows]
    assert sorted(spans) == [(i, j) for i in range(LAYERS) for j in range(i, LAYERS)]  # 21 spans
    for row in rows:
        assert row["run_id"] == record["run_id"] and row["task"] == "sst2" and row["metric"] == "accuracy"
        # No layer off is the trained model itself: the run's own validation score.
        assert row["baseline_value"] == pytest.approx(record["val_metrics"]["accuracy"])
        assert row["relative_change"] == pytest.approx((row["value"] - row["baseline_value"]) / row["baseline_value"])


def test_all_layers_off_equals_the_model_without_adapters(trained: tuple[dict, list[dict], Path], shared_data_dir: Path) -> None:
    record, rows, cache = trained
    all_off = next(row for row in rows if (row["first_layer"], row["last_layer"]) == (0, LAYERS - 1))

    # The adapter-free model: the backbone with the run's trained LayerNorms and head, no adapters at all.
    with_adapters, _, _ = load_task_checkpoint(Path(record["checkpoint_dir"]))
    without = load_model(RUN.backbone, "classification", num_labels=2)
    kept = {name: tensor for name, tensor in with_adapters.state_dict().items() if ".adapter." not in name}
    result = without.load_state_dict(kept, strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    without.eval()

    task, device = get_task("sst2"), pick_device()
    tokenizer = load_tokenizer(RUN.backbone)
    data = prepare_run_data(task, tokenizer, RUN.max_length, RUN.doc_stride, None, RUN.max_eval_examples, shared_data_dir, cache, with_train=False)
    validation, collator = data.eval_splits["validation"], make_collator(tokenizer)
    assert all_off["value"] == pytest.approx(evaluate_split(without, task, validation, device, collator).metrics["accuracy"])

    # Not vacuous: the trained adapters do change the model's outputs.
    batch = {k: v for k, v in collator(validation.rows[:16]).items() if k != "labels"}
    with torch.inference_mode():
        assert not np.allclose(with_adapters(**batch).logits.numpy(), without(**batch).logits.numpy(), atol=1e-4)


def test_ablating_a_non_adapter_checkpoint_is_a_clear_error(tmp_path: Path, shared_data_dir: Path) -> None:
    from adaptune.model.checkpoint import save_task_checkpoint
    from adaptune.model.methods import apply_method, method_from_dict

    model = load_model(RUN.backbone, "classification", num_labels=2)
    method = method_from_dict({"name": "layernorm"})
    apply_method(model, method)
    save_task_checkpoint(model, method, RUN.backbone, tmp_path, metadata={"task": "sst2"})
    with pytest.raises(ValueError, match="needs an adapters checkpoint"):
        ablate(tmp_path, data_dir=shared_data_dir)
