"""The fixed verdict list, the rule that derives a verdict, the censored steps-to-threshold test, per-seed control
status, and that no report, docs/studies.md or README.md uses a verdict outside the list."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diffattn.studies import claims
from diffattn.studies.report import Control, Metric, check_control, read_seed, write_seed, write_study
from diffattn.studies.stats import censored_paired_test, permutation_p
from diffattn.studies.synthetic import steps_to_control_tests
from diffattn.studies.verdict import VERDICTS, PaperEffect, Verdict, derive_verdict, verdict_text

ROOT = Path(__file__).resolve().parents[1]
UP = PaperEffect(1, "Paper 2024, Table 1", 10.0, "points")


def test_the_verdict_list_is_fixed():
    assert VERDICTS == ("reproduced", "opposite", "null that excludes the paper's effect size", "inconclusive")
    assert [str(v) for v in Verdict] == list(VERDICTS)


@pytest.mark.parametrize("effect, ci, p, paper, want", [
    (5.0, (2.0, 8.0), 0.01, UP, Verdict.REPRODUCED),
    (-5.0, (-8.0, -2.0), 0.01, UP, Verdict.OPPOSITE),
    (-5.0, (-8.0, -2.0), 0.01, PaperEffect(-1, "P 2024"), Verdict.REPRODUCED),
    (1.0, (-3.0, 5.0), 0.6, UP, Verdict.NULL_EXCLUDES),  # 5 < 10: the paper's size is outside the interval
    (1.0, (-3.0, 12.0), 0.6, UP, Verdict.INCONCLUSIVE),  # the interval still holds 10
    (1.0, (-3.0, 5.0), 0.6, PaperEffect(1, "P 2024"), Verdict.INCONCLUSIVE),  # no size: no null verdict
    (-1.0, (-5.0, 3.0), 0.6, PaperEffect(-1, "P 2024", -10.0), Verdict.NULL_EXCLUDES),
    (-1.0, (-12.0, 3.0), 0.6, PaperEffect(-1, "P 2024", -10.0), Verdict.INCONCLUSIVE),
    (-4.0, (-7.0, -1.0), 0.2, UP, Verdict.NULL_EXCLUDES),  # significant before Holm only: a null, not opposite
    (None, None, None, UP, Verdict.INCONCLUSIVE),
    (5.0, (2.0, 8.0), 0.05, UP, Verdict.NULL_EXCLUDES),  # p = α is not < α
])
def test_derive_verdict(effect, ci, p, paper, want):
    assert derive_verdict(effect, ci, p, paper) is want


def test_a_failed_control_is_inconclusive_and_a_null_states_the_size():
    assert derive_verdict(5.0, (2.0, 8.0), 0.001, UP, control_passed=False) is Verdict.INCONCLUSIVE
    # a mechanism compared between models that do not all solve the task: inconclusive however significant
    assert derive_verdict(-5.0, (-8.0, -2.0), 0.001, UP) is Verdict.OPPOSITE
    assert derive_verdict(-5.0, (-8.0, -2.0), 0.001, UP, confounded=True) is Verdict.INCONCLUSIVE
    assert verdict_text(Verdict.NULL_EXCLUDES, UP) == \
        "null that excludes the paper's effect size (+10 points, Paper 2024, Table 1)"
    with pytest.raises(ValueError, match="needs the paper's size"):
        verdict_text(Verdict.NULL_EXCLUDES, PaperEffect(1, "P 2024"))
    with pytest.raises(ValueError, match="sign of direction"):
        PaperEffect(1, "P 2024", -3.0)


# Hand-computed cases of the censored paired test (module docstring of diffattn.studies.stats): None = censored at
# the budget.
def test_censored_paired_test_all_censored_against_all_reached():
    # the needles study's Diff V1 against the Transformer: d = 600 - [300, 360, 240, 300, 420] = [300, 240, 360, 300,
    # 180], all positive: 2 of the 32 sign patterns reach |sum| = 1380, p = 2/32; Gehan 5 wins, sign p = 2/32
    t = censored_paired_test([None] * 5, [300, 360, 240, 300, 420], 600)
    assert t["p"] == pytest.approx(0.0625) and t["p_gehan"] == pytest.approx(0.0625)
    assert t["mean_diff"] == pytest.approx(276.0) and (t["wins"], t["losses"], t["ties"]) == (5, 0, 0)
    assert t["reached_x"] == 0 and t["reached_y"] == 5


def test_censored_paired_test_mixed():
    # x reached on seed 0 only, earlier than y there: d = [-50, 300, 350, 350, 300], |sum| = 1250; the patterns with
    # |sum| >= 1250 flip at most the -50 (sums ±1350, ±1250): 4/32. Gehan: 4 wins, 1 loss: 2 (1 + 5) / 32 = 0.375
    t = censored_paired_test([250, None, None, None, None], [300, 300, 250, 250, 300], 600)
    assert t["p"] == pytest.approx(0.125) and t["p_gehan"] == pytest.approx(0.375)
    assert (t["wins"], t["losses"]) == (4, 1)


def test_censored_paired_test_both_censored_is_a_tie_and_observed_pairs_compare():
    t = censored_paired_test([None, None], [None, 100], 200)  # d = [0, 100]: every pattern has |sum| = 100
    assert t["p"] == 1.0 and (t["wins"], t["losses"], t["ties"]) == (1, 0, 1) and t["p_gehan"] == 1.0
    # d = [5, -5, 20]: sums ±30, ±20, ±20, ±10 over the 8 patterns, 6 with |sum| >= 20: 0.75; Gehan 2 wins 1 loss
    t = censored_paired_test([10, 20, 30], [5, 25, 10], 50)
    assert t["p"] == pytest.approx(0.75) and t["p_gehan"] == pytest.approx(1.0)
    assert permutation_p([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="budget"):
        censored_paired_test([700, None], [100, 100], 600)


def test_steps_to_control_tests_holm_and_verdict():
    lines, out = steps_to_control_tests({"T": [300, 360, 240, 300, 420], "D": [None] * 5, "G": [None] * 5}, 600)
    d = out[0]
    assert d["p"] == pytest.approx(0.0625) and d["p_holm"] == pytest.approx(0.125)
    # +85 % of the Transformer's steps, interval far above the paper's -36.3 %: a null that excludes it
    assert d["relative"][0] == pytest.approx(100 * 276 / 324)
    assert d["verdict"] == Verdict.NULL_EXCLUDES.value and claims.FEWER_STEPS.size == -36.3
    assert any("Holm p 0.1250" in line for line in lines)
    _, failed = steps_to_control_tests({"T": [300, 360], "D": [None, None]}, 600, control_passed=False)
    assert failed[0]["verdict"] == Verdict.INCONCLUSIVE.value


def test_per_seed_control_status_and_pre_registered_exclusion(tmp_path):
    per_seed = {s: {"B": {"acc": b}, "V": {"acc": v}} for s, b, v in
                [(0, 0.9, 0.5), (1, 0.95, 0.55), (2, 0.2, 0.9), (3, 0.92, 0.52)]}
    ctrl = Control("B accuracy (%)", "acc", 60.0, scale=100.0)
    c = check_control(per_seed, ctrl, "2026-11-26, commit abc1234")
    assert c["passed"] and c["failed_seeds"] == [2] and [p["passed"] for p in c["seeds"]] == [True, True, False, True]
    assert "(set 2026-11-26, commit abc1234)" in c["line"] and "2: 20.00 ✗ never learnt" in c["line"]
    metric = [Metric("acc", "acc", 100.0, 1, claim=PaperEffect(1, "P 2024"))]
    cfg = {"study": "x", "control_set": "2026-11-26, commit abc1234", "exclude_failed_seeds": False}
    kept = write_study(tmp_path / "k", cfg, "T", "i", per_seed, metric, 1.0, control=ctrl)
    assert kept["rows"][0]["vs_baseline"]["V"]["n"] == 4 and kept["rows"][0]["excluded_seeds"] == []
    dropped = write_study(tmp_path / "d", {**cfg, "exclude_failed_seeds": True}, "T", "i", per_seed, metric, 1.0,
                          control=ctrl)
    test = dropped["rows"][0]["vs_baseline"]["V"]
    assert test["n"] == 3 and dropped["rows"][0]["excluded_seeds"] == [2] and test["mean_diff"] < 0
    report = Path(dropped["report"]).read_text()
    assert "| 2 | 20.00 ✗ never learnt |" in report and "excluded from the paired tests" in report
    assert dropped["results"]["verdicts"][0]["verdict"] == "opposite" and "→ **opposite**" in report
    # the report keys never invalidate a finished seed
    write_seed(tmp_path / "s", {"steps": 3, "seeds": [0], "out": "o", "control_set": "a"}, {"B": {}})
    assert read_seed(tmp_path / "s", {"steps": 3, "seeds": [0, 1], "out": "p", "control_set": "b",
                                      "exclude_failed_seeds": True}) == {"B": {}}


def test_every_packaged_config_records_when_its_control_was_set():
    for path in sorted((ROOT / "src/diffattn/configs/studies").glob("*.yaml")):
        text = path.read_text()
        m = re.search(r'^control_set: "(\d{4}-\d{2}-\d{2}), commit ([0-9a-f]{7,40}) \(', text, re.M)
        assert m, f"{path.name} records no control_set (date, commit) beside its control"


def test_results_json_carries_verdicts_from_the_list(tmp_path):
    per_seed = {s: {"B": {"acc": 0.9 + s / 100}, "V": {"acc": 0.5 + s / 50}} for s in range(3)}
    write_study(tmp_path, {"study": "x"}, "T", "i", per_seed, [Metric("acc", "acc", 100.0, 1, claim=UP)], 1.0,
                control=Control("B accuracy (%)", "acc", 60.0, scale=100.0))
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["verdicts"] and all(v["verdict"] in VERDICTS for v in res["verdicts"])
    assert "verdict" not in res and res["control_status"] == "passed"
