"""diffattn.serve without vLLM: the served attention arithmetic (one call per layer, query order, tensor-parallel
shards) against the layers' own forward in float64, the checkpoint layouts a server reads (diffattn, DiffLlama,
Motif) against the converters' models, the transformers configurations and the vLLM version check."""

import json
import math

import pytest
import torch
import torch.nn as nn

import diffattn
from diffattn import convert
from diffattn.layers import AttentionSpec
from diffattn.models import CausalLM
from diffattn.models.motif import MotifLM
from diffattn.serve import check_vllm_version
from diffattn.serve.checkpoints import reference_model, to_diffattn_names
from diffattn.serve.configs import DiffattnLMConfig, MotifConfig, register_configs
from diffattn.serve.layout import SERVED_KINDS, ServedLayer, reference_layer_forward, sdpa_attend, served_attention

T = 7  # tokens of a test sequence


def build_layer(kind: str, dim: int = 32, num_heads: int = 4, rope: str = "half", **kwargs) -> nn.Module:
    """A causal float64 attention layer of block 3 with every parameter drawn from N(0, 0.3²) (λ and norms too)."""
    layer = AttentionSpec(kind=kind, causal=True, rope=rope, **kwargs).build(dim, num_heads, depth=3).double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            torch.nn.init.normal_(p, std=0.3)
    return layer


def sequence(dim: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(T, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


# (kind, dim, num_heads, rope, settings)
LAYERS = {
    "standard_gqa": ("standard", 32, 4, "half", dict(num_kv_heads=2)),
    "diff_gqa": ("diff", 32, 4, "half", dict(num_kv_heads=2)),
    "diff": ("diff", 32, 4, "half", {}),
    "diff_ye": ("diff", 32, 4, "half", dict(lambda_init="ye")),
    "diff_per_head": ("diff", 32, 4, "half", dict(lambda_options={"per_head": True})),
    "diff_gqa_interleaved": ("diff", 32, 4, "interleaved", dict(num_kv_heads=2)),
    "gated_q_residual": ("gated", 32, 4, "half", dict(q_residual=True)),
    "gated_gqa": ("gated", 32, 4, "half", dict(num_kv_heads=2)),
    "diff_v2_gqa": ("diff_v2", 32, 4, "half", dict(num_kv_heads=2)),
    "grouped_4_1": ("grouped", 40, 10, "half", dict(num_noise_heads=2, num_kv_heads=4, head_dim=8)),
    "grouped_5_1_per_head": ("grouped", 24, 6, "half",
                             dict(num_noise_heads=1, num_kv_heads=2, head_dim=8, lambda_options={"per_head": True})),
    "grouped_4_1_per_head": ("grouped", 40, 10, "half", dict(num_noise_heads=2, num_kv_heads=4, head_dim=8,
                                                             lambda_options={"per_head": True})),
    "grouped_no_sub_norm": ("grouped", 40, 10, "half",
                            dict(num_noise_heads=2, num_kv_heads=4, head_dim=8, sub_norm=False)),
    "grouped_2_1_one_group": ("grouped", 48, 6, "half", dict(num_noise_heads=2, num_kv_heads=2, head_dim=8)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_reference_layer_forward_equals_the_layers_causal_forward(name):
    kind, dim, heads, rope, kwargs = LAYERS[name]
    layer = build_layer(kind, dim, heads, rope, **kwargs)
    x = sequence(dim)
    with torch.no_grad():
        ours, theirs = reference_layer_forward(layer, x), layer(x[None])[0]
    assert theirs.abs().max().item() > 0.1  # not a trivially small output
    assert max_diff(ours, theirs) <= 1e-12
    # the served result is causal: the first tokens do not see the later ones
    with torch.no_grad():
        assert max_diff(reference_layer_forward(layer, x[:3]), theirs[:3]) <= 1e-12


def served_qkv(layer: nn.Module, x: torch.Tensor):
    """(layout, q, k, v, weight1, lam) as :func:`reference_layer_forward` makes them: q (T, Hq·d) in the served
    order after RoPE, k (T, Hkv·d) after RoPE, v (T, Hkv·d), λ form output over all heads."""
    from diffattn.layers.rope import apply_rotary

    layout = ServedLayer.of(layer)
    d = layout.head_dim
    q = layer.q_proj(x).view(T, layout.num_heads, d)[:, torch.tensor(layout.query_order())]
    k = layer.k_proj(x).view(T, layout.num_kv_heads, d)
    cos, sin = layer.rotary(torch.arange(T), dtype=q.dtype)
    q, k = (apply_rotary(t.transpose(0, 1)[None], cos, sin, layer.rotary.style)[0].transpose(0, 1) for t in (q, k))
    weight1, lam = layer.lambda_fn(x[None])
    return layout, q.reshape(T, -1), k.reshape(T, -1), layer.v_proj(x), weight1, lam


def attend_for(layout: ServedLayer, tp: int):
    def attend(q, k, v):
        return sdpa_attend(q, k, v, heads=layout.num_heads // tp, kv_heads=layout.groups // tp,
                           head_size=layout.head_size, scale=1.0 / math.sqrt(layout.head_dim))
    return attend


# two key/value groups each, and a λ per head
TP_LAYERS = {
    "grouped_4_1_per_head": ("grouped", 40, 10, dict(num_noise_heads=2, num_kv_heads=4, head_dim=8,
                                                     lambda_options={"per_head": True})),
    "diff_v2_gqa": ("diff_v2", 32, 4, dict(num_kv_heads=2)),
}


@pytest.mark.parametrize("name", list(TP_LAYERS))
def test_tensor_parallel_shards_concatenate_to_the_single_rank_output(name):
    kind, dim, heads, kwargs = TP_LAYERS[name]
    layer = build_layer(kind, dim, heads, **kwargs)
    x = sequence(dim)
    with torch.no_grad():
        layout, q, k, v, weight1, lam = served_qkv(layer, x)
        assert layout.groups == 2
        assert isinstance(lam, torch.Tensor) and lam.shape[1] == layout.lambda_heads > 1  # a λ per head
        full = served_attention(layout, q, k, v, attend_for(layout, 1), weight1=weight1, lam=lam)
        kv_width = (2 if layout.paired else 1) * layout.head_dim  # one key/value group per rank
        q_width = q.shape[1] // 2
        shards = [served_attention(layout, q[:, r * q_width:(r + 1) * q_width], k[:, r * kv_width:(r + 1) * kv_width],
                                   v[:, r * kv_width:(r + 1) * kv_width], attend_for(layout, 2), weight1=weight1,
                                   lam=lam, rank=r, tp=2) for r in range(2)]
    assert full.shape == (T, layout.signal_heads * layout.out_head_size)
    assert max_diff(torch.cat(shards, dim=-1), full) <= 1e-12
    # each rank really takes its own λ heads: rank 1 given the λ heads reversed computes something else
    swapped = lam.flip(1)
    with torch.no_grad():
        wrong = served_attention(layout, q[:, q_width:], k[:, kv_width:], v[:, kv_width:], attend_for(layout, 2),
                                 weight1=weight1, lam=swapped, rank=1, tp=2)
    assert max_diff(wrong, shards[1]) > 1e-6


@pytest.mark.parametrize("kind,dim,heads,kwargs,order", [
    ("diff", 32, 4, dict(num_kv_heads=2), [0, 2, 1, 3]),  # one group: [s n s n] -> signals, then noises
    ("diff", 32, 4, dict(num_kv_heads=4), [0, 1, 2, 3]),  # two groups [s n], [s n]
    # 4:1 in two groups: the checkpoint's [s s s s n] [s s s s n] is already group-major
    ("grouped", 40, 10, dict(num_noise_heads=2, num_kv_heads=4, head_dim=8), list(range(10))),
    # 2:1 in one group: [s s n s s n] -> signals 0 1 3 4, then noises 2 5
    ("grouped", 48, 6, dict(num_noise_heads=2, num_kv_heads=2, head_dim=8), [0, 1, 3, 4, 2, 5]),
    ("diff_v2", 32, 4, dict(num_kv_heads=2), list(range(8))),
    ("standard", 32, 4, dict(num_kv_heads=2), [0, 1, 2, 3]),
], ids=["diff_1_group", "diff_2_groups", "grouped_4_1", "grouped_2_1_one_group", "diff_v2", "standard"])
def test_query_order(kind, dim, heads, kwargs, order):
    assert ServedLayer.of(build_layer(kind, dim, heads, **kwargs)).query_order() == order


@pytest.mark.parametrize("kind,kwargs,groups,what", [
    ("diff", dict(num_kv_heads=2), 1, "key/value groups (num_kv_heads / 2)"),
    ("grouped", dict(num_noise_heads=2, num_kv_heads=4, head_dim=8, dim=40, num_heads=10), 2,
     "key/value groups (num_kv_heads / 2)"),
    ("diff_v2", dict(num_kv_heads=2), 2, "key/value heads"),
])
def test_check_parallel_needs_whole_groups_per_rank(kind, kwargs, groups, what):
    kwargs = dict(kwargs)
    layer = build_layer(kind, kwargs.pop("dim", 32), kwargs.pop("num_heads", 4), **kwargs)
    layout = ServedLayer.of(layer)
    assert layout.groups == groups
    layout.check_parallel(groups)  # one group per rank
    tp = 2 * groups if groups > 1 else 2
    with pytest.raises(ValueError) as e:
        layout.check_parallel(tp)
    assert str(e.value) == (f"tensor_parallel_size={tp} must divide the {what} of a {kind!r} layer, {groups}")


def test_served_layer_of_a_module_that_is_no_attention_layer_names_the_served_kinds():
    with pytest.raises(ValueError, match="cannot be served") as e:
        ServedLayer.of(nn.Linear(4, 4))
    assert str(SERVED_KINDS) in str(e.value)


# --------------------------------------------------------------------------------------------------- checkpoints

DIFF_LM = dict(vocab_size=61, dim=64, depth=2, num_heads=4, max_seq_len=128,
               attention=dict(kind="diff", lambda_init="ye", num_kv_heads=2, causal=True, rope="half"))


def saved_config(model: nn.Module, folder) -> dict:
    model.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def shapes(sd) -> dict:
    return {k: tuple(v.shape) for k, v in sd.items()}


def loaded(ref: nn.Module, names, dtype=torch.float64) -> nn.Module:
    """The meta reference model with CPU storage of ``dtype`` and the named tensors loaded (strict), as a server
    fills it."""
    model = ref.to_empty(device="cpu").to(dtype)
    model.load_state_dict(dict(names), strict=True)
    return model.eval()


@pytest.mark.parametrize("cls", [CausalLM, MotifLM])
def test_a_saved_causal_lm_names_its_vllm_architecture_and_still_loads(cls, tmp_path):
    model = cls(**DIFF_LM)
    cfg = saved_config(model, tmp_path / "m")
    assert cfg["model_type"] == "diffattn" and cfg["architectures"] == ["DiffattnForCausalLM"]
    assert cfg["architecture"] == cls.__name__
    ref = reference_model("diffattn", cfg)
    assert type(ref) is cls and all(p.device.type == "meta" for p in ref.parameters())
    assert shapes(ref.state_dict()) == shapes(model.state_dict())
    again = diffattn.from_pretrained(tmp_path / "m")  # strict
    assert type(again) is cls
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    assert diffattn.formats.saved_kind(tmp_path / "m")[0] == "a diffattn save_pretrained folder"
    # the names stream through unchanged
    served = loaded(ref, to_diffattn_names("diffattn", ref, model.state_dict().items()), torch.float32)
    ids = torch.randint(0, 61, (1, 9))
    with torch.no_grad():
        assert torch.equal(served(ids), model.eval()(ids))


def test_reference_model_refuses_other_diffattn_models_and_old_formats(tmp_path):
    cfg = saved_config(CausalLM(**DIFF_LM), tmp_path / "m")
    assert "VisionTransformer" in diffattn.models.base._CLASSES
    with pytest.raises(ValueError, match="causal LMs") as e:
        reference_model("diffattn", {**cfg, "architecture": "VisionTransformer"})
    assert "'VisionTransformer'" in str(e.value)
    with pytest.raises(ValueError, match="causal LMs"):  # no architecture entry
        reference_model("diffattn", {k: v for k, v in cfg.items() if k != "architecture"})
    with pytest.raises(ValueError, match="got 'NoSuchModel'"):  # model_class names the known ones
        reference_model("diffattn", {**cfg, "architecture": "NoSuchModel"})
    with pytest.raises(ValueError, match="format 0"):
        reference_model("diffattn", {**cfg, "diffattn_format": 0})
    with pytest.raises(ValueError, match="layout must be one of"):
        reference_model("vllm", cfg)


def tiny_diffllama(tie: bool):
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    config = DiffLlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                             vocab_size=97, intermediate_size=128, tie_word_embeddings=tie)
    hf = DiffLlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "lambda" in name:
                torch.nn.init.normal_(p, std=0.3)  # a λ far from its initial value
    return hf


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_diffllama_names_give_the_logits_of_transformers_and_of_from_diffllama(tie):
    hf = tiny_diffllama(tie)
    ref = reference_model("diffllama", hf.config.to_dict())
    assert type(ref) is CausalLM and ref.tie_embeddings is tie
    model = loaded(ref, to_diffattn_names("diffllama", ref, hf.state_dict().items()))
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
        converted = convert.from_diffllama(hf)(ids)
    assert theirs.dtype == torch.float64 and theirs.abs().max().item() > 0.01
    assert max_diff(ours, converted) <= 1e-12
    # transformers' DiffLlama computes its RoPE tables in float32 even in a float64 model (about 5e-8 here)
    assert max_diff(ours, theirs) <= 1e-6


def test_unknown_diffllama_tensor_is_named():
    hf = tiny_diffllama(False)
    ref = reference_model("diffllama", hf.config.to_dict())
    for bad in ("model.layers.0.self_attn.extra.weight", "model.extra"):
        with pytest.raises(ValueError, match=bad.replace(".", r"\.")):
            list(to_diffattn_names("diffllama", ref, [(bad, torch.zeros(1))]))


GDA = dict(architectures=["MotifForCausalLM"], model_type="motif", vocab_size=61, hidden_size=40,
           intermediate_size=48, num_hidden_layers=2, num_attention_heads=10, num_noise_heads=2,
           num_key_value_heads=4, head_dim=8, hidden_act="poly_norm", rms_norm_eps=1e-6, attn_rms_norm_eps=1e-5,
           rope_theta=500000.0, max_position_embeddings=128, tie_word_embeddings=False, attention_bias=False,
           use_bias=False)  # Motif-2-12.7B-like, 4:1


def released_motif(tie: bool) -> tuple[dict, dict]:
    """(config.json dict, released-layout state dict) of a random float64 GDA MotifLM at 4:1 (to_motif)."""
    model = MotifLM(**convert.motif_kwargs({**GDA, "tie_word_embeddings": tie})).double()
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
    return convert.to_motif(model, base_config={**GDA, "tie_word_embeddings": tie})


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_motif_names_give_the_logits_of_from_motif(tie):
    cfg, sd = released_motif(tie)
    assert ("lm_head.weight" in sd) is not tie
    ref = reference_model("motif", cfg)
    assert type(ref) is MotifLM and ref.attention == "grouped"
    assert ServedLayer.of(ref.blocks[0].attn) == ServedLayer("grouped", "paired", 10, 4, 8, 2)
    names = dict(to_diffattn_names("motif", ref, [*sd.items(), ("model.rotary_emb.inv_freq", torch.ones(4))]))
    if tie:  # a tied checkpoint has no lm_head.weight: the server shares the embedding
        names["lm_head.weight"] = names["tok_embed.weight"]
    model = loaded(ref, names.items())
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        ours, theirs = model(ids), convert.from_motif(sd, config=cfg)(ids)
    assert theirs.dtype == torch.float64 and theirs.abs().max().item() > 0.01
    assert max_diff(ours, theirs) <= 1e-10


def test_unknown_motif_tensor_is_named():
    cfg, _ = released_motif(False)
    ref = reference_model("motif", cfg)
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.extra'"):
        list(to_diffattn_names("motif", ref, [("model.layers.0.self_attn.extra", torch.zeros(1))]))
    with pytest.raises(ValueError, match=r"'model\.layers\.2\.mlp\.gate_proj\.weight'"):  # depth 2: no layer 2
        list(to_diffattn_names("motif", ref, [("model.layers.2.mlp.gate_proj.weight", torch.zeros(1))]))


# -------------------------------------------------------------------------------------------------- configs

def test_diffattn_config_has_the_standard_names_of_the_served_cache(tmp_path):
    saved_config(CausalLM(**DIFF_LM), tmp_path / "m")
    config = DiffattnLMConfig(**json.loads((tmp_path / "m" / "config.json").read_text()))
    assert (config.hidden_size, config.num_hidden_layers, config.max_position_embeddings) == (64, 2, 128)
    d = 64 // 4
    # 4 query heads of width d; 2 key heads of width d = one key/value group of width 2d
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 1, 2 * d)
    assert config.tie_word_embeddings is False and config.dim == 64  # diffattn's own keys stay
    register_configs()
    register_configs()  # idempotent
    from transformers import AutoConfig

    auto = AutoConfig.from_pretrained(tmp_path / "m")
    assert type(auto) is DiffattnLMConfig
    assert (auto.num_attention_heads, auto.num_key_value_heads, auto.head_dim) == (4, 1, 2 * d)


def test_motif_config_ties_embeddings_unless_the_file_says_otherwise():
    assert MotifConfig(**{k: v for k, v in GDA.items() if k != "tie_word_embeddings"}).tie_word_embeddings is True
    assert MotifConfig(**GDA).tie_word_embeddings is False


# ------------------------------------------------------------------------------------------------ vLLM version

@pytest.mark.parametrize("version", ["0.33.1", "0.31.0", "1.32.0"])
def test_untested_vllm_releases_are_refused_unless_asked(version, monkeypatch):
    monkeypatch.delenv("DIFFATTN_VLLM_ANY_VERSION", raising=False)
    check_vllm_version("0.32.0")
    check_vllm_version("0.32.2rc1")
    with pytest.raises(ValueError) as e:
        check_vllm_version(version)
    msg = str(e.value)
    assert "0.32" in msg and "DIFFATTN_VLLM_ANY_VERSION=1" in msg and f"this is vLLM {version}" in msg
    monkeypatch.setenv("DIFFATTN_VLLM_ANY_VERSION", "1")
    check_vllm_version(version)
    check_vllm_version("0.40.0")
