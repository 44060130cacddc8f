"""``RetrofitConfig``: every choice of a retrofit in one validated dataclass, saved as JSON with the adapter (as
peft's ``LoraConfig`` is saved with a LoRA adapter)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..formats import check_fields
from ..lambdas import DEFAULT_LAMBDA_INIT, check_lambda_init
from .methods import list_methods

__all__ = ["RetrofitConfig", "TRAIN_MODES"]

TRAIN_MODES = ("attention", "adapters", "all")

LayerSelection = Sequence[int] | Callable[[int, str], bool] | None


def _is_index(i: Any) -> bool:
    return isinstance(i, int) and not isinstance(i, bool)


@dataclass
class RetrofitConfig:
    """How :func:`diffattn.retrofit` converts a model.

    Args:
        method: ``"daa"``, ``"dex"``, ``"diffq"``, ``"diffk"``, ``"diffv"`` (DAA (2025); DEX: Kong et al. 2025) or
            ``"shared_qk"``, ``"split_heads"`` (Li et al. 2025); see :mod:`diffattn.adapters.methods`.
        lambda_init: λ_init of DAA (2025) eq. 3 (Ye et al. 2024 eq. 2 for the re-parameterised λ), a finite float,
            or ``"ye"``: 0.8 − 0.6·exp(−0.3·l) with l the 0-based index of the attention layer in module order.
        anneal_steps: T, the annealing duration in optimizer steps (DAA (2025) eq. 3), a positive int.
        layers: which attention layers (0-based, module order) to convert: a non-empty sequence of distinct int
            indices (negative ones count from the end), a predicate ``(index, name) -> bool``, or None for all.
        train: what stays trainable: ``"attention"`` (the converted attention modules with their adapters, the rest
            frozen, as DAA (2025) App. E.1 trains), ``"adapters"`` (only the new weights and λ) or ``"all"``.
        trainable: names of further modules that stay trainable whatever ``train`` freezes (qualified names as
            ``model.named_modules()`` gives them), e.g. ``("classifier",)`` for the new head of an
            ``AutoModelForSequenceClassification``; they are saved with the adapter (peft's ``modules_to_save``).

    Raises ValueError (TypeError for a wrong type) naming the field, the value and what it needs.
    """

    method: str
    lambda_init: float | str = DEFAULT_LAMBDA_INIT
    anneal_steps: int = 1000
    layers: LayerSelection = None
    train: str = "attention"
    trainable: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method not in list_methods():
            raise ValueError(f"method must be one of {list_methods()}, got {self.method!r}")
        self.lambda_init = check_lambda_init(self.lambda_init)
        a = self.anneal_steps
        if isinstance(a, bool) or not isinstance(a, int) or a <= 0:
            raise ValueError(f"anneal_steps must be a positive int (optimizer steps), got {a!r}")
        if not isinstance(self.train, str) or self.train not in TRAIN_MODES:
            raise ValueError(f"train must be one of {TRAIN_MODES}, got {self.train!r}")
        self.layers = _check_layers(self.layers)
        self.trainable = _check_trainable(self.trainable)

    # ------------------------------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values; ``layers`` must be None or indices (a predicate cannot be saved)."""
        if callable(self.layers):
            raise ValueError("a RetrofitConfig with a layers predicate cannot be saved; the retrofitted model's "
                             "config (diffattn.adapters.retrofit_config(model)) holds the chosen indices")
        d = asdict(self)
        d["layers"] = None if self.layers is None else list(self.layers)
        d["trainable"] = list(self.trainable)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetrofitConfig:
        """Build from :meth:`to_dict` output; unknown keys are an error (ValueError naming them)."""
        check_fields(cls, data)
        if "method" not in data:
            raise ValueError("a RetrofitConfig needs 'method'")
        return cls(**dict(data))


def _check_layers(layers: Any) -> LayerSelection:
    if layers is None or callable(layers):
        return layers
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise TypeError(f"layers must be None, a sequence of 0-based layer indices or a predicate "
                        f"(index, name) -> bool, got {type(layers).__name__} {layers!r}")
    layers = list(layers)
    if not layers:
        raise ValueError("layers must name at least one attention layer, got an empty sequence (pass None to "
                         "convert every layer)")
    bad = [i for i in layers if not _is_index(i)]
    if bad:
        raise TypeError(f"layers must hold int layer indices (bools are not indices), got {bad[0]!r} in {layers!r}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers must not repeat an index, got {layers!r}")
    return layers


def _check_trainable(names: Any) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"trainable must be a sequence of module names (e.g. ('classifier',)), got "
                        f"{type(names).__name__} {names!r}")
    names = tuple(names)
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise TypeError(f"trainable must hold non-empty module names (str), got {bad[0]!r} in {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"trainable must not repeat a module name, got {names!r}")
    return names
