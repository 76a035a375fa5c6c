"""Triton kernels of a fused step: each operation's Triton code (*_triton.py) beside its torch custom operator,
autograd wrapper and reference implementation (the module named for the operation)."""
