"""diffusers' Stable Audio 3 DiT on diffattn's operator: the processor against diffusers' own processors (tiny random
configs, float64), self- and cross-attention with context masks, gradients, and the maps it records."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("diffusers", reason="diffusers >= 0.40 (pip install 'diffattn[audio]') runs the Stable Audio 3 DiT")
from diffusers import StableAudio3DiTModel  # noqa: E402
from diffusers.models.transformers.transformer_stable_audio3 import (  # noqa: E402
    StableAudio3CrossAttention,
    StableAudio3RotaryEmbedding,
    StableAudio3SelfAttention,
)

from diffattn.adapters.diffusers import (  # noqa: E402
    StableAudio3DiffattnProcessor,
    capture_stable_audio_maps,
    stable_audio_attention_modules,
)
from diffattn.convert.stable_audio import from_diffusers_stable_audio  # noqa: E402


def _perturb(module: torch.nn.Module) -> None:
    """Every parameter moved off its init (the zero-initialised convs and projections included), so every path of
    the DiT reaches the output."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))


def _dit(dtype=torch.float64) -> StableAudio3DiTModel:
    torch.manual_seed(0)
    model = StableAudio3DiTModel(io_channels=8, embed_dim=64, depth=2, num_heads=4, cond_token_dim=16,
                                 global_cond_dim=12, local_add_cond_dim=5, timestep_features_dim=16,
                                 num_memory_tokens=3, use_differential_attention=True)
    _perturb(model)
    return model.to(dtype).eval()


def _inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 10, generator=g, dtype=dtype)
    t = torch.rand(2, generator=g, dtype=dtype)
    ctx = torch.randn(2, 7, 16, generator=g, dtype=dtype)
    glob = torch.randn(2, 12, generator=g, dtype=dtype)
    mask = torch.tensor([[True] * 5 + [False] * 2, [True] * 7])
    return x, t, ctx, glob, mask


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa"])
@pytest.mark.parametrize("masked", [False, True])
def test_the_dit_with_diffattn_processors_is_diffusers_dit(backend, masked):
    """float64, the whole DiT (memory tokens, partial RoPE, QK-norms, AdaLN, every self- and cross-attention):
    ≤ 1e-10 from diffusers' processors (the DiT replaces padded context tokens by its padding embedding when given
    ``encoder_attention_mask``)."""
    ref_model = _dit()
    model = copy.deepcopy(ref_model)
    model.set_attn_processor(StableAudio3DiffattnProcessor(backend))
    assert {type(p).__name__ for p in model.attn_processors.values()} == {"StableAudio3DiffattnProcessor"}
    x, t, ctx, glob, mask = _inputs()
    kwargs = {"encoder_attention_mask": mask} if masked else {}
    with torch.no_grad():
        ref = ref_model(x, t, ctx, glob, **kwargs).sample
        out = model(x, t, ctx, glob, **kwargs).sample
    assert ref.abs().max() > 0.5  # the attention paths reach the output: a real comparison
    assert (out - ref).abs().max().item() <= 1e-10


def test_gradients_are_diffusers_gradients():
    ref_model = _dit().train()
    model = copy.deepcopy(ref_model)
    model.set_attn_processor(StableAudio3DiffattnProcessor())
    x, t, ctx, glob, _ = _inputs()
    for m in (ref_model, model):
        m(x, t, ctx, glob).sample.square().sum().backward()
    checked = 0
    for (name, p_ref), p in zip(ref_model.named_parameters(), model.parameters()):
        assert (p.grad is None) == (p_ref.grad is None), name  # the inpainting and padding inputs are unused
        if p.grad is not None:  # diffusers' QK-norm and rotation run in float32: their backward rounds to float32
            assert (p.grad - p_ref.grad).abs().max().item() <= 1e-6 * p_ref.grad.abs().max().item(), name
            checked += "attn" in name
    assert checked == 2 * (4 + 5)  # self: to_qkv, to_out, q_norm, k_norm; cross: to_q, to_kv and the same three


def test_float32_agrees_to_rounding():
    ref_model = _dit(torch.float32)
    model = copy.deepcopy(ref_model)
    model.set_attn_processor(StableAudio3DiffattnProcessor())
    x, t, ctx, glob, _ = _inputs(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(model(x, t, ctx, glob).sample, ref_model(x, t, ctx, glob).sample,
                                   rtol=1e-5, atol=1e-5)


def test_self_and_cross_modules_with_a_context_mask():
    """The modules alone: cross-attention takes a (B, M) context mask, True = attend (the DiT itself never passes
    one); a row with some valid keys is diffusers' exactly."""
    torch.manual_seed(0)
    sa = StableAudio3SelfAttention(64, dim_heads=16).double()
    ca = StableAudio3CrossAttention(64, 24, dim_heads=16).double()
    _perturb(sa), _perturb(ca)
    x, c = torch.randn(2, 9, 64, dtype=torch.float64), torch.randn(2, 5, 24, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True, False], [True] * 5])
    rope = StableAudio3RotaryEmbedding(8).double()(9, x.device)
    with torch.no_grad():
        ref_sa, ref_ca = sa(x, rope), ca(x, c, mask)
        sa.set_processor(StableAudio3DiffattnProcessor())
        ca.set_processor(StableAudio3DiffattnProcessor())
        assert (sa(x, rope) - ref_sa).abs().max().item() <= 1e-10
        assert (ca(x, c, mask) - ref_ca).abs().max().item() <= 1e-10
        assert (ca(x, c) - ca(x, c, torch.ones(2, 5, dtype=torch.bool))).abs().max().item() <= 1e-12


def test_bad_uses_are_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        StableAudio3DiffattnProcessor("flash")
    with pytest.raises(ValueError, match="on_maps must be None or a callable"):
        StableAudio3DiffattnProcessor(on_maps=3)
    plain = StableAudio3SelfAttention(32, dim_heads=8, use_differential=False)
    plain.set_processor(StableAudio3DiffattnProcessor())
    with pytest.raises(ValueError, match="has use_differential=False"):
        plain(torch.randn(1, 3, 32), StableAudio3RotaryEmbedding(4)(3, "cpu"))
    ca = StableAudio3CrossAttention(32, 32, dim_heads=8)
    with pytest.raises(ValueError, match="context is required"):
        StableAudio3DiffattnProcessor()(ca, torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="has no differential Stable Audio 3 attention module"):
        with capture_stable_audio_maps(torch.nn.Linear(2, 2)):
            pass


# ---------------------------------------------------------------------------------------------- the maps

def test_the_maps_of_every_layer_and_head_leave_the_output_bit_for_bit():
    model = _dit()
    x, t, ctx, glob, _ = _inputs()
    names = [n for n, _ in stable_audio_attention_modules(model)]
    assert names == ["transformer_blocks.0.self_attn", "transformer_blocks.0.cross_attn",
                     "transformer_blocks.1.self_attn", "transformer_blocks.1.cross_attn"]
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw, n=n: inputs.setdefault(n, (args, kw)),
                                         with_kwargs=True) for n, m in stable_audio_attention_modules(model)]
    model.set_attn_processor(StableAudio3DiffattnProcessor())
    before = [m.processor for _, m in stable_audio_attention_modules(model)]
    with torch.no_grad():
        ref = model(x, t, ctx, glob).sample
        with capture_stable_audio_maps(model) as maps:
            out = model(x, t, ctx, glob).sample
    for h in hooks:
        h.remove()
    assert torch.equal(out, ref)
    assert [m.processor for _, m in stable_audio_attention_modules(model)] == before  # restored
    assert list(maps) == names and all(len(v) == 1 for v in maps.values())
    for name, ((w,), module) in zip(names, ((maps[n], dict(model.named_modules())[n]) for n in names)):
        nk = 13 if name.endswith("self_attn") else 7  # 3 memory tokens + 10 latents; 7 context tokens
        assert w.first.shape == w.second.shape == w.combined.shape == (2, 4, 13, nk)
        assert torch.equal(w.combined, w.first - w.second)  # λ = 1
        torch.testing.assert_close(w.second.sum(-1), torch.ones(2, 4, 13, dtype=torch.float64))
        # the maps are those of diffattn's layer built from the module, on the module's own input
        (args, kw) = inputs[name]
        layer = from_diffusers_stable_audio(module)
        with torch.no_grad():
            if name.endswith("self_attn"):
                _, lw = layer(args[0], need_weights=True)
            else:
                _, lw = layer(args[0], need_weights=True, context=kw["context"])
        # diffusers computes the QK-norm and the rotation in float32, the float64 layer in float64
        assert (lw.first - w.first).abs().max().item() <= 1e-6
        assert (lw.second - w.second).abs().max().item() <= 1e-6


@pytest.fixture
def sage_allowed(monkeypatch):
    """diffusers' attention-backend registry as the test found it afterwards, with the SageAttention requirement checks
    (the ``sageattention`` package, a Hub download) skipped: the processor must refuse before any of them matters."""
    from diffusers.models import attention_dispatch

    registry = attention_dispatch._AttentionBackendRegistry
    monkeypatch.setattr(registry, "_active_backend", registry._active_backend)
    monkeypatch.setattr(attention_dispatch, "_check_attention_backend_requirements", lambda backend: None)
    monkeypatch.setattr(attention_dispatch, "_maybe_download_kernel_for_backend", lambda backend: None)
    return attention_dispatch


@pytest.mark.parametrize("name", ["sage", "sage_varlen", "_sage_qk_int8_pv_fp8_cuda", "_sage_qk_int8_pv_fp16_triton"])
def test_an_eight_bit_diffusers_backend_is_refused_naming_it(name, sage_allowed):
    model = _dit(torch.float32)
    model.set_attn_processor(StableAudio3DiffattnProcessor())
    x, t, ctx, glob, _ = _inputs(torch.float32)
    with sage_allowed.attention_backend(name):  # diffusers' active backend
        with pytest.raises(ValueError, match=rf"StableAudio3(Self|Cross)Attention is differential attention, and the "
                                             rf"diffusers attention backend '{name}' \(diffusers' active attention "
                                             rf"backend.*computes attention in 8 bits.*'native'.*backend='auto'"):
            model(x, t, ctx, glob)
    with torch.no_grad():
        model(x, t, ctx, glob)  # the context left: full precision again, and the processor runs
    model.set_attention_backend(name)  # on every module's processor (and diffusers' active backend)
    with pytest.raises(ValueError, match=rf"'{name}' \(set on the module by model.set_attention_backend\)"):
        model(x, t, ctx, glob)
    model.set_attention_backend("native")
    with torch.no_grad():
        assert torch.isfinite(model(x, t, ctx, glob).sample).all()


@pytest.mark.parametrize("name", ["native", "_native_math", "flex"])
def test_full_precision_diffusers_backends_pass(name, sage_allowed):
    model = _dit(torch.float32)
    model.set_attn_processor(StableAudio3DiffattnProcessor("sdpa"))
    x, t, ctx, glob, _ = _inputs(torch.float32)
    with torch.no_grad():
        ref = model(x, t, ctx, glob).sample
        with sage_allowed.attention_backend(name):
            assert torch.equal(model(x, t, ctx, glob).sample, ref)  # diffattn's operator computes either way
