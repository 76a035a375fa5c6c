"""The image each component runs in, chosen per accelerator.

Registry and tag come from the environment (`ADAPTUNE_REGISTRY`, `ADAPTUNE_IMAGE_TAG`) so that
`make images` and `make compile` / `make submit` agree without editing code.
"""

from __future__ import annotations

from adaptune.core import environment

ACCELERATOR_IMAGES = {"cpu": "adaptune-cpu", "gpu": "adaptune-gpu", "tpu": "adaptune-tpu"}
DEFAULT_REGISTRY = environment.DEFAULTS.registry  # a placeholder: submit refuses it (image references are lowercase)
DEFAULT_TAG = environment.DEFAULTS.image_tag


def image_for(accelerator: str) -> str:
    """Full image reference for an accelerator family: "cpu", "gpu" or "tpu"."""
    if accelerator not in ACCELERATOR_IMAGES:
        raise ValueError(f"unknown accelerator family {accelerator!r}; expected one of {sorted(ACCELERATOR_IMAGES)}")
    registry = environment.settings().registry.rstrip("/")
    tag = environment.settings().image_tag
    return f"{registry}/{ACCELERATOR_IMAGES[accelerator]}:{tag}"
