"""Named experiments expand into the paper's grids; bad grids fail in plan() with clear messages."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from adaptune.core import environment
from adaptune.report.results import read_results, write_runs
from adaptune.sweep.experiments import EXPERIMENTS, UnknownExperimentError, get_experiment
from adaptune.sweep.fan_in import select_ablation_runs
from adaptune.sweep.plan import PlanError, plan
from adaptune.sweep.spec import Ablation, Sweep, method_grid
from adaptune.train.config import TrainConfig
from adaptune.train.record import failed_run_record


def test_every_named_experiment_plans_with_unique_deterministic_run_ids() -> None:
    for name, spec in EXPERIMENTS.items():
        first, second = plan(spec), plan(spec)
        ids = [run.run_id for run in first.runs]
        assert ids == [run.run_id for run in second.runs], name
        assert len(ids) == len(set(ids)) > 0, name
        assert first.accelerator_hours > 0, name
        assert all(run.experiment == name for run in first.runs), name


def test_grid_sizes_follow_the_paper() -> None:
    # Table 1: 9 GLUE scores from 8 trainings (an MNLI run scores MNLI-m and -mm) x 5 seeds x (full
    # fine-tuning over Devlin et al.'s 4 lr x 3 epochs + 3 adapter sizes x the paper's 3 lr x 2 epochs).
    assert len(plan(get_experiment("glue_full")).runs) == 8 * 5 * (4 * 1 + 3 * 3 * 2)
    # Table 2: 17 tasks x (full + 8 top-k + 6 adapter sizes) x 4 lr x 3 seeds, epochs fixed by Table 4.
    assert len(plan(get_experiment("extra_full")).runs) == 17 * 15 * 4 * 3
    # Figure 4: (10 adapter sizes + 12 top-k + LayerNorm) x 3 lr x 2 epochs x 3 seeds on 9 GLUE scores (8 trainings).
    assert len(plan(get_experiment("tradeoff")).runs) == 8 * 23 * 3 * 2 * 3
    # §3.5 on BERT-large: 24 top-k x 3 lr x 3 epochs + 10 adapter sizes x 4 lr x 3 epochs, 3 seeds.
    assert len(plan(get_experiment("squad")).runs) == (24 * 3 * 3 + 10 * 4 * 3) * 3
    # 2 tasks x (full, adapters, LayerNorm-only, and the head alone as a probe at 4 rates)
    assert len(plan(get_experiment("smoke")).runs) == 2 * (3 + 4)


def test_extra_full_uses_table_4_epochs_per_method() -> None:
    runs = plan(get_experiment("extra_full")).runs
    airline = {(run.method["name"], run.epochs) for run in runs if run.task == "airline"}
    # Table 4: Crowdflower airline 50 epochs fine-tuning, 20 adapters; top-k is fine-tuning.
    assert airline == {("full", 50), ("top_k", 50), ("adapters", 20)}


def test_glue_full_is_bert_large_and_paper_full_keeps_each_blocks_backbone() -> None:
    assert {run.backbone for run in plan(get_experiment("glue_full")).runs} == {"bert-large-uncased"}
    assert {run.backbone for run in plan(get_experiment("squad")).runs} == {"bert-large-uncased"}  # F1 90.7: Devlin's BERT-large
    full = plan(get_experiment("paper_full"))
    assert {run.backbone for run in full.runs} == {"bert-large-uncased", "bert-base-uncased"}
    parts = sum(len(plan(get_experiment(n)).runs) for n in ("glue_full", "extra_full", "tradeoff", "squad", "ablation", "lr_robustness"))
    # tradeoff and ablation share the size-64, init 1e-2 runs of MNLI-m and CoLA: planned once.
    assert len(full.runs) == parts - full.merged_duplicates and full.merged_duplicates > 0


def test_glue_full_gives_full_fine_tuning_devlins_grid_and_adapters_the_papers() -> None:
    runs = plan(get_experiment("glue_full")).runs
    grid = lambda name: {(run.lr, run.epochs, run.batch_size) for run in runs if run.method["name"] == name}  # noqa: E731
    assert grid("full") == {(lr, 3, 32) for lr in (2e-5, 3e-5, 4e-5, 5e-5)}  # Devlin et al. §4.1
    assert {(lr, epochs) for lr, epochs, _ in grid("adapters")} == {(lr, e) for lr in (3e-5, 3e-4, 3e-3) for e in (3, 20)}  # §3.2


def test_ablation_experiment_sweeps_init_std_over_1e7_to_1() -> None:
    stds = {run.method["init_std"] for run in plan(get_experiment("ablation")).runs}
    assert min(stds) == pytest.approx(1e-7) and max(stds) == 1.0 and len(stds) == 8


def _spec(**sweep_changes: object) -> object:
    base = Sweep(tasks=("rte",), methods=method_grid(full=True), learning_rates=(1e-4,), epochs=(1,))
    return dataclasses.replace(get_experiment("smoke"), sweeps=(dataclasses.replace(base, **sweep_changes),), ablation=None)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"tasks": ("mrcp",)}, "did you mean mrpc"),
        ({"methods": ({"name": "adaptors", "size": 8},)}, "known methods"),
        ({"learning_rates": (0.0,)}, "learning rate must be > 0"),
        ({"methods": method_grid(top_k=(7,))}, "exceeds the 6 layers of all-MiniLM-L6-v2"),
        ({"methods": ({"name": "adapters", "size": 0},)}, "size must be >= 1"),
        ({"seeds": (0, 0)}, "seeds repeats 0"),
        ({"epochs": ()}, "epochs is empty"),
        ({"epochs": "paper"}, "the paper gives no epochs for task 'rte'"),
        ({"learning_rates": (float("inf"),)}, "learning rate must be > 0 and finite, got inf"),
        ({"seeds": (-1,)}, "seeds must be whole numbers >= 0, got -1"),
        ({"max_length": 100_000}, "max_length must be 8..512 tokens"),
        ({"backbone": "/nonexistent/model"}, "backbone path /nonexistent/model does not exist"),
        ({"tasks": ("squad",), "max_length": 192}, "max_length 192 leaves SQuAD's windows no room at doc stride 128: use the paper's 384"),
    ],
)
def test_invalid_grids_fail_in_plan_with_a_clear_message(changes: dict, expected: str) -> None:
    with pytest.raises(PlanError, match=expected.replace("(", r"\(")):
        plan(_spec(**changes))


def test_every_problem_is_reported_at_once_and_empty_grids_fail() -> None:
    with pytest.raises(PlanError) as error:
        plan(_spec(tasks=("rte", "nosuchtask"), learning_rates=(-1.0,)))
    assert "nosuchtask" in str(error.value) and "learning rate must be > 0" in str(error.value)
    with pytest.raises(PlanError, match="empty grid"):
        plan(dataclasses.replace(get_experiment("smoke"), sweeps=()))
    with pytest.raises(PlanError, match="top_k k=13 exceeds the 12 layers of bert-base-uncased"):
        plan(dataclasses.replace(get_experiment("extra_full"), sweeps=(
            Sweep(tasks=("sms_spam",), methods=method_grid(top_k=(13,)), learning_rates=(1e-4,)),)))


def test_ablation_needs_a_planned_adapter_run() -> None:
    spec = dataclasses.replace(_spec(), ablation=Ablation(tasks=("rte",), method={"name": "adapters", "size": 64}))
    with pytest.raises(PlanError, match="needs a planned adapters64 run"):
        plan(spec)


def test_unknown_experiment_names_the_closest() -> None:
    with pytest.raises(UnknownExperimentError, match="did you mean glue_full"):
        get_experiment("glue_ful")


def test_summary_prints_the_grid_run_count_and_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.__main__ import main

    assert main(["plan", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "\n14 runs\n" in out and "accelerator-hours" in out and "sms_spam" in out
    assert main(["plan", "nope"]) == 2


def test_select_ablation_runs_takes_the_best_finished_run_per_task() -> None:
    spec = get_experiment("smoke")
    runs = [run for run in plan(spec).runs if run.task == "sms_spam"]
    records = []
    for run, f1, status in zip(runs, (0.9, 0.6, 0.8), ("ok", "ok", "ok")):
        record = failed_run_record(run, "")
        record.update(status=status, val_metrics={"accuracy": f1})
        records.append(record)
    first_adapter = next(r for r in records if r["method"]["name"] == "adapters")
    # A second run of the ablation's method (another seed), listed after the first and better on validation.
    better_adapter = failed_run_record(dataclasses.replace(next(r for r in runs if r.method["name"] == "adapters"), seed=1), "")
    better_adapter.update(status="ok", val_metrics={"accuracy": first_adapter["val_metrics"]["accuracy"] + 0.1})
    records.append(better_adapter)
    assert select_ablation_runs(records, spec.ablation) == [better_adapter]
    better_adapter["status"] = "failed"
    assert select_ablation_runs(records, spec.ablation) == [first_adapter]
    first_adapter["status"] = "failed"
    assert select_ablation_runs(records, spec.ablation) == []


def test_select_ablation_runs_keeps_to_the_ablations_backbone() -> None:
    """paper_full holds size-64 adapter runs of MNLI-m on BERT-large (Table 1) and BERT-base (Figure 6):
    the better-scoring BERT-large run must not be ablated instead of the paper's BERT-base one."""
    spec = get_experiment("paper_full")
    assert spec.ablation.backbone == "bert-base-uncased" == get_experiment("ablation").ablation.backbone
    method = {"name": "adapters", "size": 64, "init_std": 1e-2}
    records = []
    for backbone, score in (("bert-large-uncased", 0.9), ("bert-base-uncased", 0.8)):
        record = failed_run_record(TrainConfig(task="mnli_m", method=method, lr=3e-4, backbone=backbone), "")
        record.update(status="ok", val_metrics={"accuracy": score})
        records.append(record)
    assert select_ablation_runs(records, spec.ablation) == [records[1]]
    assert select_ablation_runs(records, dataclasses.replace(spec.ablation, backbone=None)) == [records[0]]


def test_the_ablation_reads_table_1s_run_when_seeds_tie_on_validation() -> None:
    """One best-on-validation rule: of two CoLA adapter seeds tied on validation, the ablation (Figure 6)
    ablates the run Table 1 reports (report.selection: ties to the smallest run id), not the first in plan order."""
    import pandas as pd

    from adaptune.report.reference import load_reference
    from adaptune.report.results import run_row
    from adaptune.report.selection import best_by_validation
    from adaptune.report.tables import table1_candidates

    spec = get_experiment("paper_full")
    method = {"name": "adapters", "size": 64, "init_std": 1e-2, "nonlinearity": "gelu"}
    records = []
    for seed, score in ((0, 0.5), (1, 0.6), (2, 0.6)):
        record = failed_run_record(TrainConfig(task="cola", method=method, lr=3e-4, seed=seed, backbone="bert-base-uncased"), "")
        record.update(status="ok", reason=None, val_metrics={"matthews_correlation": score})
        records.append(record)
    tied = sorted(record["run_id"] for record in records[1:])
    records.sort(key=lambda record: record["run_id"] != tied[1])  # plan order puts the larger run id of the tie first
    candidates, _ = table1_candidates(pd.DataFrame.from_records([run_row(record) for record in records]), load_reference())
    table1_run = best_by_validation(candidates, ["task", "method"])["run_id"].tolist()
    assert table1_run == [tied[0]]
    assert [record["run_id"] for record in select_ablation_runs(records, spec.ablation)] == table1_run


def test_failed_run_record_is_a_valid_result_row(tmp_path: object) -> None:
    run = plan(get_experiment("smoke")).runs[0]
    write_runs([failed_run_record(run, "Traceback: boom")], tmp_path)
    runs = read_results(tmp_path)["runs"]
    assert runs.loc[0, "run_id"] == run.run_id and runs.loc[0, "status"] == "failed"


def test_a_task_missing_from_the_local_mirror_fails_before_anything_runs(shared_data_dir: Path) -> None:
    from adaptune.sweep.data_check import DataPreparationError, check_local_data

    planned = plan(_spec(tasks=("rte", "qnli")))  # the mirror holds QNLI's dev set only
    with pytest.raises(DataPreparationError, match=r"\nqnli: .*glue/QNLI/train\.tsv not found: download the publisher's file again"):
        check_local_data(planned, shared_data_dir)
    check_local_data(plan(_spec(tasks=("rte", "sms_spam"))), shared_data_dir)  # both present: no error



def test_shards_start_in_the_order_of_their_first_run_across_tasks() -> None:
    """glue_local lists its sweeps in the order of what they decide (each task's full fine-tuning and
    20-epoch adapters, seed by seed, before the rest of the grid): its shards keep that order across
    tasks, so MRPC's and SST-2's deciding runs do not wait for CoLA's whole grid."""
    spec = EXPERIMENTS["glue_local"]
    planned = plan(spec)
    declared = [run.run_id for sweep in spec.sweeps for run in plan(dataclasses.replace(spec, sweeps=(sweep,))).runs]
    position = {run_id: declared.index(run_id) for run_id in dict.fromkeys(declared)}
    firsts = [position[shard.runs[0].run_id] for shard in planned.shards]
    assert firsts == sorted(firsts)
    assert [shard.runs[0].task for shard in planned.shards[:3]] == ["cola", "mrpc", "sst2"]
    assert [shard.id for shard in planned.shards[:3]] == ["0000-cola", "0001-mrpc", "0002-sst2"]
    assert sorted(run.run_id for shard in planned.shards for run in shard.runs) == sorted(position)
    assert all(len({run.task for run in shard.runs}) == 1 for shard in planned.shards)


def test_a_plans_shards_hold_whole_fused_groups_and_the_runner_forms_those_groups() -> None:
    """On the H100 preset (8 runs a group), a group key's runs are packed a group at a time, never cut where a
    shard fills: RTE's 9 adapter runs (3 learning rates x 3 seeds) train as 5 and 4, not as 8 and a run alone, and
    its 10 full fine-tuning runs alone. The shard runner, given each shard, forms exactly the plan's groups, and
    the plan prices each run at its group's size."""
    from adaptune.sweep.device_sharing import runs_per_group
    from adaptune.sweep.run_attempt import form_groups
    from adaptune.sweep.spec import ACCELERATORS

    spec = dataclasses.replace(
        EXPERIMENTS["glue_local"], name="groups_check", accelerator=ACCELERATORS["h100"], shard_size=6,
        backbone="bert-base-uncased",
        sweeps=(Sweep(tasks=("rte",), methods=method_grid(full=True, adapter_sizes=(64,)), learning_rates=(3e-5, 3e-4, 3e-3),
                      seeds=(0, 1, 2)), Sweep(tasks=("rte",), methods=method_grid(full=True), learning_rates=(1e-4,), seeds=(0,))))
    planned = plan(spec)
    adapters = [run.run_id for run in planned.runs if run.method["name"] == "adapters"]
    assert len(adapters) == 9
    assert sorted(len(group) for group in planned.groups if group[0].method["name"] == "adapters") == [4, 5]
    assert all(len(group) == 1 for group in planned.groups if group[0].method["name"] == "full")
    shard_of = {run.run_id: shard.id for shard in planned.shards for run in shard.runs}
    assert sorted(shard_of) == sorted(run.run_id for run in planned.runs)
    assert all(len({shard_of[run.run_id] for run in group}) == 1 for group in planned.groups)
    assert all(len(shard.runs) <= spec.shard_size for shard in planned.shards)
    formed = [[run.run_id for run in group] for shard in planned.shards
              for group in form_groups(list(shard.runs), runs_per_group(spec.accelerator))]
    assert sorted(formed) == sorted([run.run_id for run in group] for group in planned.groups)
    assert {planned.group_sizes[run_id] for run_id in adapters} == {4, 5}
    five = next(group for group in planned.groups if len(group) == 5)
    four = next(group for group in planned.groups if len(group) == 4)
    assert planned.run_hours[four[0].run_id] > planned.run_hours[five[0].run_id]  # fewer runs share a group's launches
    assert "fused: 2 groups (1 of 5, 1 of 4); 10 runs alone" in planned.summary().splitlines()


def test_paper_fulls_8800_runs_train_in_the_groups_the_plan_priced() -> None:
    """At the paper's scale on H100s (8 runs a group): every planned group lies in one shard, the shard runner
    forms exactly the plan's groups from every shard, and no run that could share a forward pass trains alone
    (before 2026-11-28, 133 did: shards were packed run by run)."""
    from adaptune.fused.grouping import group_capacity, group_key
    from adaptune.sweep.device_sharing import runs_per_group
    from adaptune.sweep.run_attempt import form_groups

    spec = EXPERIMENTS["paper_full"]
    planned = plan(spec)
    per_group = runs_per_group(spec.accelerator)
    formed = sorted(tuple(run.run_id for run in group) for shard in planned.shards for group in form_groups(list(shard.runs), per_group))
    assert formed == sorted(tuple(run.run_id for run in group) for group in planned.groups)
    assert sum(map(len, formed)) == len(planned.runs) == 8800
    keys = Counter(group_key(run) for run in planned.runs)
    could_share = [group[0] for group in planned.groups if len(group) == 1 and group_key(group[0]) is not None
                   and keys[group_key(group[0])] > 1 and group_capacity(group[0], per_group) > 1]
    assert could_share == []
    assert max(map(len, formed)) == per_group


def test_whole_model_runs_train_one_a_group_and_a_bad_group_size_fails_at_planning() -> None:
    """Full fine-tuning trains one a group (stacked whole models did not pay on an H100); a group size that is not a
    number of runs fails at planning, in one line."""
    from adaptune.sweep.spec import ACCELERATORS

    spec = dataclasses.replace(EXPERIMENTS["glue_local"], name="whole_groups_check", accelerator=ACCELERATORS["h100"],
                               backbone="bert-base-uncased", sweeps=(Sweep(tasks=("rte",), methods=method_grid(full=True),
                                                                           learning_rates=(3e-5, 3e-4, 3e-3), seeds=(0, 1, 2)),))
    assert sorted(map(len, plan(spec).groups)) == [1] * 9
    with environment.patch(runs_per_group="x"), \
            pytest.raises((PlanError, ValueError), match="ADAPTUNE_RUNS_PER_GROUP.*(whole number >= 1|'x')"):
        plan(spec)


# A CPU sweep of 2 methods x 2 learning rates x 2 seeds, pinned to float32 so its runs record "cpu" on any machine.
FUSED_SWEEP = {
    "name": "fused_estimate_check", "backbone": "all-MiniLM-L6-v2", "accelerator": {"cpu_precision": "float32"},
    "max_train_examples": 1000,
    "sweeps": [{"tasks": ["sst2"], "methods": ["adapters:16", "layernorm"], "learning_rates": [1e-4, 1e-3], "epochs": [2],
                "seeds": [0, 1]}],
}


@pytest.mark.parametrize("runs_per_group", ["4", "1"])
def test_the_plan_prices_a_fused_sweep_by_its_fused_records_and_says_which_records_it_set_aside(
    runs_per_group: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store holds the sweep's 8 runs, trained fused 4 at a time in float32 ("cpu"; each record carries its group's
    400 s: 1,000 rows x 2 epochs over 100 s a run, 20 examples/s), and one more trained in bf16 ("cpu:bf16"). Fused 4 at
    a time (ADAPTUNE_RUNS_PER_GROUP=4), the plan prices every run by the fused records; trained alone (=1) it cannot,
    and its estimate line says how many records it set aside and why, not only that it used the published table."""
    from adaptune.core.files import json_text
    from adaptune.data.tasks import get_task
    from adaptune.sweep.spec_file import spec_from_dict
    from adaptune.sweep.store import RunStore
    from adaptune.train.record import run_record
    from pipelines.__main__ import main

    spec = spec_from_dict(FUSED_SWEEP)
    store = RunStore(tmp_path / "store")
    runs = plan(spec).runs
    for config in runs:
        record = run_record(config, get_task(config.task).primary_metric, device="cpu")
        record.update(status="ok", wall_time_s=400.0, group_size=4, split_sizes={"train": 1000, "validation": 100, "test": 100})
        assert store.publish_record(record)
    bf16 = dataclasses.replace(runs[0], seed=7)
    bf16_record = run_record(bf16, "accuracy", device="cpu:bf16")
    bf16_record.update(status="ok", wall_time_s=50.0, split_sizes={"train": 1000, "validation": 100, "test": 100})
    assert store.publish_record(bf16_record)
    sweep = tmp_path / "fused.json"
    sweep.write_text(json_text(FUSED_SWEEP))
    monkeypatch.setenv("ADAPTUNE_RUNS_PER_GROUP", runs_per_group)
    assert main(["plan", str(sweep), "--runs-root", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    (basis,) = [line for line in out.splitlines() if line.startswith("estimate basis: ")]
    (estimate,) = [line for line in out.splitlines() if line.startswith("estimate: ")]
    if runs_per_group == "4":
        assert basis.startswith("estimate basis: throughput measured by the run store's records (")
        assert "all-MiniLM-L6-v2 adapters fused 4 at a time on cpu: 20.0 examples/s from 4 run(s)" in basis
        assert "all-MiniLM-L6-v2 layernorm fused 4 at a time on cpu: 20.0 examples/s from 4 run(s)" in basis
        assert "not a measurement" not in basis and "priced one run at a time" not in basis
        assert "; 1 of the run store's record(s) set aside: 1 trained on cpu:bf16, not cpu" in basis
        assert estimate.startswith(f"estimate: {8 * 2000 / 20.0 / 3600:.2f} accelerator-hours")  # 8 runs x 100 s
    else:
        assert basis.startswith("estimate basis: throughput from adaptune.sweep.cost.THROUGHPUT (published figures, not a measurement)")
        assert ("; 9 of the run store's record(s) set aside: 8 trained fused 4 at a time (all-MiniLM-L6-v2 adapters, "
                "all-MiniLM-L6-v2 layernorm) where the plan trains them alone, runs_per_group 1: a fused run's cost is its "
                "share of its group's time, which depends on the group's size; 1 trained on cpu:bf16, not cpu") in basis


def test_a_probe_is_priced_as_one_forward_pass_over_its_rows_whatever_its_epochs() -> None:
    """The head alone on a classification or regression task trains as a probe on features computed once
    (adaptune.train.probe): a third of one full epoch's steps, at any number of epochs; on a span task it trains
    through the whole model and is priced by its epochs."""
    from adaptune.sweep.cost import PROBE_PASS_COST, estimate_hours

    spec = get_experiment("cpu_small")
    probe = TrainConfig(task="sst2", method={"name": "head"}, epochs=10, max_train_examples=1000)
    one_full_epoch = estimate_hours(dataclasses.replace(probe, method={"name": "full"}, epochs=1), spec)
    assert estimate_hours(probe, spec) == estimate_hours(dataclasses.replace(probe, epochs=100), spec)
    assert estimate_hours(probe, spec) == pytest.approx(one_full_epoch * PROBE_PASS_COST)
    span = TrainConfig(task="squad", method={"name": "head"}, epochs=1, max_length=384, max_train_examples=1000)
    assert estimate_hours(dataclasses.replace(span, epochs=2), spec) == pytest.approx(2 * estimate_hours(span, spec))
