"""Branch maps of retrofitted models: A1, A2 and the combined map through capture_attention (every binding) and
through output_attentions / need_weights, against a float64 reference computed from each module's weights."""

from __future__ import annotations

import pytest
import torch

import diffattn.adapters as A
from diffattn.diagnostics import capture_attention

FAMILIES = ["gpt2", "bert", "llama", "timm", "open_clip"]
HF = ("gpt2", "bert", "llama")


def _build(family: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """(float64 model, its input) for a family; HF models use the eager implementation (it returns maps)."""
    torch.manual_seed(0)
    if family in HF:
        T = pytest.importorskip("transformers")
        if family == "gpt2":
            cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16)
            model = T.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")
        elif family == "bert":
            cfg = T.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=64)
            model = T.BertModel._from_config(cfg, attn_implementation="eager")
        else:
            cfg = T.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=64)
            model = T.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")
        return model.double().eval(), torch.randint(1, 64, (2, 6))
    if family == "timm":
        pytest.importorskip("timm")
        from timm.models.vision_transformer import VisionTransformer

        model = VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=3)
        return model.double().eval(), torch.randn(2, 3, 16, 16, dtype=torch.float64)
    open_clip = pytest.importorskip("open_clip")
    cfg = {"embed_dim": 16, "vision_cfg": {"image_size": 16, "layers": 2, "width": 32, "patch_size": 8,
                                           "head_width": 8},
           "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 4, "layers": 2}}
    return open_clip.CLIP(**cfg).visual.double().eval(), torch.randn(2, 3, 16, 16, dtype=torch.float64)


def _run(family, model, x, **kw):
    return model(input_ids=x, **kw) if family in HF else model(x)


def _heads(t: torch.Tensor, d: int) -> torch.Tensor:
    B, N, _ = t.shape
    return t.view(B, N, -1, d).transpose(1, 2)  # (B, heads, N, d)


def _project(family: str, m: torch.nn.Module, x: torch.Tensor, which: str) -> torch.Tensor:
    """One pretrained projection of the retrofitted module ``m`` on x (B, N, D), as heads (B, heads, N, d)."""
    i = "qkv".index(which)
    if family == "gpt2":
        return _heads(m.c_attn(x).split(m.split_size, dim=2)[i], m.head_dim)
    if family == "bert":
        return _heads(getattr(m, ("query", "key", "value")[i])(x), m.attention_head_size)
    if family == "llama":
        return _heads(getattr(m, ("q_proj", "k_proj", "v_proj")[i])(x), m.head_dim)
    if family == "timm":
        D = x.shape[-1]
        return _heads(torch.nn.functional.linear(x, m.qkv.weight[i * D:(i + 1) * D], m.qkv.bias[i * D:(i + 1) * D]),
                      m.head_dim)
    D = m.embed_dim
    return _heads(torch.nn.functional.linear(x, m.in_proj_weight[i * D:(i + 1) * D],
                                             m.in_proj_bias[i * D:(i + 1) * D]), m.head_dim)


def _reference(family: str, m: torch.nn.Module, x: torch.Tensor, kwargs: dict) -> tuple:
    """(A1, A2 or None, combined) in float64 from the module's weights: DAA (2025) eq. 4 / App. D, eq. 11."""
    ad = m.diff_adapter
    q, k = _project(family, m, x, "q"), _project(family, m, x, "k")
    q2 = k2 = None
    if ad.method == "daa":
        q2 = torch.einsum("bhnd,hde->bhne", q, ad.W_daa)  # W_daa before the rotary embedding
    elif ad.method == "diffk":
        k2 = _project(family, m, x @ ad.W_dk, "k")
    if family == "llama":
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cos, sin = kwargs["position_embeddings"]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if q2 is not None:
            q2, _ = apply_rotary_pos_emb(q2, k, cos, sin)
        if k2 is not None:
            _, k2 = apply_rotary_pos_emb(q, k2, cos, sin)
        rep = q.shape[1] // k.shape[1]  # grouped-query attention
        k = k.repeat_interleave(rep, dim=1)
        k2 = None if k2 is None else k2.repeat_interleave(rep, dim=1)
    d, N = q.shape[-1], q.shape[2]
    causal = family in ("gpt2", "llama")
    blocked = torch.ones(N, N, dtype=torch.bool).triu(1) if causal else torch.zeros(N, N, dtype=torch.bool)

    def softmax(qq, kk):
        return torch.softmax((qq @ kk.transpose(-1, -2) * d**-0.5).masked_fill(blocked, float("-inf")), -1)

    a1 = softmax(q, k)
    if ad.method == "dex":
        return a1, None, a1
    a2 = softmax(q if q2 is None else q2, k if k2 is None else k2)
    lam = float(ad.lambda_value())
    return a1, a2, a1 - lam * a2


def _retrofitted(family: str, method: str):
    model, x = _build(family)
    A.retrofit(model, method, anneal_steps=10, train="all")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, a in A.adapters(model):  # off the identity, λ(4) = (1 − 0.4)·0.4·0.8 + 0.4·λ_learn ≠ 0
            for p in a.parameters():
                if p.dim() >= 2:
                    p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            a.lam.lambda_learn.add_(0.1)
    A.step(model, 4)
    return model, x


@pytest.mark.parametrize("method", ["daa", "diffk", "dex"])
@pytest.mark.parametrize("family", FAMILIES)
def test_capture_gives_both_branches_for_every_binding(family, method):
    model, x = _retrofitted(family, method)
    inputs: dict[str, tuple] = {}
    mods = {n: m for n, m in model.named_modules() if hasattr(m, "diff_adapter")}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, kwargs, n=n: inputs.__setitem__(n, (args[0] if args else
                                                              kwargs.get("hidden_states", kwargs.get("x")),
                                                              kwargs)), with_kwargs=True)
        for n, m in mods.items()]
    with torch.no_grad():
        ref_out = _run(family, model, x)
        with capture_attention(model) as cap:
            out = _run(family, model, x)
    for h in hooks:
        h.remove()
    ref_t = ref_out if isinstance(ref_out, torch.Tensor) else ref_out[0]
    out_t = out if isinstance(out, torch.Tensor) else out[0]
    torch.testing.assert_close(out_t, ref_t, atol=1e-12, rtol=0)  # outputs unchanged
    assert [m.name for m in cap.layers] == list(mods) and all(m.kind == "retrofit" for m in cap.layers)
    for rec in cap.layers:
        m = mods[rec.name]
        xin, kw = inputs[rec.name]
        if family == "open_clip" and not m.batch_first:
            xin = xin.transpose(0, 1)
        with torch.no_grad():
            a1, a2, comb = _reference(family, m, xin, kw)
        torch.testing.assert_close(rec.first.double(), a1, atol=1e-6, rtol=0)
        torch.testing.assert_close(rec.combined.double(), comb, atol=1e-6, rtol=0)
        if a2 is None:
            assert rec.second is None
        else:
            torch.testing.assert_close(rec.second.double(), a2, atol=1e-6, rtol=0)
            assert (a1 - a2).abs().max().item() > 1e-3  # the branches differ: the test can tell them apart
        assert float(rec.lambda_[0]) == pytest.approx(float(m.diff_adapter.lambda_value().detach()), abs=1e-7)
    for m in mods.values():  # nothing kept after the context
        assert m.diff_adapter.keep_maps is False and m.diff_adapter.last_maps is None


@pytest.mark.parametrize("method", ["daa", "dex"])
@pytest.mark.parametrize("family", HF)
def test_output_attentions_carries_the_branches(family, method):
    model, x = _retrofitted(family, method)
    inputs: dict[int, tuple] = {}
    mods = [m for m in model.modules() if hasattr(m, "diff_adapter")]
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, kwargs, i=i: inputs.__setitem__(i, (args[0] if args else kwargs["hidden_states"], kwargs)),
        with_kwargs=True) for i, m in enumerate(mods)]
    with torch.no_grad():
        out = model(input_ids=x, output_attentions=True)
    for h in hooks:
        h.remove()
    assert len(out.attentions) == len(mods)
    for i, (m, maps) in enumerate(zip(mods, out.attentions)):
        first, second, combined = A.branch_maps(maps)
        assert combined is maps
        with torch.no_grad():
            a1, a2, comb = _reference(family, m, inputs[i][0], inputs[i][1])
        torch.testing.assert_close(combined, comb, atol=1e-12, rtol=0)  # float64 all the way: exact to rounding
        torch.testing.assert_close(first, a1, atol=1e-12, rtol=0)
        if a2 is None:
            assert second is None
        else:
            torch.testing.assert_close(second, a2, atol=1e-12, rtol=0)


def test_open_clip_need_weights_carries_the_branches():
    model, x = _retrofitted("open_clip", "daa")
    attn = model.transformer.resblocks[0].attn
    h = torch.randn(2, 5, 32, dtype=torch.float64)
    xin = h if attn.batch_first else h.transpose(0, 1)
    with torch.no_grad():
        _, maps = attn(xin, xin, xin, need_weights=True, average_attn_weights=False)
        a1, a2, comb = _reference("open_clip", attn, h, {})
    first, second, combined = A.branch_maps(maps)
    torch.testing.assert_close(combined, comb, atol=1e-12, rtol=0)
    torch.testing.assert_close(first, a1, atol=1e-12, rtol=0)
    torch.testing.assert_close(second, a2, atol=1e-12, rtol=0)


def test_branch_maps_rejects_other_tensors():
    with pytest.raises(ValueError, match="maps must be an attention map returned by a layer converted"):
        A.branch_maps(torch.zeros(1, 1, 2, 2))
