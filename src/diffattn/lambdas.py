"""Every λ form of differential attention, one registry of them, and the λ_init schedules.

Each form is a :class:`LambdaForm`: a small module whose ``forward(x)`` returns ``(weight1, lambda_)`` ready for
:func:`diffattn.functional.diff_attention`, each a float or a tensor broadcastable to (B, H, N, 1). Forms are
registered by name with :func:`register_lambda` and built with one signature by :func:`build_lambda`, which is
what the attention layers call (``lambda_form=``, ``lambda_options=``):

| form          | weight1 | λ                                                | sub-norm | source                      |
|---------------|---------|--------------------------------------------------|----------|-----------------------------|
| reparam       | 1       | exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init         | yes      | Ye et al. 2024, eq. 2       |
| dual_scalar   | 1       | exp(a) − exp(b) + λ_init, a = b = 0 at init      | yes      | timm ``DiffAttention``      |
| constant      | 1       | λ_init                                           | yes      | ablations                   |
| gate          | g       | 1 − g, g = σ(X W_g + b_g) per token and head     | yes      | M-DGSA 2025, eq. 3          |
| token_sigmoid | 1       | σ(X W) per token and head                        | no       | Ye et al. 2026, Diff. T. V2 |
| annealed      | 1       | (1 − α)(t/T) λ_init + α λ_learn, α = min(1, t/T) | yes      | DEX / DAA retrofits, eq. 3  |

"sub-norm" is the form's :attr:`LambdaForm.sub_norm`: whether :class:`~diffattn.layers.DiffAttention` and
:class:`~diffattn.layers.GatedDiffAttention` apply the per-head RMSNorm × (1 − λ_init) when ``sub_norm`` is not
given. ``token_sigmoid`` takes ``bias=True`` for σ(X W + b), the form of diffattn 0.1.0 (whose files load with it
through :mod:`diffattn.formats`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
import torch.nn as nn

from .ops import upcast
from .registry import registered, registering

__all__ = [
    "DEFAULT_LAMBDA_INIT",
    "LAMBDA_FORMS",
    "LambdaForm",
    "register_lambda",
    "available_lambdas",
    "lambda_class",
    "build_lambda",
    "lambda_init_constant",
    "lambda_init_ye",
    "lambda_init_motif",
    "LAMBDA_INIT_SCHEDULES",
    "resolve_lambda_init",
    "check_lambda_init",
    "LambdaInitTypeError",
    "reparam_lambda",
    "ReparamLambda",
    "DualScalarLambda",
    "ConstantLambda",
    "GateLambda",
    "TokenSigmoidLambda",
    "AnnealedLambda",
]

_ONE = 1.0

#: λ_init when none is given: the constant of DiffCLIP (Hammoud & Ghanem 2025, §3.3) and of DAA (2025, eq. 3), and
#: the value M-DGSA (2025, App. B.5) found best; every default λ_init in diffattn is this one
DEFAULT_LAMBDA_INIT = 0.8


# ---------------------------------------------------------------------------------------- λ_init schedules


def _check_finite(name: str, value) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a finite float, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite float, got {value}")
    return value


def lambda_init_constant(value: float = DEFAULT_LAMBDA_INIT) -> float:
    """The constant λ_init of DiffCLIP (Hammoud et al. 2025, §3.3: 0.8)."""
    return check_lambda_init(value, schedules=False)


def lambda_init_ye(depth: int) -> float:
    """λ_init = 0.8 − 0.6·exp(−0.3·depth) with ``depth`` the **0-based** layer index (Ye et al. 2024 §2.1).

    Layer 0 gets 0.2; DiffCLIP* (Hammoud et al. 2025, §4.4) uses the same schedule.
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"depth is the 0-based layer index and must be an integer >= 0, got {depth!r}")
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def lambda_init_motif(depth: int) -> float:
    """λ_init = 0.8 − 0.6·exp(−0.3·(depth − 1)) with ``depth`` the 0-based layer index: the schedule of the released
    Motif models (Motif Technologies 2025, arXiv 2508.09148 and 2511.07464; ``lambda_init_fn`` of their modeling code
    and of vLLM's ``motif.py``), which counts layers from −1, so layer 0 gets 0.8 − 0.6·e^0.3 ≈ −0.0099 and layer 1
    gets 0.2. Kept as released: their checkpoints were trained with it."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"depth is the 0-based layer index and must be an integer >= 0, got {depth!r}")
    return 0.8 - 0.6 * math.exp(-0.3 * (depth - 1))


#: the named λ_init schedules: ``lambda_init="<name>"`` gives layer ``depth`` (0-based) the value ``f(depth)``
LAMBDA_INIT_SCHEDULES = {"ye": lambda_init_ye, "motif": lambda_init_motif}


def _unknown_schedule(lambda_init) -> str:
    return (f"lambda_init must be a finite float or 'ye', got {lambda_init!r} (the named schedules: "
            f"{sorted(LAMBDA_INIT_SCHEDULES)})")


def resolve_lambda_init(lambda_init: float | str, depth: int = 0) -> float:
    """A finite float stays as is; a schedule's name (``"ye"``: :func:`lambda_init_ye`, ``"motif"``:
    :func:`lambda_init_motif`) applies it to the 0-based ``depth``. Checked by :func:`check_lambda_init`."""
    value = check_lambda_init(lambda_init)
    return LAMBDA_INIT_SCHEDULES[value](depth) if isinstance(value, str) else value


class LambdaInitTypeError(TypeError, ValueError):
    """A λ_init that is neither a number nor a string: a TypeError, and a ValueError like every other bad
    setting (what the λ forms and the layers raised for it before :func:`check_lambda_init` was the one check)."""


def check_lambda_init(lambda_init, *, schedules: bool = True) -> float | str:
    """The one check of a λ_init, wherever it is given: a finite float (returned as a float) or, where
    ``schedules`` (a setting before any layer depth is known: :class:`~diffattn.layers.AttentionSpec`,
    :class:`~diffattn.adapters.RetrofitConfig`, a layer's ``lambda_init``), the name of a schedule of
    :data:`LAMBDA_INIT_SCHEDULES` (``"ye"``, ``"motif"``); a λ form takes the float only (``schedules=False``).

    Raises :class:`LambdaInitTypeError` (a TypeError and a ValueError) for a value that is not a number or a string,
    ValueError for any other string or a non-finite number."""
    what = "a finite float or 'ye'" if schedules else "a finite float"
    if isinstance(lambda_init, str):
        if not schedules or lambda_init not in LAMBDA_INIT_SCHEDULES:
            raise ValueError(_unknown_schedule(lambda_init) if schedules else
                             f"lambda_init must be {what}, got {lambda_init!r}")
        return lambda_init
    if isinstance(lambda_init, bool) or not isinstance(lambda_init, numbers.Real):
        raise LambdaInitTypeError(f"lambda_init must be {what}, got {type(lambda_init).__name__} {lambda_init!r}")
    if not math.isfinite(float(lambda_init)):
        raise ValueError(f"lambda_init must be {what}, got {lambda_init!r}")
    return float(lambda_init)


# ------------------------------------------------------------------------------------------------ registry


class LambdaForm(nn.Module):
    """Base of the λ forms: ``forward(x)`` → ``(weight1, lambda_)``, each a float or a tensor broadcastable to
    (B, H, N, 1) (x: (B, N, dim); forms that do not depend on the tokens ignore it).

    :meth:`build` is the one constructor signature the registry uses; each form keeps its own ``__init__``.
    """

    name: str = ""
    sub_norm: bool = True  # the layers' default: RMSNorm × (1 − λ_init) per head after (w1 A1 − λ A2) V

    @classmethod
    def build(cls, *, dim: int, num_heads: int, head_dim: int, lambda_init: float, **options) -> LambdaForm:
        raise NotImplementedError  # pragma: no cover - each registered form defines it

    def forward(self, x: torch.Tensor | None = None):  # pragma: no cover - abstract
        raise NotImplementedError

    def kernel_inputs(self, x: torch.Tensor) -> tuple[str, tuple[torch.Tensor, ...], float] | None:
        """What the fused kernels need to compute (w1, λ) themselves: (mode, tensors, λ_init) with mode "reparam"
        (the four vectors), "gate" or "sigmoid" (the logits, (B, N, H)); None for a form they do not compute, which
        then runs :meth:`forward` before the kernel."""
        return None

    #: the attribute naming the linear layer whose logits of the tokens the form reads (None: it reads none); a
    #: server fuses that layer into its input projection and hands the logits to :meth:`from_logits`
    logits_proj: str | None = None

    def from_logits(self, z: torch.Tensor):
        """``(weight1, lambda_)`` from the logits z (B, N, H) of :attr:`logits_proj`: ``forward(x)`` is
        ``from_logits(getattr(self, self.logits_proj)(x))``."""
        raise TypeError(f"the {self.name!r} λ form reads no logits of the tokens")  # pragma: no cover


_REGISTRY: dict[str, type[LambdaForm]] = {}


def register_lambda(name: str) -> Callable[[type[LambdaForm]], type[LambdaForm]]:
    """Class decorator: register a :class:`LambdaForm` subclass under ``name`` (once)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a λ form name must be a non-empty string, got {name!r}")
    return registering(_REGISTRY, name, LambdaForm, "register_lambda", "λ form")


def available_lambdas() -> tuple[str, ...]:
    """Names of the registered λ forms, in registration order."""
    return tuple(_REGISTRY)


def lambda_class(name: str) -> type[LambdaForm]:
    """The registered class of λ form ``name``."""
    return registered(_REGISTRY, name, "lambda_form")


def build_lambda(name: str, *, dim: int, num_heads: int, head_dim: int, lambda_init: float,
                 **options) -> LambdaForm:
    """The λ module of form ``name`` for a layer of width ``dim`` with ``num_heads`` differential heads of width
    ``head_dim``; ``options`` are the form's own keyword arguments (e.g. ``std`` for reparam, ``bias`` for gate)."""
    cls = lambda_class(name)
    lambda_init = check_lambda_init(lambda_init, schedules=False)
    try:
        return cls.build(dim=dim, num_heads=num_heads, head_dim=head_dim, lambda_init=lambda_init, **options)
    except TypeError as e:
        raise ValueError(f"lambda_options {sorted(options)} do not fit λ form {name!r}: {e}") from None


# ---------------------------------------------------------------------------------------------- forms


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a·b over the last dim, one op: (d,) → (), (H, d) → (H,)."""
    return torch.dot(a, b) if a.dim() == 1 else torch.matmul(a.unsqueeze(-2), b.unsqueeze(-1))[..., 0, 0]


class _ReparamLambdaFn(torch.autograd.Function):
    """λ = exp(q1·k1) − exp(q2·k2) + λ_init with its gradient written out, so that a training step spends about 12
    dispatched ops on λ instead of 20 (the host cost of a differential layer on a GPU is its op count):

        ∂λ/∂q1 = e1·k1, ∂λ/∂k1 = e1·q1, ∂λ/∂q2 = −e2·k2, ∂λ/∂k2 = −e2·q2,   e_b = exp(q_b·k_b)
    """

    @staticmethod
    def forward(ctx, q1, k1, q2, k2, lambda_init: float):
        e1, e2 = torch.exp(_dot(q1, k1)), torch.exp(_dot(q2, k2))
        ctx.save_for_backward(q1, k1, q2, k2, e1, e2)
        return torch.sub(e1, e2).add_(lambda_init)

    @staticmethod
    def backward(ctx, g):
        q1, k1, q2, k2, e1, e2 = ctx.saved_tensors
        c1 = (g * e1).unsqueeze(-1)  # (..., 1)
        c2 = torch.mul(g, e2).neg_().unsqueeze(-1)
        return c1 * k1, c1 * q1, c2 * k2, c2 * q2, None


def reparam_lambda(lambda_q1, lambda_k1, lambda_q2, lambda_k2, lambda_init: float) -> torch.Tensor:
    """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, computed in float32 (Ye et al. 2024 eq. 2).

    The vectors may carry leading dims (one λ per head): the dot product runs over the last dim. When a gradient
    is needed it goes through :class:`_ReparamLambdaFn` (the same numbers, fewer ops); tracing and export see the
    plain expression.
    """
    q1, k1, q2, k2 = (upcast(t) for t in (lambda_q1, lambda_k1, lambda_q2, lambda_k2))
    if (torch.is_grad_enabled() and any(t.requires_grad for t in (q1, k1, q2, k2)) and q1.shape == k1.shape
            == q2.shape == k2.shape and len({t.dtype for t in (q1, k1, q2, k2)}) == 1
            and not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())):
        return _ReparamLambdaFn.apply(q1, k1, q2, k2, float(lambda_init))
    l1 = torch.exp(torch.sum(q1 * k1, dim=-1))
    l2 = torch.exp(torch.sum(q2 * k2, dim=-1))
    return l1 - l2 + lambda_init


def _scalar(lam: torch.Tensor) -> torch.Tensor:
    return lam.reshape(1, -1, 1, 1) if lam.dim() == 1 else lam


@register_lambda("reparam")
class ReparamLambda(LambdaForm):
    """Re-parameterised λ of Ye et al. 2024 (eq. 2): four vectors of width ``head_dim`` drawn from N(0, std²).

    With ``num_heads`` set, each head gets its own four vectors and λ has shape (1, H, 1, 1). Through the
    registry: ``std`` (default 0.1) and ``per_head`` (default False: one λ per layer, as in the paper).
    """

    def __init__(self, head_dim: int, lambda_init: float = DEFAULT_LAMBDA_INIT, *, std: float = 0.1,
                 num_heads: int | None = None):
        super().__init__()
        shape = (head_dim,) if num_heads is None else (num_heads, head_dim)
        self.lambda_init = check_lambda_init(lambda_init, schedules=False)
        self.std = _check_finite("std", std)
        self.lambda_q1 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.lambda_k1 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.lambda_q2 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.lambda_k2 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, mean=0.0, std=self.std)

    @classmethod
    def build(cls, *, dim, num_heads, head_dim, lambda_init, std: float = 0.1, per_head: bool = False):
        return cls(head_dim, lambda_init, std=std, num_heads=num_heads if per_head else None)

    def value(self) -> torch.Tensor:
        """λ as a 0-d tensor, or (1, H, 1, 1) per head."""
        lam = reparam_lambda(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.lambda_init)
        return _scalar(lam)

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        return _ONE, self.value()

    def kernel_inputs(self, x: torch.Tensor) -> tuple[str, tuple[torch.Tensor, ...], float] | None:
        if self.lambda_q1.dim() != 1:  # one λ per head: computed before the kernel
            return None
        return "reparam", (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2), self.lambda_init


@register_lambda("dual_scalar")
class DualScalarLambda(LambdaForm):
    """λ = exp(a) − exp(b) + λ_init with scalars a = b = 0 at init (timm's ``DiffAttention(dual_lambda=True)``)."""

    def __init__(self, lambda_init: float = DEFAULT_LAMBDA_INIT):
        super().__init__()
        self.lambda_init = check_lambda_init(lambda_init, schedules=False)
        self.lambda_a = nn.Parameter(torch.zeros((), dtype=torch.float32))
        self.lambda_b = nn.Parameter(torch.zeros((), dtype=torch.float32))

    @classmethod
    def build(cls, *, dim, num_heads, head_dim, lambda_init):
        return cls(lambda_init)

    def value(self) -> torch.Tensor:
        return torch.exp(self.lambda_a) - torch.exp(self.lambda_b) + self.lambda_init

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        return _ONE, self.value()


@register_lambda("constant")
class ConstantLambda(LambdaForm):
    """A fixed λ = λ_init (no parameters); for ablations."""

    def __init__(self, lambda_init: float = DEFAULT_LAMBDA_INIT):
        super().__init__()
        self.lambda_init = check_lambda_init(lambda_init, schedules=False)

    @classmethod
    def build(cls, *, dim, num_heads, head_dim, lambda_init):
        return cls(lambda_init)

    def value(self) -> torch.Tensor:
        return torch.tensor(self.lambda_init)

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, float]:
        return _ONE, self.lambda_init


def _sigmoid_heads(z: torch.Tensor) -> torch.Tensor:
    """σ(z) of the logits z (B, N, H) as (B, H, N, 1), in ≥ float32."""
    return torch.sigmoid(upcast(z)).transpose(1, 2).unsqueeze(-1)


class _TokenLambda(LambdaForm):
    """A λ form read from the tokens: one linear layer D → H, the attribute named :attr:`logits_proj`, whose logits
    z (B, N, H) give ``(weight1, lambda_)`` through :meth:`from_logits`, and which the fused kernels read as
    :attr:`kernel_mode`. ``bias`` None: the form's :attr:`default_bias`."""

    #: what the fused kernels call these logits (:meth:`LambdaForm.kernel_inputs`)
    kernel_mode: str = ""
    default_bias: bool = False

    def __init__(self, dim: int, num_heads: int, *, bias: bool | None = None):
        super().__init__()
        self.num_heads = num_heads
        setattr(self, self.logits_proj, nn.Linear(dim, num_heads, bias=self.default_bias if bias is None else bias))

    def forward(self, x: torch.Tensor):
        return self.from_logits(getattr(self, self.logits_proj)(x))

    def kernel_inputs(self, x: torch.Tensor) -> tuple[str, tuple[torch.Tensor, ...], float] | None:
        return self.kernel_mode, (getattr(self, self.logits_proj)(x),), 0.0  # logits (B, N, H)


@register_lambda("gate")
class GateLambda(_TokenLambda):
    """M-DGSA gate (Lygizou & Kalamaras 2025, eq. 2–3): g = σ(X W_g + b_g) ∈ (0, 1)^{N×H}; weight1 = g on A⁺,
    λ = 1 − g on A⁻.

    One linear layer D → H (the paper's §5.3 found deeper gates worse). ``gate_proj`` keeps the name its models use.
    """

    logits_proj = "gate_proj"
    kernel_mode = "gate"
    default_bias = True

    @classmethod
    def build(cls, *, dim, num_heads, head_dim, lambda_init, bias: bool = True):
        return cls(dim, num_heads, bias=bias)

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """g of shape (B, H, N, 1) in float32."""
        return _sigmoid_heads(self.gate_proj(x))  # (B, H, N, 1)

    def from_logits(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = _sigmoid_heads(z)  # (B, H, N, 1)
        return g, 1.0 - g


@register_lambda("token_sigmoid")
class TokenSigmoidLambda(_TokenLambda):
    """λ = σ(X W) per token and head on A2 only, weight1 = 1, and no sub-norm: the Differential Transformer V2
    (Ye et al. 2026; microsoft/unilm ``multihead_flashdiffv2.py``, whose ``lambda_proj`` has no bias).

    ``bias=True`` gives σ(X W + b), the form of diffattn 0.1.0.
    """

    sub_norm = False
    logits_proj = "lambda_proj"
    kernel_mode = "sigmoid"

    @classmethod
    def build(cls, *, dim, num_heads, head_dim, lambda_init, bias: bool = False):
        return cls(dim, num_heads, bias=bias)

    def from_logits(self, z: torch.Tensor) -> tuple[float, torch.Tensor]:
        return _ONE, _sigmoid_heads(z)  # (B, H, N, 1)


@register_lambda("annealed")
class AnnealedLambda(LambdaForm):
    """λ(t) = (1 − α)·(t/T)·λ_init + α·λ_learn, α = min(1, t/T) (the DAA retrofit's eq. 3, after DEX).

    λ(0) = 0 exactly, so a retrofitted model starts as the pretrained one; the (t/T)·λ_init ramp moves it off that
    point even when every new weight is still the identity (with λ ≡ 0 the gradient of λ_learn alone is what
    moves it, and it vanishes at λ_learn = 0 for some retrofits). Past T, λ = λ_learn. ``step`` is a buffer, so a
    resumed state dict continues the schedule; call :meth:`advance` once per optimizer step.
    """

    def __init__(self, lambda_init: float = DEFAULT_LAMBDA_INIT, anneal_steps: int = 1000, *,
                 lambda_learn_init: float = 0.0):
        super().__init__()
        if not isinstance(anneal_steps, int) or isinstance(anneal_steps, bool) or anneal_steps <= 0:
            raise ValueError(f"anneal_steps must be a positive integer, got {anneal_steps!r}")
        self.lambda_init = check_lambda_init(lambda_init, schedules=False)
        self.anneal_steps = int(anneal_steps)
        self.lambda_learn = nn.Parameter(torch.tensor(float(lambda_learn_init)))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @classmethod
    def build(cls, *, dim, num_heads, head_dim, lambda_init, anneal_steps: int = 1000,
              lambda_learn_init: float = 0.0):
        return cls(lambda_init, anneal_steps, lambda_learn_init=lambda_learn_init)

    def value(self) -> torch.Tensor:
        r = self.step.to(upcast(self.lambda_learn).dtype) / self.anneal_steps
        alpha = torch.clamp(r, max=1.0)
        return (1.0 - alpha) * r * self.lambda_init + alpha * upcast(self.lambda_learn)

    @torch.no_grad()
    def advance(self, n: int = 1) -> None:
        self.step += n

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        return _ONE, self.value()

    def extra_repr(self) -> str:
        return f"lambda_init={self.lambda_init}, anneal_steps={self.anneal_steps}"


LAMBDA_FORMS = available_lambdas()  # the built-in forms; see available_lambdas() for later registrations
