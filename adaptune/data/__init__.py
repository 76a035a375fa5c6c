"""The data: the task registry, raw-file readers, sources and deterministic splits, the tokenization
cache, SQuAD features, batching (imports core and model)."""
