"""One-off side-by-side (2026-11-26): the counter masks' int32 form (adaptune.fused.run_dropout) against
the int64 definition it replaced (bench/counter_scheme.py), per mask site and per fused training step
(adapters 64, counter masks, eager), interleaved in one process. Prints JSON.
    .venv/bin/python -m bench.counter_mask_int32"""

import json
import statistics
import time

import torch

from adaptune.core.backbones import DEFAULT_BACKBONE
from adaptune.core.devices import pick_device
from adaptune.fused import run_dropout
from adaptune.fused.settings import StepSettings
from bench import fused
from bench.counter_scheme import defined_keep_mask


def _int64_keep_mask(keys: torch.Tensor, draws: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """The definition on int64 words: a run group holds its keys and per-pass counts as int32 words."""
    low32 = (1 << 32) - 1
    return defined_keep_mask(keys.long() & low32, draws.long() & low32, shape, p)


FORMS = {"int32": run_dropout.counter_keep_mask, "int64": _int64_keep_mask}


def _timed(fn, repeats: int = 5) -> dict[str, float]:
    times = {form: [] for form in FORMS}
    for _ in range(repeats):
        for form, mask in FORMS.items():
            run_dropout.counter_keep_mask = mask
            fn()  # warm
            started = time.perf_counter()
            fn()
            times[form].append(time.perf_counter() - started)
    run_dropout.counter_keep_mask = FORMS["int32"]
    return {form: round(statistics.median(values) * 1000, 2) for form, values in times.items()}


def main() -> None:
    torch.set_num_threads(2)
    keys = torch.randint(0, 1 << 32, (16, 2), dtype=torch.int64)
    draws = torch.randint(0, 1 << 20, (16,), dtype=torch.int64)
    sites = {"attention_probabilities k16x32x12x64x64": (16, 32, 12, 64, 64), "hidden k16x32x64x384": (16, 32, 64, 384)}
    out = {"what": __doc__.split("\n")[0], "torch": torch.__version__, "threads": torch.get_num_threads(), "mask_site_ms": {}}
    for name, shape in sites.items():
        out["mask_site_ms"][name] = _timed(lambda shape=shape: run_dropout.counter_keep_mask(keys, draws, shape, 0.1))
    device = pick_device("cpu")
    generator = torch.Generator().manual_seed(0)  # the mask's cost depends on shapes only: 32 rows of 64 tokens
    batch = {"input_ids": torch.randint(1000, 30000, (32, 64), generator=generator), "attention_mask": torch.ones(32, 64, dtype=torch.int64),
             "token_type_ids": torch.zeros(32, 64, dtype=torch.int64), "labels": torch.randint(0, 2, (32,), generator=generator)}
    out["fused_step_ms"] = {}
    for k in (4, 16):
        step = fused.step_fn(DEFAULT_BACKBONE, k, device, batch, together=True, settings=StepSettings(dropout_masks="counter"))
        out["fused_step_ms"][f"minilm adapters64 k={k}"] = _timed(step, repeats=3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
