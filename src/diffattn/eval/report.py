"""``report.md`` and the table ``diffattn eval`` prints: one section per suite of a results dict (one table per
metric group, the corruption and needle grids, the attention diagnostics, the plots, what was skipped), and the
headline metrics each suite shows, the rows ``diffattn compare`` compares (:mod:`diffattn.eval.comparison`).

Results at or below the chance level a suite records (what guessing uniformly scores) are marked.
"""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_write_file
from .kinds import EVAL_KINDS

__all__ = ["BOOKKEEPING", "suite_names", "headline_metrics", "metric_label", "summary_table", "write_report",
           "format_value", "nested_get"]

#: numbers in results that describe the protocol, not how good the model is (left out of ``compare``)
BOOKKEEPING = frozenset({"seconds", "eval_seed", "images", "episodes", "tokens", "examples", "C", "val_accuracy",
                         "layers", "params", "trials", "chance", "num_classes", "train_images", "way", "shot",
                         "queries"})


def format_value(v) -> str:
    """A value as the tables show it: a float with 4 decimals (4 significant digits from 10⁴ on), else ``str``."""
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def _table(rows: dict, head=("metric", "value"), chance: dict | None = None, prefix: str = "") -> list[str]:
    """A metric table; with ``chance`` (``{"group.metric": level}``) a chance column, and results at or below
    chance marked."""
    levels = {k: (chance or {}).get(f"{prefix}{k}") for k in rows}
    if not any(v is not None for v in levels.values()):
        lines = [f"| {head[0]} | {head[1]} |", "|---|---:|"]
        return lines + [f"| {k} | {format_value(v)} |" for k, v in rows.items()] + [""]
    lines = [f"| {head[0]} | {head[1]} | chance |", "|---|---:|---:|"]
    for k, v in rows.items():
        level = levels[k]
        flag = " **(at or below chance)**" if level is not None and isinstance(v, (int, float)) and v <= level \
            else ""
        lines.append(f"| {k} | {format_value(v)}{flag} | {'' if level is None else format_value(level)} |")
    return lines + [""]


def suite_names() -> tuple[str, ...]:
    """The suites a results dict may hold, in the order tables show them: the suite of each registered kind of model
    (:data:`diffattn.eval.kinds.EVAL_KINDS`), in the order of registration."""
    return tuple(k.suite for k in EVAL_KINDS.values())


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def headline_metrics(suite: dict) -> dict[str, float]:
    """The headline metrics of one suite's results, ``{"group.metric": value}``: every group of plain numbers less
    the protocol's own numbers (:data:`BOOKKEEPING`), and the corruptions' clean / mean accuracy / mCE. The rows of
    ``diffattn eval``'s table, and the only rows ``diffattn compare`` shows."""
    rows = {f"{group}.{k}": v for group, val in suite.items() if isinstance(val, dict)
            and group not in ("diagnostics", "chance", "skipped", "plots") and val
            and all(_number(x) for x in val.values())
            for k, v in val.items() if k not in BOOKKEEPING}
    if isinstance(suite.get("corruptions"), dict):
        rows.update({f"corruptions.{k}": suite["corruptions"][k] for k in ("clean", "mean_accuracy", "mce")
                     if _number(suite["corruptions"].get(k))})
    return rows


def metric_label(suite: dict, key: str) -> str:
    """How tables name metric ``key`` (``group.metric``) of ``suite``: few-shot with its way and shot
    (``few_shot.mean (5-way 5-shot)``)."""
    group = suite.get(key.split(".", 1)[0])
    if key.startswith("few_shot.") and isinstance(group, dict) and "way" in group and "shot" in group:
        return f"{key} ({group['way']}-way {group['shot']}-shot)"
    return key


def summary_table(results: dict) -> str:
    """What ``diffattn eval`` prints: the model in one line, then per suite the report's table of its headline
    metrics (:func:`headline_metrics`), with the chance column and the results at or below chance marked where the
    suite records chance levels; ``report.md`` has every table and the plots."""
    m = results["model"]
    lines = [f"{m.get('name') or m['architecture']} ({m['architecture']}, {m['params']:,} parameters): "
             f"{results.get('protocol', '?')} protocol, {results.get('seconds', '?')} s", ""]
    for suite in suite_names():
        r = results.get(suite)
        if r is None:
            continue
        rows = headline_metrics(r)
        chance = {metric_label(r, k): v for k, v in (r.get("chance") or {}).items()}
        lines += [suite, ""] + _table({metric_label(r, k): v for k, v in rows.items()}, chance=chance)
    return "\n".join(lines).rstrip() + "\n"


def nested_get(d: dict, dotted: str):
    """``d[a][b]…`` for the dotted key "a.b…" of nested results; None where a level is missing or not a dict."""
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def write_report(results: dict, path: str | Path) -> Path:
    """``report.md``: the model, one table per metric group, the plots (relative links) and skipped suites."""
    m = results["model"]
    lines = [f"# Evaluation: {m.get('name') or m['architecture']}", "",
             f"`{m['path']}` · {m['architecture']} ({m['kind']}) · {m['params']:,} parameters · protocol "
             f"{results['protocol']} · {results.get('seconds', '?')} s", ""]
    for suite in suite_names():
        r = results.get(suite)
        if r is None:
            continue
        lines += [f"## {suite}", ""]
        chance = r.get("chance") or {}
        below = [k for k, level in chance.items()
                 if isinstance(nested_get(r, k), (int, float)) and nested_get(r, k) <= level]
        if below:
            lines += [f"**At or below chance:** {', '.join(below)} (chance: what guessing uniformly scores).", ""]
        for key, val in r.items():
            if key in ("plots", "diagnostics", "skipped", "chance"):
                continue
            if key == "corruptions":
                sev = sorted({s for row in val["table"].values() for s in row})
                lines += ["", "### corruptions (accuracy)", "", "| corruption | " + " | ".join(f"s{s}" for s in sev)
                          + " |", "|---|" + "---:|" * len(sev)]
                lines += [f"| {c} | " + " | ".join(format_value(row.get(s, "")) for s in sev) + " |"
                          for c, row in val["table"].items()]
                lines += ["", f"clean {format_value(val['clean'])} · mean {format_value(val['mean_accuracy'])} · mCE "
                          f"{val['mce']:.2f}", ""]
            elif key == "needle":
                lengths = list(val)
                depths = list(next(iter(val.values())))
                lines += ["", "### needle retrieval (rows: depth, columns: context length)", "",
                          "| depth | " + " | ".join(lengths) + " |", "|---|" + "---:|" * len(lengths)]
                lines += [f"| {d} | " + " | ".join(format_value(val[n].get(d)) for n in lengths) + " |" for d in depths]
                lines += [""]
            elif key == "few_shot" and "way" in val:
                lines += ["", f"### few shot ({val['way']}-way {val['shot']}-shot, {val.get('queries', '?')} queries "
                          f"per class, {val.get('episodes', '?')} episodes; chance 1/{val['way']})", ""]
                lines += _table(val, chance=chance, prefix=f"{key}.")
            elif isinstance(val, dict) and all(not isinstance(v, dict) for v in val.values()):
                lines += ["", f"### {key.replace('_', ' ')}", ""] + _table(val, chance=chance, prefix=f"{key}.")
            elif isinstance(val, dict):
                lines += ["", f"### {key.replace('_', ' ')}", ""]
                for sub, sv in val.items():
                    lines += [f"{sub}:", ""] + (_table(sv) if isinstance(sv, dict) else [format_value(sv), ""])
            else:
                lines += [f"- {key}: {format_value(val)}"]
        lines += [""]
        d = r.get("diagnostics")
        if d:
            lines += ["### attention diagnostics", ""]
            lam_key = "gate_per_layer" if "gate_per_layer" in d else "lambda_per_layer"
            rows = {"layers": d["layers"], "layer kind": d["kind"]}
            rows[lam_key.replace("_", " ")] = ", ".join("—" if v is None else f"{v:.3f}" for v in d[lam_key])
            rows["entropy A1 per layer (nats)"] = ", ".join(f"{v:.3f}" for v in d["entropy_first"])
            if d["entropy_second"]:
                rows["entropy A2 per layer (nats)"] = ", ".join(f"{v:.3f}" for v in d["entropy_second"])
            lines += [f"- {k}: {v}" for k, v in rows.items()] + [""]
        for plot in r.get("plots", []):
            lines += [f"![{plot}]({plot})", ""]
        if r.get("skipped"):
            lines += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in r["skipped"].items()), ""]
    if results.get("skipped"):
        lines += ["## skipped", ""] + [f"- {k}: {v}" for k, v in results["skipped"].items()] + [""]
    path = Path(path)
    with atomic_write_file(path, "w") as f:
        f.write("\n".join(lines))
    return path
