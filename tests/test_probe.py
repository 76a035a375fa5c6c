"""The head alone trains as a probe on the frozen backbone's features computed once (adaptune.train.probe): the same
training as inside the whole model but for the backbone's dropout, a checkpoint that scores as the run recorded, one
feature pass for a task's head-alone runs, and a regression head too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from adaptune.core.devices import pick_device
from adaptune.data.batching import make_collator
from adaptune.data.tasks import get_task
from adaptune.model.backbone import load_tokenizer
from adaptune.model.checkpoint import load_task_checkpoint
from adaptune.report.methods_table import methods_markdown, methods_table
from adaptune.report.results import read_results, write_results
from adaptune.train import loop, probe
from adaptune.train.config import TrainConfig
from adaptune.train.evaluate import evaluate_split
from adaptune.train.loop import prepare_data, train_and_evaluate

pytestmark = pytest.mark.xdist_group("probe")  # one worker: the feature cache is a process's

HEAD = dict(method={"name": "head"}, lr=1e-2, epochs=3, max_length=64, batch_size=16, max_train_examples=128,
            max_eval_examples=64, experiment="test_probe")
# The probe's features come from evaluation batches, the whole model's training forward from training batches: mean
# pooling over another padding sums in another order (float32 rounding: measured 4e-9 in the epoch losses, 6e-8 in
# the final classifier, the same scores).
SAME_TRAINING = 1e-6


@pytest.fixture()
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """An empty feature cache for the test, and the number of feature passes it made (one entry per split computed)."""
    passes: list[int] = []
    monkeypatch.setattr(probe, "SHARED_FEATURES", probe.FeatureCache())
    real = probe.pooled_features

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        passes.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(probe, "pooled_features", counted)
    return passes


def _train(config: TrainConfig, out: Path, data_dir: Path) -> dict[str, Any]:
    record = train_and_evaluate(config, data_dir=data_dir, out_dir=out, progress=False)
    assert record["status"] in ("ok", "degenerate"), record.get("reason")
    return record


def _classifier(record: dict[str, Any]) -> dict[str, torch.Tensor]:
    tensors = load_file(Path(record["checkpoint_dir"]) / "task.safetensors")
    return {name: tensor for name, tensor in tensors.items() if "classifier" in name}


def test_a_probe_trains_the_head_as_the_whole_model_does_without_the_backbones_dropout(
        tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: list[int], without_dropout: None) -> None:
    """With every dropout off, the probe on cached features and the head trained inside the whole model (the probe
    refused) take the same steps: the same epoch losses, scores and final classifier, to float32's rounding."""
    config = TrainConfig(task="mrpc", **HEAD)
    probed = _train(config, tmp_path / "probe", shared_data_dir)
    monkeypatch.setattr(loop, "probe_head", lambda *args: None)
    whole = _train(config, tmp_path / "whole", shared_data_dir)
    assert "probe" in probed and "probe" not in whole
    assert probed["curve"][-1]["train_loss"] < probed["curve"][0]["train_loss"] - 0.02  # it learns
    for a, b in zip(probed["curve"], whole["curve"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=SAME_TRAINING)
    assert probed["val_metrics"] == pytest.approx(whole["val_metrics"], abs=1 / 64)  # measured equal; a row at most, at a near-tie
    for name, tensor in _classifier(probed).items():
        torch.testing.assert_close(tensor, _classifier(whole)[name], atol=SAME_TRAINING, rtol=0)


def test_a_probes_checkpoint_scores_its_rows_exactly_as_the_run_recorded(tmp_path: Path, shared_data_dir: Path,
                                                                         fresh_cache: list[int]) -> None:
    """Dropout on (the head's, drawn from the run's stream). The checkpoint, loaded as a bundle loads it and scored by
    the whole model's evaluation, gives the record's validation and test scores to the bit: the probe read what the
    model's classifier reads, in the batches evaluation takes."""
    config = TrainConfig(task="sms_spam", **HEAD)
    record = _train(config, tmp_path / "run", shared_data_dir)
    assert record["probe"]["feature_rows"] == sum(record["split_sizes"].values()) and not record["probe"]["features_reused"]
    model, _, _ = load_task_checkpoint(Path(record["checkpoint_dir"]))
    device, task = pick_device(), get_task("sms_spam")
    tokenizer = load_tokenizer(config.backbone)
    data, _ = prepare_data(config, task, tokenizer, shared_data_dir, None)
    collator = make_collator(tokenizer, pad_to_multiple_of=device.pad_multiple)
    model.to(device.torch_device)
    for split, recorded in (("validation", record["val_metrics"]), ("test", record["test_metrics"])):
        assert evaluate_split(model, task, data.eval_splits[split], device, collator).metrics == recorded


def test_the_head_alone_runs_of_a_task_share_one_feature_pass(tmp_path: Path, shared_data_dir: Path, fresh_cache: list[int]) -> None:
    """Two rates and two seeds on one task: the train, validation and test features are computed once, by the first
    run; each run still trains its own head from its own seed (four different results)."""
    configs = [TrainConfig(task="mrpc", **{**HEAD, "lr": lr, "seed": seed}) for lr, seed in ((1e-2, 0), (3e-3, 1), (1e-2, 2), (3e-2, 0))]
    records = [_train(config, tmp_path / config.run_id, shared_data_dir) for config in configs]
    assert fresh_cache == [128, 64, 64]  # train, validation, test: one pass each
    assert [record["probe"]["features_reused"] for record in records] == [False, True, True, True]
    assert len({tuple(tensor.flatten()[:4].tolist()) for record in records for tensor in _classifier(record).values()
                if tensor.dim() == 2}) == 4

    # The report says what the head alone used: runs.parquet's probe column, and a note beneath the methods table.
    write_results(records, tmp_path / "results")
    runs = read_results(tmp_path / "results")["runs"]
    assert runs["probe"].tolist() == [True] * 4
    table = methods_table(runs, data_dir=shared_data_dir)
    assert table.set_index("method").loc["head", "probe"]
    assert "the task head trained as a probe on the frozen backbone's pooled features, computed once with no dropout in the " \
           "backbone; 3 epochs" in methods_markdown(table)
    without = methods_table(runs.assign(probe=False), data_dir=shared_data_dir)  # records from before the probe
    assert "as a probe" not in methods_markdown(without)


def test_a_regression_probe_learns_and_its_checkpoint_reproduces_the_record(tmp_path: Path, stsb_mirror: Path,
                                                                             fresh_cache: list[int]) -> None:
    """STS-B's path (a float label, one output, mean squared error, Spearman and Pearson) as a probe."""
    config = TrainConfig(task="stsb", **{**HEAD, "epochs": 10, "max_train_examples": None, "max_eval_examples": None})
    record = _train(config, tmp_path / "run", stsb_mirror)
    assert "probe" in record and record["curve"][-1]["train_loss"] < record["curve"][0]["train_loss"] / 2
    assert record["val_metrics"]["spearman"] > 0.3  # the word-overlap scores are learnable from sentence embeddings
    model, _, _ = load_task_checkpoint(Path(record["checkpoint_dir"]))
    device, task = pick_device(), get_task("stsb")
    tokenizer = load_tokenizer(config.backbone)
    data, _ = prepare_data(config, task, tokenizer, stsb_mirror, None)
    model.to(device.torch_device)
    assert evaluate_split(model, task, data.eval_splits["validation"], device,
                          make_collator(tokenizer, pad_to_multiple_of=device.pad_multiple)).metrics == record["val_metrics"]


class Interrupted(Exception):
    pass


def test_an_interrupted_probe_resumes_to_the_same_result(tmp_path: Path, shared_data_dir: Path, fresh_cache: list[int]) -> None:
    config = TrainConfig(task="mrpc", checkpoint_every_steps=5, **HEAD)
    uninterrupted = _train(config, tmp_path / "whole", shared_data_dir)

    def preempt_at_step_12(step: int) -> None:
        if step == 12:  # mid epoch 2 (8 steps an epoch); the last saved state is step 10
            raise Interrupted

    with pytest.raises(Interrupted):
        train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "cut", progress=False, step_callback=preempt_at_step_12)
    steps: list[int] = []
    resumed = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "cut", progress=False, step_callback=steps.append)
    assert steps == list(range(11, 25))
    assert resumed["curve"] == uninterrupted["curve"] and resumed["test_metrics"] == uninterrupted["test_metrics"]
