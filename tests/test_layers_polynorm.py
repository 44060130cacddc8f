"""PolyNorm and the Motif MLPs: Motif-3's dense MLP (sigmoid coefficients, output scale, hidden clamp) exact against
a float64 transcription of llama.cpp's graph (``tests/reference_motif3.py``), with the clamps hit; the routed
experts' two extra clamps change the result where the dense form does not apply them; PolyNorm without the sigmoid
is Motif-2's; bad arguments are refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from diffattn.convert.motif3 import from_motif3_mlp
from diffattn.layers import Motif3PolyNormGLU, PolyNorm

from .reference_motif3 import motif3_mlp_reference

TOL = dict(rtol=0.0, atol=1e-10)


def mlp_config(*, sigmoid: bool = True, scale: float = 0.5, clamp: float | None = 2.5) -> dict:
    return {"hidden_size": 16, "intermediate_size": 24, "polynorm_sigmoid_weight": sigmoid,
            "polynorm_output_scale": scale, "hidden_clamp": clamp, "polynorm_bias_clamp": 0.5}


def released_mlp(cfg: dict, layer: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float64 tensors under the released names of dense layer ``layer``'s MLP."""
    g = torch.Generator().manual_seed(seed)
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    p = f"model.layers.{layer}.mlp."
    return {p + "gate_proj.weight": 0.5 * torch.randn(f, d, generator=g, dtype=torch.float64),
            p + "up_proj.weight": 0.5 * torch.randn(f, d, generator=g, dtype=torch.float64),
            p + "down_proj.weight": 0.2 * torch.randn(d, f, generator=g, dtype=torch.float64),
            p + "act_fn.weight": torch.randn(3, generator=g, dtype=torch.float64),
            p + "act_fn.bias": torch.tensor([0.8], dtype=torch.float64)}


def reference(cfg: dict, sd: dict, layer: int, x: torch.Tensor, **flags) -> torch.Tensor:
    p = f"model.layers.{layer}.mlp."
    w = {"gate_proj": sd[p + "gate_proj.weight"], "up_proj": sd[p + "up_proj.weight"],
         "down_proj": sd[p + "down_proj.weight"], "poly_w": sd[p + "act_fn.weight"], "poly_b": sd[p + "act_fn.bias"]}
    hp = dict(eps=1e-6, sigmoid_w=cfg["polynorm_sigmoid_weight"], out_scale=cfg["polynorm_output_scale"],
              bias_clamp=cfg["polynorm_bias_clamp"] or 0.0, hidden_clamp=cfg["hidden_clamp"] or 0.0)
    return motif3_mlp_reference(w, x, hp, **flags)


def inputs(seed: int = 1) -> torch.Tensor:
    return 2.0 * torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------------------------------- parity with llama.cpp

@pytest.mark.parametrize("sigmoid", [True, False], ids=["sigmoid", "raw"])
@pytest.mark.parametrize("scale", [1.0, 0.5, 0.7])
@pytest.mark.parametrize("clamp", [None, 2.5, 40.0], ids=["no_clamp", "clamp_hit", "clamp_idle"])
def test_the_dense_mlp_matches_the_llama_cpp_graph_in_float64(sigmoid, scale, clamp):
    cfg = mlp_config(sigmoid=sigmoid, scale=scale, clamp=clamp)
    sd = released_mlp(cfg, 0)
    mlp = from_motif3_mlp(cfg, sd, 0)
    assert (mlp.act_fn.sigmoid_weight, mlp.output_scale, mlp.hidden_clamp, mlp.act_fn.eps) == (
        sigmoid, scale, clamp, 1e-6)
    x = inputs()
    out = mlp(x)
    assert out.dtype == torch.float64 and out.shape == x.shape
    for b in range(2):
        torch.testing.assert_close(out[b], reference(cfg, sd, 0, x[b]), **TOL)


def test_the_clamp_is_hit_and_changes_the_output():
    cfg = mlp_config(clamp=2.5)
    sd = released_mlp(cfg, 0)
    x = inputs()
    gate, up = x @ sd["model.layers.0.mlp.gate_proj.weight"].T, x @ sd["model.layers.0.mlp.up_proj.weight"].T
    for t in (gate, up):  # some entries beyond the clamp, some within
        assert (t.abs() > 2.5).float().mean() > 0.2 and (t.abs() < 2.5).float().mean() > 0.2
    clamped = from_motif3_mlp(cfg, sd, 0)(x)
    free = from_motif3_mlp({**cfg, "hidden_clamp": None}, sd, 0)(x)
    assert (clamped - free).abs().max() > 0.1
    torch.testing.assert_close(free[0], reference({**cfg, "hidden_clamp": None}, sd, 0, x[0]), **TOL)


def test_the_experts_clamps_are_not_those_of_the_dense_mlp():
    """The routed experts clamp the bias (to ±polynorm_bias_clamp) and the product PolyNorm(g) ⊙ u (to
    ±hidden_clamp); the dense MLP does neither, and the module computes the dense form."""
    cfg = mlp_config(clamp=2.5)
    sd = released_mlp(cfg, 0)
    x = inputs()
    out = from_motif3_mlp(cfg, sd, 0)(x)[0]
    dense = reference(cfg, sd, 0, x[0])
    torch.testing.assert_close(out, dense, **TOL)
    for flags in (dict(clamp_bias=True), dict(clamp_result=True)):
        assert (reference(cfg, sd, 0, x[0], **flags) - dense).abs().max() > 1e-3, flags


def test_low_precision_projections_keep_their_dtype_and_the_float32_coefficients():
    cfg = mlp_config()
    sd = released_mlp(cfg, 2)
    low = {k: v.to(torch.float32 if ".act_fn." in k else torch.bfloat16) for k, v in sd.items()}
    mlp = from_motif3_mlp(cfg, low, 2)
    assert mlp.gate_proj.weight.dtype == torch.bfloat16 and mlp.act_fn.weight.dtype == torch.float32
    x = inputs()
    out = mlp(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    ref = reference(cfg, {k: v.double() for k, v in low.items()}, 2, x[0].to(torch.bfloat16).double())
    assert ((out[0].double() - ref).norm() / ref.norm()).item() < 3e-2


# --------------------------------------------------------------------------------------------- the modules

def test_defaults_are_those_of_the_public_code_and_the_parameters_carry_the_released_names():
    mlp = Motif3PolyNormGLU(8, 12)
    assert (mlp.act_fn.eps, mlp.act_fn.sigmoid_weight, mlp.output_scale, mlp.hidden_clamp) == (1e-6, True, 1.0, None)
    assert {k: tuple(v.shape) for k, v in mlp.state_dict().items()} == {
        "gate_proj.weight": (12, 8), "up_proj.weight": (12, 8), "down_proj.weight": (8, 12),
        "act_fn.weight": (3,), "act_fn.bias": (1,)}
    assert "sigmoid_weight=True" in repr(mlp) and "hidden_clamp=None" in repr(mlp)
    assert PolyNorm().sigmoid_weight is False and PolyNorm().extra_repr() == "eps=1e-06"


def test_the_sigmoid_coefficients_are_polynorm_with_sigmoid_of_the_weight():
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    sig, raw = PolyNorm(sigmoid_weight=True).double(), PolyNorm().double()
    with torch.no_grad():
        sig.weight.copy_(torch.tensor([0.3, -1.2, 2.0]))
        raw.weight.copy_(torch.sigmoid(sig.weight))
        sig.bias.fill_(0.25)
        raw.bias.fill_(0.25)
    assert torch.equal(sig(x), raw(x))
    w = raw.weight
    n = lambda t: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)  # noqa: E731
    torch.testing.assert_close(raw(x), w[0] * n(x ** 3) + w[1] * n(x ** 2) + w[2] * n(x) + 0.25, **TOL)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dim=0), "dim must be an integer >= 1, got 0"),
    (dict(hidden_dim=2.5), "hidden_dim must be an integer >= 1, got 2.5"),
    (dict(output_scale=0.0), "output_scale must be a finite float > 0, got 0.0"),
    (dict(output_scale=math.inf), "output_scale must be a finite float > 0, got inf"),
    (dict(hidden_clamp=-1.0), r"hidden_clamp must be a finite float > 0 or None, got -1.0"),
    (dict(hidden_clamp=True), r"hidden_clamp must be a finite float > 0 or None, got True"),
    (dict(sigmoid_weight=1), "sigmoid_weight must be a bool, got 1"),
    (dict(eps=0.0), "eps must be a finite float > 0, got 0.0"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    args = {"dim": 8, "hidden_dim": 12, **kwargs}
    with pytest.raises(ValueError, match=message):
        Motif3PolyNormGLU(args.pop("dim"), args.pop("hidden_dim"), **args)
