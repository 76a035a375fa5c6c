"""The Triton kernels of adaptune.model.layer_norm_kernel (that module's docstring says what they compute and why).
Rows are a group's (runs x rows_per_run) lines of `features`, run after run; run r's scale and shift are row r of
`weight` and `bias`. The forward pass takes a row per program; the backward pass a span of one run's rows per
program, so that it sums its rows' scale and shift gradients in registers and writes them once, as a partial
sum that the caller adds up per run (no atomics: the sums are in a fixed order)."""

import triton
import triton.language as tl


@triton.jit
def layer_norm_forward(x, weight, bias, out, mean, rstd, rows_per_run, features, eps, BLOCK: tl.constexpr):
    """out = (x - mean) * rstd * weight[run] + bias[run], the statistics in float32 over a row's features;
    mean and rstd are kept per row for the backward pass."""
    row = tl.program_id(0)
    run = row // rows_per_run
    columns = tl.arange(0, BLOCK)
    inside = columns < features
    offsets = row.to(tl.int64) * features + columns  # 64-bit offsets: groups past 2^31 elements
    values = tl.load(x + offsets, mask=inside, other=0.0).to(tl.float32)
    average = tl.sum(values, axis=0) / features
    centred = tl.where(inside, values - average, 0.0)
    inverse = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / features + eps)
    scale = tl.load(weight + run * features + columns, mask=inside, other=0.0).to(tl.float32)
    shift = tl.load(bias + run * features + columns, mask=inside, other=0.0).to(tl.float32)
    tl.store(out + offsets, (centred * inverse * scale + shift).to(out.dtype.element_ty), mask=inside)
    tl.store(mean + row, average)
    tl.store(rstd + row, inverse)


@triton.jit
def layer_norm_backward(x, weight, grad_out, mean, rstd, grad_x, partial_weight, partial_bias, rows_per_run, features,
                        ROWS: tl.constexpr, BLOCK: tl.constexpr, GRAD_X: tl.constexpr):
    """For rows [part x ROWS, part x ROWS + ROWS) of run `run` (the grid's two axes): the input's gradient (where
    GRAD_X) and the sums over those rows of grad_out x normalized and of grad_out, written to row run x parts + part
    of partial_weight and partial_bias."""
    run, part, parts = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    columns = tl.arange(0, BLOCK)
    inside = columns < features
    scale = tl.load(weight + run * features + columns, mask=inside, other=0.0).to(tl.float32)
    weight_sum = tl.zeros([BLOCK], dtype=tl.float32)
    bias_sum = tl.zeros([BLOCK], dtype=tl.float32)
    first = part * ROWS
    for local in range(first, tl.minimum(first + ROWS, rows_per_run)):
        row = run.to(tl.int64) * rows_per_run + local
        offsets = row * features + columns
        values = tl.load(x + offsets, mask=inside, other=0.0).to(tl.float32)
        incoming = tl.load(grad_out + offsets, mask=inside, other=0.0).to(tl.float32)
        inverse = tl.load(rstd + row)
        normalized = tl.where(inside, (values - tl.load(mean + row)) * inverse, 0.0)
        weight_sum += incoming * normalized
        bias_sum += incoming
        if GRAD_X:
            scaled = incoming * scale
            along = tl.sum(scaled * normalized, axis=0) / features
            average = tl.sum(scaled, axis=0) / features
            tl.store(grad_x + offsets, ((scaled - normalized * along - average) * inverse).to(grad_x.dtype.element_ty), mask=inside)
    partial = (run * parts + part).to(tl.int64) * features + columns
    tl.store(partial_weight + partial, weight_sum, mask=inside)
    tl.store(partial_bias + partial, bias_sum, mask=inside)
