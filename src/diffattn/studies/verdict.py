"""The one list of verdicts a study may give a paper's claim, and the rule that derives a verdict from the statistics.

A claim is a paper's statement that a variant differs from its baseline in one direction on one metric, optionally
with the size the paper reports in the study's units (:class:`PaperEffect`). A study's paired test of that metric
(:func:`~diffattn.studies.stats.paired_test`, Holm-adjusted over its table) gives the mean difference, its 95 %
interval and the adjusted p; :func:`derive_verdict` turns them into exactly one of:

- ``reproduced``: Holm-adjusted p < α and the mean difference in the paper's direction;
- ``opposite``: Holm-adjusted p < α and the mean difference against the paper's direction;
- ``null that excludes the paper's effect size``: not significant, and the 95 % interval of the difference excludes
  the size the paper reports (the interval's end on the paper's side lies short of it). The size is stated beside
  the verdict (:func:`verdict_text`). Without a reported size in the study's units this verdict is not available;
- ``inconclusive``: anything else, and always when the baseline failed its control (no test), when there is no
  test, or when the comparison is confounded: a mechanism (attention mass, outliers) compared between models that
  do not all solve the task, where any difference may be the difference between solving it and not.

The interval is the unadjusted 95 % interval of the paired mean difference (t with n − 1 degrees of freedom),
the p-value Holm-adjusted (Holm 1979): a null excludes the paper's size only when the unadjusted interval already
does, which is the lenient side for a null; the p used for the two significant verdicts is the strict one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["Verdict", "VERDICTS", "PaperEffect", "derive_verdict", "verdict_text", "verdict_of_test"]


class Verdict(str, Enum):
    """The four verdicts (module docstring); the value is the text the reports and docs print."""

    REPRODUCED = "reproduced"
    OPPOSITE = "opposite"
    NULL_EXCLUDES = "null that excludes the paper's effect size"
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value


#: the verdict texts, in the order above: nothing else may stand as a verdict in a report, docs/studies.md or README
VERDICTS: tuple[str, ...] = tuple(v.value for v in Verdict)


@dataclass(frozen=True)
class PaperEffect:
    """A paper's claim on one metric: ``direction`` +1 when the paper reports the variant higher than its baseline,
    −1 lower; ``size`` the difference (variant − baseline) the paper reports, in the study's units and with that
    sign (None: the paper gives none in these units); ``source`` where it says so, e.g. "Ye et al. 2024, Table 2";
    ``unit`` how the size is printed ("points", "% of the baseline's steps", "")."""

    direction: int
    source: str
    size: float | None = None
    unit: str = ""

    def __post_init__(self):
        if self.direction not in (1, -1) or isinstance(self.direction, bool):
            raise ValueError(f"direction must be +1 or -1, got {self.direction!r}")
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"source must name where the paper reports the effect, got {self.source!r}")
        if self.size is not None:
            if isinstance(self.size, bool) or not isinstance(self.size, (int, float)) or \
                    not math.isfinite(self.size) or self.size == 0:
                raise ValueError(f"size must be a finite non-zero number or None, got {self.size!r}")
            if (self.size > 0) != (self.direction > 0):
                raise ValueError(f"size {self.size!r} must have the sign of direction {self.direction!r}")

    def size_text(self) -> str:
        """The paper's size as printed beside a null, e.g. "+14.8 points, Ye et al. 2024, Table 2"."""
        if self.size is None:
            return f"no size in these units, {self.source}"
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.size:+.3g}".replace("-", "−") + f"{unit}, {self.source}"


def derive_verdict(effect: float | None, ci: Sequence[float] | None, p_holm: float | None, paper: PaperEffect, *,
                   alpha: float = 0.05, control_passed: bool = True, confounded: bool = False) -> Verdict:
    """The verdict on ``paper``'s claim from the paired mean difference ``effect`` (variant − baseline), its 95 %
    interval ``ci`` (low, high) and its Holm-adjusted ``p_holm`` (module docstring). Any of them None, a failed
    control or a ``confounded`` comparison (a mechanism compared between models that do not all solve the task)
    gives ``inconclusive``."""
    if not isinstance(paper, PaperEffect):
        raise TypeError(f"paper must be a PaperEffect, got {paper!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if not control_passed or confounded or effect is None or ci is None or p_holm is None:
        return Verdict.INCONCLUSIVE
    lo, hi = (float(v) for v in ci)
    effect, p_holm = float(effect), float(p_holm)
    if any(math.isnan(v) for v in (effect, lo, hi, p_holm)):
        return Verdict.INCONCLUSIVE
    if lo > hi:
        raise ValueError(f"ci must be (low, high), got {ci!r}")
    if p_holm < alpha and effect != 0:
        return Verdict.REPRODUCED if (effect > 0) == (paper.direction > 0) else Verdict.OPPOSITE
    if paper.size is not None and (hi < paper.size if paper.size > 0 else lo > paper.size):
        return Verdict.NULL_EXCLUDES
    return Verdict.INCONCLUSIVE


def verdict_of_test(test: Mapping[str, Any] | None, paper: PaperEffect, *, alpha: float = 0.05,
                    control_passed: bool = True) -> Verdict:
    """:func:`derive_verdict` on a :func:`~diffattn.studies.stats.paired_test` result holding ``p_holm`` (None: no
    test, ``inconclusive``)."""
    if not test:
        return Verdict.INCONCLUSIVE
    return derive_verdict(test.get("mean_diff"), test.get("ci95"), test.get("p_holm", None), paper, alpha=alpha,
                          control_passed=control_passed)


def verdict_text(verdict: Verdict, paper: PaperEffect | None = None) -> str:
    """The verdict as printed: the list's text, with the paper's size beside a null (e.g. "null that excludes the
    paper's effect size (+14.8 points, Ye et al. 2024, Table 2)")."""
    verdict = Verdict(verdict)
    if verdict is Verdict.NULL_EXCLUDES:
        if paper is None or paper.size is None:
            raise ValueError("a null that excludes the paper's effect size needs the paper's size to state")
        return f"{verdict.value} ({paper.size_text()})"
    return verdict.value
