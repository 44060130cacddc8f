"""The one table of metric directions (diffattn.directions) that compare, training and the studies read."""

from __future__ import annotations

import pytest

from diffattn.directions import better, higher_is_better


@pytest.mark.parametrize("key, arrow", [
    ("clip.few_shot.mean", "↑"), ("clip.few_shot.std", ""), ("vision.noise.0.5", "↑"),
    ("clip.zero_shot.top1", "↑"), ("clip.retrieval.image_to_text@5", "↑"), ("language.perplexity.ppl", "↓"),
    ("vision.corruptions.mce", "↓"), ("language.attention_noise.signed.ratio", ""), ("loss", "↓"),
])
def test_directions(key, arrow):
    assert better(key) == arrow
    assert higher_is_better(key) is {"↑": True, "↓": False, "": None}[arrow]
