"""The plateau probe (diffattn.studies.probe): its measures against direct computations, a probed run trains
exactly as the unprobed one, and the committed probe agrees with the factorial it retrains."""

import json
from pathlib import Path

import pytest
import torch

from diffattn.data.synthetic import SyntheticVocab, mqar_batch
from diffattn.studies.probe import PROBE_RESULTS, block_probe, probe_runs, render_probe
from diffattn.studies.recall_ablation import DEFAULTS, run_one, variant_model
from diffattn.studies.synthetic import answer_loss

ROOT = Path(__file__).resolve().parents[1]
VOCAB = SyntheticVocab(num_keys=8, num_values=8, num_filler=1)


def _model(variant="diff_lambda0.8"):
    return variant_model(variant, vocab_size=VOCAB.size, dim=32, depth=2, max_seq_len=16, seed=0)


def _batch(n=8):
    return mqar_batch(n, pairs=2, generator=torch.Generator().manual_seed(1), vocab=VOCAB)


def test_block_probe_measures_what_it_says_and_leaves_the_gradients():
    model, batch = _model(), _batch()
    answer_loss(model, _batch(4)).backward()  # gradients from a step that the probe must not touch
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    probe = block_probe(model, batch)
    assert len(probe) == 2
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, before[n]), n
    # direct computation for block 1: its input is block 0's output
    blk0, blk1 = model.blocks
    seen = {}
    h = blk1.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0].detach()))
    loss = answer_loss(model, batch)
    h.remove()
    x = seen["x"]
    a = blk1.attn(blk1.norm1(x))
    m = blk1.mlp(blk1.norm2(x + a))
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    assert probe[1]["rms_in"] == pytest.approx(rms(x), rel=1e-5)
    assert probe[1]["attn_ratio"] == pytest.approx(rms(a) / rms(x), rel=1e-5)
    assert probe[1]["attn_share"] == pytest.approx(rms(a) / (rms(a) + rms(m)), rel=1e-5)
    grads = torch.autograd.grad(loss, list(blk0.attn.parameters()))
    assert probe[0]["grad_attn"] == pytest.approx(torch.sqrt(sum(g.pow(2).sum() for g in grads)).item(), rel=1e-5)
    assert 0 < probe[0]["attn_share"] < 1 and probe[0]["grad_mlp"] > 0


def test_a_probed_run_trains_exactly_as_the_unprobed_one(tmp_path):
    cfg = {**DEFAULTS, "steps": 12, "batch_size": 4, "warmup_steps": 2, "eval_every": 6, "samples": 8,
           "curve_samples": 8, "vocab": {"num_keys": 8, "num_values": 8, "num_filler": 1}, "pairs": [2, 4]}
    plain = run_one(cfg, VOCAB, "diff_lambda0.8", 32, 1e-3, 5, tmp_path / "a", False, "reported")
    batch = _batch()
    probed = run_one(cfg, VOCAB, "diff_lambda0.8", 32, 1e-3, 5, tmp_path / "b", False, "reported",
                     probe=lambda m: block_probe(m, batch))
    assert probed["curve"] == plain["curve"] and probed["final_loss"] == plain["final_loss"]
    assert [s for s, _ in probed["probe"]] == [6, 12] and "probe" not in plain


def test_probe_runs_names_unknown_variants(tmp_path):
    res = {"config": {}, "reported": {"w64": {}}, "chosen_lr": {"w64": {"standard": 1e-3}}}
    with pytest.raises(ValueError, match=r"variants must be among the results' \['standard'\] at w64, got \['x'\]"):
        probe_runs(res, ["x"], [0], tmp_path)


def test_the_committed_probe_retrains_the_factorial_exactly():
    """Each probed run's area under the curve equals the committed factorial's at its seed (the same training,
    on the machine that recorded both), and the docs table renders from it."""
    folder = ROOT / PROBE_RESULTS
    if not (folder / "results.json").is_file():
        pytest.skip("the plateau probe has no committed results yet (studies/exploratory/plateau_probe/)")
    probe = json.loads((folder / "results.json").read_text())
    source = json.loads((ROOT / probe["source"]).read_text())
    seeds = source["config"]["seeds"]
    for v in probe["variants"]:
        for s, run in probe["runs"][v].items():
            committed = source["reported"][probe["width"]][v][seeds.index(int(s))]
            assert run["auc"] == committed["auc"] and run["lr"] == committed["lr"], (v, s)
    assert "| block |" in render_probe(ROOT)
