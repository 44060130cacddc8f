"""Motif-3's released layout ↔ diffattn: the attention (GroupedLatentDiffAttention) and the dense MLP
(Motif3PolyNormGLU): the names, the per-layer spec and MLP settings read from config.json (sliding-window layers,
their window and RoPE base, YaRN on the full layers; which layers are dense, the PolyNorm keys and their defaults),
bit-identical round trips and the config entries written back, clear refusals (MoE layers among them)."""

from __future__ import annotations

import pytest
import torch

from diffattn.convert.motif3 import (
    MOTIF3_ATTENTION_NAMES,
    MOTIF3_MLP_NAMES,
    diffattn_to_motif3_attention,
    diffattn_to_motif3_mlp,
    from_motif3_attention,
    from_motif3_mlp,
    motif3_attention_spec,
    motif3_is_dense,
    motif3_is_sliding,
    motif3_mlp_config,
    motif3_mlp_settings,
    motif3_to_diffattn_attention,
    motif3_to_diffattn_mlp,
    motif3_yarn_settings,
    to_motif3_attention,
    to_motif3_mlp,
)
from diffattn.layers import GroupedLatentDiffAttention, Motif3PolyNormGLU

from .test_layers_gdla import motif3_config, released_weights
from .test_layers_polynorm import mlp_config, released_mlp


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("gate", [True, False])
def test_round_trip_is_bit_identical_and_keeps_the_dtype(dtype, gate):
    cfg = motif3_config(10, 2, 2)
    sd = {k: v.to(dtype) for k, v in released_weights(cfg, 3, gate=gate).items()}
    sd["model.layers.3.mlp.gate_proj.weight"] = torch.zeros(2, 2)  # other modules' tensors are not read
    layer = from_motif3_attention(cfg, sd, 3)
    assert isinstance(layer, GroupedLatentDiffAttention) and layer.q_a_proj.weight.dtype == dtype
    back = to_motif3_attention(layer, 3)
    want = {k: v for k, v in sd.items() if ".self_attn." in k}
    assert set(back) == set(want) and len(back) == (9 if gate else 8)
    for k, v in want.items():
        assert back[k].dtype == dtype and torch.equal(back[k], v), k
    ours = motif3_to_diffattn_attention(sd, 3)
    assert diffattn_to_motif3_attention(ours, 3).keys() == want.keys()
    assert all(ours[MOTIF3_ATTENTION_NAMES[k.rsplit("self_attn.", 1)[1]]] is v for k, v in want.items())


def test_the_spec_of_each_layer_follows_the_interleaved_pattern():
    cfg = motif3_config(10, 2, 5)
    cfg["sliding_window_period"] = 3
    assert [motif3_is_sliding(cfg, i) for i in range(7)] == [False, True, True, False, True, True, False]
    full, dim, h = motif3_attention_spec(cfg, 0)
    swa, _, _ = motif3_attention_spec(cfg, 1)
    assert (dim, h) == (48, 10) and full.sliding_window is None and full.rope_theta == 10000.0
    assert swa.sliding_window == 4 and swa.rope_theta == 500.0  # HF's window 3 → itself and 3 keys before it
    assert (full.q_lora_rank, full.kv_lora_rank, full.qk_nope_head_dim, full.qk_rope_head_dim, full.v_head_dim,
            full.num_noise_heads, full.num_kv_heads) == (24, 16, 6, 4, 6, 2, 5)
    cfg["use_sliding_window"] = False
    assert not any(motif3_is_sliding(cfg, i) for i in range(4))


def test_yarn_keys_give_the_full_layers_their_settings_and_leave_the_sliding_ones_plain():
    cfg = {**motif3_config(10, 2, 2), "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16,
                                                       "original_max_position_embeddings": 2048, "mscale": 0.707}}
    full, _, _ = motif3_attention_spec(cfg, 0)
    swa, _, _ = motif3_attention_spec(cfg, 1)
    assert motif3_yarn_settings(cfg) == {"yarn_factor": 8.0, "yarn_original_context": 2048, "yarn_beta_fast": 16.0,
                                         "yarn_beta_slow": 1.0, "yarn_mscale": 0.707}
    assert (full.yarn_factor, full.yarn_original_context, full.yarn_beta_fast, full.yarn_beta_slow,
            full.yarn_mscale) == (8.0, 2048, 16.0, 1.0, 0.707)
    assert swa.yarn_factor == 1.0 and swa.yarn_original_context is None and swa.rope_theta == 500.0
    # llama.cpp's converter's fallbacks: the top-level rope_factor, original_seq_len (32768) and mscale (1)
    top = {**motif3_config(10, 2, 2), "rope_factor": 2.0}
    assert motif3_yarn_settings(top) == {"yarn_factor": 2.0, "yarn_original_context": 32768, "yarn_beta_fast": 32.0,
                                         "yarn_beta_slow": 1.0, "yarn_mscale": 1.0}
    assert motif3_yarn_settings({**top, "original_seq_len": 4096, "mscale": 0.5})["yarn_original_context"] == 4096
    for unscaled in ({}, {"rope_factor": 1.0}, {"rope_scaling": None}, {"rope_scaling": {"factor": 1.0}}):
        assert motif3_yarn_settings({**motif3_config(10, 2, 2), **unscaled}) == {}
    assert motif3_attention_spec({**motif3_config(10, 2, 2), "rope_factor": 1.0}, 0)[0].yarn_factor == 1.0


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"type": "linear", "factor": 4.0}}, "RoPE scaling 'linear' .*YaRN only"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0, "extrapolation_factor": 0.5}}, "extrapolation_factor must be 1"),
    ({"rope_scaling": [4.0]}, "config.rope_scaling must be a dict or null"),
    ({"q_lora_rank": None}, "config.json has no 'q_lora_rank'"),
    ({"sliding_window_pattern": "blocks"}, "sliding_window_pattern must be 'interleave'"),
])
def test_configs_it_cannot_compute_are_refused(change, message):
    cfg = {**motif3_config(10, 2, 2), **change}
    with pytest.raises(ValueError, match=message):
        motif3_attention_spec(cfg, 1)


def test_missing_tensors_wrong_shapes_and_foreign_keys_are_named():
    cfg = motif3_config(10, 2, 2)
    sd = released_weights(cfg, 0)
    with pytest.raises(ValueError, match="has no 'model.layers.0.self_attn.wkv_b.weight'"):
        from_motif3_attention(cfg, {k: v for k, v in sd.items() if "wkv_b" not in k}, 0)
    with pytest.raises(ValueError, match=r"kv_b_proj.weight.: \(\(24, 16\), \(60, 16\)\)"):
        from_motif3_attention({**cfg, "num_key_value_heads": 5}, sd, 0)
    with pytest.raises(ValueError, match="cannot express exactly: \\['lambda_q1'\\]"):
        diffattn_to_motif3_attention({"lambda_q1": torch.zeros(2)}, 0)
    with pytest.raises(ValueError, match="layer must be an integer >= 0"):
        motif3_to_diffattn_attention(sd, -1)
    with pytest.raises(ValueError, match="module must be a diffattn GroupedLatentDiffAttention"):
        to_motif3_attention(torch.nn.Linear(2, 2), 0)


# ------------------------------------------------------------------------------------------------ dense MLP

@pytest.mark.parametrize("dtypes", [(torch.float64, torch.float64), (torch.bfloat16, torch.float32),
                                    (torch.bfloat16, torch.bfloat16)], ids=["f64", "bf16_f32", "bf16"])
def test_mlp_round_trip_is_bit_identical_and_keeps_each_dtype(dtypes):
    cfg = {**motif3_config(10, 2, 2), **mlp_config()}
    sd = {k: v.to(dtypes[1] if ".act_fn." in k else dtypes[0]) for k, v in released_mlp(cfg, 3).items()}
    sd.update(released_weights(cfg, 3))  # the attention's tensors are not read
    mlp = from_motif3_mlp(cfg, sd, 3)
    assert isinstance(mlp, Motif3PolyNormGLU)
    assert mlp.gate_proj.weight.dtype == dtypes[0] and mlp.act_fn.bias.dtype == dtypes[1]
    back = to_motif3_mlp(mlp, 3)
    want = {k: v for k, v in sd.items() if ".mlp." in k}
    assert set(back) == set(want) and len(back) == 5
    for k, v in want.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    assert all(mlp.state_dict()[k.rsplit(".mlp.", 1)[1]].data_ptr() == v.data_ptr() for k, v in want.items())
    ours = motif3_to_diffattn_mlp(sd, 3)
    assert diffattn_to_motif3_mlp(ours, 3).keys() == want.keys()
    assert all(ours[MOTIF3_MLP_NAMES[k.rsplit(".mlp.", 1)[1]]] is v for k, v in want.items())


def test_mlp_settings_follow_the_config_keys_and_the_public_defaults():
    bare = {"hidden_size": 16, "intermediate_size": 24}
    assert motif3_mlp_settings(bare, 0) == dict(dim=16, hidden_dim=24, eps=1e-6, sigmoid_weight=True,
                                                output_scale=1.0, hidden_clamp=None)
    assert motif3_mlp_settings({**bare, "hidden_clamp": 0}, 0)["hidden_clamp"] is None  # llama.cpp: only when > 0
    got = motif3_mlp_settings({**bare, "polynorm_sigmoid_weight": False, "polynorm_output_scale": 0.5,
                               "hidden_clamp": 1e6, "polynorm_bias_clamp": 0.5}, 0)
    assert (got["sigmoid_weight"], got["output_scale"], got["hidden_clamp"]) == (False, 0.5, 1e6)
    for cfg in (bare, mlp_config(), mlp_config(sigmoid=False, scale=0.7, clamp=None)):
        module = Motif3PolyNormGLU(**motif3_mlp_settings(cfg, 0))
        entries = motif3_mlp_config(module)
        assert motif3_mlp_settings(entries, 0) == motif3_mlp_settings(cfg, 0)
        assert {k: cfg.get(k) for k in entries if k in cfg} == {k: entries[k] for k in entries if k in cfg}


def test_which_layers_are_dense():
    moe = {"num_experts": 8, "n_dense_first_layers": 2, "interleave_moe_layer_step": 2}
    assert [motif3_is_dense(moe, i) for i in range(7)] == [True, True, True, False, True, False, True]
    moe["interleave_moe_layer_step"] = 1
    assert [motif3_is_dense(moe, i) for i in range(4)] == [True, True, False, False]
    assert all(motif3_is_dense({"num_experts": 0}, i) for i in range(4)) and motif3_is_dense({}, 5)


def test_mlp_refusals_name_what_is_wrong():
    cfg = mlp_config()
    sd = released_mlp(cfg, 2)
    moe = {**cfg, "num_experts": 8, "n_dense_first_layers": 2}
    with pytest.raises(ValueError, match="layer 2 of this config is an MoE layer .*not the MoE experts and router"):
        from_motif3_mlp(moe, sd, 2)
    with pytest.raises(ValueError, match="has no 'model.layers.2.mlp.act_fn.bias'"):
        from_motif3_mlp(cfg, {k: v for k, v in sd.items() if "act_fn.bias" not in k}, 2)
    with pytest.raises(ValueError, match=r"gate_proj.weight.: \(\(24, 16\), \(32, 16\)\)"):
        from_motif3_mlp({**cfg, "intermediate_size": 32}, sd, 2)
    with pytest.raises(ValueError, match="config.json has no 'intermediate_size'"):
        motif3_mlp_settings({"hidden_size": 16}, 0)
    with pytest.raises(ValueError, match="polynorm_sigmoid_weight must be a bool, got 'yes'"):
        motif3_mlp_settings({**cfg, "polynorm_sigmoid_weight": "yes"}, 0)
    with pytest.raises(ValueError, match=r"cannot express exactly: \['drop.p'\]"):
        diffattn_to_motif3_mlp({"drop.p": torch.zeros(1)}, 0)
    with pytest.raises(ValueError, match="module must be a diffattn Motif3PolyNormGLU"):
        to_motif3_mlp(torch.nn.Linear(2, 2), 0)
    with pytest.raises(ValueError, match="Motif-3's layout fixes 1e-06"):
        motif3_mlp_config(Motif3PolyNormGLU(4, 8, eps=1e-5))
