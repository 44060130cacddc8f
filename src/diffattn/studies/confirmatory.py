"""The confirmatory results: each registered question's answer, computed from the committed results of its run.

A registration (:mod:`.registration`, ``studies/registrations/<name>.yaml``) fixes the question before the run: the
primary endpoint, the compared variants, the test, the Holm family, the seeds, the control and the paper's effect.
Its run's ``results.json`` and ``report.md`` are committed in ``studies/results/<name>/`` after the registration
(:func:`~diffattn.studies.provenance.results_descend_errors` checks the order), with ``run.json`` saying which
library commit trained it, the command and its wall time. This module reads them back and derives, by code only:

- the per-seed values of the primary endpoint for the variant and its baseline, in the registered seed order;
- the registered test (:func:`~diffattn.studies.stats.paired_test`, or
  :func:`~diffattn.studies.stats.censored_paired_test` for steps to a level, censored at the step budget);
- Holm's adjustment over the registration's family: the primary endpoints of the registrations it names, a member
  without committed results counted at p = 1 (the family never shrinks after the fact);
- the control on the mean over the seeds (failed: inconclusive, no test read);
- the verdict (:func:`~diffattn.studies.verdict.derive_verdict`) against the registered paper effect;
- the label: confirmatory when the run was a confirmatory run of the registration (its ``results.json`` says so:
  the registration was committed and the run used the registered study and seeds) and no deviation in
  ``studies/deviations.md`` made it exploratory.

``diffattn study-summary`` renders :func:`render_confirmatory_table` into docs/studies.md and :func:`render_readme`
into README.md; ``--check`` (run by the tests) fails when either differs from the committed results.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .config import study_for
from .provenance import REGISTRATIONS, RESULTS
from .registration import Registration, load_registrations
from .report import table_cell
from .stats import censored_paired_test, holm, mean_std, paired_test
from .verdict import PaperEffect, Verdict, derive_verdict

__all__ = ["DEVIATIONS", "endpoint_values", "deviation_rows", "answer", "answers", "render_confirmatory_table",
           "render_readme", "CONFIRMATORY_START", "CONFIRMATORY_END"]

#: the deviations log, relative to the checkout
DEVIATIONS = Path("studies") / "deviations.md"
CONFIRMATORY_START = "<!-- confirmatory:start (rendered by `diffattn study-summary` from studies/results/) -->"
CONFIRMATORY_END = "<!-- confirmatory:end -->"


def endpoint_values(results: Mapping[str, Any], key: str, variant: str) -> list[float | None]:
    """The per-seed values of metric ``key`` for ``variant`` in a study's ``results.json``, in the run's seed order
    (:meth:`~diffattn.studies.base.Study.endpoint_values` of the study that wrote it): points (%) for accuracies and
    areas, steps (None: never reached) for ``steps_to_control``."""
    return study_for(results.get("study"), "results.json").endpoint_values(results, key, variant)


def deviation_rows(root: str | Path) -> list[dict[str, str]]:
    """The rows of the deviations log's table (column name → cell)."""
    path = Path(root) / DEVIATIONS
    if not path.is_file():
        return []
    header, rows = None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def _paper(reg: Registration) -> PaperEffect:
    value = float(reg.paper_effect["value"])
    return PaperEffect(1 if value > 0 else -1, str(reg.paper_effect["source"]), value,
                       str(reg.paper_effect.get("unit", "")))


def _read(root: Path, name: str) -> tuple[dict, dict] | None:
    folder = root / RESULTS / name
    if not (folder / "results.json").is_file():
        return None
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    run = json.loads((folder / "run.json").read_text(encoding="utf-8")) if (folder / "run.json").is_file() else {}
    return results, run


def _test(reg: Registration, results: Mapping) -> dict[str, Any]:
    x = endpoint_values(results, reg.primary_endpoint, reg.variant)
    y = endpoint_values(results, reg.primary_endpoint, reg.baseline)
    if reg.test == "censored_paired_test":
        return {"x": x, "y": y, **censored_paired_test(x, y, results["config"]["steps"])}
    return {"x": x, "y": y, **paired_test(x, y)}


def answer(reg: Registration, root: str | Path, registrations: Mapping[str, Registration]) -> dict[str, Any] | None:
    """The answer to registration ``reg`` from its committed results (module docstring), or None without them."""
    root = Path(root)
    read = _read(root, reg.name)
    if read is None:
        return None
    results, run = read
    if sorted(results["config"]["seeds"]) != sorted(reg.seeds):
        raise ValueError(f"{RESULTS / reg.name}/results.json ran seeds {results['config']['seeds']}, the registration "
                         f"{reg.seeds}")
    test = _test(reg, results)
    family, missing = [], 0
    for member in reg.holm_family:
        if member == reg.name:
            family.append(test["p"])
            continue
        other = registrations.get(member)
        found = _read(root, member) if other is not None else None
        missing += found is None
        family.append(_test(other, found[0])["p"] if found is not None else 1.0)
    p_holm = holm(family)[list(reg.holm_family).index(reg.name)] if reg.name in reg.holm_family else test["p"]
    key, level = reg.control["key"], float(reg.control["level"])
    control = endpoint_values(results, key, reg.baseline)
    control_mean = sum(control) / len(control)
    control_passed = control_mean >= level
    verdict = derive_verdict(test["mean_diff"], test["ci95"], p_holm, _paper(reg), control_passed=control_passed)
    entry = next((e for e in results.get("registration", {}).get("registrations", []) if e["name"] == reg.name), {})
    deviations = [d for d in deviation_rows(root)
                  if reg.name in (n.strip(" `") for n in d.get("registration", "").split(","))]
    exploratory = [d for d in deviations if d.get("effect", "").strip("`* ") == "exploratory"]
    if not entry.get("confirmatory"):
        label, why = "exploratory", entry.get("reason") or "the run did not name this registration"
    elif exploratory:
        label, why = "exploratory", "deviation: " + "; ".join(d.get("done instead", "") for d in exploratory)
    else:
        label, why = "confirmatory", ""
    return {"registration": reg, "results": results, "run": run, "test": test, "p_holm": p_holm,
            "family_size": len(reg.holm_family), "family_missing": missing,
            "control_values": control, "control_mean": control_mean, "control_passed": control_passed,
            "verdict": verdict, "paper": _paper(reg), "label": label, "why": why,
            "registered_in": entry.get("commit"), "deviations": deviations}


def answers(root: str | Path) -> list[dict[str, Any]]:
    """Every registration's answer that has committed results, in the registrations' name order."""
    regs = load_registrations(root)
    out = []
    for name in sorted(regs):
        a = answer(regs[name], root, regs)
        if a is not None:
            out.append(a)
    return out


def _fmt(v: float, digits: int = 1, sign: bool = False) -> str:
    if math.isinf(v):
        return ("+" if v > 0 else "−") + "∞"
    return f"{v:{'+' if sign else ''}.{digits}f}".replace("-", "−")


def _mean_sd(values: Sequence[float | None], budget: int | None) -> str:
    m, sd = mean_std([budget if v is None else v for v in values])
    never = sum(v is None for v in values)
    return f"{_fmt(m)} ± {_fmt(sd)}" + (f" ({never} never, at {budget})" if never else "")


def _row_cells(a: Mapping[str, Any]) -> dict[str, str]:
    reg, t = a["registration"], a["test"]
    budget = a["results"]["config"].get("steps") if reg.test == "censored_paired_test" else None
    unit = reg.paper_effect.get("unit", "")
    run = a["run"]
    stats = (f"{_fmt(t['mean_diff'], sign=True)} [{_fmt(t['ci95'][0], sign=True)}, {_fmt(t['ci95'][1], sign=True)}]"
             + (f", d_z {_fmt(t['d_z'], 2, sign=True)}" if "d_z" in t else "")
             + f", p {t['p']:.3g}, Holm p {a['p_holm']:.3g} (family of {a['family_size']}"
             + (f", {a['family_missing']} without results at p = 1" if a["family_missing"] else "") + ")")
    control = (f"{reg.control['key']} ≥ {reg.control['level']:g}: {_fmt(a['control_mean'])} "
               f"{'✓' if a['control_passed'] else '✗ (inconclusive)'}")
    return {
        "question": f"{reg.name}: `{reg.variant}` − `{reg.baseline}`, {reg.primary_endpoint} ({reg.test})",
        "seeds": f"{len(reg.seeds)} ({reg.seeds[0]}–{reg.seeds[-1]})",
        "values": f"{_mean_sd(t['x'], budget)} vs {_mean_sd(t['y'], budget)}",
        "stats": stats,
        "mdd": f"{reg.mdd:.3g} ({unit})",
        "paper": a["paper"].size_text(),
        "control": control,
        "verdict": f"**{a['verdict'].value}**" + (f" ({a['paper'].size_text()})"
                                                   if a["verdict"] is Verdict.NULL_EXCLUDES else ""),
        "label": a["label"] + (f" ({a['why']})" if a["why"] else
                               f" ({len(a['deviations'])} deviation(s) logged, effect confirmatory)"
                               if a["deviations"] else ""),
        "commits": f"registered {str(a['registered_in'])[:7]}, trained at {str(run.get('library_commit', '?'))[:7]}",
        "command": f"{run.get('command', '?')}, {run.get('wall_minutes', '?')} min",
    }


def render_confirmatory_table(found: Sequence[Mapping[str, Any]]) -> str:
    """The docs/studies.md table of the registered questions answered so far (module docstring)."""
    if not found:
        return "No registered question has committed results yet."
    counts = {v: sum(a["verdict"] is v for a in found) for v in Verdict}
    lines = [f"{len(found)} registered questions with committed results (`{RESULTS}/<registration>/`), each "
             f"registered in `{REGISTRATIONS}/` before its run. Verdicts: "
             + ", ".join(f"{v.value} {n}" for v, n in counts.items() if n) + ".", "",
             "| question: variant − baseline, primary endpoint (test) | seeds | variant vs baseline, mean ± sd | "
             "difference [95 % CI], p | minimum detectable difference | paper's effect | control | verdict | label | "
             "commits | command, wall time |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in found:
        c = _row_cells(a)
        keys = ("question", "seeds", "values", "stats", "mdd", "paper", "control", "verdict", "label", "commits",
                "command")
        lines.append("| " + " | ".join(table_cell(c[k]) for k in keys) + " |")
    return "\n".join(lines)


def render_readme(found: Sequence[Mapping[str, Any]]) -> str:
    """The README's short list: one line per registered question answered (module docstring)."""
    if not found:
        return "No registered question has committed results yet."
    lines = []
    for a in found:
        reg, t = a["registration"], a["test"]
        lines.append(f"- `{reg.variant}` − `{reg.baseline}` on {reg.primary_endpoint} ({len(reg.seeds)} seeds, "
                     f"{a['label']}): {_fmt(t['mean_diff'], sign=True)} [{_fmt(t['ci95'][0], sign=True)}, "
                     f"{_fmt(t['ci95'][1], sign=True)}], Holm p {a['p_holm']:.3g} → **{a['verdict'].value}**"
                     + ("" if a["control_passed"] else f" (the baseline missed its control: {reg.control['key']} "
                                                        f"{_fmt(a['control_mean'])} < {reg.control['level']:g})"))
    return "\n".join(lines)
