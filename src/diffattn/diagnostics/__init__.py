"""Attention diagnostics: captured maps (A1, A2, combined, λ, gate), entropy, attention noise, rollout, plots;
attention logits and hidden-state outliers, quantised logits. It may import the library; never ``train``.

    from diffattn.diagnostics import capture_attention, answer_attention, rollout
    with capture_attention(model) as cap:
        model(x)
    rollout(cap.combined())
"""

from .capture import AttentionCapture, LayerMaps, attention_modules, capture_attention
from .logits import (
    HiddenStateCapture,
    LogitCapture,
    capture_hidden_states,
    capture_logits,
    hidden_stats,
    logit_layers,
    logit_stats,
    quantize_absmax,
    quantized_logits,
)
from .noise import MODES, answer_attention, branch_entropy, foreground_attention, patch_mask, rollout, transform

__all__ = ["AttentionCapture", "LayerMaps", "attention_modules", "capture_attention", "MODES", "answer_attention",
           "branch_entropy", "foreground_attention", "patch_mask", "rollout", "transform", "LogitCapture",
           "HiddenStateCapture", "capture_logits", "logit_stats", "capture_hidden_states", "hidden_stats",
           "quantized_logits", "quantize_absmax", "logit_layers"]
