"""The model: backbones, adapters, tuning methods, parameter counts, compact checkpoints (imports core)."""
