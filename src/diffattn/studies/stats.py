"""Statistics over seeds: mean ± sample standard deviation, and paired comparisons of two variants trained with the
same seeds.

Paired t-test (Student 1908): the per-seed differences d_s = x_s − y_s, t = mean(d) / (sd(d) / √n) with
n − 1 degrees of freedom, two-sided p = P(|T| ≥ |t|). The t distribution's CDF for an integer number of degrees
of freedom ν has a closed form (Abramowitz & Stegun 1964, eq. 26.7.3–26.7.4), with θ = atan(t / √ν):

    A(t | ν) = P(|T| < t) = (2/π)(θ + sin θ cos θ Σ_{k=0}^{(ν−3)/2} a_k cos^{2k} θ)   ν odd  (a_0 = 1,
                                                                   a_k = a_{k−1} · 2k / (2k + 1); ν = 1: 2θ/π)
                          = sin θ Σ_{k=0}^{(ν−2)/2} b_k cos^{2k} θ                     ν even (b_0 = 1,
                                                                   b_k = b_{k−1} · (2k − 1) / (2k))

so no scipy is needed. Sign test: the number of seeds on which the difference is positive, against
Binomial(n, 1/2) with ties dropped, two-sided (with 3 seeds its smallest p-value is 0.25: it can never reach 0.05).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["mean_std", "t_two_sided_p", "sign_test_p", "paired_test", "paired_statement"]


def _floats(name: str, values: Sequence[float]) -> list[float]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{name} must hold at least one number, got an empty sequence")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must hold finite numbers, got {out}")
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation with n − 1 in the denominator; 0.0 for a single value)."""
    v = _floats("values", values)
    m = sum(v) / len(v)
    if len(v) == 1:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` (a positive int) degrees of freedom (module docstring)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be a positive int, got {df!r}")
    if math.isnan(t):
        raise ValueError("t must be a number, got nan")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd
        series, term = 0.0, 1.0
        for k in range((df - 1) // 2):  # k = 0 .. (ν−3)/2
            if k:
                term *= c2 * 2 * k / (2 * k + 1)
            series += term
        a = (2 / math.pi) * (theta + s * math.cos(theta) * series) if df > 1 else 2 * theta / math.pi
    else:
        series, term = 0.0, 1.0
        for k in range(df // 2):  # k = 0 .. (ν−2)/2
            if k:
                term *= c2 * (2 * k - 1) / (2 * k)
            series += term
        a = s * series
    return min(1.0, max(0.0, 1.0 - a))


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test: P(a count at least as far from n/2 as ``wins``) under Binomial(n, 1/2),
    n = wins + losses (ties are dropped before). 1.0 when n = 0."""
    for name, v in (("wins", wins), ("losses", losses)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_test(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Paired comparison of ``x`` against ``y`` (one value per seed, same seed order): the mean and sample std of
    d = x − y, the t statistic and its two-sided p-value (n − 1 degrees of freedom), and the sign test.

    Identical non-zero differences (zero spread) give t = ±inf and p = 0; all-zero differences give p = 1.
    Returns ``{"n", "mean_diff", "std_diff", "t", "p", "wins", "losses", "ties", "p_sign"}``.
    """
    xs, ys = _floats("x", x), _floats("y", y)
    if len(xs) != len(ys):
        raise ValueError(f"x and y must hold one value per seed each, got {len(xs)} and {len(ys)} values")
    if len(xs) < 2:
        raise ValueError(f"a paired test needs at least 2 seeds, got {len(xs)}")
    d = [a - b for a, b in zip(xs, ys)]
    n = len(d)
    m, sd = mean_std(d)
    scale = max(1.0, max(abs(v) for v in xs + ys))
    if sd <= 1e-12 * scale:
        t = 0.0 if abs(m) <= 1e-12 * scale else math.copysign(math.inf, m)
    else:
        t = m / (sd / math.sqrt(n))
    p = 1.0 if t == 0.0 else t_two_sided_p(t, n - 1)
    tol = 1e-12 * scale
    wins, losses = sum(v > tol for v in d), sum(v < -tol for v in d)
    return {"n": n, "mean_diff": m, "std_diff": sd, "t": t, "p": p, "wins": wins, "losses": losses,
            "ties": n - wins - losses, "p_sign": sign_test_p(wins, losses)}


def paired_statement(test: dict[str, float], label: str, base: str, *, alpha: float = 0.05, digits: int = 2) -> str:
    """One line for a :func:`paired_test` result of ``label`` against ``base``, e.g. "DiffViT − ViT = +1.20 ± 0.40
    (t-test p = 0.031, sign test p = 0.25, higher on 3 of 3 seeds): DiffViT higher than ViT (p < 0.05)"."""
    head = (f"{label} − {base} = {test['mean_diff']:+.{digits}f} ± {test['std_diff']:.{digits}f} "
            f"(t-test p = {test['p']:.3f}, sign test p = {test['p_sign']:.2f}, higher on {test['wins']} of "
            f"{test['n']} seeds)")
    if test["p"] < alpha:
        return f"{head}: {label} {'higher' if test['mean_diff'] > 0 else 'lower'} than {base} (p < {alpha:g})"
    return f"{head}: no significant difference at p < {alpha:g}"
