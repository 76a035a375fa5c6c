"""The image each component runs in, chosen per accelerator.

Registry and tag come from the environment (`ADAPTUNE_REGISTRY`, `ADAPTUNE_IMAGE_TAG`) so that
`make images` and `make compile` / `make submit` agree without editing code.
"""

from __future__ import annotations

import os

ACCELERATOR_IMAGES = {"cpu": "adaptune-cpu", "gpu": "adaptune-gpu", "tpu": "adaptune-tpu"}
DEFAULT_REGISTRY = "us-docker.pkg.dev/your-project/adaptune"  # image references are lowercase
DEFAULT_TAG = "0.2.0"


def image_for(accelerator: str) -> str:
    """Full image reference for an accelerator family: "cpu", "gpu" or "tpu"."""
    if accelerator not in ACCELERATOR_IMAGES:
        raise ValueError(f"unknown accelerator family {accelerator!r}; expected one of {sorted(ACCELERATOR_IMAGES)}")
    registry = os.environ.get("ADAPTUNE_REGISTRY", DEFAULT_REGISTRY).rstrip("/")
    tag = os.environ.get("ADAPTUNE_IMAGE_TAG", DEFAULT_TAG)
    return f"{registry}/{ACCELERATOR_IMAGES[accelerator]}:{tag}"
