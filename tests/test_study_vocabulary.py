"""No study report, docs/studies.md or README.md gives a verdict outside the fixed list
(:data:`diffattn.studies.verdict.VERDICTS`): the phrases earlier docs used are forbidden, every summary table's verdict
column holds verdicts of the list (a null with the paper's size), and every bold verdict statement is one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diffattn.studies.verdict import VERDICTS, Verdict

ROOT = Path(__file__).resolve().parents[1]

#: verdict words and phrases outside the list that earlier docs used
FORBIDDEN = ("not reproduced", "partly reproduced", "partially reproduced", "reproduced at this size",
             "**explained**", "learns faster on every seed", "learns recall faster than the transformer on every seed",
             "in v2's favour", "partly inconclusive", "verdict: compared")
SOURCES = [ROOT / "docs/studies.md", ROOT / "README.md", ROOT / "docs/vlm.md", ROOT / "docs/detection.md",
           *sorted((ROOT / "src/diffattn/studies").glob("*.py"))]


def _verdict_cells(text: str) -> list[str]:
    """The verdict column of every markdown table whose header has a "verdict" column."""
    cells, col = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            col = None
            continue
        parts = [p.strip() for p in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if col is None:
            col = next((i for i, p in enumerate(parts) if p.lower() == "verdict"), -1)
            continue
        if col >= 0 and not set(line) <= set("|-: ") and col < len(parts):
            cells.append(parts[col])
    return cells


def _allowed(cell: str) -> bool:
    """A verdict cell: one verdict of the list in bold, or several "name: verdict" parts separated by ";", each
    with an optional parenthesis after it."""
    for part in cell.split(";"):
        part = part.strip()
        part = re.sub(r"^[^*]*?:\s*", "", part) if not part.startswith("**") else part
        m = re.match(r"^\*\*(.+?)\*\*(\s*\(.*\))?$", part)
        if not m or m.group(1) not in VERDICTS:
            return False
        if m.group(1) == Verdict.NULL_EXCLUDES.value and not m.group(2):
            return False  # a null names the paper's size
    return True


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_verdict_outside_the_list(path):
    _check_vocabulary(path)


def test_a_written_study_report_uses_only_the_list(tmp_path):
    from diffattn.studies.report import Control, Metric, write_study
    from diffattn.studies.verdict import PaperEffect

    per_seed = {s: {"B": {"acc": 0.9 + s / 100, "x": 1.0}, "V": {"acc": 0.5 + s / 50, "x": 1.0 + s}}
                for s in range(3)}
    metrics = [Metric("acc", "acc", 100.0, 1, claim=PaperEffect(1, "P 2024", 5.0, "points")),
               Metric("x", "x", 1.0, 2, claim=PaperEffect(-1, "Q 2025"))]
    for name, level in (("passed", 60.0), ("failed", 99.0)):
        res = write_study(tmp_path / name, {"study": "x"}, "T", "i", per_seed, metrics, 1.0,
                          control=Control("B accuracy (%)", "acc", level, scale=100.0))
        _check_vocabulary(Path(res["report"]))


def _check_vocabulary(path: Path) -> None:
    text = path.read_text()
    low = text.lower()
    bad = [w for w in FORBIDDEN if w in low]
    assert not bad, f"{path.name} uses verdicts outside {VERDICTS}: {bad}"
    cells = _verdict_cells(text)
    wrong = [c for c in cells if not _allowed(c)]
    assert not wrong, f"{path.name}: verdict cells outside {VERDICTS}: {wrong}"
    # every "Verdict(s) …: **X**" statement names a verdict of the list
    for m in re.finditer(r"[Vv]erdicts?(?: \([^)]*\))?:\s*\*\*([^*]+)\*\*|\*\*[Vv]erdicts?(?: \([^)]*\))?: "
                         r"([^*]+?)\.?\*\*", text):
        if m.group(1) is None:
            assert m.group(2) in VERDICTS, f"{path.name}: verdict {m.group(2)!r} outside the list"
            continue
        if "{" in m.group(1):  # an f-string's placeholder in a study module
            continue
        assert m.group(1).rstrip(".") in VERDICTS, f"{path.name}: verdict {m.group(1)!r} outside the list"
    for m in re.finditer(r"→ \*\*([^*]+)\*\*", text):
        head = m.group(1)
        if "{" in head:
            continue
        assert any(head == v or head.startswith(v + " (") for v in VERDICTS), \
            f"{path.name}: verdict {head!r} outside the list"


def test_the_summary_tables_have_a_verdict_column_from_the_list():
    for path in (ROOT / "docs/studies.md", ROOT / "README.md"):
        cells = _verdict_cells(path.read_text())
        assert len(cells) >= 10, f"{path.name}: no summary table with a verdict column"


def test_the_summary_tables_are_rendered_from_the_recorded_results():
    from diffattn.studies.summary import render_files

    assert render_files(ROOT, check=True) == [], \
        "docs/studies.md or README.md differs from `diffattn study-summary` (docs/study_summary.yaml)"


def test_every_negative_is_in_both_summaries():
    from diffattn.studies.summary import _row, load_rows

    rows = [_row(r) for r in load_rows(ROOT / "docs/study_summary.yaml")]
    readme, docs = (ROOT / "README.md").read_text(), (ROOT / "docs/studies.md").read_text()
    negatives = [t for r in rows for t in r["tests"] if t["verdict"] is Verdict.OPPOSITE]
    assert negatives
    for t in negatives:
        label = t["label"].replace("|", "\\|")  # as escaped in the table cells
        assert label in docs and label in readme, f"the negative {t['label']!r} is missing from a summary"
    # the noise study's worse held-out perplexity for the Diff Transformer
    assert "4.15 vs 3.68" in readme and "4.15 vs 3.68" in docs and "Holm p 0.045" in readme
