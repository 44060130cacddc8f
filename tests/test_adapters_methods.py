"""The retrofit-method registry: the built-in methods, its errors, and a method registered from this test module
(one class, no other file touched) retrofitting a tiny GPT-2 exactly as the equivalent built-in would."""

import warnings

import pytest
import torch
import torch.nn as nn

import diffattn.adapters as A
from diffattn.adapters import methods as M
from diffattn.adapters.methods import AnnealedMethod, register_method, unregister_method

from .test_adapters import real_text_ids, tiny_gpt2


class DiagDAA(AnnealedMethod):
    """DAA with a diagonal per-head query transform: Q2 = Q diag(s_h), s (h, d) ones at init; (A1 − λ(t) A2) V.

    The same function as DAA (2025, eq. 4) with W_daa = diag(s_h), with d instead of d² new parameters per head."""

    def init_parameters(self, adapter, *, device=None, dtype=None) -> None:
        adapter.s_diag = nn.Parameter(torch.ones(adapter.num_heads, adapter.head_dim, device=device, dtype=dtype))

    def second_branch(self, adapter, x, q, project):
        return q * adapter.s_diag.to(q.dtype)[None, :, None, :], None, None  # (B, h, N, d)


@pytest.fixture
def diag_daa():
    register_method("diag_daa")(DiagDAA)
    try:
        yield "diag_daa"
    finally:
        unregister_method("diag_daa")


def test_builtin_methods_in_order():
    assert A.METHODS == ("daa", "dex", "diffq", "diffk", "diffv", "shared_qk", "split_heads")
    assert A.list_methods() == A.METHODS
    assert A.ANNEALED_METHODS == ("daa", "dex", "diffq", "diffk", "diffv")
    assert A.BLENDED_METHODS == ("shared_qk", "split_heads")
    assert M.INPUT_METHODS == {"diffq": "q", "diffk": "k", "diffv": "v"}
    for name in A.METHODS:
        assert M.method_class(name).name == name
        assert isinstance(A.build_method(name), M.RetrofitMethod)


def test_registry_errors():
    with pytest.raises(ValueError, match="'daa' is already registered \\(by DAA\\)"):
        register_method("daa")(DiagDAA)
    with pytest.raises(TypeError, match="needs a RetrofitMethod subclass, got <class 'int'>"):
        register_method("not_a_method")(int)
    with pytest.raises(ValueError, match="must be an identifier string, got 'two words'"):
        register_method("two words")
    with pytest.raises(ValueError, match="method must be one of \\('daa', .*'split_heads'\\), got 'nope'"):
        A.build_method("nope")
    with pytest.raises(ValueError, match="method must be one of .* got 'nope'"):
        A.RetrofitConfig("nope")
    with pytest.raises(ValueError, match="'nope' is not registered"):
        unregister_method("nope")
    assert A.list_methods() == A.METHODS  # nothing was registered by the failures


def test_renamed_groups_warn_with_the_new_name():
    for old, new in (("SEED001_METHODS", "ANNEALED_METHODS"), ("SEED002_METHODS", "BLENDED_METHODS")):
        with pytest.warns(FutureWarning, match=f"methods.{old} is deprecated .*; use diffattn.adapters.methods.{new}"):
            assert getattr(M, old) == getattr(M, new)
        with pytest.warns(FutureWarning, match=f"adapters.{old} is deprecated .*; use diffattn.adapters.{new}"):
            assert getattr(A, old) == getattr(A, new)


def test_method_from_a_test_module_retrofits_like_the_builtin(diag_daa):
    ids = real_text_ids(16)
    base = tiny_gpt2()
    with torch.no_grad():
        ref = base(ids).logits
    model = A.retrofit(tiny_gpt2(), diag_daa, anneal_steps=10)
    model.load_state_dict(base.state_dict(), strict=False)
    assert A.retrofit_config(model).method == "diag_daa"
    counts = A.count_parameters(model)
    assert [layer["new"] for layer in counts["layers"]] == [4 * 8 + 1] * 2  # s (h, d) + λ_learn per layer
    with torch.no_grad():  # step 0: λ(0) = 0, the pretrained function
        torch.testing.assert_close(model(ids).logits, ref, atol=1e-5, rtol=0)

    daa = A.retrofit(tiny_gpt2(), "daa", anneal_steps=10)
    daa.load_state_dict(base.state_dict(), strict=False)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for (_, a), (_, b) in zip(A.adapters(model), A.adapters(daa), strict=True):
            a.s_diag.copy_(1.0 + 0.5 * torch.randn(a.s_diag.shape, generator=g))
            b.W_daa.copy_(torch.diag_embed(a.s_diag))  # the same transform as a DAA matrix
            a.lam.lambda_learn.fill_(0.3)
            b.lam.lambda_learn.fill_(0.3)
            a.advance(4)
            b.advance(4)
        out, out_daa = model(ids).logits, daa(ids).logits
    assert (out - ref).abs().max() > 1e-3  # the second branch matters now
    torch.testing.assert_close(out, out_daa, atol=1e-5, rtol=0)
    summary = A.lambda_summary(model)
    assert [s["step"] for s in summary] == [4, 4]
    assert summary[0]["lambda_learn"] == pytest.approx(0.3)
    assert summary[0]["blend"] is None
    # λ(4) = (1 − α)(t/T)λ_init + αλ_learn with α = t/T = 0.4 (DAA (2025) eq. 3)
    assert summary[0]["lambda"] == pytest.approx(0.6 * 0.4 * 0.8 + 0.4 * 0.3, abs=1e-6)


def test_method_from_a_test_module_saves_and_loads(diag_daa, tmp_path):
    ids = real_text_ids(16)
    model = A.retrofit(tiny_gpt2(), diag_daa, anneal_steps=10)
    with torch.no_grad():
        for _, a in A.adapters(model):
            a.s_diag.mul_(1.5)
            a.advance(7)
        want = model(ids).logits
    A.save_adapter(model, tmp_path / "ad")
    fresh = tiny_gpt2()
    fresh.load_state_dict({k: v for k, v in model.state_dict().items() if "diff_adapter" not in k}, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("error", FutureWarning)
        loaded = A.load_adapter(fresh, tmp_path / "ad")
    assert [int(a.step_buffer) for _, a in A.adapters(loaded)] == [7, 7]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, want, atol=0, rtol=0)


def test_every_method_file_of_the_package_is_registered():
    """A method shipped with diffattn is one new file in adapters/methods/: the package finds and imports every
    module but the shared ones, the papers' methods first in the papers' order."""
    from pathlib import Path

    import diffattn.adapters.methods as M

    files = sorted(p.stem for p in Path(M.__file__).parent.glob("*.py")
                   if p.stem not in ("__init__", "adapter", "base", "ops") and not p.stem.startswith("_"))
    assert sorted(m.rsplit(".", 1)[1] for m in M.METHOD_MODULES) == files
    assert M.METHODS[:7] == ("daa", "dex", "diffq", "diffk", "diffv", "shared_qk", "split_heads")
    assert set(M.METHODS) >= set(files)
