"""λ forms and λ_init schedules against their formulas (docs/design.md, λ forms)."""

from __future__ import annotations

import math

import pytest
import torch

from diffattn.lambdas import (
    AnnealedLambda,
    ConstantLambda,
    DualScalarLambda,
    GateLambda,
    ReparamLambda,
    TokenSigmoidLambda,
    build_lambda,
    lambda_init_ye,
    resolve_lambda_init,
)


def test_ye_schedule_is_zero_based():
    assert lambda_init_ye(0) == pytest.approx(0.2)
    for depth in (1, 5, 11):
        assert lambda_init_ye(depth) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * depth))
    assert resolve_lambda_init("ye", 3) == pytest.approx(0.8 - 0.6 * math.exp(-0.9))
    assert resolve_lambda_init(0.8, 7) == 0.8
    with pytest.raises(ValueError, match="lambda_init"):
        resolve_lambda_init("yee", 0)
    with pytest.raises(ValueError, match="depth"):
        lambda_init_ye(-1)


def test_reparam_formula_and_init():
    torch.manual_seed(0)
    m = ReparamLambda(64, 0.8)
    for p in (m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2):
        assert p.dtype == torch.float32 and p.shape == (64,)
        assert 0.05 < p.std().item() < 0.15  # N(0, 0.1²)
    expect = (math.exp((m.lambda_q1 * m.lambda_k1).sum().item())
              - math.exp((m.lambda_q2 * m.lambda_k2).sum().item()) + 0.8)
    w1, lam = m()
    assert w1 == 1.0 and lam.item() == pytest.approx(expect, rel=1e-6)
    per_head = ReparamLambda(8, 0.5, num_heads=3)
    assert per_head.value().shape == (1, 3, 1, 1)


def test_dual_scalar_and_constant():
    m = DualScalarLambda(0.3)
    assert m.value().item() == pytest.approx(0.3)  # exp(0) − exp(0) + λ_init
    with torch.no_grad():
        m.lambda_a.fill_(0.5)
    assert m.value().item() == pytest.approx(math.exp(0.5) - 1 + 0.3, rel=1e-6)
    assert ConstantLambda(0.6)() == (1.0, 0.6)
    assert len(list(ConstantLambda().parameters())) == 0


def test_gate_and_token_sigmoid_are_per_token_and_head():
    x = torch.randn(2, 5, 16)
    gate = GateLambda(16, 4)
    g, lam = gate(x)
    assert g.shape == (2, 4, 5, 1)
    expect = torch.sigmoid(x @ gate.gate_proj.weight.T + gate.gate_proj.bias).transpose(1, 2).unsqueeze(-1)
    assert torch.allclose(g, expect) and torch.allclose(lam, 1 - expect)
    ts = TokenSigmoidLambda(16, 4)
    w1, lam = ts(x)
    assert w1 == 1.0 and lam.shape == (2, 4, 5, 1) and ((lam > 0) & (lam < 1)).all()


def annealed(t, T, lambda_init, lambda_learn):
    alpha = min(1.0, t / T)
    return (1 - alpha) * (t / T) * lambda_init + alpha * lambda_learn


def test_annealed_schedule_matches_seed_001_eq_3():
    T = 100
    m = AnnealedLambda(0.8, T, lambda_learn_init=0.05)
    assert m.value().item() == pytest.approx(annealed(0, T, 0.8, 0.05)) == 0.0
    for t in (T // 2, T, 2 * T):
        m.step.fill_(t)
        assert m.value().item() == pytest.approx(annealed(t, T, 0.8, 0.05), abs=1e-7)
    assert m.value().item() == pytest.approx(0.05)  # past T: λ = λ_learn


def test_annealed_starts_at_exact_zero_and_resumes_from_state_dict():
    m = AnnealedLambda(0.8, 10)
    assert m.value().item() == 0.0
    for _ in range(4):
        m.advance()
    sd = m.state_dict()
    assert "step" in sd and sd["step"].item() == 4
    resumed = AnnealedLambda(0.8, 10)
    resumed.load_state_dict(sd)
    resumed.advance()
    assert resumed.value().item() == pytest.approx(annealed(5, 10, 0.8, 0.0))
    # the ramp moves λ even when λ_learn gets no gradient: it is not a stationary point
    assert resumed.value().item() > 0


def test_annealed_gradient_reaches_lambda_learn():
    m = AnnealedLambda(0.8, 10)
    m.step.fill_(5)
    m.value().backward()
    assert m.lambda_learn.grad.item() == pytest.approx(0.5)  # α = t/T


def test_build_lambda_and_errors():
    for form in ("reparam", "dual_scalar", "constant", "gate", "token_sigmoid", "annealed"):
        build_lambda(form, head_dim=8, dim=16, num_heads=2, lambda_init=0.8)
    with pytest.raises(ValueError, match="lambda_form"):
        build_lambda("scalar", head_dim=8, dim=16, num_heads=2, lambda_init=0.8)
    with pytest.raises(ValueError, match="anneal_steps"):
        AnnealedLambda(0.8, 0)


def test_registry_builds_every_form_once_with_one_signature():
    from diffattn.lambdas import LambdaForm, available_lambdas, lambda_class, register_lambda

    assert set(available_lambdas()) >= {"reparam", "dual_scalar", "constant", "gate", "token_sigmoid", "annealed"}
    for name in available_lambdas():
        m = build_lambda(name, dim=16, num_heads=2, head_dim=8, lambda_init=0.5)
        assert isinstance(m, LambdaForm) and type(m) is lambda_class(name) and m.name == name
        w1, lam = m(torch.randn(3, 4, 16))
        lam = torch.as_tensor(lam)
        assert torch.broadcast_shapes(lam.shape, (3, 2, 4, 1)) == (3, 2, 4, 1)
    with pytest.raises(ValueError, match="already registered"):
        register_lambda("reparam")(type("Again", (LambdaForm,), {}))
    with pytest.raises(ValueError, match="lambda_options"):
        build_lambda("gate", dim=16, num_heads=2, head_dim=8, lambda_init=0.5, std=0.1)
    per_head = build_lambda("reparam", dim=16, num_heads=2, head_dim=8, lambda_init=0.5, per_head=True, std=0.0)
    assert per_head(None)[1].shape == (1, 2, 1, 1) and torch.allclose(per_head(None)[1], torch.tensor(0.5))
    assert build_lambda("token_sigmoid", dim=16, num_heads=2, head_dim=8, lambda_init=0.5).lambda_proj.bias is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), True, "0.8"])
def test_lambda_init_must_be_finite(bad):
    with pytest.raises(ValueError, match="lambda_init"):
        resolve_lambda_init(bad)
    with pytest.raises(ValueError, match="lambda_init"):
        build_lambda("reparam", dim=16, num_heads=2, head_dim=8, lambda_init=bad)
    with pytest.raises(ValueError, match="lambda_init"):
        ReparamLambda(8, bad)


def test_numpy_scalars_are_accepted():
    np = pytest.importorskip("numpy")
    assert resolve_lambda_init(np.float32(0.5)) == 0.5
    assert ConstantLambda(np.float64(0.25)).lambda_init == 0.25


def test_check_lambda_init_is_the_one_check_of_a_given_value():
    from diffattn.lambdas import DEFAULT_LAMBDA_INIT, check_lambda_init

    assert check_lambda_init("ye") == "ye"
    assert check_lambda_init(1) == 1.0 and isinstance(check_lambda_init(1), float)
    assert check_lambda_init(DEFAULT_LAMBDA_INIT) == 0.8
    with pytest.raises(ValueError, match="lambda_init must be a finite float or 'ye', got 'depth'"):
        check_lambda_init("depth")
    with pytest.raises(ValueError, match="lambda_init must be a finite float or 'ye', got inf"):
        check_lambda_init(float("inf"))
    with pytest.raises(TypeError, match="lambda_init must be a finite float or 'ye', got NoneType None"):
        check_lambda_init(None)
