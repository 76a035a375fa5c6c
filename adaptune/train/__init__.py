"""One run: its config and id, the record, checks, the training loop and its state, evaluation,
metrics, provenance, the ablation, `python -m adaptune train` (imports core, model, data)."""
