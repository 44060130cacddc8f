"""Attention diagnostics: captured maps (A1, A2, combined, λ, gate), entropy, attention noise, rollout, plots.
It may import the library; never ``train``."""
