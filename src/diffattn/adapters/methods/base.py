"""The retrofit-method protocol and its registry.

A retrofit method is one :class:`RetrofitMethod` subclass, registered by name with :func:`register_method`. It says
everything that differs between methods; the :class:`~diffattn.adapters.methods.RetrofitAdapter` module holds the
weights it creates and the bindings call it through :func:`~diffattn.adapters.methods.second_branch` and
:func:`~diffattn.adapters.methods.run_method`, never by name:

- **parameters** (:meth:`RetrofitMethod.init_parameters`): the new matrices, identity at init;
- **schedule** (:meth:`RetrofitMethod.init_schedule`): the λ module ``lam`` and the step counter t. Two schedules
  exist: :class:`AnnealedMethod` (λ(t) of DAA (2025) eq. 3, :class:`~diffattn.lambdas.AnnealedLambda`, zero at
  t = 0) and :class:`BlendedMethod` (Li et al. 2025: re-parameterised λ of Ye et al. 2024 eq. 2, per-head RMSNorm
  × (1 − λ_init), blended in from the pretrained output by β(t) = min(1, t/T));
- **second branch** (:meth:`RetrofitMethod.second_branch`): the q2 / k2 / v2 it projects, if any;
- **attention** (:meth:`RetrofitMethod.attend`): the core after projection, rotary embedding and cache.

A new method is one module with one class::

    @register_method("diffq_scaled")
    class DiffQScaled(InputMethod):
        which = "q"
        ...

Every method must compute the pretrained function at step 0 (``tests/test_adapters_registry.py`` checks a method
registered from a test module).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import torch
import torch.nn as nn

from ...lambdas import AnnealedLambda, ReparamLambda
from ...layers.norm import head_rms_norm
from ...registry import registered, registering
from .ops import diff_attend

__all__ = [
    "RetrofitMethod",
    "AnnealedMethod",
    "BlendedMethod",
    "InputMethod",
    "Branches",
    "Project",
    "register_method",
    "build_method",
    "method_class",
    "list_methods",
]

#: ``project(x', which)``: the pretrained projection ``which`` ("q", "k" or "v") of x' (B, N, D) as heads
#: (B, heads, N, d), with the family's per-head step (timm's q/k norm)
Project = Callable[[torch.Tensor, str], torch.Tensor]


class Branches(NamedTuple):
    """What :meth:`RetrofitMethod.attend` returns: the (B, h, Nq, dv) output and, when maps were asked for, the
    first-branch map, the second-branch map (None for one-map methods) and the combined map (each (B, h, Nq, Nk))."""

    out: torch.Tensor
    first: torch.Tensor | None
    second: torch.Tensor | None
    combined: torch.Tensor | None


def lambda_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """λ in float32, or float64 for a float64 model."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class RetrofitMethod(ABC):
    """One retrofit method: its parameters, λ schedule, second branch and attention core.

    Every hook takes the layer's :class:`~diffattn.adapters.methods.RetrofitAdapter` (``adapter``), which holds
    the sizes (``dim``, ``num_heads``, ``head_dim``, ``value_dim``), ``lambda_init``, ``anneal_steps`` and the
    weights the hooks create.

    Instances hold no state (the adapter holds the weights), so one instance may serve every layer. Subclass
    :class:`AnnealedMethod` or :class:`BlendedMethod` (they implement the schedule) and register the class with
    :func:`register_method`.
    """

    #: the registered name (set by :func:`register_method`)
    name: ClassVar[str] = ""
    #: True when the output is blended in from the pretrained output by β(t) (:class:`BlendedMethod`)
    blended: ClassVar[bool] = False

    def check(self, *, dim: int, num_heads: int, head_dim: int, value_dim: int) -> None:
        """Raise ValueError when the method cannot apply to a layer of these sizes (D, h, d, dv). Default: any size."""
        return None

    def init_parameters(self, adapter: nn.Module, *, device=None, dtype=None) -> None:
        """Create the method's new weights on ``adapter`` (identity at init, so step 0 is the pretrained layer).
        Default: none (the shared-QK and split-heads methods of Li et al. 2025 add only λ and the norm)."""
        return None

    @abstractmethod
    def init_schedule(self, adapter: nn.Module, *, device=None, dtype=None) -> None:
        """Create ``adapter.lam`` (the λ module) and the step counter t."""

    @abstractmethod
    def step_buffer(self, adapter: nn.Module) -> torch.Tensor:
        """The 0-d long buffer holding t."""

    def lambda_learn(self, adapter: nn.Module) -> float | None:
        """The learnt scalar λ_learn of an annealed λ(t); None for methods without one."""
        return None

    def second_branch(self, adapter: nn.Module, x: torch.Tensor, q: torch.Tensor,
                      project: Project) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(q2, k2, v2), None where the second branch reuses the first. ``x`` (B, N, D) is the layer input, ``q``
        (B, h, N, d) the first-branch query before any rotary embedding. Default: no second projection."""
        return None, None, None

    @abstractmethod
    def attend(self, adapter: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               q2: torch.Tensor | None, k2: torch.Tensor | None, v2: torch.Tensor | None, lam: torch.Tensor,
               weights: bool, kw: dict) -> Branches:
        """The attention core: q (B, h, Nq, d), k/v (B, Hkv, Nk, d), λ a 0-d tensor; ``kw`` goes to
        :func:`~diffattn.adapters.methods.ops.attend` / :func:`~diffattn.adapters.methods.ops.diff_attend`
        (mask, causal flag, scale, dropout, softcap, backend, masked rows). Maps only when ``weights``."""


class AnnealedMethod(RetrofitMethod):
    """Methods of DAA (2025) with the annealed λ(t) = (1 − α)(t/T)λ_init + αλ_learn, α = min(1, t/T) (eq. 3),
    which is 0 at t = 0; ``adapter.lam`` is an :class:`~diffattn.lambdas.AnnealedLambda` holding t.

    The default core is (A1 − λ(t) A2) V with A2 = A(q2, k2), q2/k2 defaulting to q/k (DAA eq. 4, DiffQ, DiffK)."""

    def init_schedule(self, adapter: nn.Module, *, device=None, dtype=None) -> None:
        adapter.lam = AnnealedLambda(adapter.lambda_init, adapter.anneal_steps).to(device=device,
                                                                                  dtype=lambda_dtype(dtype))

    def step_buffer(self, adapter: nn.Module) -> torch.Tensor:
        return adapter.lam.step

    def lambda_learn(self, adapter: nn.Module) -> float | None:
        return float(adapter.lam.lambda_learn)

    def attend(self, adapter, q, k, v, *, q2, k2, v2, lam, weights, kw) -> Branches:
        out, ws = diff_attend(q, k, q if q2 is None else q2, k if k2 is None else k2, v, lam, weights, **kw)
        return Branches(out, *(ws if ws is not None else (None, None, None)))


class InputMethod(AnnealedMethod):
    """DiffQ / DiffK / DiffV of DAA (2025, App. D.2): the second branch projects X' = X W_d with the pretrained
    projection ``which``; W_d{which} (D, D) is the identity at init."""

    #: the projection whose input is transformed: "q", "k" or "v"
    which: ClassVar[str] = ""

    def weight_name(self) -> str:
        return f"W_d{self.which}"

    def init_parameters(self, adapter, *, device=None, dtype=None) -> None:
        setattr(adapter, self.weight_name(),
                nn.Parameter(torch.eye(adapter.dim, device=device, dtype=dtype)))  # (D, D)

    def transform_input(self, adapter: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """X' = X W_d. x: (B, N, D) → (B, N, D)."""
        return torch.matmul(x, getattr(adapter, self.weight_name()).to(x.dtype))

    def second_branch(self, adapter, x, q, project):
        t = project(self.transform_input(adapter, x), self.which)  # (B, heads, N, d)
        return tuple(t if w == self.which else None for w in "qkv")  # type: ignore[return-value]


class BlendedMethod(RetrofitMethod):
    """Methods of Li et al. 2025: re-parameterised λ (Ye et al. 2024 eq. 2), per-head RMSNorm ``diff_norm`` of the
    value width × (1 − λ_init), and the output blended in: O = (1 − β) O_pretrained + β O_diff, β(t) = min(1, t/T),
    so step 0 is the pretrained layer and from t = T on the layer is exactly Li et al.'s (the blend is our
    addition). ``adapter.step`` holds t. Subclasses give the λ vector width and :meth:`differential`."""

    blended = True

    @abstractmethod
    def lambda_width(self, head_dim: int) -> int:
        """The width of the λ vectors λ_q1 … λ_k2 (the branch width)."""

    def init_schedule(self, adapter, *, device=None, dtype=None) -> None:
        adapter.lam = ReparamLambda(self.lambda_width(adapter.head_dim), adapter.lambda_init).to(
            device=device, dtype=lambda_dtype(dtype))
        adapter.diff_norm = head_rms_norm(adapter.value_dim).to(device=device, dtype=dtype)
        adapter.register_buffer("step", torch.zeros((), dtype=torch.long, device=device))

    def step_buffer(self, adapter) -> torch.Tensor:
        return adapter.step

    @abstractmethod
    def differential(self, adapter: nn.Module, q, k, v, lam: torch.Tensor, weights: bool, kw: dict,
                     full: bool) -> tuple:
        """(O_diff, its map, first map, second map, O_pretrained, its map) before the norm; O_pretrained and its
        map may be None when ``full`` (β = 1: not needed)."""

    def attend(self, adapter, q, k, v, *, q2, k2, v2, lam, weights, kw) -> Branches:
        beta = adapter.blend()
        full = bool(beta >= 1.0)
        od, pd, first, second, o1, p1 = self.differential(adapter, q, k, v, lam, weights, kw, full)
        od = adapter.diff_norm(od) * (1.0 - adapter.lambda_init)  # per-head RMSNorm × (1 − λ_init)
        if full:
            return Branches(od, first, second, pd)
        b = beta.to(od.dtype)
        out = (1.0 - b) * o1 + b * od  # β(t) blend from the pretrained output
        return Branches(out, first, second, None if pd is None else (1.0 - beta) * p1 + beta * pd)


# ------------------------------------------------------------------------------------------------ registry

_REGISTRY: dict[str, type[RetrofitMethod]] = {}


def register_method(name: str) -> Callable[[type[RetrofitMethod]], type[RetrofitMethod]]:
    """Class decorator: register a :class:`RetrofitMethod` subclass under ``name`` (what ``retrofit(model, name)``
    and :class:`~diffattn.adapters.RetrofitConfig` take)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a retrofit method name must be an identifier string, got {name!r}")
    return registering(_REGISTRY, name, RetrofitMethod, "register_method", "retrofit method")


def list_methods() -> tuple[str, ...]:
    """The registered retrofit methods, the built-in ones first, in registration order."""
    return tuple(_REGISTRY)


def method_class(name: str) -> type[RetrofitMethod]:
    """The class registered as ``name``."""
    return registered(_REGISTRY, name, "method")


def build_method(name: str) -> RetrofitMethod:
    """An instance of the method registered as ``name``."""
    return method_class(name)()


def unregister_method(name: str) -> None:
    """Remove ``name`` from the registry (for tests that register a method of their own)."""
    if name not in _REGISTRY:
        raise ValueError(f"retrofit method {name!r} is not registered; registered: {list_methods()}")
    del _REGISTRY[name]
