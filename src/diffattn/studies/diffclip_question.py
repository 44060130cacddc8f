"""The question the DiffCLIP demo and study answer, pre-registered on 2026-11-27 before any run of it: does DiffCLIP
retrieve held-out pairs of its own training distribution better than CLIP trained on the same data, seed and budget
(Hammoud & Ghanem 2025, §4)?

The metric is the mean recall of :func:`heldout_retrieval` (R@1, R@5 and R@10,
image→text and text→image, averaged per pair) on the 222 held-out pairs of the two training sets. Its control
(:data:`CONTROL`): the baseline must reach twice chance (9.6 %; chance 4.8 %). The verdict (:func:`verdict`) is one
of :data:`~diffattn.studies.verdict.VERDICTS`: the demo (one seed, :func:`compare_to_baseline`) tests the difference
paired over the 222 held-out pairs, the study (:func:`study_answer`) paired over seeds.
"""

from __future__ import annotations

from typing import Any

import torch

from ..data import get_dataset
from ..eval.retrieval import hits_at_k
from . import claims
from .report import Control, check_control
from .stats import paired_test
from .verdict import VERDICTS, Verdict, derive_verdict

__all__ = ["DEMO_PAIR_SETS", "HELDOUT_KS", "heldout_retrieval", "QUESTION", "PAPER_EFFECT", "CONTROL", "VERDICTS",
           "verdict", "why", "compare_to_baseline", "study_answer"]

#: the image–caption sets the demo trains on, whose test splits hold the question's held-out pairs
DEMO_PAIR_SETS = ("tuxpaint_captions", "emoji")

#: the recall depths averaged by :func:`heldout_retrieval`
HELDOUT_KS = (1, 5, 10)


@torch.no_grad()
def heldout_retrieval(model) -> dict[str, Any]:
    """The demo's question metric (:data:`QUESTION`): image↔text retrieval on the held-out pairs of the training
    distribution, the test splits of the Tux Paint stamps (91 pairs) and the emoji (131), each split its own
    gallery. Each pair scores the mean of its six hits (R@1, R@5, R@10; image→text and text→image; ties count
    against the query, :func:`~diffattn.eval.retrieval.hits_at_k`), so the mean over pairs is the mean recall
    (RSUM / 6). Returns ``{"mean_recall", "per_pair" (one score per pair, Tux Paint first), "sets": {name:
    {"pairs", "mean_recall", "chance"}}, "chance": {"mean_recall": …}}`` (fractions); chance is what a random
    ranking scores, k / n averaged over the ks and pairs."""
    model.eval()
    per_pair: list[float] = []
    sets: dict[str, dict] = {}
    chance_sum = 0.0
    for name in DEMO_PAIR_SETS:
        ds = get_dataset(name, split="test")
        n = len(ds)
        imgs = torch.stack([model.eval_transform(ds.load_image(i)) for i in range(n)])  # (n, 3, S, S)
        f = torch.cat([model.encode_image(imgs[i:i + 256]).float() for i in range(0, n, 256)])  # (n, E)
        t = torch.cat([model.encode_text(model.tokenizer(ds.captions[i:i + 256])).float()
                       for i in range(0, n, 256)])[:n]  # (n, E)
        sim = torch.nn.functional.normalize(f.double(), dim=-1) @ torch.nn.functional.normalize(t.double(), dim=-1).t()
        correct = torch.eye(n, dtype=torch.bool)  # pair i: image i and caption i
        hits = torch.stack([h for k in HELDOUT_KS for h in (hits_at_k(sim, correct, k),
                                                            hits_at_k(sim.t(), correct, k))]).double()  # (6, n)
        scores = hits.mean(dim=0).tolist()
        chance = sum(min(k, n) for k in HELDOUT_KS) / len(HELDOUT_KS) / n
        sets[name] = {"pairs": n, "mean_recall": sum(scores) / n, "chance": chance}
        per_pair += scores
        chance_sum += chance * n
    return {"mean_recall": sum(per_pair) / len(per_pair), "per_pair": per_pair, "sets": sets,
            "chance": {"mean_recall": chance_sum / len(per_pair)}}


#: the demo's question, pre-registered on 2026-11-27 before any run of it (module docstring)
QUESTION: dict[str, Any] = {
    "registered": "2026-11-27",
    "text": "Does DiffCLIP retrieve held-out pairs of its own training distribution better than CLIP trained on "
            "the same data, seed and budget (Hammoud & Ghanem 2025, §4: DiffCLIP ahead on image–text "
            "retrieval)?",
    "metric": "held-out retrieval mean recall: R@1, R@5, R@10, image→text and text→image, averaged over the 222 "
              "held-out pairs (91 Tux Paint test pairs, 131 emoji test pairs, each split its own gallery)",
    "key": "primary.mean_recall",
    "baseline": "clip", "variant": "diffclip",
    "test": "demo (one seed): two-sided paired t-test over the 222 held-out pairs of the per-pair score "
            "difference, with its 95 % interval; study: the same metric paired over seeds. α = 0.05, one "
            "pre-registered test per variant, so no multiplicity correction for it",
}
#: the paper's effect a null must exclude, in points of mean recall (:data:`diffattn.studies.claims.DIFFCLIP_RETRIEVAL`:
#: the paper gives no retrieval gain in these units; +2 points, fixed before the run, is the order of its headline
#: gains; its Table 2 at CC3M gives +1.2 image and +1.8 text retrieval R@5)
PAPER_EFFECT = claims.DIFFCLIP_RETRIEVAL.size
#: the positive control, pre-registered with :data:`QUESTION`: the baseline's held-out retrieval mean recall at
#: least twice chance (chance (1 + 5 + 10) / 3 / n averaged over the 222 pairs = 4.80 %; 2 × = 9.6 %)
CONTROL = Control("baseline held-out retrieval mean recall (%; R@1/5/10 both directions over the 222 held-out "
                  "Tux Paint + emoji pairs, chance 4.8 %)", "primary.mean_recall", 9.6, scale=100.0)


def verdict(test: dict[str, Any] | None, control_passed: bool, alpha: float = 0.05) -> str:
    """One of :data:`VERDICTS` from a :func:`~diffattn.studies.stats.paired_test` of variant − baseline in points
    (None: no test), by :func:`~diffattn.studies.verdict.derive_verdict` against
    :data:`~diffattn.studies.claims.DIFFCLIP_RETRIEVAL` with the test's own p (one pre-registered test per variant,
    no multiplicity correction): "inconclusive" when the control failed or there is no test; "reproduced" /
    "opposite" when p < ``alpha``; the null when the upper end of the 95 % interval lies below
    :data:`PAPER_EFFECT`; "inconclusive" otherwise (the interval holds both 0 and the paper's effect)."""
    if not test:
        return Verdict.INCONCLUSIVE.value
    return derive_verdict(test["mean_diff"], test["ci95"], test["p"], claims.DIFFCLIP_RETRIEVAL, alpha=alpha,
                          control_passed=control_passed).value


def why(word: str) -> str:
    """What a tested :func:`verdict` means, for the report line."""
    return {Verdict.REPRODUCED.value: "the variant is ahead, p < 0.05",
            Verdict.OPPOSITE.value: "the variant is behind, p < 0.05",
            Verdict.NULL_EXCLUDES.value: f"no significant difference, and the interval ends below the paper's "
                                         f"+{PAPER_EFFECT:g} points of mean recall",
            Verdict.INCONCLUSIVE.value: f"the interval holds both 0 and the paper's +{PAPER_EFFECT:g}: this budget "
                                        f"cannot tell them apart"}[word]


def _difference_text(lab: str, base: str, test: dict[str, Any], paired_over: str) -> str:
    """The paired difference of the question's metric as the report states it."""
    lo, hi = test["ci95"]
    return (f"{lab} − {base} = {test['mean_diff']:+.2f} points of mean recall, 95 % interval [{lo:+.2f}, {hi:+.2f}], "
            f"p = {test['p']:.3g} (paired t {paired_over}); the paper's effect taken as +{PAPER_EFFECT:g} points.")


def compare_to_baseline(summary: dict[str, dict], seed: int) -> dict[str, Any]:
    """The demo's answer at one seed: :data:`CONTROL` on the first variant (the baseline) and, for every other
    variant, the paired test over the held-out pairs of its per-pair score minus the baseline's (in points) and
    its :func:`verdict`. Returns ``{"control": check_control's dict, "tests": {label: test + "verdict"},
    "lines": the report's lines}``."""
    labels = list(summary)
    base = labels[0]
    control = check_control({seed: summary}, CONTROL)
    value = control["values"][0] if control["values"] else float("nan")
    lines = [f"**Control** (pre-registered {QUESTION['registered']}): {CONTROL.name} must be ≥ {CONTROL.threshold:g}; "
             f"{base} reached {value:.1f} at seed {seed}: "
             + ("**passed**." if control["passed"] else "**failed**, so the verdict is inconclusive: the baseline "
                                                        "did not learn the task."), ""]
    tests: dict[str, Any] = {}
    for lab in labels[1:]:
        a = [100 * v for v in summary[lab]["primary"]["per_pair"]]
        b = [100 * v for v in summary[base]["primary"]["per_pair"]]
        test = paired_test(a, b) if control["passed"] else None
        word = verdict(test, control["passed"])
        tests[lab] = {**(test or {}), "verdict": word}
        if test:
            lines.append(f"**Verdict, {lab} vs {base}: {word}** ({why(word)}). " + _difference_text(
                lab, base, test, f"over the {test['n']} held-out pairs; {test['wins']} pairs higher, "
                                 f"{test['losses']} lower"))
        else:
            lines.append(f"**Verdict, {lab} vs {base}: {word}** (the control failed; no test).")
    if len(labels) < 2:
        lines.append("**Verdict: inconclusive** (one variant: nothing to compare).")
    return {"control": control, "tests": tests, "lines": lines}


def study_answer(per_seed: dict[int, dict]) -> str:
    """The report section that answers :data:`QUESTION` over seeds, at the top of the study's report: for every
    variant but the first, the paired test over seeds of its held-out retrieval mean recall minus the baseline's (in
    points; the pre-registered test, not Holm-adjusted with the table's secondary metrics) and its :func:`verdict`,
    inconclusive when :data:`CONTROL` fails on the baseline's mean over seeds (the control line follows the
    section, as in every study report)."""
    control = check_control(per_seed, CONTROL)
    labels = list(next(iter(per_seed.values())))
    base, n = labels[0], len(per_seed)
    lines = [f"## The question (pre-registered {QUESTION['registered']})", "", QUESTION["text"] + " Metric: "
             + QUESTION["metric"] + f"; paired over the {n} seeds. Control: below.", ""]
    for lab in labels[1:]:
        a, b = ([100 * per_seed[s][v]["primary"]["mean_recall"] for s in per_seed] for v in (lab, base))
        test = paired_test(a, b) if control["passed"] and n >= 2 else None
        word = verdict(test, control["passed"])
        if test:
            lines.append(f"- **{lab} vs {base}: {word}** ({why(word)}). " + _difference_text(
                lab, base, test, f"over {n} seeds; higher on {test['wins']} of {n}"))
        else:
            lines.append(f"- **{lab} vs {base}: {word}** (no test: "
                         + ("the control failed)." if not control["passed"] else "fewer than 2 seeds)."))
    return "\n".join(lines)
