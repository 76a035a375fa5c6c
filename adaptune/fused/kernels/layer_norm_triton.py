"""The Triton kernels of adaptune.fused.kernels.layer_norm (that module's docstring says what they compute and why).
Rows are a group's (runs x rows_per_run) lines of `features`, run after run; run r's scale and shift are row r of
`weight` and `bias`. A tile is LINES rows of BLOCK features (masked past the last feature; LINES x BLOCK about a
thousand elements: one row of BERT's 768 or 1,024, many of a narrow model's). The forward pass takes a tile per
program; the backward pass a span of ROWS of one run's rows per program, a tile at a time, so that it sums the
scale's and shift's gradients over its rows in registers and writes them once, as a partial sum that the caller adds
up per run (no atomics: the sums are in a fixed order)."""

import triton
import triton.language as tl


@triton.jit
def layer_norm_forward(x, weight, bias, out, mean, rstd, rows, rows_per_run, features, eps, LINES: tl.constexpr,
                       BLOCK: tl.constexpr):
    """out = (x - mean) * rstd * weight[run] + bias[run], the statistics in float32 over a row's features;
    mean and rstd are kept per row for the backward pass."""
    row = tl.program_id(0) * LINES + tl.arange(0, LINES)
    real = row < rows
    columns = tl.arange(0, BLOCK)
    inside = real[:, None] & (columns[None, :] < features)
    offsets = row[:, None].to(tl.int64) * features + columns[None, :]  # 64-bit offsets: groups past 2^31 elements
    values = tl.load(x + offsets, mask=inside, other=0.0).to(tl.float32)
    average = tl.sum(values, axis=1) / features
    centred = tl.where(inside, values - average[:, None], 0.0)
    inverse = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / features + eps)
    scales = (row // rows_per_run)[:, None] * features + columns[None, :]
    scale = tl.load(weight + scales, mask=inside, other=0.0).to(tl.float32)
    shift = tl.load(bias + scales, mask=inside, other=0.0).to(tl.float32)
    tl.store(out + offsets, (centred * inverse[:, None] * scale + shift).to(out.dtype.element_ty), mask=inside)
    tl.store(mean + row, average, mask=real)
    tl.store(rstd + row, inverse, mask=real)


@triton.jit
def layer_norm_backward(x, weight, grad_out, mean, rstd, grad_x, partial_weight, partial_bias, rows_per_run, features,
                        ROWS: tl.constexpr, LINES: tl.constexpr, BLOCK: tl.constexpr, GRAD_X: tl.constexpr):
    """For rows [part x ROWS, part x ROWS + ROWS) of run `run` (the grid's two axes), LINES at a time: the input's
    gradient (where GRAD_X) and the sums over those rows of grad_out x normalized and of grad_out, written to row
    run x parts + part of partial_weight and partial_bias."""
    run, part, parts = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    columns = tl.arange(0, BLOCK)
    features_inside = columns < features
    scale = tl.load(weight + run * features + columns, mask=features_inside, other=0.0).to(tl.float32)
    weight_sum = tl.zeros([BLOCK], dtype=tl.float32)
    bias_sum = tl.zeros([BLOCK], dtype=tl.float32)
    first = part * ROWS
    last = tl.minimum(first + ROWS, rows_per_run)
    for start in range(first, last, LINES):
        local = start + tl.arange(0, LINES)
        real = local < last
        row = run.to(tl.int64) * rows_per_run + local
        inside = real[:, None] & features_inside[None, :]
        offsets = row[:, None] * features + columns[None, :]
        values = tl.load(x + offsets, mask=inside, other=0.0).to(tl.float32)
        incoming = tl.load(grad_out + offsets, mask=inside, other=0.0).to(tl.float32)
        inverse = tl.load(rstd + row, mask=real, other=0.0)
        normalized = tl.where(inside, (values - tl.load(mean + row, mask=real, other=0.0)[:, None]) * inverse[:, None], 0.0)
        weight_sum += tl.sum(incoming * normalized, axis=0)
        bias_sum += tl.sum(incoming, axis=0)
        if GRAD_X:
            scaled = incoming * scale[None, :]
            along = tl.sum(scaled * normalized, axis=1) / features
            average = tl.sum(scaled, axis=1) / features
            grad = (scaled - normalized * along[:, None] - average[:, None]) * inverse[:, None]
            tl.store(grad_x + offsets, grad.to(grad_x.dtype.element_ty), mask=inside)
    partial = (run * parts + part).to(tl.int64) * features + columns
    tl.store(partial_weight + partial, weight_sum, mask=features_inside)
    tl.store(partial_bias + partial, bias_sum, mask=features_inside)
