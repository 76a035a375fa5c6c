"""A sweep's status (adaptune.sweep.status.SweepStatus) as the text `python -m pipelines status` prints."""

from __future__ import annotations

from adaptune.sweep.status import FINISHED, NOT_STARTED, RUNNING, STALE, UNREADABLE, SweepStatus

SHOWN_RUNNING = 10  # the longest-held runs listed; the rest are counted


def format_status(status: SweepStatus) -> str:
    finished = status.count(*FINISHED)
    lines = [
        f"{status.experiment}: {status.planned:,} runs planned, run store {status.store}",
        f"finished {finished:,} ({_share(finished, status.planned)}): "
        + ", ".join(f"{status.count(state):,} {state}" for state in FINISHED),
        f"in progress {status.count(RUNNING):,}",
        f"not started {status.count(NOT_STARTED):,}"
        + (f" ({status.interrupted:,} of them interrupted: they resume from a saved state or an expired lease)" if status.interrupted else ""),
    ]
    if status.count(STALE):
        lines.append(f"stale {status.count(STALE):,}: records from another data scheme, counted apart "
                     "(neither reused nor retrained; RETRAIN_STALE=1 / --retrain-stale retrains them)")
    if status.count(UNREADABLE):
        lines.append(f"unreadable {status.count(UNREADABLE):,}: records that cannot be read, counted apart "
                     "(RETRY_UNREADABLE=1 / --retry-unreadable retrains them, keeping each file aside)")
        lines += [f"  {reason}" for reason in list(status.unreadable.values())[:SHOWN_RUNNING]]
    lines += [
        "",
        f"accelerator-hours: {_hours(status.spent_hours)} spent (the records' wall time, a fused group's counted once); "
        f"the plan estimated {_hours(status.estimated_hours)} for the whole sweep",
        *([f"  where it went: {_phases(status.spent_by_phase)}"] if status.spent_by_phase else []),
        f"remaining: ~{_hours(status.remaining_hours)} accelerator-hours, ETA ~{_duration(status.eta_hours * 3600)} "
        f"with {status.parallelism} shards at once",
        f"  basis: {status.estimate_basis}",
        "",
        "by task:",
        _indented(status.by("task").reset_index().to_string(index=False)),
        "",
        "by method:",
        _indented(status.by("method").reset_index().to_string(index=False)),
    ]
    if status.running:
        lines += ["", f"in progress ({len(status.running):,}), longest held first:"]
        for run in status.running[:SHOWN_RUNNING]:
            held = "held for an unknown time" if run.held_s is None else f"held {_duration(run.held_s)}"
            renewed = "" if run.renewed_s is None else f", renewed {_duration(run.renewed_s)} ago"
            lines.append(f"  {run.run_id}  {held} by {run.owner}{renewed}")
        if len(status.running) > SHOWN_RUNNING:
            lines.append(f"  ... and {len(status.running) - SHOWN_RUNNING:,} more")
    if status.failures:
        lines += ["", f"failures ({status.count('failed'):,}) by reason (count, one run, reason):"]
        lines += [f"  {group.count:>5,}  {group.example}  {group.reason}" for group in status.failures]
    return "\n".join(lines)


def _phases(seconds: dict[str, float]) -> str:
    """70% steps, 20% evaluation, 6% setup, 4% saving (largest first)."""
    whole = sum(seconds.values())
    return ", ".join(f"{100 * part / whole:.0f}% {phase}" for phase, part in sorted(seconds.items(), key=lambda item: -item[1]))


def _indented(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _hours(hours: float) -> str:
    return f"{hours:,.2f}" if hours < 10 else f"{hours:,.0f}"


def _duration(seconds: float) -> str:
    """12 s, 7 min, 3 h 05 min, 2 d 4 h."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(round(seconds / 3600), 24)
    return f"{days} d {hours} h"
