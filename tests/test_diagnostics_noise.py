"""Entropy, answer-span attention, foreground attention, signed rollout and plots on hand-built maps."""

from __future__ import annotations

import math

import pytest
import torch

from diffattn.diagnostics import answer_attention, branch_entropy, foreground_attention, patch_mask, rollout
from diffattn.diagnostics.plots import plot_corruption_curves, plot_lambdas, plot_maps, plot_needle_grid


def test_branch_entropy_hand_computed():
    a = torch.zeros(1, 2, 2, 4)
    a[0, 0] = 0.25  # uniform over 4 → log 4
    a[0, 1, :, 0] = 1.0  # one-hot → 0
    torch.testing.assert_close(branch_entropy(a), torch.tensor([math.log(4), 0.0]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="negative entries"):
        branch_entropy(a - 0.5)


def test_answer_attention_hand_computed_and_modes():
    # one layer, one head, keys: [ctx, ans, ans, ctx, query]; last query row
    a = torch.zeros(1, 1, 5, 5)
    a[0, 0, -1] = torch.tensor([0.3, 0.4, 0.2, -0.1, 0.2])
    answer = torch.tensor([False, True, True, False, False])
    context = torch.tensor([True, True, True, True, False])
    s = answer_attention([a], answer, context)
    assert s["answer"] == pytest.approx(0.6) and s["noise"] == pytest.approx(0.2) and s["ratio"] == pytest.approx(3)
    r = answer_attention([a], answer, context, mode="relu")
    assert r["noise"] == pytest.approx(0.3)
    b = answer_attention([a, a * 0.5], answer, context, mode="abs")  # mean over layers
    assert b["answer"] == pytest.approx(0.45) and b["noise"] == pytest.approx(0.3)
    # share: |row| sums to 0.3 + 0.4 + 0.2 + 0.1 + 0.2 = 1.2; the same share at every scale of the map (a
    # differential row summing to 1 − λ reads like a softmax row)
    sh = answer_attention([a, a * 0.5], answer, context, mode="share")
    assert sh["answer"] == pytest.approx(0.6 / 1.2) and sh["noise"] == pytest.approx(0.4 / 1.2)
    zero = answer_attention([a * 0], answer, context, mode="share")  # an all-zero row stays zero, no NaN
    assert zero["answer"] == 0.0 and zero["noise"] == 0.0
    with pytest.raises(ValueError, match="inside context"):
        answer_attention([a], answer, torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mode must be one of"):
        answer_attention([a], answer, context, mode="square")


def test_foreground_attention_hand_computed():
    # 2×2 patch grid from a 4×4 mask whose top-left 2×2 block is foreground
    mask = torch.zeros(1, 4, 4)
    mask[0, :2, :2] = 1
    assert patch_mask(mask, (2, 2)).tolist() == [[True, False, False, False]]
    a = torch.zeros(1, 2, 5, 5)
    a[0, 0, 0] = torch.tensor([0.2, 0.5, 0.1, 0.1, 0.1])  # CLS row, head 0
    a[0, 1, 0] = torch.tensor([0.0, 0.1, 0.3, 0.3, 0.3])  # head 1
    r = foreground_attention([a], mask, (2, 2))
    assert r["inside"] == pytest.approx(0.3) and r["outside"] == pytest.approx(0.6)
    assert r["density_inside"] == pytest.approx(0.3) and r["density_outside"] == pytest.approx(0.2)
    assert r["density_ratio"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match=r"needs \(B, heads, 5, 5\)"):
        foreground_attention([a[..., :4]], mask, (2, 2))


def test_foreground_attention_from_the_object_patches_hand_computed():
    """query='foreground' (no CLS: a detector's feature map): the rows of the foreground patches, averaged."""
    mask = torch.zeros(1, 4, 4)
    mask[0, :2, :] = 1  # the top row of the 2×2 patch grid is foreground
    a = torch.zeros(1, 1, 4, 4)
    a[0, 0, 0] = torch.tensor([0.5, 0.2, -0.1, 0.4])  # foreground query 0: signed in 0.7, out 0.3 (ReLU 0.4)
    a[0, 0, 1] = torch.tensor([0.3, 0.5, 0.1, 0.1])  # foreground query 1: in 0.8, out 0.2
    a[0, 0, 2:] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # background queries: not counted
    r = foreground_attention([a], mask, (2, 2), num_prefix_tokens=0, query="foreground")
    assert r["inside"] == pytest.approx(0.75) and r["outside"] == pytest.approx(0.25)
    assert r["density_inside"] == pytest.approx(0.375) and r["density_ratio"] == pytest.approx(3.0)
    r = foreground_attention([a], mask, (2, 2), num_prefix_tokens=0, query="foreground", mode="relu")
    assert r["outside"] == pytest.approx(0.3) and r["density_ratio"] == pytest.approx(2.5)
    uniform = torch.full((1, 2, 4, 4), 0.25)
    assert foreground_attention([uniform], mask, (2, 2), num_prefix_tokens=0,
                                query="foreground")["density_ratio"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs a CLS token"):
        foreground_attention([a], mask, (2, 2), num_prefix_tokens=0)
    with pytest.raises(ValueError, match="query must be"):
        foreground_attention([a], mask, (2, 2), num_prefix_tokens=0, query="all")


def test_rollout_matches_abnar_zuidema_for_nonnegative_maps():
    g = torch.Generator().manual_seed(0)
    maps = [torch.softmax(torch.randn(1, 2, 4, 4, generator=g), -1) for _ in range(3)]
    ref = None
    for a in maps:  # Abnar & Zuidema: 0.5A + 0.5I, renormalise rows (keepdim), multiply
        a = a.double().mean(1)
        a = 0.5 * a + 0.5 * torch.eye(4, dtype=torch.float64)
        a = a / a.sum(-1, keepdim=True)
        ref = a if ref is None else a @ ref
    torch.testing.assert_close(rollout(maps), ref.float())
    torch.testing.assert_close(rollout(maps).sum(-1), torch.ones(1, 4))


def test_rollout_signed_uses_l1_rows():
    a = torch.tensor([[[[0.9, -0.3], [-0.6, 0.2]]]])  # one head; row sums 0.6 and −0.4
    r = rollout([a])
    # 0.5A + 0.5I = [[0.95, −0.15], [−0.3, 0.6]]; L1 rows 1.1 and 0.9
    expect = torch.tensor([[[0.95 / 1.1, -0.15 / 1.1], [-0.3 / 0.9, 0.6 / 0.9]]])
    torch.testing.assert_close(r, expect)
    assert float(rollout([a, a, a]).abs().max()) <= 1.0


def test_plots_write_pngs(tmp_path):
    a1 = torch.softmax(torch.randn(1, 2, 6, 6), -1)
    a2 = torch.softmax(torch.randn(1, 2, 6, 6), -1)
    paths = [
        plot_maps(a1, a2, a1 - 0.5 * a2, tmp_path / "maps.png", tokens=list("abcdef")),
        plot_lambdas([0.2, torch.tensor([0.3, 0.5])], tmp_path / "lam.png"),
        plot_corruption_curves({"gaussian_noise": {1: 0.9, 2: 0.7}, "fog": {1: 0.8, 2: 0.6}}, tmp_path / "c.png",
                               clean=0.95),
        plot_needle_grid({64: {0.0: 1.0, 0.5: 0.5}, 128: {0.0: 0.0, 0.5: 1.0}}, tmp_path / "n.png"),
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="must end in .png"):
        plot_lambdas([0.1], tmp_path / "x.jpg")
