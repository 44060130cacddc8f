"""The summary tables of docs/studies.md and README.md, rendered from the recorded statistics in
``docs/study_summary.yaml`` with every verdict derived by :mod:`diffattn.studies.verdict` (never written by hand).

    diffattn study-summary            # rewrite both tables (between their study-summary markers)
    diffattn study-summary --check    # exit 1 when either file differs from the rendering

One row per claim and run: rows that use the same run say so, and a run that two studies share (the needles and
recall studies at width 64: one training stream, one set of seeds) gives one row per claim, not one per study.
Each row's control cell marks every seed (✓ the baseline reached the level at that seed, ✗ never learnt) and says
when the level was set; its verdict is the primary (first) test's; the result cell gives every test with its own
verdict. Steps-to-threshold rows are tested here from the recorded per-seed steps
(:func:`~diffattn.studies.synthetic.steps_to_control_tests`, censored at the budget), and a row with recorded
per-seed values (``paired``) by :func:`~diffattn.studies.stats.paired_test` with Holm over its variants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import claims
from .confirmatory import CONFIRMATORY_END, CONFIRMATORY_START, answers, render_confirmatory_table, render_readme
from .factorial import FACTORIAL_END, FACTORIAL_START, render_factorial
from .probe import PROBE_END, PROBE_START, render_probe
from .report import table_cell
from .stats import holm, paired_test
from .synthetic import steps_to_control_tests
from .verdict import PaperEffect, Verdict, derive_verdict

__all__ = ["load_rows", "render_docs_table", "render_readme_table", "render_files", "START", "END"]

START = "<!-- study-summary:start (rendered by `diffattn study-summary` from docs/study_summary.yaml) -->"
END = "<!-- study-summary:end -->"


def _num(v: float, digits: int, sign: bool = True) -> str:
    return f"{v:{'+' if sign else ''}.{digits}f}".replace("-", "−")


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _claim(name: str) -> PaperEffect:
    paper = getattr(claims, name, None)
    if not isinstance(paper, PaperEffect):
        raise ValueError(f"claim {name!r} is not a PaperEffect of diffattn.studies.claims")
    return paper


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of the summary YAML (module docstring)."""
    data = yaml.safe_load(Path(path).read_text())
    rows = data.get("rows") if isinstance(data, Mapping) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path} must hold a mapping with a non-empty list 'rows'")
    return rows


def _control(row: Mapping) -> tuple[bool, str, str]:
    """(every control passed on the mean, the docs cell, the short README cell)."""
    passed_all, cells, short = True, [], []
    for c in row["control"]:
        level = c["threshold"]
        if "per_seed" in c:
            values = [float(v) for v in c["per_seed"]]
            seeds = row.get("seeds", list(range(len(values))))
            mean = sum(values) / len(values)
            marks = [v >= level for v in values]
            failed = [f"seed {s}: {v:.2f}" for s, v, ok in zip(seeds, values, marks) if not ok]
            per = " ".join("✓" if ok else "✗" for ok in marks)
            seeds_text = f"seeds {seeds[0]}–{seeds[-1]}: {per}" + (f" ({', '.join(failed)}: never learnt)"
                                                                    if failed else "")
            seeds_short = f"✓ on {sum(marks)} of {len(marks)} seeds"
        else:
            mean, seeds_text = float(c["mean"]), f"per seed: not recorded (mean over {c['n_seeds']} seeds)"
            seeds_short = "per seed not recorded"
        ok = mean >= level
        passed_all &= ok
        short.append(f"{'passed' if ok else 'failed'} ({mean:.1f} vs {level:g}), {seeds_short}")
        cells.append(f"{c['name']} ≥ {level:g} → {mean:.1f}: {'passed' if ok else '**failed**'}; {seeds_text}; "
                     f"set {c['set']}")
    return passed_all, "<br>".join(cells), ", ".join(short)


def _verdict_md(verdict: Verdict, paper: PaperEffect, confounded: str | None = None) -> str:
    if verdict is Verdict.NULL_EXCLUDES:
        return f"**{verdict.value}** ({paper.size_text()})"
    if confounded:
        return f"**{verdict.value}** (confounded: {confounded})"
    return f"**{verdict.value}**"


def _tests(row: Mapping, control_passed: bool) -> list[dict[str, Any]]:
    """Every test of the row, in order (the first is the primary): label, statistics text, verdict, paper."""
    out: list[dict[str, Any]] = []
    for t in row.get("tests", []):
        paper = _claim(t["claim"])
        if t.get("untested"):
            out.append({"label": t["label"], "stats": "no test (the control failed: means only)",
                        "verdict": Verdict.INCONCLUSIVE, "paper": paper})
            continue
        d = int(t.get("digits", 1))
        unit = f" {t['unit']}" if t.get("unit") else ""
        verdict = derive_verdict(t["effect"], t["ci"], t["p_holm"], paper, control_passed=control_passed,
                                 confounded=bool(row.get("confounded")))
        note = f", {t['note']}" if t.get("note") else ""
        stats = (f"{_num(t['effect'], d)}{unit} [{_num(t['ci'][0], d)}, {_num(t['ci'][1], d)}], Holm p "
                 f"{_p(t['p_holm'])}{note}")
        out.append({"label": t["label"], "stats": stats, "verdict": verdict, "paper": paper})
    if "paired" in row:
        pr = row["paired"]
        paper = _claim(pr["claim"])
        labels = list(pr["per_seed"])
        base = labels[0]
        tests = {lab: paired_test(pr["per_seed"][lab], pr["per_seed"][base]) for lab in labels[1:]}
        for lab, p in zip(tests, holm([t["p"] for t in tests.values()])):
            t = tests[lab]
            verdict = derive_verdict(t["mean_diff"], t["ci95"], p, paper, control_passed=control_passed,
                                     confounded=bool(row.get("confounded")))
            unit = f" {pr['unit']}" if pr.get("unit") else ""
            stats = (f"{_num(t['mean_diff'], 1)}{unit} [{_num(t['ci95'][0], 1)}, {_num(t['ci95'][1], 1)}], paired "
                     f"t p {t['p']:.2f}, Holm p (over the {len(tests)} variants) {_p(p)}, higher on {t['wins']} of "
                     f"{t['n']} seeds")
            out.append({"label": f"{pr['label']}, {lab} − {base}", "stats": stats, "verdict": verdict,
                        "paper": paper})
    for block in row.get("steps", []):
        reached = {lab: list(v) for lab, v in block["per_seed"].items()}
        _, tests = steps_to_control_tests(reached, int(block["budget"]), claims.FEWER_STEPS)
        base = next(iter(reached))
        hit = [v for v in reached[base] if v is not None]
        for t in tests:
            rel = t["relative"]
            verdict = derive_verdict(rel[0], rel[1:], t["p_holm"], claims.FEWER_STEPS,
                                     control_passed=control_passed, confounded=bool(row.get("confounded")))
            stats = (f"{_num(t['mean_diff'], 0)} steps, {_num(rel[0], 0)} % of {base}'s "
                     f"[{_num(rel[1], 0)}, {_num(rel[2], 0)}]; reached on {t['reached_x']} vs {t['reached_y']} of "
                     f"{t['n']} seeds ({base} at step {sum(hit) / max(1, len(hit)):.0f} on average); censored "
                     f"permutation p {t['p']:.4f}, Holm p {t['p_holm']:.3f}")
            out.append({"label": f"{block['label']}, {t['variant']} − {base}", "stats": stats, "verdict": verdict,
                        "paper": claims.FEWER_STEPS})
    if not out:
        reason = row.get("untested", "no test")
        out.append({"label": "no test", "stats": reason, "verdict": Verdict.INCONCLUSIVE, "paper": None})
    return out


def _row(row: Mapping) -> dict[str, Any]:
    passed, control_cell, control_short = _control(row)
    tests = _tests(row, passed)
    primary = tests[0]
    verdict = primary["verdict"] if passed else Verdict.INCONCLUSIVE
    return {"row": row, "control": control_cell, "control_short": control_short, "tests": tests,
            "verdict": verdict, "verdict_md": _verdict_md(verdict, primary["paper"], row.get("confounded"))
            if primary["paper"] else
            f"**{verdict.value}**"}


def _result_cell(r: Mapping) -> str:
    parts = []
    for t in r["tests"]:
        if t["paper"] is None:
            parts.append(t["stats"])
        else:
            parts.append(f"{t['label']}: {t['stats']} → {t['verdict'].value}")
    note = r["row"].get("note")
    return "; ".join(parts) + (f" ({note})" if note else "")


def _family_note(rendered: Sequence[Mapping]) -> str:
    shared = [r["row"]["claim"].split(" (")[0] for r in rendered if len(r["row"]["runs"]) > 1]
    counts = {v: sum(r["verdict"] is v for r in rendered) for v in Verdict}
    cells_b = [o for r in rendered for o in r["protocol_b"][:1]]
    counts_b = {v: sum(o["verdict"] is v for o in cells_b) for v in Verdict}
    return (f"{len(rendered)} rows, one claim each. The needles and recall studies train their width-64 models on "
            f"one training stream with the same seeds, so each claim they both answer is one row, not two counted "
            f"rows: {'; '.join(shared)}. A claim asked under both protocols is one row with a cell for each: "
            f"(a) the shared recipe, (b) each model's lr tuned on its own. Row verdicts under (a): "
            + ", ".join(f"{v.value} {n}" for v, n in counts.items())
            + f"; the {len(cells_b)} rows with a (b) cell, under (b): "
            + ", ".join(f"{v.value} {n}" for v, n in counts_b.items() if n) + ".")


def _merged(rows: Sequence[Mapping]) -> list[dict[str, Any]]:
    """Each row rendered, with the rows that ask the same claim under protocol (b) (``same_claim_as: <id>``)
    rendered as its ``protocol_b`` cells."""
    ids = {r["id"] for r in rows}
    for r in rows:
        if r.get("same_claim_as") is not None and r["same_claim_as"] not in ids:
            raise ValueError(f"row {r['id']!r}: same_claim_as names no row, got {r['same_claim_as']!r}")
    out = []
    for r in rows:
        if r.get("same_claim_as") is None:
            rendered = _row(r)
            rendered["protocol_b"] = [_row(o) for o in rows if o.get("same_claim_as") == r["id"]]
            out.append(rendered)
    return out


def _both(r: Mapping, cell_a: str, cells_b: Sequence[str]) -> str:
    """One table cell with the (a) text and, where the claim was also asked under (b), the (b) text."""
    if not r["protocol_b"]:
        return cell_a
    return f"(a) {cell_a}<br>(b) " + "<br>(b) ".join(cells_b)


def _verdict_both(r: Mapping) -> str:
    if not r["protocol_b"]:
        return r["verdict_md"]
    return f"(a): {r['verdict_md']}; (b): {r['protocol_b'][0]['verdict_md']}"


def render_docs_table(rows: Sequence[Mapping]) -> str:
    """The docs/studies.md summary: claim, setup, control (per seed, when set), result (every test with its
    verdict), the row's verdict, command; a claim asked under both protocols has an (a) and a (b) part in each."""
    rendered = _merged(rows)
    lines = [_family_note(rendered), "",
             "| claim (paper, where) | our setup | control: level → baseline reached; per seed; set | result: every "
             "test → its verdict | verdict | command, wall time |", "|---|---|---|---|---|---|"]
    for r in rendered:
        row, others = r["row"], r["protocol_b"]
        setup = _both(r, row["setup"], [o["row"]["setup"] for o in others])
        control = _both(r, r["control"], [o["control"] for o in others])
        result = _both(r, _result_cell(r), [_result_cell(o) for o in others])
        command = _both(r, row["command"], [o["row"]["command"] for o in others])
        cells = [table_cell(x) for x in (row["claim"], setup, control, result)]
        lines.append(f"| {' | '.join(cells)} | {_verdict_both(r)} | {table_cell(command)} |")
    return "\n".join(lines)


def _readme_result(r: Mapping) -> str:
    p = r["tests"][0]
    others = [t for t in r["tests"][1:] if t["verdict"] is Verdict.OPPOSITE]
    result = f"{p['label']}: {p['stats']}" if p["paper"] is not None else p["stats"]
    if others:
        result += "; also opposite: " + "; ".join(f"{t['label']} {t['stats'].split(', Holm')[0]}" for t in others)
    return result


def render_readme_table(rows: Sequence[Mapping]) -> str:
    """The README's summary: claim, primary result, control per seed, verdict, command; every negative (an
    ``opposite`` verdict on any test) named in its row; a claim asked under both protocols with both parts."""
    rendered = _merged(rows)
    lines = ["| claim (paper) | result (primary test) | baseline control | verdict | command |",
             "|---|---|---|---|---|"]
    for r in rendered:
        others = r["protocol_b"]
        result = _both(r, _readme_result(r), [_readme_result(o) for o in others])
        control = _both(r, r["control_short"], [o["control_short"] for o in others])
        command = _both(r, r["row"]["command"], [o["row"]["command"] for o in others])
        lines.append(f"| {table_cell(r['row']['claim'])} | {table_cell(result)} | {control} | {_verdict_both(r)} | "
                     f"{table_cell(command)} |")
    return "\n".join(lines)


def _replace(text: str, body: str, where: str, start: str = START, end: str = END) -> str:
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{where} must hold the markers {start!r} and {end!r} once each, in that order")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def render_files(root: str | Path, *, check: bool = False) -> list[str]:
    """Render both tables into ``<root>/docs/studies.md`` and ``<root>/README.md`` (``check``: write nothing);
    returns the files that differed."""
    root = Path(root)
    rows = load_rows(root / "docs" / "study_summary.yaml")
    found = answers(root)
    changed = []
    for rel, body, registered in (("docs/studies.md", render_docs_table(rows), render_confirmatory_table(found)),
                                  ("README.md", render_readme_table(rows), render_readme(found))):
        path = root / rel
        text = path.read_text()
        new = _replace(_replace(text, body, rel), registered, rel, CONFIRMATORY_START, CONFIRMATORY_END)
        if rel == "docs/studies.md":
            new = _replace(new, render_factorial(root), rel, FACTORIAL_START, FACTORIAL_END)
            new = _replace(new, render_probe(root), rel, PROBE_START, PROBE_END)
        if new != text:
            changed.append(rel)
            if not check:
                path.write_text(new)
    return changed

