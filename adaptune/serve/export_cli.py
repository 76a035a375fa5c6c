"""`python -m adaptune export`: the runs `bundle` would select (or one named run), each as a folder in the format its
users load: AdapterHub (adapters, pfeiffer), peft (lora, ia3), or safetensors with LOADING.md (full, top_k,
layernorm, head); with a model card and CHECKSUMS (adaptune.serve.export)."""

from __future__ import annotations

import argparse

from adaptune.serve.selection import DEFAULT_METHOD, SELECT_RULES

EXPORT_DESCRIPTION = ("Write each selected run as a folder its users load: AdapterHub format (adapters 1.x `load_adapter`; "
                      "methods adapters, pfeiffer), peft format (`PeftModel.from_pretrained`; lora, ia3), or safetensors of the "
                      "changed tensors with LOADING.md (transformers; full, top_k, layernorm, head); each with a model card "
                      "(README.md) and CHECKSUMS.")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = EXPORT_DESCRIPTION
    parser.add_argument("--runs-root", required=True, help="the run store a sweep wrote (the directory, or gs:// URL, holding runs/)")
    parser.add_argument("--out", required=True, help="the directory to write <task>/ folders into (each must be absent or empty)")
    parser.add_argument("--select", choices=SELECT_RULES, default="best",
                        help="which run per task: best = by the rule of the report's table the task is in, as bundle: Table 1's "
                             "single run best on validation; for Table 2's tasks, the configuration best on mean validation over "
                             "seeds, its seed best on validation")
    parser.add_argument("--method", default=None,
                        help=f"a method name (adapters: the best over every size) or label (adapters64, lora8, full) (default: {DEFAULT_METHOD})")
    parser.add_argument("--tasks", nargs="+", default=None, help="only these tasks (default: every task with a usable run)")
    parser.add_argument("--run-id", default=None, help="export this one run instead of a selection (any status, if it has a checkpoint)")
    parser.add_argument("--data-dir", default=None, help="local data mirror, read only for label names that tasks.py does not declare")


def export_from_args(args: argparse.Namespace) -> int:
    from adaptune.serve.export import export_runs, select_for_export
    from adaptune.serve.export_formats import ExportError
    from adaptune.sweep.store import RunStore

    if args.run_id and (args.method or args.tasks):
        raise ExportError("--run-id names one run: leave out --method and --tasks (or leave out --run-id to select by them)")
    method = args.method or DEFAULT_METHOD
    store = RunStore(args.runs_root)
    chosen = select_for_export(store, method, args.tasks, args.run_id)
    selection = f"Exported by run id (`--run-id {args.run_id}`)." if args.run_id else None  # None: each card says its table's rule
    exported = export_runs(store, chosen, args.out, selection, args.data_dir, method)
    for entry in exported:
        print(f"{entry['task']:<10} {entry['method_label']:<12} {entry['format']:<12} val {entry['metric']} {entry['val_score']:.4f}  "
              f"{entry['bytes']:>12,} bytes  {entry['folder']}  ({entry['run_id']})")
    return 0
