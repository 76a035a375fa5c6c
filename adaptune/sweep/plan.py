"""Expand an experiment's grid into validated run configs, with a cost estimate; runs nothing.

`plan(spec)` checks everything it can before a single run starts: task and method names against
the registries (with the closest known names), value ranges (learning rate, epochs, adapter size,
k against the backbone's depth), empty blocks and repeated values. Runs come out in a fixed
order (task, then block, method, learning rate, epochs, seed) with `TrainConfig.run_id`s, so the
same spec always gives the same plan and KFP's cache recognises finished runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from typing import Any

from adaptune.core.errors import UserError
from adaptune.core.precision import CPU_PRECISIONS
from adaptune.data.squad import window_problem
from adaptune.data.tasks import Task, UnknownTaskError, get_task
from adaptune.fused.grouping import fused_groups
from adaptune.fused.settings import StepSettings
from adaptune.model.layouts import BackboneError, backbone_layers, backbone_layout, unusable_backbone
from adaptune.sweep.cost import estimate_hours, measured_at_length, measurement_for, step_tokens, table_fused_speedup
from adaptune.sweep.cpu_calibration import CpuCalibration
from adaptune.sweep.device_sharing import runs_per_group
from adaptune.sweep.spec import PAPER_EPOCHS, Ablation, ExperimentSpec, Sweep
from adaptune.sweep.throughput import Measured, ThroughputKey, throughput_key
from adaptune.train.config import TrainConfig, method_label


class PlanError(UserError, ValueError):
    """An experiment grid that cannot run as declared; the message says what to change."""


MAX_POSITIONS = 512  # BERT's position embeddings
# A KFP cluster compiles a ParallelFor into one Argo workflow object kept in etcd; fan-outs of about
# 2,000 items have failed with "etcdserver: request is too large" (kubeflow/pipelines#4175). For the
# kfp target the shards grow until the fan-out is at most this many iterations.
KFP_MAX_FANOUT = 300
# A shard's task ends itself (exit 124) after this many times its estimated hours, plus the slack: a
# hung or misplaced task stops burning accelerator hours (a Vertex AI custom job's default timeout is 7 days).
DEADLINE_FACTOR = 3.0
DEADLINE_SLACK_HOURS = 1.0
DEADLINE_MAX_HOURS = 7 * 24.0  # never longer than a Vertex AI custom job's own default timeout

@dataclasses.dataclass(frozen=True)
class Shard:
    """Runs one pipeline task trains one after another, loading the backbone and tokenized data once.

    Every run of a shard has the same task, backbone and token length. Shards are re-derived from
    the spec by every component (plan is deterministic), so the DAG fans out only their small ids.
    """

    id: str  # "0007-cola": position in the plan, then the task, readable in the pipeline console
    runs: tuple[TrainConfig, ...]

    @property
    def task(self) -> str:
        return self.runs[0].task


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: ExperimentSpec
    runs: list[TrainConfig]
    run_hours: dict[str, float]  # run_id -> estimated wall-clock hours on one accelerator set
    merged_duplicates: int  # runs reached by more than one block, kept once
    # The fused groups the runs will train in (planned_groups), in plan order; a shard takes whole groups.
    groups: list[list[TrainConfig]]
    # Shards are always packed by the published table's hours: every component re-plans the spec
    # without the store, and must find the same shards. None: the same as run_hours.
    packing_hours: dict[str, float] | None = None
    # The store's measured throughputs that run_hours used, by (backbone, accelerator, method name, group size).
    measured: dict[ThroughputKey, Measured] = dataclasses.field(default_factory=dict)
    # run_id -> where the spec's sweeps first declare the run (runs are listed task by task).
    declared_order: dict[str, int] = dataclasses.field(default_factory=dict)
    # The store's finished records measured is not from, counted by why (throughput.set_aside_on: another
    # accelerator or precision); those at another group size are in measured and told apart by estimate_source.
    set_aside: dict[str, int] = dataclasses.field(default_factory=dict)
    # On a CPU, the table's rates scaled to this machine by its benchmark, or why not (adaptune.sweep.cpu_calibration).
    cpu_calibration: CpuCalibration | None = None

    @functools.cached_property
    def group_sizes(self) -> dict[str, int]:
        """run_id -> the size of the fused group it will train in (1: alone)."""
        return {run.run_id: len(group) for group in self.groups for run in group}

    @property
    def accelerator_hours(self) -> float:
        """Estimated wall-clock hours x accelerators per run (x1 on CPU nodes). An estimate."""
        return sum(self.run_hours.values()) * max(self.spec.accelerator.count, 1)

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(run.task for run in self.runs))

    @functools.cached_property
    def shards(self) -> list[Shard]:
        """The runs packed per (task, backbone, length), a fused group at a time (never split: the shard runner
        forms the same groups again), in plan order, into shards of at most spec.shard_size runs and about
        spec.shard_hours estimated hours: many small-task runs share a shard, while a long run (MNLI on
        BERT-large), or a long group (QQP's adapter runs fused 8), gets one to itself, so no shard holds up the
        sweep for days. The shards are in the order
        the sweeps declare their first runs."""
        buckets: dict[tuple, list[list[TrainConfig]]] = {}
        for group in self.groups:
            run = group[0]
            buckets.setdefault((run.task, run.backbone, run.max_length, run.doc_stride), []).append(group)
        packed: list[list[TrainConfig]] = []
        packing_hours = self.packing_hours or self.run_hours
        for groups in buckets.values():
            current: list[TrainConfig] = []
            hours = 0.0
            for group in groups:
                group_hours = sum(packing_hours[run.run_id] for run in group)
                if current and (len(current) + len(group) > self.spec.shard_size or hours + group_hours > self.spec.shard_hours):
                    packed.append(current)
                    current, hours = [], 0.0
                current.extend(group)
                hours += group_hours
            packed.append(current)
        # Shards start in the order the sweeps declare their first runs, not task after task: an
        # experiment whose sweeps come in the order of what they decide (glue_local) gets every task's
        # deciding runs before any task's remaining grid.
        position = {run.run_id: self.declared_order.get(run.run_id, index) for index, run in enumerate(self.runs)}
        packed.sort(key=lambda runs: position[runs[0].run_id])
        return [Shard(id=f"{index:04d}-{runs[0].task}", runs=tuple(runs)) for index, runs in enumerate(packed)]

    def shard_hours(self, shard: Shard) -> float:
        return sum(self.run_hours[run.run_id] for run in shard.runs)

    def deadline_hours(self, shard: Shard) -> float:
        """How long the shard's task may run before it ends itself: DEADLINE_FACTOR x its estimate + slack,
        at most DEADLINE_MAX_HOURS."""
        return min(DEADLINE_FACTOR * self.shard_hours(shard) + DEADLINE_SLACK_HOURS, DEADLINE_MAX_HOURS)

    def shard(self, shard_id: str) -> Shard:
        for shard in self.shards:
            if shard.id == shard_id:
                return shard
        raise PlanError(f"experiment {self.spec.name!r} has no shard {shard_id!r} ({len(self.shards)} shards); "
                        "the spec changed since the pipeline planned it")

    @property
    def peak_accelerators(self) -> int:
        """Accelerators the DAG may hold at once: shards in flight x accelerators per shard."""
        return min(len(self.shards), self.spec.parallelism) * self.spec.accelerator.count

    def wall_clock_hours(self, run_ids: set[str] | None = None) -> float:
        """Estimated hours until the last shard ends: shards start in plan order on `parallelism` slots.
        With `run_ids`, only those runs are counted (what is left of a sweep under way)."""
        import heapq

        shard_hours = [sum(self.run_hours[run.run_id] for run in shard.runs if run_ids is None or run.run_id in run_ids)
                       for shard in self.shards]
        shard_hours = [hours for hours in shard_hours if hours > 0]
        slots = [0.0] * min(self.spec.parallelism, max(len(shard_hours), 1))
        for hours in shard_hours:
            heapq.heapreplace(slots, slots[0] + hours)
        return max(slots)

    def calibrated(self, measured: dict[ThroughputKey, Measured], set_aside: dict[str, int] | None = None,
                   cpu_calibration: CpuCalibration | None = None) -> Plan:
        """The same plan and shards, its hours estimated from `measured` throughputs where they apply, else from the
        table (on a CPU scaled by `cpu_calibration`'s factor where it has one); `set_aside`: the store's records left
        out of `measured`, by why (throughput.set_aside_on)."""
        factor = cpu_calibration.factor if cpu_calibration and cpu_calibration.factor else 1.0
        run_hours = {run.run_id: estimate_hours(run, self.spec, measured, self.group_sizes[run.run_id], factor) for run in self.runs}
        return dataclasses.replace(self, run_hours=run_hours, packing_hours=self.packing_hours or self.run_hours,
                                   measured=dict(measured), set_aside=dict(set_aside or {}), cpu_calibration=cpu_calibration)

    def estimate_source(self) -> str:
        """Which throughputs the estimate used: the store's measurements (with their run counts and the
        group size they were fused at) or the table, and where fused runs were priced one at a time."""
        table = "adaptune.sweep.cost.THROUGHPUT (published figures, not a measurement)"
        calibration = self.cpu_calibration if self.spec.accelerator.label == "cpu" else None
        if calibration is not None and calibration.factor:
            table = f"adaptune.sweep.cost.THROUGHPUT {calibration.basis}"
        keys: set[tuple[Any, ...]] = set()
        unpriced_groups: Counter[int] = Counter()
        table_groups: Counter[int] = Counter()
        at_length = at_mean_length = 0
        for run in self.runs:
            planned = self.group_sizes[run.run_id]
            found = measurement_for(run, self.spec, self.measured, planned)
            at_length += found is None and measured_at_length(run, self.spec)
            at_mean_length += found is None and not measured_at_length(run, self.spec) and step_tokens(run) != run.max_length
            keys.add(found[0] if found else throughput_key(run.backbone, self.spec.accelerator.label, run.method))
            if found is None and table_fused_speedup(run, self.spec, planned) > 1:
                table_groups[planned] += 1
            elif planned > 1 and (found is None or found[0][3] != planned):
                unpriced_groups[planned] += 1
        used = {key: self.measured[key] for key in sorted(keys) if key in self.measured}
        fused_note = ""
        if table_groups:
            by_size = ", ".join(f"{count:,} " + (f"fused {size} at a time" if size > 1 else "alone, the step replayed as CUDA graphs")
                                for size, count in sorted(table_groups.items(), reverse=True))
            fused_note = (f"; {sum(table_groups.values()):,} run(s) priced at bench-gpu's measured fused speedup ({by_size}; "
                          "adaptune.sweep.cost.FUSED_SPEEDUP: of the training step; what a group spends outside its steps is "
                          "not in it, so the store's records, once there, price these runs)")
        fused_note += "".join(f"; {count:,} run(s) that train fused {size} at a time priced one run at a time (no "
                              f"fused measurement for their method at that group size yet)" for size, count in sorted(unpriced_groups.items()))
        if at_length:
            fused_note += (f"; {at_length:,} run(s) priced at bench-gpu's one-run step measured at their length "
                           "(adaptune.sweep.cost.MEASURED_ONE_RUN_AT_LENGTH)")
        if at_mean_length:
            fused_note += (f"; {at_mean_length:,} run(s) priced at the tokens their task's batches are padded to on average, not "
                           "their max_length (adaptune.sweep.cost.MEAN_PADDED_LENGTH: an upper bound from a step measured at 128)")
        fused_note += self._set_aside_note(set(used))
        if calibration is not None and not calibration.factor:
            fused_note += f"; the table's CPU rate not scaled to this machine: {calibration.basis}"
        if not used:
            return f"throughput from {table}{fused_note}"
        measured = "; ".join(f"{backbone} {method}{f' fused {size} at a time' if size > 1 else ''} on {label}: "
                             f"{m.examples_per_s:,.1f} examples/s from {m.runs:,} run(s)"
                             for (backbone, label, method, size), m in used.items())
        rest = len(keys) - len(used)
        return (f"throughput measured by the run store's records ({measured})"
                + (f"; {table} for the other {rest} backbone/method pair(s)" if rest else "") + fused_note)

    def _set_aside_note(self, used: set[ThroughputKey]) -> str:
        """The store's records the estimate did not use, how many and why: measured at a group size none of
        their method's runs will train in here (fused records when the plan trains runs alone, records alone
        when fused ones price the runs, or fused at another size), for a backbone and method the plan has no
        run of, or on another accelerator or precision (self.set_aside)."""
        label = self.spec.accelerator.label
        sizes: dict[tuple[str, str, str], set[int]] = {}
        for run in self.runs:
            sizes.setdefault(throughput_key(run.backbone, label, run.method)[:3], set()).add(self.group_sizes[run.run_id])
        other_method: list[str] = []
        by_size: dict[tuple[str, str], list[tuple[str, int]]] = {}  # (how trained, how planned) -> [(what, records)]
        for key, measured in sorted(self.measured.items()):
            if key in used:
                continue
            backbone, _, method, size = key
            trained = f"fused {size} at a time" if size > 1 else "alone"
            planned = sizes.get((backbone, label, method))
            if planned is None:
                other_method.append(f"{measured.runs:,} of {backbone} {method} trained {trained} (the plan has no such run)")
                continue
            alone_here = ", runs_per_group 1" if planned == {1} and runs_per_group(self.spec.accelerator) == 1 else ""
            where = " or ".join(f"fused {planned_size} at a time" if planned_size > 1 else "alone" for planned_size in sorted(planned))
            by_size.setdefault((trained, where + alone_here), []).append((f"{backbone} {method}", measured.runs))
        other_size = [f"{sum(count for _, count in what):,} trained {trained} ({', '.join(name for name, _ in what)}) where the plan "
                      f"trains them {where}" for (trained, where), what in by_size.items()]
        if other_size:
            other_size[-1] += ": a fused run's cost is its share of its group's time, which depends on the group's size"
        reasons = other_size + other_method + [f"{count:,} {why}" for why, count in self.set_aside.items()]
        if not reasons:
            return ""
        total = sum(m.runs for key, m in self.measured.items() if key not in used) + sum(self.set_aside.values())
        return f"; {total:,} of the run store's record(s) set aside: " + "; ".join(reasons)

    def summary(self) -> str:
        spec = self.spec
        accel = spec.accelerator
        lines = [
            f"experiment {spec.name}: {spec.description}",
            f"accelerator {accel.label}" + (f" x{accel.count}" if accel.count else "")
            + f", {len(self.shards)} shards of at most {spec.shard_size} runs or ~{spec.shard_hours:g} h, {spec.parallelism} at a time"
            + f", retries {spec.retries}, pod retries {spec.pod_retries}",
        ]
        header = ("task", "runs", "backbone", "methods", "learning rates", "epochs", "seeds")
        rows = [header]
        for task in self.tasks:
            runs = [run for run in self.runs if run.task == task]
            rows.append(
                (
                    task,
                    str(len(runs)),
                    ",".join(dict.fromkeys(run.backbone for run in runs)),
                    _compact(method_label(run.method) for run in runs),
                    _compact(f"{run.lr:g}" for run in runs),
                    _compact(str(run.epochs) for run in runs),
                    _compact(str(run.seed) for run in runs),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
        if spec.ablation:
            lines.append(
                f"ablation: the best {method_label(spec.ablation.method)} run of {', '.join(spec.ablation.tasks)}"
                + (f" on {spec.ablation.backbone}" if spec.ablation.backbone else "")
            )
        if spec.max_train_examples:
            lines.append(f"subsampled: at most {spec.max_train_examples} training examples per task")
        if spec.tasks_left_out:
            lines.append(f"left out, no data here ({len(spec.tasks_left_out)} tasks):")
            lines += [f"  {line}" for line in spec.tasks_left_out]
        if self.merged_duplicates:
            lines.append(f"{self.merged_duplicates} runs shared by several blocks are planned once")
        lines.append(f"{len(self.runs)} runs")
        if fused := self.fused_line():
            lines.append(fused)
        lines.append(self.fanout_line())
        if accel.count:
            quota = f" (max_accelerators {spec.max_accelerators})" if spec.max_accelerators is not None else ""
            lines.append(f"peak: {self.peak_accelerators} {accel.label} at once{quota}")
        lines.append(
            f"estimate: {_hours(self.accelerator_hours)} accelerator-hours ({accel.label} x{max(accel.count, 1)} per run), "
            f"~{_hours(self.wall_clock_hours())} h wall-clock with {spec.parallelism} shards at once"
        )
        lines.append(f"estimate basis: {self.estimate_source()}")
        return "\n".join(lines)


    def fused_line(self) -> str:
        """How the runs share forward passes (runs_per_group): groups by size, and the runs that train alone."""
        sizes = Counter(len(group) for group in self.groups)
        if not any(size > 1 for size in sizes):
            return ""
        grouped = ", ".join(f"{count:,} of {size}" for size, count in sorted(sizes.items(), reverse=True) if size > 1)
        return f"fused: {sum(count for size, count in sizes.items() if size > 1):,} groups ({grouped}); {sizes[1]:,} runs alone"

    def fanout_line(self) -> str:
        """The DAG's fan-out (ParallelFor iterations) on Vertex AI and, with its ceiling, on a KFP cluster."""
        line = f"fan-out: {len(self.shards)} iterations (Vertex AI)"
        if len(self.shards) <= KFP_MAX_FANOUT:
            return line + f"; the same on a KFP cluster (ceiling {KFP_MAX_FANOUT})"
        kfp_plan = fit_fanout(self)
        kfp_spec = kfp_plan.spec
        return (line + f"; {len(kfp_plan.shards)} on a KFP cluster (ceiling {KFP_MAX_FANOUT}: shards of at most "
                f"{kfp_spec.shard_size} runs or ~{kfp_spec.shard_hours:g} h, ~{_hours(kfp_plan.wall_clock_hours())} h wall-clock)")


def within_fanout(spec: ExperimentSpec, ceiling: int = KFP_MAX_FANOUT) -> ExperimentSpec:
    """`spec` with shards grown (shard_size and shard_hours doubled at a time) until at most `ceiling`."""
    return fit_fanout(plan(spec), ceiling).spec


def fit_fanout(planned: Plan, ceiling: int = KFP_MAX_FANOUT) -> Plan:
    """The plan of `planned.spec` with shards grown until there are at most `ceiling` (within_fanout)."""
    current = planned
    while len(current.shards) > ceiling:
        spec = current.spec
        if spec.shard_size >= len(current.runs) and spec.shard_hours >= 1e6:
            raise PlanError(f"experiment {spec.name!r} needs more than {ceiling} shards even with every run of a task in one: "
                            "split it into smaller experiments")
        current = plan(dataclasses.replace(spec, shard_size=spec.shard_size * 2, shard_hours=spec.shard_hours * 2))
    return current


def plan(spec: ExperimentSpec, measured: dict[ThroughputKey, Measured] | None = None,
         set_aside: dict[str, int] | None = None, cpu_calibration: CpuCalibration | None = None) -> Plan:
    """Expand and validate `spec`; raises PlanError naming every problem found. `measured`
    (adaptune.sweep.throughput.measure_throughput of a run store's records) replaces the published
    throughput where it has the run's backbone, accelerator, method and group size (else alone); shards stay
    the same. `set_aside` (throughput.set_aside_on): the store's records left out, which the estimate line counts.
    `cpu_calibration` (cpu_calibration.calibration_from_bench): a CPU plan's table scaled to this machine, or why not."""
    problems: list[str] = []
    if spec.skip_tasks_without_data:  # not yet resolved where its command started (get_experiment): against the default data source
        from adaptune.sweep.task_data import with_tasks_that_have_data

        spec = with_tasks_that_have_data(spec)
    if not spec.sweeps:
        raise PlanError(f"experiment {spec.name!r} has an empty grid: declare at least one Sweep in its sweeps")
    _check_spec_values(spec, problems)
    per_task: dict[str, list[TrainConfig]] = {}
    declared: dict[str, int] = {}
    for index, sweep in enumerate(spec.sweeps):
        where = f"experiment {spec.name!r}, sweep {index}"
        for config in _expand(spec, sweep, where, problems):
            per_task.setdefault(config.task, []).append(config)
            declared.setdefault(config.run_id, len(declared))
    if problems:
        raise PlanError("invalid experiment grid:\n  - " + "\n  - ".join(dict.fromkeys(problems)))

    runs: list[TrainConfig] = []
    seen: set[str] = set()
    for task_runs in per_task.values():
        for config in task_runs:
            if config.run_id not in seen:
                seen.add(config.run_id)
                runs.append(config)
    if spec.ablation:
        _check_ablation(spec.ablation, runs)
    try:
        groups = planned_groups(runs, spec)
    except ValueError as error:  # a group size set in the environment that is not a number of runs
        raise PlanError(str(error)) from None
    grouped = Plan(spec=spec, runs=runs, run_hours={}, merged_duplicates=sum(map(len, per_task.values())) - len(runs),
                   groups=groups, declared_order=declared)
    planned = dataclasses.replace(grouped, run_hours={run.run_id: estimate_hours(run, spec, group_size=grouped.group_sizes[run.run_id])
                                                      for run in runs})
    if spec.max_accelerators is not None and planned.peak_accelerators > spec.max_accelerators:
        raise PlanError(
            f"experiment {spec.name!r} may hold {planned.peak_accelerators} {spec.accelerator.label} at once "
            f"({min(len(planned.shards), spec.parallelism)} shards x {spec.accelerator.count}), over max_accelerators "
            f"{spec.max_accelerators}: lower parallelism, or raise max_accelerators to what your quota allows"
        )
    if measured or set_aside or cpu_calibration:
        return planned.calibrated(measured or {}, set_aside, cpu_calibration)
    return planned


def planned_groups(runs: list[TrainConfig], spec: ExperimentSpec) -> list[list[TrainConfig]]:
    """The fused groups the runs will train in (adaptune.fused.grouping.fused_groups over the whole plan, at the
    accelerator's runs_per_group, at most a shard's runs), so that a group key's runs fill as few groups as they
    can instead of being cut wherever a shard ends: paper_full's 7,008 groupable classification runs on H100s
    trained in 1,432 groups (133 of them a run alone) when shards were packed run by run, and in 1,298 now."""
    return fused_groups(runs, min(runs_per_group(spec.accelerator), spec.shard_size))


def _check_spec_values(spec: ExperimentSpec, problems: list[str]) -> None:
    if spec.parallelism < 1:
        problems.append(f"parallelism must be >= 1 (shards trained at once), got {spec.parallelism}")
    if spec.shard_size < 1:
        problems.append(f"shard_size must be >= 1 (runs per shard), got {spec.shard_size}")
    if not spec.shard_hours > 0:
        problems.append(f"shard_hours must be > 0 (estimated hours per shard), got {spec.shard_hours}")
    if spec.max_accelerators is not None and spec.max_accelerators < 1:
        problems.append(f"max_accelerators must be >= 1 or None (unchecked), got {spec.max_accelerators}")
    for field in ("retries", "pod_retries"):
        if getattr(spec, field) < 0:
            problems.append(f"{field} must be >= 0, got {getattr(spec, field)}")
    for field in ("max_train_examples", "max_eval_examples"):
        value = getattr(spec, field)
        if value is not None and value < 1:
            problems.append(f"{field} must be >= 1 or None (the whole split), got {value}")
    accel = spec.accelerator
    if accel.family not in ("cpu", "gpu", "tpu"):
        problems.append(f"accelerator family must be cpu, gpu or tpu, got {accel.family!r}")
    elif accel.family != "cpu" and (not accel.type or accel.count < 1):
        problems.append(f"a {accel.family} accelerator needs a type (e.g. NVIDIA_H100_80GB) and count >= 1")
    for field in ("runs_per_group",):
        value = getattr(accel, field)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            problems.append(f"accelerator {field} must be a whole number >= 1, got {value!r}")
    if accel.cpu_precision not in CPU_PRECISIONS:
        problems.append(f"accelerator cpu_precision must be one of {', '.join(CPU_PRECISIONS)}, got {accel.cpu_precision!r}")
    try:
        StepSettings.preset(accel.step_settings)
    except ValueError as error:
        problems.append(f"accelerator step_settings: {error}")
    else:
        try:  # the shard runner's own settings: this environment's over the preset's
            StepSettings.from_environment(preset=accel.step_settings)
        except ValueError as error:
            problems.append(f"step settings: {error}")


def _expand(spec: ExperimentSpec, sweep: Sweep, where: str, problems: list[str]) -> list[TrainConfig]:
    for field in ("tasks", "methods", "learning_rates", "epochs", "seeds"):
        values = getattr(sweep, field)
        if not values:
            problems.append(f"{where}: {field} is empty, so the block has no runs")
        elif values != PAPER_EPOCHS:
            repeated = [value for value, n in Counter(map(repr, values)).items() if n > 1]
            if repeated:
                problems.append(f"{where}: {field} repeats {', '.join(repeated)} (duplicate run ids)")
    problems += [f"{where}: learning rate must be > 0 and finite, got {lr}" for lr in sweep.learning_rates
                 if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0)]
    problems += [f"{where}: seeds must be whole numbers >= 0, got {seed!r}" for seed in sweep.seeds
                 if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0)]
    if sweep.epochs != PAPER_EPOCHS:
        problems += [f"{where}: epochs must be an integer >= 1, got {e}" for e in sweep.epochs if not (isinstance(e, int) and e >= 1)]
    if sweep.max_length is not None and not 8 <= sweep.max_length <= MAX_POSITIONS:
        problems.append(f"{where}: max_length must be 8..{MAX_POSITIONS} tokens (BERT's positions), got {sweep.max_length}")
    if sweep.batch_size is not None and sweep.batch_size < 1:
        problems.append(f"{where}: batch_size must be >= 1, got {sweep.batch_size}")

    backbone = sweep.backbone or spec.backbone
    backbone_problem = unusable_backbone(backbone)
    if backbone_problem:
        problems.append(f"{where}: {backbone_problem}")
        return []
    # A task scored by another's runs (mnli_mm by mnli_m's) plans that task's runs, once.
    known = [task for task in (_known_task(name, where, problems) for name in sweep.tasks) if task]
    tasks = list({task.name: task for task in (get_task(t.trained_as) if t.trained_as else t for t in known)}.values())
    methods = [m for m in (_canonical_method(m, backbone, where, problems) for m in sweep.methods) if m]
    max_length = sweep.max_length or TrainConfig.max_length  # the field's default
    if any(task.kind == "span" for task in tasks) and window_problem(max_length, TrainConfig.doc_stride):
        # SQuAD's windows: refused here, not by the data step or a run (a sweep's runs take the default doc stride)
        problems.append(f"{where}: max_length {max_length} leaves SQuAD's windows no room at doc stride {TrainConfig.doc_stride}: "
                        f"use the paper's 384 (at least {2 * TrainConfig.doc_stride + 2})")
    if not tasks or not methods:
        return []
    configs = []
    for task in tasks:
        for method in methods:
            for lr in sweep.learning_rates:
                for epochs in _epochs_for(sweep, task, method, where, problems):
                    for seed in sweep.seeds:
                        overrides = {key: getattr(sweep, key) for key in ("max_length", "batch_size") if getattr(sweep, key)}
                        configs.append(
                            TrainConfig(
                                task=task.name, method=method, lr=lr, epochs=epochs, seed=seed, backbone=backbone,
                                max_train_examples=spec.max_train_examples, max_eval_examples=spec.max_eval_examples,
                                experiment=spec.name, **overrides,
                            )
                        )
    return configs


def _known_task(name: str, where: str, problems: list[str]) -> Task | None:
    try:
        return get_task(name)
    except UnknownTaskError as error:
        problems.append(f"{where}: {error}")
        return None


def _canonical_method(method: dict[str, Any], backbone: str, where: str, problems: list[str]) -> dict[str, Any] | None:
    """The method dict as methods.py writes it (defaults filled in), so equal methods get equal run ids."""
    from adaptune.model.methods import backbone_problem, checks_backbone, method_from_dict

    try:
        canonical = method_from_dict(dict(method)).to_dict()
    except (TypeError, ValueError) as error:
        problems.append(f"{where}: method {method!r}: {error}")
        return None
    if canonical["name"] == "top_k":
        try:
            layers = backbone_layers(backbone)
        except BackboneError as error:
            raise PlanError(str(error)) from None
        if canonical["k"] > layers:
            problems.append(f"{where}: top_k k={canonical['k']} exceeds the {layers} layers of {backbone}")
            return None
    method_cfg = method_from_dict(canonical)
    problem = backbone_problem(method_cfg, backbone_layout(backbone)) if checks_backbone(method_cfg) else None
    if problem:
        problems.append(f"{where}: {problem}")
        return None
    return canonical


def _epochs_for(sweep: Sweep, task: Task, method: dict[str, Any], where: str, problems: list[str]) -> tuple[int, ...]:
    if sweep.epochs != PAPER_EPOCHS:
        return sweep.epochs
    if task.paper_epochs is None:
        problems.append(f"{where}: epochs='paper' but the paper gives no epochs for task {task.name!r} (Table 4 covers the additional tasks); list the epochs")
        return ()
    finetune, adapters = task.paper_epochs
    # Table 4 has fine-tuning and adapters columns: top_k is fine-tuning, LayerNorm-only is parameter-efficient.
    return (finetune,) if method["name"] in ("full", "top_k") else (adapters,)


def _check_ablation(ablation: Ablation, runs: list[TrainConfig]) -> None:
    from adaptune.model.methods import method_from_dict

    try:
        method = method_from_dict(dict(ablation.method)).to_dict()
    except (TypeError, ValueError) as error:
        raise PlanError(f"ablation method {ablation.method!r}: {error}") from None
    if method["name"] != "adapters":
        raise PlanError(f"ablation switches adapters off, so its method must be adapters, got {method['name']!r}")
    on = f" on {ablation.backbone}" if ablation.backbone else ""
    for task in ablation.tasks:
        if not any(
            run.task == get_task(task).name and run.method == method and (ablation.backbone is None or run.backbone == ablation.backbone)
            for run in runs
        ):
            raise PlanError(f"ablation of {task!r} needs a planned {method_label(method)} run of that task{on}; add one to a sweep")


def _hours(hours: float) -> str:
    return f"{hours:.2f}" if hours < 10 else f"{hours:.0f}"


def _compact(values: Any) -> str:
    return ",".join(dict.fromkeys(values))
