"""Every λ form of differential attention, and the λ_init schedules (DESIGN.md §3.2).

Each form is a small module whose ``forward(x)`` returns ``(weight1, lambda_)`` ready for
:func:`diffattn.functional.diff_attention`, each a tensor broadcastable to (B, H, N, 1):

| form            | weight1 | λ                                                        | source                     |
|-----------------|---------|----------------------------------------------------------|----------------------------|
| reparam         | 1       | exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init                 | Ye et al. eq. 2; seed 000  |
| dual_scalar     | 1       | exp(a) − exp(b) + λ_init, a = b = 0 at init              | timm ``DiffAttention``     |
| constant        | 1       | λ_init                                                   | ablations                  |
| gate            | g       | 1 − g, g = σ(X W_g + b_g) per token and head             | M-DGSA, seed 004 eq. 3     |
| token_sigmoid   | 1       | σ(X W + b) per token and head                            | Diff Transformer V2        |
| annealed        | 1       | (1 − α)(t/T) λ_init + α λ_learn, α = min(1, t/T)         | DEX; DAA, seed 001 eq. 3   |
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .functional import _upcast

__all__ = [
    "LAMBDA_FORMS",
    "lambda_init_constant",
    "lambda_init_ye",
    "resolve_lambda_init",
    "reparam_lambda",
    "ReparamLambda",
    "DualScalarLambda",
    "ConstantLambda",
    "GateLambda",
    "TokenSigmoidLambda",
    "AnnealedLambda",
    "build_lambda",
]

LAMBDA_FORMS = ("reparam", "dual_scalar", "constant", "gate", "token_sigmoid", "annealed")

_ONE = 1.0


# ---------------------------------------------------------------------------------------- λ_init schedules


def lambda_init_constant(value: float = 0.8) -> float:
    """The constant λ_init of DiffCLIP (seed 000 §3.3: 0.8)."""
    return float(value)


def lambda_init_ye(depth: int) -> float:
    """λ_init = 0.8 − 0.6·exp(−0.3·depth) with ``depth`` the **0-based** layer index (Ye et al. 2024 §2.1).

    Layer 0 gets 0.2; DiffCLIP* (seed 000 §4.4) uses the same schedule.
    """
    if depth < 0:
        raise ValueError(f"depth is the 0-based layer index and must be >= 0, got {depth}")
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def resolve_lambda_init(lambda_init: float | str, depth: int = 0) -> float:
    """A float stays as is; ``"ye"`` applies :func:`lambda_init_ye` to the 0-based ``depth``."""
    if isinstance(lambda_init, str):
        if lambda_init != "ye":
            raise ValueError(f"lambda_init must be a float or 'ye', got {lambda_init!r}")
        return lambda_init_ye(depth)
    if not isinstance(lambda_init, (int, float)):
        raise ValueError(f"lambda_init must be a float or 'ye', got {type(lambda_init).__name__}")
    return float(lambda_init)


# ---------------------------------------------------------------------------------------------- forms


def reparam_lambda(lambda_q1, lambda_k1, lambda_q2, lambda_k2, lambda_init: float) -> torch.Tensor:
    """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, computed in float32 (Ye et al. 2024 eq. 2).

    The vectors may carry leading dims (one λ per head): the dot product runs over the last dim.
    """
    l1 = torch.exp(torch.sum(_upcast(lambda_q1) * _upcast(lambda_k1), dim=-1))
    l2 = torch.exp(torch.sum(_upcast(lambda_q2) * _upcast(lambda_k2), dim=-1))
    return l1 - l2 + lambda_init


def _scalar(lam: torch.Tensor) -> torch.Tensor:
    return lam.reshape(1, -1, 1, 1) if lam.dim() == 1 else lam


class ReparamLambda(nn.Module):
    """Re-parameterised λ of Ye et al. 2024 (eq. 2): four vectors of width ``head_dim`` drawn from N(0, std²).

    With ``num_heads`` set, each head gets its own four vectors and λ has shape (1, H, 1, 1).
    """

    def __init__(self, head_dim: int, lambda_init: float = 0.8, *, std: float = 0.1, num_heads: int | None = None):
        super().__init__()
        shape = (head_dim,) if num_heads is None else (num_heads, head_dim)
        self.lambda_init = float(lambda_init)
        self.std = std
        self.lambda_q1 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.lambda_k1 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.lambda_q2 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.lambda_k2 = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, mean=0.0, std=self.std)

    def value(self) -> torch.Tensor:
        """λ as a 0-d tensor, or (1, H, 1, 1) per head."""
        lam = reparam_lambda(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.lambda_init)
        return _scalar(lam)

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        return _ONE, self.value()


class DualScalarLambda(nn.Module):
    """λ = exp(a) − exp(b) + λ_init with scalars a = b = 0 at init (timm's ``DiffAttention(dual_lambda=True)``)."""

    def __init__(self, lambda_init: float = 0.8):
        super().__init__()
        self.lambda_init = float(lambda_init)
        self.lambda_a = nn.Parameter(torch.zeros((), dtype=torch.float32))
        self.lambda_b = nn.Parameter(torch.zeros((), dtype=torch.float32))

    def value(self) -> torch.Tensor:
        return torch.exp(self.lambda_a) - torch.exp(self.lambda_b) + self.lambda_init

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        return _ONE, self.value()


class ConstantLambda(nn.Module):
    """A fixed λ = λ_init (no parameters); for ablations."""

    def __init__(self, lambda_init: float = 0.8):
        super().__init__()
        self.lambda_init = float(lambda_init)

    def value(self) -> torch.Tensor:
        return torch.tensor(self.lambda_init)

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, float]:
        return _ONE, self.lambda_init


class GateLambda(nn.Module):
    """M-DGSA gate (seed 004 eq. 2–3): g = σ(X W_g + b_g) ∈ (0, 1)^{N×H}; weight1 = g on A⁺, λ = 1 − g on A⁻.

    One linear layer D → H (seed 004 §5.3 found deeper gates worse). ``gate_proj`` keeps the name its models use.
    """

    def __init__(self, dim: int, num_heads: int, *, bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.gate_proj = nn.Linear(dim, num_heads, bias=bias)

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """g of shape (B, H, N, 1) in float32."""
        return torch.sigmoid(_upcast(self.gate_proj(x))).transpose(1, 2).unsqueeze(-1)  # (B, H, N, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.gate(x)
        return g, 1.0 - g


class TokenSigmoidLambda(nn.Module):
    """λ = σ(X W + b) per token and head on A2 only, weight1 = 1 (Diff Transformer V2; used without sub-norm)."""

    def __init__(self, dim: int, num_heads: int, *, bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.lambda_proj = nn.Linear(dim, num_heads, bias=bias)

    def forward(self, x: torch.Tensor) -> tuple[float, torch.Tensor]:
        return _ONE, torch.sigmoid(_upcast(self.lambda_proj(x))).transpose(1, 2).unsqueeze(-1)  # (B, H, N, 1)


class AnnealedLambda(nn.Module):
    """λ(t) = (1 − α)·(t/T)·λ_init + α·λ_learn, α = min(1, t/T) (seed 001 eq. 3, after DEX).

    λ(0) = 0 exactly, so a retrofitted model starts as the pretrained one; the (t/T)·λ_init ramp moves it off that
    point even when every new weight is still the identity (with λ ≡ 0 the gradient of λ_learn alone is what
    moves it, and it vanishes at λ_learn = 0 for some retrofits). Past T, λ = λ_learn. ``step`` is a buffer, so a
    resumed state dict continues the schedule; call :meth:`advance` once per optimizer step.
    """

    def __init__(self, lambda_init: float = 0.8, anneal_steps: int = 1000, *, lambda_learn_init: float = 0.0):
        super().__init__()
        if anneal_steps <= 0:
            raise ValueError(f"anneal_steps must be a positive integer, got {anneal_steps}")
        self.lambda_init = float(lambda_init)
        self.anneal_steps = int(anneal_steps)
        self.lambda_learn = nn.Parameter(torch.tensor(float(lambda_learn_init)))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def value(self) -> torch.Tensor:
        r = self.step.to(_upcast(self.lambda_learn).dtype) / self.anneal_steps
        alpha = torch.clamp(r, max=1.0)
        return (1.0 - alpha) * r * self.lambda_init + alpha * _upcast(self.lambda_learn)

    @torch.no_grad()
    def advance(self, n: int = 1) -> None:
        self.step += n

    def forward(self, x: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        return _ONE, self.value()

    def extra_repr(self) -> str:
        return f"lambda_init={self.lambda_init}, anneal_steps={self.anneal_steps}"


def build_lambda(form: str, *, head_dim: int, dim: int, num_heads: int, lambda_init: float,
                 anneal_steps: int = 1000) -> nn.Module:
    """The λ module of ``form`` (one of :data:`LAMBDA_FORMS`) for a layer with ``num_heads`` differential heads."""
    if form == "reparam":
        return ReparamLambda(head_dim, lambda_init)
    if form == "dual_scalar":
        return DualScalarLambda(lambda_init)
    if form == "constant":
        return ConstantLambda(lambda_init)
    if form == "gate":
        return GateLambda(dim, num_heads)
    if form == "token_sigmoid":
        return TokenSigmoidLambda(dim, num_heads)
    if form == "annealed":
        return AnnealedLambda(lambda_init, anneal_steps)
    raise ValueError(f"lambda_form must be one of {LAMBDA_FORMS}, got {form!r}")
