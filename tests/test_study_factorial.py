"""The recall factorial's cells, interaction contrasts and rendered tables (diffattn.studies.factorial)."""

import json

import pytest

from diffattn.studies.factorial import CONTRASTS, LEVELS, cells, contrasts, render_factorial
from diffattn.studies.recall_ablation import VARIANTS, variant_settings

FACTORIAL = [v for v in VARIANTS if v.startswith(("diff_lambda0.", "diff_no_subnorm_lambda"))]


def test_cells_come_from_the_variant_settings():
    found = cells(list(VARIANTS))
    assert len(found) == 12 and sorted(found.values()) == sorted(FACTORIAL)
    assert found[(True, "tied", 0.8)] == "diff_lambda0.8"
    assert found[(True, "fixed", 0.8)] == "diff_lambda0.8_fixed"
    assert found[(False, "tied", 0.5)] == "diff_no_subnorm_lambda0.5_tied"
    assert found[(False, "fixed", 0.2)] == "diff_no_subnorm_lambda0.2"
    assert "diff" not in found.values() and "diff_lambda0" not in found.values()  # "ye" and λ_init 0 are outside
    with pytest.raises(ValueError, match="variant must be one of the recall ablation's"):
        variant_settings("vit")


def test_every_contrast_is_balanced():
    for name, (_, weights) in CONTRASTS.items():
        assert sum(weights.values()) == 0, name
        assert all(w in (-1, 1) for w in weights.values()), name


def _results(auc, seeds=8):
    """A results.json of the factorial at width 64 whose cell (sub-norm, scale, λ) has AUC ``auc(cell, seed)``."""
    reported = {"standard": [{"auc": 0.8, "accuracy": 0.95} for _ in range(seeds)]}
    for cell, v in cells(FACTORIAL).items():
        reported[v] = [{"auc": auc(cell, i) / 100, "accuracy": 0.5} for i in range(seeds)]
    cfg = {"seeds": list(range(200, 200 + seeds)), "tuning_seeds": [300], "depth": 2, "steps": 600, "pairs": [2, 4],
           "control_accuracy": 0.9}
    return {"config": cfg, "reported": {"w64": reported}}


def test_additive_effects_have_no_interaction_and_one_interaction_is_found():
    def additive(cell, seed):
        sub, scale, lam = cell
        return 60 + 5 * sub + 3 * (scale == "tied") + 10 * lam + 0.7 * seed  # main effects and a seed effect only

    rows = contrasts(_results(additive), "w64")
    assert [r["name"] for r in rows] == list(CONTRASTS)
    for r in rows:
        assert r["mean"] == pytest.approx(0.0, abs=1e-9) and r["p"] == 1.0

    def scale_at_08(cell, seed):  # the tied scale helps by 20 at λ_init 0.8 with the sub-norm only, ±1 by seed
        return additive(cell, seed) + (20 + (-1) ** seed) * (cell == (True, "tied", 0.8))

    by = {r["name"]: r for r in contrasts(_results(scale_at_08), "w64")}
    # each contrast holding the cell with weight +1 sees +20 on the mean, with all eight seeds the same sign
    for name, (_, weights) in CONTRASTS.items():
        w = weights.get((True, "tied", 0.8), 0)
        assert by[name]["mean"] == pytest.approx(20 * w, abs=1e-9)
        assert by[name]["p"] == (pytest.approx(2 / 2 ** 8) if w else 1.0)
        lo, hi = by[name]["ci95"]
        assert lo <= 20 * w <= hi
    assert by["sub-norm × scale × λ_init"]["p_holm"] == pytest.approx(5 * 2 / 2 ** 8)  # Holm over five equal p


def test_render_reads_committed_results_and_says_what_did_not_run(tmp_path):
    assert render_factorial(tmp_path) == "The factorial has no committed results yet."
    res = _results(lambda cell, seed: 70.0 + seed)
    del res["reported"]["w64"]["diff_lambda0.5_fixed"]
    folder = tmp_path / "studies" / "results" / "recall_factorial_scale_w64"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(res))
    (folder / "run.json").write_text(json.dumps({"library_commit": "abcdef0123", "command": "diffattn study x"}))
    text = render_factorial(tmp_path)
    assert "**Width 64** (8 seeds 200–207" in text and "trained at abcdef0: `diffattn study x`" in text
    row = next(line for line in text.splitlines() if line.startswith("| 0.5 |"))
    assert row == "| 0.5 | 73.5 ± 2.4 (0/8) | not run | 73.5 ± 2.4 (0/8) | 73.5 ± 2.4 (0/8) |"
    assert len([c for c in LEVELS["columns"]]) == row.count("|") - 2
    assert "Transformer, 4 heads: 80.0 ± 0.0 (8/8)." in text
    assert "| sub-norm × λ_init (scale tied) |" in text  # needs no λ_init 0.5 cell


def test_a_width_recorded_twice_is_rendered_once(tmp_path):
    res = _results(lambda cell, seed: 70.0 + seed)
    for name in ("recall_factorial_scale_w64", "recall_factorial_scale_w128"):  # one call answered both
        folder = tmp_path / "studies" / "results" / name
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps(res))
    assert render_factorial(tmp_path).count("**Width 64**") == 1
