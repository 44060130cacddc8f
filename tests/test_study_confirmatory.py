"""The confirmatory table: a registered question's answer computed from committed results (diffattn.studies
.confirmatory), and the rendered tables of this checkout matching its committed results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diffattn.studies.confirmatory import answer, answers, deviation_rows, endpoint_values, render_confirmatory_table
from diffattn.studies.provenance import REGISTRATIONS, RESULTS
from diffattn.studies.registration import load_registrations
from diffattn.studies.stats import holm, paired_test
from diffattn.studies.summary import render_files
from diffattn.studies.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
NAME = "recall_gda_4to1"


def _results(reg, gda: list[float], std: list[float], confirmatory: bool = True) -> dict:
    """A recall_ablation results.json with per-seed AUC and accuracy (fractions) as the study writes them."""
    runs = {"gda_r4": [{"auc": a, "accuracy": a} for a in gda], "standard": [{"auc": a, "accuracy": a} for a in std]}
    return {"study": "recall_ablation", "config": {"seeds": list(reg.seeds), "steps": 600},
            "reported": {"w64": runs},
            "registration": {"label": "confirmatory" if confirmatory else "exploratory",
                             "registrations": [{"name": NAME, "commit": "c3fd5d1", "confirmatory": confirmatory,
                                                "reason": "" if confirmatory else "seeds differ"}]}}


@pytest.fixture
def root(tmp_path):
    shutil.copytree(ROOT / REGISTRATIONS, tmp_path / REGISTRATIONS)
    return tmp_path


def _write(root: Path, name: str, results: dict, run: dict | None = None) -> None:
    folder = root / RESULTS / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "run.json").write_text(json.dumps(run or {"library_commit": "abc1234", "command": "x",
                                                        "wall_minutes": 1}))


def test_answer_is_the_registered_test_with_holm_over_the_family(root):
    regs = load_registrations(root)
    reg = regs[NAME]
    n = len(reg.seeds)
    std = [0.95 + 0.001 * i for i in range(n)]  # the control (accuracy ≥ 90 %) passes
    gda = [s - 0.10 - 0.002 * (i % 3) for i, s in enumerate(std)]  # ≈ −10 points on every seed
    _write(root, NAME, _results(reg, gda, std))
    a = answer(reg, root, regs)
    direct = paired_test([100 * v for v in gda], [100 * v for v in std])
    assert a["test"]["mean_diff"] == pytest.approx(direct["mean_diff"]) and a["test"]["p"] == direct["p"]
    family = [direct["p"] if m == NAME else 1.0 for m in reg.holm_family]  # members without results at p = 1
    assert a["p_holm"] == holm(family)[list(reg.holm_family).index(NAME)]
    assert a["family_missing"] == len(reg.holm_family) - 1
    assert a["control_passed"] and a["verdict"] is Verdict.OPPOSITE  # the paper's gda helps; here −10 points
    assert a["label"] == "confirmatory"
    # a failed control: inconclusive, whatever the test says
    _write(root, NAME, _results(reg, [v - 0.5 for v in gda], [v - 0.5 for v in std]))
    assert answer(reg, root, regs)["verdict"] is Verdict.INCONCLUSIVE
    # a deviation marked exploratory, or a run that was not confirmatory, labels the answer exploratory
    _write(root, NAME, _results(reg, gda, std, confirmatory=False))
    assert answer(reg, root, regs)["label"] == "exploratory"
    _write(root, NAME, _results(reg, gda, std))
    (root / "studies" / "deviations.md").write_text(
        "| date | registration | field | registered | done instead | why | effect |\n|---|---|---|---|---|---|---|\n"
        f"| 2026-11-29 | {NAME} | seeds | 200–209 | 200–208 | a crash | exploratory |\n"
        f"| 2026-11-29 | other, `{NAME}` | run | one process | two | time | confirmatory |\n")
    assert deviation_rows(root)[0]["registration"] == NAME
    a = answer(reg, root, regs)
    assert a["label"] == "exploratory" and "200–208" in a["why"] and len(a["deviations"]) == 2
    table = render_confirmatory_table([a])
    assert "recall_gda_4to1" in table and "opposite" in table and "trained at abc1234" in table


def test_endpoints_name_what_is_missing(root):
    reg = load_registrations(root)[NAME]
    res = _results(reg, [0.5] * len(reg.seeds), [0.9] * len(reg.seeds))
    assert endpoint_values(res, "w64.auc", "gda_r4") == [50.0] * len(reg.seeds)
    with pytest.raises(ValueError, match="no 'w128.auc' for variant 'gda_r4'"):
        endpoint_values(res, "w128.auc", "gda_r4")
    with pytest.raises(ValueError, match="study .noise. cannot be read yet"):
        endpoint_values({"study": "noise", "config": {"seeds": []}}, "primary.mean_recall", "diff")
    _write(root, NAME, {**res, "config": {"seeds": [1, 2], "steps": 600}})
    with pytest.raises(ValueError, match="ran seeds \\[1, 2\\]"):
        answer(reg, root, load_registrations(root))


def test_the_rendered_tables_match_the_committed_results():
    """README.md and docs/studies.md hold what `diffattn study-summary` renders from docs/study_summary.yaml and
    studies/results/ (run `diffattn study-summary` after committing results)."""
    assert render_files(ROOT, check=True) == []
    for a in answers(ROOT):  # every committed answer is registered, with ≥ 8 seeds and a stated detectable size
        assert len(a["registration"].seeds) >= 8 and a["registration"].mdd > 0


def test_diffclip_endpoints_are_its_table_metrics_per_seed():
    """The DiffCLIP study answers its registration from ``per_seed`` (the demo summaries under the labels), in
    points, and names its metrics for a key it does not have."""
    per = {"200": {"CLIP": {"primary": {"mean_recall": 0.12}}, "DiffCLIP": {"primary": {"mean_recall": 0.125}}},
           "201": {"CLIP": {"primary": {"mean_recall": 0.10}}, "DiffCLIP": {"primary": {"mean_recall": None}}}}
    res = {"study": "diffclip", "config": {"seeds": [200, 201], "variants": ["clip", "diffclip"]},
           "labels": ["CLIP", "DiffCLIP"], "per_seed": per}
    assert endpoint_values(res, "primary.mean_recall", "clip") == pytest.approx([12.0, 10.0])
    assert endpoint_values(res, "primary.mean_recall", "diffclip") == [pytest.approx(12.5), None]
    with pytest.raises(ValueError, match="no metric 'primary.nope'.*primary.mean_recall"):
        endpoint_values(res, "primary.nope", "clip")
    with pytest.raises(ValueError, match="variant 'vit' is not among"):
        endpoint_values(res, "primary.mean_recall", "vit")
