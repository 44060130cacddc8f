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

Effect sizes: the 95 % confidence interval of the mean paired difference, mean(d) ± t_{0.975, n−1} · sd(d) / √n
(the quantile found by bisection on the closed-form CDF), and Cohen's d_z = mean(d) / sd(d) (Cohen 1988, §2.3).
Many comparisons in one table: Holm's step-down adjustment (Holm 1979) of the m p-values sorted ascending,
p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)), which controls the family-wise error rate at α.
The smallest true difference a paired test detects with power 1 − β at level α (two-sided, normal approximation,
Cohen 1988, eq. 12.2.1 for paired samples): δ = (z_{1−α/2} + z_{1−β}) · sd(d) / √n. Named after the test that
will be run (:data:`MDD_TESTS`):

- ``paired_test``: the t approximation δ = (t_{1−α/2, n−1} + t_{1−β, n−1}) · sd(d) / √n (Chow, Shao & Wang 2008,
  §3.1: the sample-size equation of the one-sample t-test, solved for δ);
- ``permutation_p`` and ``censored_paired_test``: the same t approximation (the paired sign-flip permutation test
  has the t-test's power asymptotically, Hoeffding 1952), and infinite when even the most extreme sign pattern
  cannot reach α (2 / 2^n > α: n ≤ 5 at α = 0.05);
- ``sign_test_p``: exact, for normal differences d ~ N(δ, sd²): each seed is a win with probability
  π = Φ(δ / sd), the exact two-sided sign test rejects on the win counts k with sign_test_p(k, n − k) ≤ α, its
  power Σ_{k rejected} C(n, k) π^k (1 − π)^{n−k} rises with π, and δ = sd · Φ⁻¹(π*) for the π* where it reaches
  1 − β (bisection); infinite when no count rejects (n ≤ 5 at α = 0.05).

Steps to a threshold with censoring (:func:`censored_paired_test`): a seed that never reaches the level within the
budget B is right-censored at B (its true step is > B, unknown). Two paired statistics that need no model of the
censored tail:

- the paired sign-flip permutation test (Fisher 1935, §21; Pitman 1937) on the restricted differences
  d_s = min(x_s, B) − min(y_s, B), a censored seed counted at B. Under H0 the two variants of a seed are
  exchangeable, so are their restricted steps, and every sign pattern of the d_s is equally likely: the exact
  two-sided p is the share of the 2^n patterns with |Σ ±d_s| ≥ |Σ d_s|. mean(d) is the paired difference of
  restricted mean steps (the restricted-mean idea of survival analysis, Irwin 1949): when only the variant is
  censored it is a lower bound on the true difference, when only the baseline is, an upper bound;
- the paired Gehan score (Gehan 1965's generalised Wilcoxon scoring applied within each pair, as in the censored
  matched-pairs tests of Woolson & Lachenbruch 1980): u_s = +1 when x_s is surely later than y_s (y_s observed and
  x_s censored or later), −1 when surely earlier, 0 when the order is unknown (both censored) or tied; under H0 the
  signs of the non-zero u_s are fair coins, so its exact p is the sign test's on (wins, losses).

With a common censoring time B both are exact; neither can go below 2 / 2^n (0.0625 with 5 seeds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["mean_std", "t_two_sided_p", "t_quantile", "sign_test_p", "paired_test", "paired_statement", "holm",
           "min_detectable_difference", "MDD_TESTS", "permutation_p", "censored_paired_test"]

#: the tests of this module a registered question may name, each with the power rule of
#: :func:`min_detectable_difference` (module docstring)
MDD_TESTS = ("paired_test", "sign_test_p", "permutation_p", "censored_paired_test")


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


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t with ``df`` degrees of freedom: the t with
    P(|T| ≥ t) = 2 (1 − q), by bisection on :func:`t_two_sided_p` (e.g. t_quantile(0.975, 4) = 2.776)."""
    if not (isinstance(q, float) and 0.5 < q < 1):
        raise ValueError(f"q must be a float in (0.5, 1), got {q!r}")
    target = 2 * (1 - q)
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > target else (lo, mid)
    return (lo + hi) / 2


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values, in the input's order (module docstring)."""
    p = _floats("pvalues", pvalues)
    if any(not 0 <= v <= 1 for v in p):
        raise ValueError(f"pvalues must lie in [0, 1], got {p}")
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def min_detectable_difference(std_diff: float, n: int, *, alpha: float = 0.05, power: float = 0.8,
                              test: str | None = None) -> float:
    """The smallest mean paired difference a two-sided test at ``alpha`` detects with probability ``power`` given
    the per-seed differences' standard deviation ``std_diff`` and ``n`` seeds: the normal approximation, or for
    ``test`` (one of :data:`MDD_TESTS`) that test's rule (module docstring; ``math.inf`` when the test can never
    reach ``alpha`` with ``n`` seeds). E.g. 8 seeds, sd 1, α = 0.05, 80 % power: 0.991 (normal), 1.153
    (``paired_test``)."""
    from statistics import NormalDist

    if isinstance(n, bool) or not (isinstance(n, int) and n >= 2):
        raise ValueError(f"n must be an int >= 2 (seeds), got {n!r}")
    if isinstance(std_diff, bool) or not isinstance(std_diff, (int, float)) or \
            not (math.isfinite(std_diff) and std_diff >= 0):
        raise ValueError(f"std_diff must be a finite number >= 0, got {std_diff!r}")
    for name, v in (("alpha", alpha), ("power", power)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise ValueError(f"{name} must be a number in (0, 1), got {v!r}")
    if test is not None and test not in MDD_TESTS:
        raise ValueError(f"test must be one of {', '.join(MDD_TESTS)} (or None: the normal approximation), "
                         f"got {test!r}")
    z = NormalDist().inv_cdf
    if test is None:
        return (z(1 - alpha / 2) + z(power)) * std_diff / math.sqrt(n)
    if test == "sign_test_p":
        rejected = [k for k in range(n + 1) if sign_test_p(k, n - k) <= alpha]
        if not rejected:
            return math.inf

        def reach(pi: float) -> float:  # the power at win probability pi (both tails; it rises with pi >= 1/2)
            return sum(math.comb(n, k) * pi ** k * (1 - pi) ** (n - k) for k in rejected)

        if reach(1.0) < power:
            return math.inf
        lo, hi = 0.5, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if reach(mid) < power else (lo, mid)
        return z(min(hi, 1 - 1e-15)) * std_diff
    if test in ("permutation_p", "censored_paired_test") and 2 / 2 ** n > alpha:
        return math.inf
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(float(power), n - 1)) * std_diff / math.sqrt(n)


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
    Returns ``{"n", "mean_diff", "std_diff", "t", "p", "wins", "losses", "ties", "p_sign", "ci95", "d_z"}``:
    ``ci95`` the 95 % interval of the mean difference, ``d_z`` = mean / sd (±inf or 0 without spread).
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
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    d_z = t / math.sqrt(n) if math.isfinite(t) else t
    return {"n": n, "mean_diff": m, "std_diff": sd, "t": t, "p": p, "wins": wins, "losses": losses,
            "ties": n - wins - losses, "p_sign": sign_test_p(wins, losses), "ci95": [m - half, m + half], "d_z": d_z}


def paired_statement(test: dict[str, float], label: str, base: str, *, alpha: float = 0.05, digits: int = 2) -> str:
    """One line for a :func:`paired_test` result of ``label`` against ``base``, e.g. "DiffViT − ViT = +1.20 ± 0.40
    (t-test p = 0.031, sign test p = 0.25, higher on 3 of 3 seeds): DiffViT higher than ViT (p < 0.05)"."""
    lo, hi = test.get("ci95", (math.nan, math.nan))
    p = test.get("p_holm", test["p"])
    holm_note = f", Holm-adjusted p = {p:.3f}" if "p_holm" in test else ""
    head = (f"{label} − {base} = {test['mean_diff']:+.{digits}f} ± {test['std_diff']:.{digits}f} "
            f"[95 % CI {lo:+.{digits}f}, {hi:+.{digits}f}; d_z = {test.get('d_z', math.nan):+.2f}] "
            f"(t-test p = {test['p']:.3f}{holm_note}, sign test p = {test['p_sign']:.2f}, higher on "
            f"{test['wins']} of {test['n']} seeds)")
    if p < alpha:
        return f"{head}: {label} {'higher' if test['mean_diff'] > 0 else 'lower'} than {base} (p < {alpha:g})"
    return f"{head}: no significant difference at p < {alpha:g}"


def permutation_p(d: Sequence[float]) -> float:
    """Exact two-sided paired sign-flip permutation p-value of the differences ``d`` (Fisher 1935; Pitman 1937): the
    share of the 2^n sign patterns whose |sum| is at least the observed |sum| (n ≤ 20; all-zero d gives 1.0)."""
    ds = _floats("d", d)
    n = len(ds)
    if n > 20:
        raise ValueError(f"the exact permutation test enumerates 2^n patterns; n must be <= 20, got {n}")
    observed = abs(sum(ds))
    tol = 1e-9 * max(1.0, sum(abs(v) for v in ds))
    hits = 0
    for mask in range(2 ** n):
        total = sum(-v if mask >> i & 1 else v for i, v in enumerate(ds))
        hits += abs(total) >= observed - tol
    return hits / 2 ** n


def _steps(name: str, values: Sequence[int | float | None], budget: float) -> list[float | None]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of steps (None: never reached), got {type(values).__name__}")
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v > budget:
            raise ValueError(f"{name} must hold steps in [0, budget {budget:g}] or None (never reached), got {v!r}")
        out.append(float(v))
    return out


def censored_paired_test(x: Sequence[int | float | None], y: Sequence[int | float | None],
                         budget: int | float) -> dict[str, Any]:
    """Paired comparison of steps-to-threshold ``x`` against ``y`` (one per seed, same order; None: the seed never
    reached the threshold within ``budget`` steps, right-censored there), module docstring.

    Returns ``{"n", "budget", "reached_x", "reached_y", "restricted_x", "restricted_y", "mean_diff", "std_diff",
    "ci95", "p", "wins", "losses", "ties", "p_gehan", "test"}``: ``mean_diff`` the mean of the restricted differences
    min(x, B) − min(y, B) with its t interval ``ci95`` (descriptive: a censored seed is a bound, not a value),
    ``p`` the exact paired permutation p on them, ``wins`` / ``losses`` / ``ties`` the paired Gehan scores (x surely
    later / surely earlier / order unknown or equal) and ``p_gehan`` their exact sign-test p."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of steps, got {budget!r}")
    xs, ys = _steps("x", x, budget), _steps("y", y, budget)
    if len(xs) != len(ys):
        raise ValueError(f"x and y must hold one value per seed each, got {len(xs)} and {len(ys)} values")
    if len(xs) < 2:
        raise ValueError(f"a paired test needs at least 2 seeds, got {len(xs)}")
    rx = [budget if v is None else v for v in xs]
    ry = [budget if v is None else v for v in ys]
    d = [a - b for a, b in zip(rx, ry)]
    n = len(d)
    m, sd = mean_std(d)
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    wins = losses = 0
    for a, b in zip(xs, ys):
        if b is not None and (a is None or a > b):
            wins += 1
        elif a is not None and (b is None or b > a):
            losses += 1
    return {"n": n, "budget": budget, "reached_x": sum(v is not None for v in xs),
            "reached_y": sum(v is not None for v in ys), "restricted_x": rx, "restricted_y": ry, "mean_diff": m,
            "std_diff": sd, "ci95": [m - half, m + half], "p": permutation_p(d), "wins": wins, "losses": losses,
            "ties": n - wins - losses, "p_gehan": sign_test_p(wins, losses),
            "test": "paired permutation on steps censored at the budget; paired Gehan scores"}
