"""AttentionSpec: one value for a model's attention, validated once, built into every family's layers; the flat
keyword arguments and config.json files of before build the same models; λ_init's default is defined once."""

import inspect
import json

import pytest
import torch

import diffattn
import diffattn.adapters as A
from diffattn.lambdas import DEFAULT_LAMBDA_INIT
from diffattn.layers import (
    Attention,
    AttentionSpec,
    Block,
    DiffAttention,
    DiffAttentionV2,
    GatedDiffAttention,
    attention_spec,
)
from diffattn.models.causal_lm import CausalLM, LMBlock
from diffattn.models.clip import CLIP, TextTransformer
from diffattn.models.text import TextClassifier
from diffattn.models.vit import VisionTransformer

VIT = dict(img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=4)


def _seeded(build, seed=0):
    torch.manual_seed(seed)
    return build().eval()


def test_default_lambda_init_is_defined_once():
    assert DEFAULT_LAMBDA_INIT == 0.8
    assert AttentionSpec().lambda_init == DEFAULT_LAMBDA_INIT
    owners = [Attention, DiffAttention, GatedDiffAttention, DiffAttentionV2, Block, VisionTransformer,
              TextTransformer, TextClassifier, A.RetrofitAdapter, A.retrofit]
    for owner in owners:
        assert inspect.signature(owner).parameters["lambda_init"].default is DEFAULT_LAMBDA_INIT, owner
    assert A.RetrofitConfig("daa").lambda_init == DEFAULT_LAMBDA_INIT


@pytest.mark.parametrize("kw, message", [
    (dict(kind="linear"),
     "attention must be one of \\('standard', 'diff', 'gated', 'diff_v2', 'grouped'\\), got 'linear'"),
    (dict(kind="diff", lambda_init="depth"), "lambda_init must be a finite float or 'ye', got 'depth'"),
    (dict(kind="diff", lambda_init=float("nan")), "lambda_init must be a finite float"),
    (dict(kind="diff", lambda_form="cosine"), "lambda_form must be None or one of \\('reparam'"),
    (dict(kind="diff", lambda_options=[1]), "lambda_options must be a dict or None, got list"),
    (dict(kind="standard", backend="triton"), "backend='triton' is for differential attention"),
    (dict(kind="diff", backend="flash"), "backend must be one of \\('auto', 'math', 'sdpa', 'triton'\\)"),
    (dict(kind="diff", q_residual=True), "q_residual .* needs attention='gated', got attention='diff'"),
    (dict(kind="diff", gate_bias=False), "gate_bias .* needs attention='gated'"),
    (dict(kind="diff", head_dim=16), "head_dim is the head width of attention 'diff_v2'"),
    (dict(kind="diff", attn_drop=1.0), "attention attn_drop must be a float in \\[0, 1\\), got 1.0"),
    (dict(kind="diff", sub_norm="yes"), "attention sub_norm must be a bool, got 'yes'"),
    (dict(kind="diff", rope="full"), "rope must be None or one of \\('half', 'interleaved'\\), got 'full'"),
    (dict(kind="diff", num_kv_heads=0), "attention num_kv_heads must be None or an integer >= 1, got 0"),
    (dict(kind="diff", softcap=-1.0), "attention softcap must be None or a finite float > 0, got -1.0"),
])
def test_spec_validates_once_naming_the_setting(kw, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec(**kw)


def test_spec_lambda_init_type_is_a_type_error():
    with pytest.raises(TypeError, match="lambda_init must be a finite float or 'ye', got bool True"):
        AttentionSpec("diff", lambda_init=True)


def test_spec_json_round_trip_and_unknown_keys():
    spec = AttentionSpec("gated", lambda_init="ye", lambda_options={"bias": False}, q_residual=True, backend="math")
    d = spec.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert AttentionSpec.from_dict(d) == spec
    assert AttentionSpec(lambda_init=1).lambda_init == 1.0 and isinstance(AttentionSpec(lambda_init=1).lambda_init,
                                                                           float)
    with pytest.raises(ValueError, match="unknown AttentionSpec settings \\['lamda_init'\\]"):
        AttentionSpec.from_dict({"kind": "diff", "lamda_init": 0.5})


@pytest.mark.parametrize("kind, cls, extra", [
    ("standard", Attention, {}), ("diff", DiffAttention, {}), ("gated", GatedDiffAttention, {"q_residual": True}),
    ("diff_v2", DiffAttentionV2, {"head_dim": 8}),
])
def test_build_is_the_layer_class(kind, cls, extra):
    spec = AttentionSpec(kind, lambda_init="ye", backend="math", **extra)
    layer = _seeded(lambda: spec.build(32, 4, depth=2))
    ref = _seeded(lambda: cls(32, 4, depth=2, lambda_init="ye", backend="math", **extra))
    assert type(layer) is cls
    if kind != "standard":
        assert layer.lambda_init == pytest.approx(0.8 - 0.6 * torch.exp(torch.tensor(-0.6)).item())
    x = torch.randn(2, 5, 32)
    sd, ref_sd = layer.state_dict(), ref.state_dict()
    assert sd.keys() == ref_sd.keys() and all(torch.equal(sd[k], ref_sd[k]) for k in sd)
    torch.testing.assert_close(layer(x), ref(x), atol=0, rtol=0)


def test_block_takes_a_spec_or_the_flat_arguments():
    spec = AttentionSpec("gated", lambda_init="ye", q_residual=True, attn_drop=0.1, proj_drop=0.2, causal=True)
    a = _seeded(lambda: Block(32, 4, depth=1, attention=spec, drop=0.2))
    b = _seeded(lambda: Block(32, 4, depth=1, attention="gated", lambda_init="ye", q_residual=True, attn_drop=0.1,
                              drop=0.2, causal=True))
    assert a.attn.causal and a.attn.q_residual and a.attn.attn_drop == 0.1 and a.attn.proj_drop.p == 0.2
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="Block: attention is an AttentionSpec, .* got \\['backend'\\]"):
        Block(32, 4, attention=spec, causal=True, backend="math")
    # a flat argument that agrees with the spec is no conflict (a registered model's table may set it)
    c = _seeded(lambda: Block(32, 4, depth=1, attention=spec, drop=0.2, q_residual=True, causal=True))
    torch.testing.assert_close(c(x), a(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="Block: attention must be an AttentionSpec, its dict or one of"):
        Block(32, 4, attention=3)


def _same(a, b, *inputs):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with torch.no_grad():
        torch.testing.assert_close(a(*inputs), b(*inputs), atol=0, rtol=0)


def test_families_take_a_spec_or_the_flat_arguments():
    images = torch.randn(2, 3, 16, 16)
    _same(_seeded(lambda: VisionTransformer(**VIT, attention=AttentionSpec("diff", lambda_init="ye", sub_norm=False,
                                                                             qkv_bias=False))),
          _seeded(lambda: VisionTransformer(**VIT, attention="diff", lambda_init="ye", sub_norm=False,
                                            qkv_bias=False)), images)
    ids = torch.randint(1, 100, (2, 7))
    text = dict(vocab_size=100, max_len=8, embed_dim=32, depth=2, num_heads=4, drop_rate=0.0)
    _same(_seeded(lambda: TextClassifier(**text, attention=AttentionSpec("gated", q_residual=True))),
          _seeded(lambda: TextClassifier(**text, attention="gated", q_residual=True)), ids)
    lm = dict(vocab_size=100, dim=32, depth=2, num_heads=4, num_kv_heads=2, max_seq_len=16)
    spec = AttentionSpec("diff", lambda_init="ye", num_kv_heads=2, qkv_bias=False, out_bias=False)
    a = _seeded(lambda: CausalLM(**{**lm, "num_kv_heads": None}, attention=spec))
    assert a.attention_spec.causal and a.attention_spec.rope == "half" and a.attention == "diff"
    _same(a, _seeded(lambda: CausalLM(**lm, attention="diff")), ids)
    assert isinstance(a.blocks[0], LMBlock)
    tower = dict(vocab_size=100, context_length=8, embed_dim=32, depth=2, num_heads=4)
    clip_a = _seeded(lambda: CLIP(embed_dim=16, vision=dict(VIT, attention=AttentionSpec("diff")),
                                  text=dict(tower, attention=AttentionSpec("gated"))))
    clip_b = _seeded(lambda: CLIP(embed_dim=16, vision=dict(VIT, attention="diff"),
                                  text=dict(tower, attention="gated")))
    assert clip_a.text.attention_spec.causal  # the text tower is causal whatever the spec says
    _same(clip_a, clip_b, images, ids)
    with pytest.raises(ValueError, match="CausalLM: attention is an AttentionSpec, .* got \\['lambda_form'\\]"):
        CausalLM(**{**lm, "num_kv_heads": None}, attention=spec, lambda_form="constant")


def test_registered_models_take_a_spec_that_agrees_with_their_table():
    spec = AttentionSpec("gated", q_residual=True, lambda_init="ye")
    model = diffattn.create_model("dg_vit_tiny_patch16_224", attention=spec, img_size=32, depth=2)
    assert model.attention_spec == spec and model.blocks[1].attn.q_residual
    with pytest.raises(ValueError, match="VisionTransformer: attention is an AttentionSpec, .* got \\['q_residual'\\]"):
        diffattn.create_model("dg_vit_tiny_patch16_224", attention=AttentionSpec("gated"), img_size=32, depth=2)


def test_spec_models_save_and_load(tmp_path):
    images = torch.randn(2, 3, 16, 16)
    spec = AttentionSpec("diff", lambda_init="ye", lambda_form="dual_scalar", backend="math")
    model = _seeded(lambda: VisionTransformer(**VIT, attention=spec))
    model.save_pretrained(tmp_path / "vit")
    cfg = json.loads((tmp_path / "vit" / "config.json").read_text())
    assert cfg["attention"] == spec.to_dict()
    loaded = diffattn.from_pretrained(tmp_path / "vit").eval()
    assert loaded.attention_spec == spec
    _same(model, loaded, images)

    ids = torch.randint(1, 100, (2, 8))
    tower = dict(vocab_size=100, context_length=8, embed_dim=32, depth=2, num_heads=4)
    clip = _seeded(lambda: CLIP(embed_dim=16, vision=dict(VIT, attention=spec),
                                text=dict(tower, attention=AttentionSpec("gated", lambda_init=0.5))))
    clip.save_pretrained(tmp_path / "clip")
    loaded = diffattn.from_pretrained(tmp_path / "clip").eval()
    assert loaded.visual.attention_spec == spec and loaded.text.attention_spec.lambda_init == 0.5
    _same(clip, loaded, images, ids)


def test_flat_models_save_the_flat_config_as_before(tmp_path):
    model = _seeded(lambda: VisionTransformer(**VIT, attention="gated", lambda_init="ye", q_residual=True))
    model.save_pretrained(tmp_path / "vit")
    cfg = json.loads((tmp_path / "vit" / "config.json").read_text())
    assert (cfg["attention"], cfg["lambda_init"], cfg["q_residual"]) == ("gated", "ye", True)
    loaded = diffattn.from_pretrained(tmp_path / "vit").eval()
    assert loaded.attention_spec == AttentionSpec("gated", lambda_init="ye", q_residual=True)
    _same(model, loaded, torch.randn(2, 3, 16, 16))


def test_attention_spec_keeps_a_spec_and_names_the_owner():
    spec = AttentionSpec("diff")
    assert attention_spec(spec, owner="X") is spec
    assert attention_spec(spec.to_dict(), owner="X") == spec
    assert attention_spec("diff", owner="X", fill={"proj_drop": 0.1}, force={"causal": True},
                          attn_drop_rate=("attn_drop", 0.2)) == AttentionSpec("diff", proj_drop=0.1, causal=True,
                                                                              attn_drop=0.2)
