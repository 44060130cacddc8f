"""Validation of model constructor arguments, in one place: sizes within bounds, rates in [0, 1), names from a list.

Every model class calls :func:`check_args` with its arguments before it allocates anything, so a config with
``num_classes=10**12`` or ``depth=100000`` (a corrupt or hostile ``config.json``, or a state dict whose keys claim a
100,000-block model) is refused with a ``ValueError`` that names the argument, the value and the bound, instead of
trying to allocate terabytes. The bounds are :data:`SIZE_BOUNDS`, generous for any model that fits in memory today.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..checks import check_probability, is_int

__all__ = ["SIZE_BOUNDS", "RATE_ARGS", "check_args", "check_size", "check_choice", "is_int"]

# argument → (minimum, maximum), inclusive. The one table of size bounds (loaders and converters use it as well).
SIZE_BOUNDS: dict[str, tuple[int, int]] = {
    "img_size": (1, 8192),
    "patch_size": (1, 1024),
    "in_chans": (1, 1024),
    "embed_dim": (1, 65536),
    "dim": (1, 65536),
    "depth": (1, 1024),
    "num_heads": (1, 4096),
    "num_kv_heads": (1, 4096),
    "num_classes": (0, 1_000_000),
    "vocab_size": (1, 4_000_000),
    "context_length": (1, 65536),
    "max_len": (1, 65536),
    "max_seq_len": (1, 1 << 24),
    "mlp_hidden": (1, 1 << 20),
    "pad_id": (0, 4_000_000),
}
RATE_ARGS = ("drop_rate", "attn_drop_rate", "drop_path_rate")  # probabilities in [0, 1)
_POSITIVE_FLOATS = ("norm_eps", "diff_norm_eps", "rope_theta", "mlp_ratio", "max_logit_scale")


def check_size(name: str, value, *, minimum: int | None = None, owner: str = "") -> int:
    """``value`` as an int within ``SIZE_BOUNDS[name]`` (``minimum`` raises the lower bound); ValueError otherwise."""
    lo, hi = SIZE_BOUNDS[name]
    lo = lo if minimum is None else max(lo, minimum)
    if not is_int(value) or not lo <= value <= hi:
        where = f"{owner}: " if owner else ""
        raise ValueError(f"{where}{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def check_choice(name: str, value, choices: Iterable, *, owner: str = "") -> None:
    choices = tuple(choices)
    if value not in choices:
        where = f"{owner}: " if owner else ""
        raise ValueError(f"{where}{name} must be one of {choices}, got {value!r}")


def check_args(owner: str, **values) -> None:
    """Check each keyword by its name: sizes against :data:`SIZE_BOUNDS` (``None`` allowed for ``num_kv_heads``
    and ``mlp_hidden``, which default from other sizes), rates in [0, 1), eps/θ/ratios finite and > 0."""
    for name, v in values.items():
        if name in SIZE_BOUNDS:
            if v is None and name in ("num_kv_heads", "mlp_hidden"):
                continue
            check_size(name, v, owner=owner)
        elif name in RATE_ARGS:
            check_probability(f"{owner}: {name}", v)
        elif name in _POSITIVE_FLOATS:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{owner}: {name} must be a finite number > 0, got {v!r}")
        else:
            raise KeyError(f"check_args has no rule for {name!r}")  # a programming error, not user input
