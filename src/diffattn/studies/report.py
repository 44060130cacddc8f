"""Aggregate per-seed results of a study: mean ± std per variant and metric, paired tests against the baseline
(the first variant) with 95 % intervals, effect sizes and Holm's correction over the whole table, and the files
``<out>/results.json`` and ``<out>/report.md``.

Every study states a positive control (:class:`Control`): the level its baseline must reach on the task the models
are compared on. A comparison between models that never learnt the task says nothing about their attention, so when
the baseline misses the level the report says "inconclusive: the baseline did not learn the task" and shows the
means without any test between the models. A study with parts on different tasks states one control per part
(``write_study(control=[...])``, each with the metric keys it ``gates``): a failed control removes the tests of its
own part's metrics only.

Each control is also checked per seed: the baseline's value at that seed against the same level. A seed whose
baseline misses it did not learn the task there; the report marks every seed (``✓`` / ``✗ never learnt``), and a
config that pre-registers ``exclude_failed_seeds: true`` drops those seeds from the paired tests of the metrics the
control gates (the means still cover every seed). ``control_set`` in the config says when and in which commit each
control level was fixed; the report prints it beside the control.

A metric may carry a paper's claim (``Metric.claim``, a :class:`~diffattn.studies.verdict.PaperEffect`): the report
then gives each variant's verdict on it from the fixed list (:mod:`diffattn.studies.verdict`), derived from the
paired test's mean difference, 95 % interval and Holm-adjusted p.

Every report says which registered question it answers (:func:`~diffattn.studies.provenance.registration_status`):
the commit that added the registration and the label of its results, confirmatory (the registered primary endpoint
of a registered run) or exploratory (everything else, and every run that names no registration)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..io import atomic_write_file
from .protocol import protocol_text
from .provenance import registration_status
from .stats import holm, mean_std, paired_statement, paired_test
from .verdict import PaperEffect, Verdict, verdict_of_test, verdict_text

__all__ = ["Metric", "Control", "REPORT_DEFAULTS", "check_control", "lookup", "recorded_chance", "aggregate",
           "markdown_table", "table_cell", "verdict_lines", "control_table", "write_study",
           "read_seed", "write_seed", "run_seeds", "warmup_text"]


@dataclass(frozen=True)
class Metric:
    """One row of a study table: ``name`` (shown), ``key`` (dotted path in a variant's per-seed result),
    ``scale`` (100 shows fractions as %), ``digits``, whether higher is better (None: neither) and ``chance``, what
    guessing uniformly scores, in the result's units like the values (None: the level the per-seed result records
    under its suite's ``chance``, as ``diffattn eval`` does, else no chance level); ``claim``: the paper's claim on
    this metric (every variant against the baseline), whose verdict the report derives, or None."""

    name: str
    key: str
    scale: float = 1.0
    digits: int = 2
    higher_is_better: bool | None = True
    chance: float | None = None
    claim: PaperEffect | None = None


#: config keys every study accepts beside its budget: they change the report, never a seed's result
#: (``control_set``: when and in which commit the control levels were fixed, printed beside each control;
#: ``exclude_failed_seeds``: pre-registered, drop the seeds whose baseline missed its control from the paired tests;
#: ``registrations``: the registered questions the run answers, :mod:`.provenance`)
REPORT_DEFAULTS: dict[str, Any] = {"control_set": "", "exclude_failed_seeds": False, "registrations": []}


@dataclass(frozen=True)
class Control:
    """A study's positive control: the baseline's mean over seeds of ``key`` (a dotted path in its per-seed result,
    times ``scale``) must reach ``threshold`` (at least it when ``higher_is_better``, at most it otherwise) before
    any model is compared with it. ``name`` says what is measured, e.g. "Transformer needle accuracy at the trained
    length (%)". ``gates``: the metric keys (dotted prefixes: "lm" gates "lm.ppl") whose tests need this control
    to pass; empty (the default) gates every metric of the study."""

    name: str
    key: str
    threshold: float
    scale: float = 1.0
    higher_is_better: bool = True
    gates: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.threshold, (int, float)) or isinstance(self.threshold, bool) or \
                not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number, got {self.threshold!r}")
        if not isinstance(self.gates, tuple) or not all(isinstance(g, str) and g for g in self.gates):
            raise ValueError(f"gates must be a tuple of metric keys (non-empty str), got {self.gates!r}")

    def gate(self, key: str) -> bool:
        """Whether the tests of the metric ``key`` need this control."""
        return not self.gates or any(key == g or key.startswith(g + ".") for g in self.gates)


def check_control(per_seed: Mapping[int, Mapping[str, Mapping]], control: Control,
                  control_set: str = "") -> dict[str, Any]:
    """``{"name", "key", "threshold", "higher_is_better", "baseline", "values", "mean", "passed", "seeds",
    "failed_seeds", "control_set", "line"}`` for the baseline (the first variant) of ``per_seed`` (seed → variant
    label → result). A baseline without the metric fails the control. ``seeds``: per seed (in order) its value and
    whether the baseline reached the level at that seed; ``failed_seeds``: the seeds where it did not (or has no
    value): the baseline never learnt the task there. ``control_set``: when the level was fixed (printed)."""
    seeds = list(per_seed)
    base = next(iter(per_seed[seeds[0]]))
    raw = [lookup(per_seed[s].get(base, {}), control.key) for s in seeds]
    values = [float(v) * control.scale for v in raw if v is not None]
    mean = sum(values) / len(values) if len(values) == len(raw) else math.nan

    def meets(v: float) -> bool:
        return v >= control.threshold if control.higher_is_better else v <= control.threshold

    passed = bool(values) and len(values) == len(raw) and meets(mean)
    per = [{"seed": s, "value": None if v is None else float(v) * control.scale,
            "passed": v is not None and meets(float(v) * control.scale)} for s, v in zip(seeds, raw)]
    failed_seeds = [p["seed"] for p in per if not p["passed"]]
    rel = "≥" if control.higher_is_better else "≤"
    marks = ", ".join(f"{p['seed']}: " + ("no value ✗ never learnt" if p["value"] is None else
                                          f"{p['value']:.2f} " + ("✓" if p["passed"] else "✗ never learnt"))
                      for p in per)
    line = (f"Control: {control.name} must be {rel} {control.threshold:g}"
            + (f" (set {control_set})" if control_set else "") + f"; {base} reached "
            f"{mean:.2f} (mean over {len(seeds)} seeds, per seed {[round(v, 2) for v in values]}): "
            + ("passed." if passed else "**failed — inconclusive: the baseline did not learn the task**, so no "
                                        "model is compared with it.")
            + f" Per seed: {marks}.")
    if control.gates:
        line = line.replace("so no model is compared with it", f"so no model is compared with it on "
                                                               f"{', '.join(control.gates)}")
    return {"name": control.name, "key": control.key, "threshold": control.threshold,
            "higher_is_better": control.higher_is_better, "gates": list(control.gates), "baseline": base,
            "values": values, "mean": mean, "passed": passed, "seeds": per, "failed_seeds": failed_seeds,
            "control_set": control_set, "line": line}


def lookup(d: Mapping, path: str):
    """``d[a][b]…`` for the dotted ``path`` "a.b…"; a key that itself holds dots ("noise.0.1" → d["noise"]["0.1"])
    is matched whole first."""
    while True:
        if not isinstance(d, Mapping):
            return None
        if path in d:
            return d[path]
        head, _, path = path.partition(".")
        if not path or head not in d:
            return None
        d = d[head]


def recorded_chance(result: Mapping, key: str) -> float | None:
    """The chance level of ``key`` ("suite.group.metric") that ``result`` records under ``result[suite]["chance"]``
    ("group.metric"), as ``diffattn eval``'s results do; None where it records none."""
    head, rest = key, ""
    while "." in head:
        head, _, tail = head.rpartition(".")
        rest = f"{tail}.{rest}" if rest else tail
        level = lookup(result, f"{head}.chance")
        level = level.get(rest) if isinstance(level, Mapping) else None
        if isinstance(level, (int, float)) and not isinstance(level, bool):
            return float(level)
    return None


def aggregate(per_seed: Mapping[int, Mapping[str, Mapping]], metrics: Sequence[Metric], *,
              compare: bool | Callable[[str], bool] = True,
              exclude: Callable[[str], Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """Rows ``{"metric", "key", "scale", "digits", "higher_is_better", "values": {label: [per seed]},
    "summary": {label: {"mean", "std"}}, "vs_baseline": {label: {paired test…, "p_holm", "statement"}}}`` for
    every metric that every variant has at every seed. ``per_seed``: seed → variant label → result (the first
    label is the baseline). ``p_holm`` is Holm's adjustment over every test of the table (all metrics × variants);
    with ``compare=False`` (a failed control) ``vs_baseline`` stays empty, and so it does for the metrics whose key
    a callable ``compare`` rejects. ``exclude(key)``: the seeds left out of that metric's paired tests (the
    pre-registered exclusion of seeds whose baseline missed its control; recorded as ``"excluded_seeds"``)."""
    seeds = list(per_seed)
    labels = list(per_seed[seeds[0]])
    base = labels[0]
    rows = []
    for m in metrics:
        vals = {lab: [lookup(per_seed[s].get(lab, {}), m.key) for s in seeds] for lab in labels}
        if any(v is None for vs in vals.values() for v in vs):
            continue
        values = {lab: [float(v) * m.scale for v in vs] for lab, vs in vals.items()}
        chance = m.chance if m.chance is not None else recorded_chance(per_seed[seeds[0]][base], m.key)
        row = {"metric": m.name, "key": m.key, "scale": m.scale, "digits": m.digits,
               "higher_is_better": m.higher_is_better, "chance": None if chance is None else chance * m.scale,
               "values": values, "claim": None if m.claim is None else asdict(m.claim),
               "summary": {lab: dict(zip(("mean", "std"), mean_std(v))) for lab, v in values.items()},
               "vs_baseline": {}}
        tested = compare(m.key) if callable(compare) else compare
        dropped = set(exclude(m.key)) if exclude is not None else set()
        keep = [i for i, s in enumerate(seeds) if s not in dropped]
        row["excluded_seeds"] = [s for s in seeds if s in dropped]
        for lab in labels[1:] if tested and len(keep) >= 2 else ():
            row["vs_baseline"][lab] = paired_test([values[lab][i] for i in keep], [values[base][i] for i in keep])
        rows.append(row)
    tests = [(r, lab) for r in rows for lab in r["vs_baseline"]]
    for (r, lab), p in zip(tests, holm([r["vs_baseline"][lab]["p"] for r, lab in tests]) if tests else []):
        test = r["vs_baseline"][lab]
        test["p_holm"] = p
        test["statement"] = paired_statement(test, lab, base, digits=r["digits"])
    return rows


def table_cell(text: str) -> str:
    """``text`` safe inside a markdown table cell: its pipes escaped (as in \\|h\\|), once."""
    return text.replace("\\|", "|").replace("|", "\\|")


def markdown_table(rows: Sequence[Mapping], labels: Sequence[str], n_seeds: int, protocol: str | None = None) -> str:
    """Metric × variant table of mean ± std, with the baseline-relative paired t-test p-value (Holm-adjusted over
    the table) per cell when the rows hold tests, and a chance column when any row has a chance level. ``protocol``
    ("a", "b"; :mod:`.protocol`) is named in the header when given (:func:`write_study` always gives it)."""
    with_chance = any(r.get("chance") is not None for r in rows)
    named = f"; protocol ({protocol})" if protocol else ""
    lines = [f"| metric (mean ± std over {n_seeds} seeds{named}) | " + " | ".join(labels)
             + (" | chance |" if with_chance else " |"),
             "|---|" + "---:|" * (len(labels) + with_chance)]
    for r in rows:
        d = r["digits"]
        arrow = {True: " ↑", False: " ↓", None: ""}[r["higher_is_better"]]
        cells = []
        for lab in labels:
            s = r["summary"][lab]
            cell = f"{s['mean']:.{d}f} ± {s['std']:.{d}f}"
            if lab in r["vs_baseline"]:
                cell += f" (p_Holm = {r['vs_baseline'][lab]['p_holm']:.2f})"
            cells.append(cell)
        if with_chance:
            cells.append("" if r.get("chance") is None else f"{r['chance']:.{d}f}")
        lines.append(f"| {r['metric']}{arrow} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def warmup_text(steps: int, warmup: int) -> str:
    """How a report states the schedule: "warm-up 50 then cosine", or for a warm-up that outlasts the budget what
    really ran ("linear warm-up over all 20 steps (warmup_steps 50), no cosine decay")."""
    if warmup >= steps:
        return f"linear warm-up over all {steps} steps (warmup_steps {warmup}: lr reached {steps / warmup:.0%} of " \
               f"its peak), no cosine decay"
    return f"warm-up {warmup} then cosine"


def _controls(control: Control | Sequence[Control]) -> list[Control]:
    controls = [control] if isinstance(control, Control) else list(control) if isinstance(control, (list, tuple)) \
        else None
    if not controls or not all(isinstance(c, Control) for c in controls):
        raise TypeError(f"control must be a Control or a non-empty list of Controls (the level the baseline must "
                        f"reach before any comparison), got {control!r}")
    return controls


def verdict_lines(rows: Sequence[Mapping], labels: Sequence[str], failed_keys: Callable[[str], bool]) -> \
        tuple[list[str], list[dict[str, Any]]]:
    """The verdict of every variant on every metric that carries a paper's claim (``row["claim"]``), from its
    paired test (:func:`~diffattn.studies.verdict.verdict_of_test`; ``inconclusive`` where ``failed_keys(key)``: its
    control failed). Returns the markdown lines and ``[{"metric", "variant", "verdict", "text", "claim"}]``."""
    lines, out = [], []
    for r in rows:
        if not r.get("claim"):
            continue
        paper = PaperEffect(**r["claim"])
        for lab in labels[1:]:
            verdict = verdict_of_test(r["vs_baseline"].get(lab), paper, control_passed=not failed_keys(r["key"]))
            text = verdict_text(verdict, paper)
            out.append({"metric": r["metric"], "variant": lab, "verdict": verdict.value, "text": text,
                        "claim": r["claim"]})
            test = r["vs_baseline"].get(lab)
            stats = (f"{test['mean_diff']:+.{r['digits']}f} [{test['ci95'][0]:+.{r['digits']}f}, "
                     f"{test['ci95'][1]:+.{r['digits']}f}], Holm p {test['p_holm']:.3f}") if test else "no test"
            lines.append(f"- {r['metric']}, {lab} − {labels[0]} ({paper.source}; the paper: "
                         f"{'higher' if paper.direction > 0 else 'lower'}): {stats} → **{text}**")
    return lines, out


def control_table(checked: Sequence[Mapping]) -> list[str]:
    """Markdown table: one row per seed, per control the baseline's value and ✓ (passed at that seed) or
    ✗ never learnt."""
    seeds = [p["seed"] for p in checked[0]["seeds"]]
    head = "| seed | " + " | ".join(c["name"] for c in checked) + " |"
    lines = [head, "|---:|" + "---|" * len(checked)]
    for i, s in enumerate(seeds):
        cells = []
        for c in checked:
            p = c["seeds"][i]
            value = "no value" if p["value"] is None else f"{p['value']:.2f}"
            cells.append(f"{value} {'✓' if p['passed'] else '✗ never learnt'}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def write_study(out: str | Path, cfg: Mapping, title: str, intro: str, per_seed: Mapping[int, Mapping],
                metrics: Sequence[Metric], seconds: float, extra_sections: Sequence[str] = (), *,
                control: Control | Sequence[Control]) -> dict[str, Any]:
    """Check the ``control`` (:func:`check_control`, per seed too; a list: one per part of the study, each gating
    its own metrics), aggregate ``per_seed`` (:func:`aggregate`; tests only for the metrics whose controls passed,
    without the seeds that missed their control when the config pre-registers ``exclude_failed_seeds``), derive
    the verdict of every claimed metric (:func:`verdict_lines`), write ``<out>/results.json`` and
    ``<out>/report.md``; returns ``{"rows", "table", "seconds", "report", "results", "control"}``, ``"control"`` the
    checked control (a list for a list). ``results["control_status"]`` is "passed" when every control passed,
    "failed" when none did, "partly failed" otherwise; ``results["verdicts"]`` the verdicts."""
    out = Path(out)
    controls = _controls(control)
    control_set = str(cfg.get("control_set", "") or "")
    checked = [check_control(per_seed, c, control_set) for c in controls]
    failed = [c for c, r in zip(controls, checked) if not r["passed"]]
    exclude_failed = bool(cfg.get("exclude_failed_seeds", False))

    def excluded(key: str) -> list[int]:
        if not exclude_failed:
            return []
        return sorted({s for c, r in zip(controls, checked) if c.gate(key) for s in r["failed_seeds"]})

    def gated_by_failed(key: str) -> bool:
        return any(c.gate(key) for c in failed)

    rows = aggregate(per_seed, metrics, compare=lambda key: not gated_by_failed(key), exclude=excluded)
    labels = list(next(iter(per_seed.values())))
    table = markdown_table(rows, labels, len(per_seed), cfg.get("protocol", "a"))
    n = len(per_seed)
    n_tests = sum(len(r["vs_baseline"]) for r in rows)
    untested = [r["metric"] for r in rows if not r["vs_baseline"]] if failed else []
    dropped = sorted({s for r in rows for s in r.get("excluded_seeds", [])})
    never = sorted({s for r in checked for s in r["failed_seeds"]})
    if never:
        seeds_note = (f"Seeds whose baseline missed its control (never learnt): {never}; "
                      + (f"excluded from the paired tests of the metrics their control gates (pre-registered "
                         f"`exclude_failed_seeds`): {dropped}." if exclude_failed else
                         "kept in the paired tests (the config does not pre-register their exclusion)."))
    else:
        seeds_note = "The baseline passed its control on every seed."
    registered = registration_status(cfg)
    names = dict(zip(cfg.get("variants") or [], labels))  # variant name → label
    for r in rows:  # the registered primary endpoints of a confirmatory run; every other test is exploratory
        r["confirmatory"] = [names.get(e["comparison"].get("variant")) for e in registered["registrations"]
                             if e["confirmatory"] and e["primary_endpoint"] == r["key"]
                             and names.get(e["comparison"].get("baseline")) == labels[0]]
    if n_tests:
        tests = [f"- {r['metric']}: " + "; ".join(
            f"({'confirmatory' if lab in r['confirmatory'] else 'exploratory'}) {v['statement']}"
            for lab, v in r["vs_baseline"].items()) for r in rows if r["vs_baseline"]]
        body = [f"Cells: mean ± sample std over seeds, and the two-sided paired t-test p-value against {labels[0]}, "
                f"Holm-adjusted over the {n_tests} tests of the table (↑ higher is better, ↓ lower is better)."
                + (f" No test for {', '.join(untested)}: their control failed." if untested else ""), "", table, "",
                f"## Paired over seeds: each variant minus {labels[0]}", "",
                "Mean difference ± std over seeds, its 95 % interval (t with n − 1 degrees of freedom) and Cohen's "
                "d_z; a verdict uses the Holm-adjusted p.", "", *tests, "",
                f"With {n} seeds the sign test cannot go below p = {2 / 2 ** n:.3g} and the t-test has {n - 1} "
                f"degrees of freedom: only large, consistent differences survive the correction."]
    else:
        body = ["Cells: mean ± sample std over seeds. No test between the models: the baseline failed the "
                "control.", "", table]
    verdicts_md, verdicts = verdict_lines(rows, labels, gated_by_failed)
    if verdicts_md:
        body += ["", "## Verdicts on the papers' claims", "",
                 "One of: " + ", ".join(v.value for v in Verdict) + " (diffattn.studies.verdict: from the mean "
                 "difference, its 95 % interval and the Holm-adjusted p; a null names the paper's size).", "",
                 *verdicts_md]
    status = "passed" if not failed else "failed" if len(failed) == len(controls) else "partly failed"
    report = "\n".join([
        f"# {title}", "", intro, "", protocol_text(cfg, labels[0]), "", *registered["lines"], "",
        f"Seeds {list(per_seed)}; wall time {seconds / 60:.1f} min.", "",
        *(r["line"] for r in checked), "", "Per-seed control status (✓ passed at that seed):", "",
        *control_table(checked), "", seeds_note, "", f"Controls: {status}.", "", *body, "", *extra_sections, ""])
    with atomic_write_file(out / "report.md", "w") as f:
        f.write(report)
    ctrl = checked[0] if isinstance(control, Control) else checked
    results = {"study": cfg.get("study"), "config": dict(cfg), "labels": labels, "seeds": list(per_seed),
               "control": ctrl, "control_status": status, "verdicts": verdicts, "rows": rows,
               "registration": {k: registered[k] for k in ("label", "registrations")},
               "per_seed": {str(s): v for s, v in per_seed.items()}, "seconds": round(seconds, 1)}
    with atomic_write_file(out / "results.json", "w") as f:
        json.dump(results, f, indent=1, default=float)
    return {"rows": rows, "table": table, "seconds": seconds, "report": str(out / "report.md"), "results": results,
            "control": ctrl}


def _budget(cfg: Mapping) -> dict[str, Any]:
    """The config without the keys that do not change a seed's result (seeds, out, and the report's keys
    :data:`REPORT_DEFAULTS`)."""
    return {k: v for k, v in cfg.items() if k not in ("seeds", "out", *REPORT_DEFAULTS)}


def read_seed(folder: str | Path, cfg: Mapping) -> dict | None:
    """The per-variant results saved in ``<folder>/seed_results.json`` by :func:`write_seed` for the same budget
    (the config minus seeds and out), else None: a finished seed is not recomputed when a study is re-run."""
    path = Path(folder) / "seed_results.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if saved.get("budget") != json.loads(json.dumps(_budget(cfg), default=float)):
        return None
    return saved["results"]


def write_seed(folder: str | Path, cfg: Mapping, results: Mapping) -> None:
    """Save one seed's per-variant results with the budget that produced them (:func:`read_seed`)."""
    with atomic_write_file(Path(folder) / "seed_results.json", "w") as f:
        json.dump({"budget": _budget(cfg), "results": results}, f, indent=1, default=float)


def run_seeds(cfg: Mapping, compute: Callable[[int, Path], dict]) -> dict[int, dict]:
    """Every seed of ``cfg``: its per-variant results read back from ``<out>/seed<k>/`` when they were computed with
    this budget (:func:`read_seed`), else ``compute(seed, folder)``, saved at once (:func:`write_seed`) so that a
    killed study resumes at the first unfinished seed."""
    per_seed: dict[int, dict] = {}
    for seed in cfg["seeds"]:
        folder = Path(cfg["out"]) / f"seed{seed}"
        res = read_seed(folder, cfg)
        if res is None:
            res = compute(seed, folder)
            write_seed(folder, cfg, res)
        per_seed[seed] = res
    return per_seed
