"""Motif-3's released attention layout ↔ GroupedLatentDiffAttention: the names, the per-layer spec read from
config.json (sliding-window layers, their window and RoPE base), bit-identical round trips, clear refusals."""

from __future__ import annotations

import pytest
import torch

from diffattn.convert.motif3 import (
    MOTIF3_ATTENTION_NAMES,
    diffattn_to_motif3_attention,
    from_motif3_attention,
    motif3_attention_spec,
    motif3_is_sliding,
    motif3_to_diffattn_attention,
    to_motif3_attention,
)
from diffattn.layers import GroupedLatentDiffAttention

from .test_layers_gdla import motif3_config, released_weights


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


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "YaRN-scaled RoPE"),
    ({"rope_factor": 2.0}, "YaRN-scaled RoPE"),
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
