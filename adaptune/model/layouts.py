"""What a plan may know of a backbone without loading its weights: depth, module layout, usability.

The paper's hub BERTs are known offline (core.backbones.KNOWN_BACKBONE_LAYERS); any other backbone's
config is read (local path or the embedded default). Torch and transformers are imported only when
a backbone must actually be read, so planning a hub-BERT sweep stays light.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from adaptune.core.backbones import DEFAULT_BACKBONE, EMBEDDED_BACKBONE_LAYERS, EMBEDDED_PACKAGE, KNOWN_BACKBONE_LAYERS, BackboneError


def backbone_layout(backbone: str) -> Any:
    """What a method's plan-time check sees of a backbone (methods.BackboneLayout): the known hub BERTs'
    layout without the hub, any other backbone's from its config."""
    from adaptune.model.backbone import bert_module_types, check_backbone
    from adaptune.model.methods import BackboneLayout

    if backbone in KNOWN_BACKBONE_LAYERS:
        layers = KNOWN_BACKBONE_LAYERS[backbone]
        return BackboneLayout(name=backbone, num_layers=layers, module_types=bert_module_types(layers))
    info = check_backbone(backbone)
    return BackboneLayout(name=backbone, num_layers=info.num_layers, module_types=info.module_types)


def unusable_backbone(backbone: str) -> str | None:
    """Why the backbone cannot be used (missing path, unsupported model, hub unreachable), or None.
    The paper's hub backbones are taken on trust where the hub cannot be reached to read them; the embedded default
    is usable where its package is installed."""
    if backbone in KNOWN_BACKBONE_LAYERS:
        return None
    if backbone == DEFAULT_BACKBONE:
        if importlib.util.find_spec(EMBEDDED_PACKAGE) is None:
            return (f"the embedded backbone {DEFAULT_BACKBONE!r} needs the package {EMBEDDED_PACKAGE.replace('_', '-')}: "
                    "install the project's requirements (make venv), or name another backbone")
        return None
    from adaptune.model.backbone import check_backbone

    try:
        check_backbone(backbone)
    except BackboneError as error:
        return str(error)
    return None


@functools.cache
def backbone_layers(backbone: str) -> int:
    """Number of Transformer layers of a backbone: known hub names, else its config (local path or embedded)."""
    if backbone in KNOWN_BACKBONE_LAYERS:
        return KNOWN_BACKBONE_LAYERS[backbone]
    if backbone == DEFAULT_BACKBONE:
        return EMBEDDED_BACKBONE_LAYERS
    from transformers import AutoConfig

    from adaptune.model.backbone import resolve_backbone

    try:
        return int(AutoConfig.from_pretrained(resolve_backbone(backbone)).num_hidden_layers)
    except (OSError, ValueError) as error:
        raise BackboneError(
            f"cannot read the config of backbone {backbone!r} to check top_k ({error}); use a local path, the embedded "
            f"{DEFAULT_BACKBONE}, or one of {sorted(KNOWN_BACKBONE_LAYERS)}"
        ) from None
