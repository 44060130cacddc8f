"""Load an attention layer's state dict with the meaning it had when it was saved.

A layer is saved as its state dict (``layer.state_dict()``, e.g. with ``safetensors.torch.save_file``) and rebuilt
from the constructor arguments its owner keeps; diffattn 0.1.0 offered nothing else for layers. When a default of a
layer changes between diffattn formats (:mod:`diffattn.formats`), the same arguments build another function, so
:func:`load_layer` takes the format of the code that wrote the state dict and migrates the arguments first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from ..formats import FORMAT, check_format, migrate
from .attention import attention_class

__all__ = ["load_layer"]


def load_layer(attention: str, config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor], *,
               diffattn_format: int) -> nn.Module:
    """The attention layer ``attention_class(attention)(**config)`` with ``state_dict`` loaded strictly, computing
    what the saved layer computed.

    Args:
        attention: ``"standard"``, ``"diff"``, ``"gated"`` or ``"diff_v2"`` (:func:`attention_class`).
        config: the constructor's keyword arguments, ``dim`` and ``num_heads`` included, as the layer was built.
        state_dict: its ``state_dict()`` (the λ tensors under their checkpoint names, ``lambda_q1`` …).
        diffattn_format: the format of the diffattn that saved it: 0 for diffattn 0.1.0 and the code before
            format 1, :data:`diffattn.formats.FORMAT` for this one. For an older format the arguments go through
            :func:`diffattn.formats.migrate`, which warns (:class:`~diffattn.formats.FormatMigrationWarning`) and
            names every argument it set: e.g. a 0.1.0 ``DiffAttention(lambda_form="token_sigmoid")`` is rebuilt with
            ``lambda_options={"bias": True}``, its λ = σ(X W + b).

    Raises ValueError naming every missing, unexpected or mis-shaped tensor (nothing is returned then), and
    :class:`~diffattn.formats.FormatVersionError` for a format newer than this code reads.
    """
    cls = attention_class(attention)
    if not isinstance(config, Mapping) or "attention" in config:
        raise ValueError("config must be a dict of the layer's constructor arguments (without 'attention')")
    source = check_format(diffattn_format, f"the state dict of the {cls.__name__} layer")
    kwargs, state = migrate("layer", {"attention": attention, **config}, state_dict, source=source,
                            what=f"the {cls.__name__} state dict")
    kwargs.pop("attention")
    layer = cls(**kwargs)
    try:
        layer.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"the state dict does not match {cls.__name__}({kwargs}) of diffattn format {FORMAT}: "
                         f"{e}") from None
    return layer
