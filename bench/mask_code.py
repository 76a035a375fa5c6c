"""Why the counter masks' compiled form (adaptune.fused.run_dropout.fused_counter_keep_mask) drew other bits than the
eager operators on an H100 at a training step's inputs (bench/gpu.json "h100_2026_11_28"), where on the CPU it draws
the same: each factor alone, on a GPU. For every case, a fresh compile (dynamo reset) of the mask over one block
shape or the training sequence of shapes, dynamic or static sizes, int32 or int64 draws; whether its bits equal the
eager form's, and where they first differ. Inductor's generated code goes to stderr (TORCH_LOGS=output_code).
    TORCH_LOGS=output_code,recompiles python -m bench.mask_code > out.json 2> code.log"""

from __future__ import annotations

import json
import sys

import torch

from adaptune.fused.run_dropout import CounterStream, RunRandomness, counter_keep_mask

K, FEATURES, P = 8, 768, 0.1
SEQUENCE = [(K, 32, length, FEATURES) for length in (32, 64, 96, 128, 64)] + [(K, 32, FEATURES)]


def _keep_mask_like(keys: torch.Tensor, draws: torch.Tensor, like: torch.Tensor, p: float) -> torch.Tensor:
    """counter_keep_mask with the mask's shape given as a tensor's (run_dropout.fused_counter_keep_mask compiles the same)."""
    return counter_keep_mask(keys, draws, like.shape, p)


def _first_difference(compiled: torch.Tensor, eager: torch.Tensor) -> dict[str, object] | None:
    differs = compiled != eager
    if not differs.any():
        return None
    where = differs.nonzero()[0].tolist()
    return {"differing": int(differs.sum()), "of": differs.numel(), "first_at": where,
            "runs_differing": sorted({int(run) for run in differs.flatten(1).any(dim=1).nonzero().flatten()})}


def _case(shapes: list[tuple[int, ...]], dynamic: bool, draws_dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    torch._dynamo.reset()
    compiled = torch.compile(_keep_mask_like, dynamic=dynamic)
    keys = RunRandomness([CounterStream(seed) for seed in range(K)]).keys.to(device)
    draws = torch.tensor([3 + 7919 * run + 5 for run in range(K)], dtype=draws_dtype, device=device)
    results = []
    for shape in shapes:
        mask = compiled(keys, draws, torch.empty(shape, device="meta"), P)
        results.append({"shape": list(shape), "difference": _first_difference(mask, counter_keep_mask(keys, draws, shape, P))})
    return {"dynamic": dynamic, "draws": str(draws_dtype), "results": results}


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = []
    for dynamic in (True, False):
        for draws_dtype in (torch.int32, torch.int64):
            cases.append(_case(SEQUENCE, dynamic, draws_dtype, device))
            cases.append(_case([SEQUENCE[1]], dynamic, draws_dtype, device))  # one shape, compiled fresh
            print(f"dynamic={dynamic} draws={draws_dtype}: done", file=sys.stderr, flush=True)
    json.dump({"device": str(torch.cuda.get_device_name() if device.type == "cuda" else "cpu"), "torch": torch.__version__,
               "cases": cases}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
