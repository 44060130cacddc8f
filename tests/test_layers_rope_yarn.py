"""YaRN's RoPE frequencies (:class:`~diffattn.layers.rope.YarnRotaryEmbedding`): ggml's ramp and correction range
(the numbers worked by hand), the same frequencies as Hugging Face's ``_compute_yarn_parameters``, tables of
magnitude 1, the softmax factor, refusals; plain :class:`~diffattn.layers.rope.RotaryEmbedding` is unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from diffattn.layers.rope import RotaryEmbedding, YarnRotaryEmbedding, yarn_softmax_factor


def test_plain_tables_are_the_closed_form_bit_for_bit():
    pos = torch.arange(7)
    cos, sin = RotaryEmbedding(8, base=500.0)(pos, dtype=torch.float64)
    inv = 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    freqs = pos.to(torch.float64)[:, None] * inv
    freqs = torch.cat([freqs, freqs], -1)
    assert torch.equal(cos, freqs.cos()) and torch.equal(sin, freqs.sin())


def test_the_ramp_runs_between_the_correction_dims():
    # d = 12, base 1e4, L = 4096: c(32) = 1.96 → lo = 1, c(1) = 4.22 → hi = 5; γ = 1, 1, 3/4, 1/2, 1/4, 0
    rope = YarnRotaryEmbedding(12, factor=4.0, original_context=4096)
    assert rope.correction_range() == (1, 5)
    theta = 10000.0 ** (-torch.arange(0, 12, 2, dtype=torch.float64) / 12)
    gamma = torch.tensor([1.0, 1.0, 0.75, 0.5, 0.25, 0.0], dtype=torch.float64)
    torch.testing.assert_close(rope.inv_freq(), theta / 4 * (1 - gamma) + theta * gamma, rtol=0, atol=1e-15)
    cos, sin = rope(torch.arange(5), dtype=torch.float64)
    torch.testing.assert_close(cos * cos + sin * sin, torch.ones(5, 12, dtype=torch.float64), rtol=0, atol=1e-15)
    # a context so short that both correction dims clamp to 0: a ramp of zero width (ggml divides by 0.001), pair 0
    # kept, every other pair interpolated
    short = YarnRotaryEmbedding(12, factor=4.0, original_context=4)
    assert short.correction_range() == (0, 0)
    torch.testing.assert_close(short.inv_freq(), torch.cat([theta[:1], theta[1:] / 4]), rtol=0, atol=0)


@pytest.mark.parametrize("head_dim, factor, original, beta", [
    (12, 4.0, 4096, (32.0, 1.0)), (64, 40.0, 4096, (32.0, 1.0)), (16, 8.0, 8192, (16.0, 2.0))])
def test_the_frequencies_are_hugging_faces(head_dim, factor, original, beta):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    cfg = transformers.PretrainedConfig(
        hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
        max_position_embeddings=int(original * factor),
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor, "beta_fast": beta[0],
                         "beta_slow": beta[1], "original_max_position_embeddings": original})
    hf, attention_factor = _compute_yarn_parameters(cfg)
    ours = YarnRotaryEmbedding(head_dim, factor=factor, original_context=original, beta_fast=beta[0],
                               beta_slow=beta[1]).inv_freq()
    torch.testing.assert_close(ours.float(), hf, rtol=1e-6, atol=0)  # Hugging Face builds its ramp in float32
    # Hugging Face's default puts m = 1 + 0.1 ln f on cos and sin; llama.cpp and DeepSeek-V2 put m² on the softmax
    assert attention_factor**2 == pytest.approx(yarn_softmax_factor(factor), rel=1e-15)


def test_the_softmax_factor():
    assert yarn_softmax_factor(1.0) == 1.0 and yarn_softmax_factor(0.5, 3.0) == 1.0
    assert yarn_softmax_factor(4.0, 0.707) == (1 + 0.0707 * math.log(4.0)) ** 2
    assert yarn_softmax_factor(4.0, 0.0) == 1.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(factor=0.5, original_context=64), "YaRN factor must be >= 1"),
    (dict(factor=2.0, original_context=0), "YaRN original_context must be an integer >= 1, got 0"),
    (dict(factor=2.0, original_context=64, beta_fast=-1.0), "YaRN beta_fast must be a finite float > 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        YarnRotaryEmbedding(8, **kwargs)
