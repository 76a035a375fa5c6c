"""Evaluation batches (adaptune.train.evaluate): a GPU takes larger ones than a CPU, and the rows a batch holds
move no prediction, so a run's scores do not depend on the device's batch size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from adaptune.core.devices import Device, pick_device
from adaptune.data.batching import make_collator
from adaptune.data.tasks import get_task
from adaptune.model.backbone import load_model, load_tokenizer
from adaptune.train import evaluate
from adaptune.train.evaluate import EVAL_BATCH_SIZE, GPU_EVAL_BATCH_SIZE, evaluation_batch_size
from adaptune.train.run_data import prepare_run_data


def test_a_gpu_evaluates_in_larger_batches_than_a_cpu() -> None:
    gpu = Device(kind="cuda", torch_device=torch.device("cpu"), name="cuda:stand-in", autocast_dtype=None)
    assert evaluation_batch_size(pick_device("cpu")) == EVAL_BATCH_SIZE < GPU_EVAL_BATCH_SIZE == evaluation_batch_size(gpu)


def test_the_rows_an_evaluation_batch_holds_move_no_prediction(tmp_path: Path, shared_data_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """96 MRPC validation rows scored in batches of 32 and of 128 (one batch, padded to its longest row): the same
    logits for every row, so the same scores."""
    logits: list[np.ndarray] = []
    real_scored = evaluate.scored_outputs

    def scored(task: Any, split: Any, outputs: list[Any]) -> Any:
        logits.append(np.stack(outputs))
        return real_scored(task, split, outputs)

    monkeypatch.setattr(evaluate, "scored_outputs", scored)
    task, device = get_task("mrpc"), pick_device("cpu")
    torch.manual_seed(0)
    model = load_model(None, "classification")
    tokenizer = load_tokenizer(None)
    data = prepare_run_data(task, tokenizer, 64, 32, None, 96, shared_data_dir, tmp_path, with_train=False)
    validation, collator = data.eval_splits["validation"], make_collator(tokenizer)
    small, large = (evaluate.evaluate_split(model, task, validation, device, collator, batch_size=size).metrics for size in (32, 128))
    assert len(validation.rows) == 96 and len(set(validation.lengths)) > 1  # one batch of 128 pads rows of several lengths
    assert logits[0].shape == logits[1].shape == (96, 2)
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)
    assert small == large
