"""`python -m adaptune bundle`: the runs a report would select, one per task, as one bundle directory."""

from __future__ import annotations

import argparse
from typing import Any

from adaptune.serve.selection import DEFAULT_METHOD, SELECT_RULES


def add_bundle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-root", required=True, help="the run store a sweep wrote (the directory, or gs:// URL, holding runs/)")
    parser.add_argument("--select", choices=SELECT_RULES, default="best",
                        help="which run per task: best = the single run best on validation (Table 1's rule)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="a new bundle directory (absent or empty)")
    where.add_argument("--into", help="an existing bundle: add the selected tasks it lacks; its files are left untouched")
    parser.add_argument("--method", default=DEFAULT_METHOD,
                        help="a method name (adapters: the best over every size) or label (adapters64, full, layernorm)")
    parser.add_argument("--tasks", nargs="+", default=None, help="only these tasks (default: every task with a usable run)")
    parser.add_argument("--data-dir", default=None, help="local data mirror, read only for label names that tasks.py does not declare")


def bundle_from_args(args: argparse.Namespace) -> int:
    from adaptune.serve.bundle import BundleError, add_to_bundle, create_bundle, read_manifest
    from adaptune.serve.selection import select_runs, store_runs
    from adaptune.sweep.store import RunStore

    store = RunStore(args.runs_root)
    existing = read_manifest(args.into) if args.into else None
    backbone = existing["backbone"]["name"] if existing else None
    chosen = select_runs(store_runs(store), args.method, args.tasks, backbone, where=store.root)
    if existing is not None:
        if not args.tasks:  # everything selectable the bundle lacks; named tasks already there are refused
            chosen = chosen[~chosen["task"].isin(existing["tasks"])]
        if chosen.empty:
            raise BundleError(f"nothing to add: every task with a usable {args.method} run is already in {args.into} "
                              f"({', '.join(sorted(existing['tasks']))})")
        manifest = add_to_bundle(args.into, chosen, store, args.method, args.data_dir)
    else:
        manifest = create_bundle(args.out, chosen, store, args.method, args.data_dir)
    print(describe(manifest, args.into or args.out, added=list(chosen["task"])))
    return 0


def describe(manifest: dict[str, Any], where: str, added: list[str]) -> str:
    """What the bundle holds, per task, and its size beside the paper's."""
    backbone, size = manifest["backbone"], manifest["size"]
    lines = [f"bundle {where}: backbone {backbone['name']} ({backbone['weights_bytes']:,} bytes of weights, "
             f"{backbone['params']:,} parameters) + {size['tasks']} task(s)"]
    for task, entry in manifest["tasks"].items():
        whole = ", its whole model" if entry["carries_whole_model"] else ""
        lines.append(f"  {'+' if task in added else ' '} {task:<10} {entry['method_label']:<12} lr {entry['lr']:g} seed {entry['seed']}  "
                     f"val {entry['metric']} {entry['val_score']:.4f}  {entry['bytes']:>12,} bytes "
                     f"({100 * entry['bytes'] / backbone['weights_bytes']:.2f}% of the backbone{whole})  {entry['run_id']}")
    lines.append(f"size: {size['bundle_bytes']:,} bytes = {size['multiple']:.3f}x one backbone's {size['backbone_bytes']:,} "
                 f"(parameters: {size['params_multiple']:.3f}x, the report's total-size rule)")
    paper = size.get("paper")
    if paper:
        lines.append(f"at the paper's {paper['tasks']} tasks, this mean size per task gives {size['params_multiple_at_paper_tasks']:.2f}x; "
                     f"paper: {paper['multiple']}x ({paper['what']}, {paper['trained_params_percent']}% per task)")
    return "\n".join(lines)
