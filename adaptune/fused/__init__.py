"""The fused training layer: what lets many independent runs share one step on an accelerator.

Run groups (each run keeps its own trained tensors, AdamW, schedule, clipping and dropout stream), the
settings of how a step computes (settings.StepSettings), compiling and CUDA graph steps, and the Triton
kernels with their torch operators and reference implementations (kernels/). Below the trainers
(adaptune.train), above the paper's model (adaptune.model)."""
