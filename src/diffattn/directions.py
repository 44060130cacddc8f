"""Which way is better for a metric: the one table that ``diffattn compare``, the training loop's choice of
``best/`` and the studies read (a metric is named by the last part of its dotted key: ``clip.zero_shot.top1`` →
``top1``). Only the standard library is imported here."""

from __future__ import annotations

__all__ = ["LOWER_IS_BETTER", "HIGHER_IS_BETTER", "better", "higher_is_better"]

#: the last part of a metric key where lower is better (not ``std``: the spread of a metric over episodes or
#: seeds says how much it varies, not how good a model is, so it has no direction)
LOWER_IS_BETTER = frozenset({"ppl", "nll", "mce", "loss", "perplexity", "final_loss", "answer_nll",
                             "needle_nll"})
#: the last part of a metric key where higher is better (besides recall@k and the accuracy tables)
HIGHER_IS_BETTER = frozenset({"top1", "top5", "mean_per_class_recall", "accuracy", "mean_accuracy", "clean", "mean",
                              "f1", "precision", "recall", "vqa_score", "exact", "existence", "index"})


def better(key: str) -> str:
    """``"↑"`` when a higher value of metric ``key`` is better, ``"↓"`` when lower is, ``""`` when neither (an
    attention mass, a ratio)."""
    parts = key.split(".")
    last = parts[-1]
    if last in LOWER_IS_BETTER or (len(parts) > 1 and parts[-2] in ("perplexity",) and last != "tokens"):
        return "↓"
    if last in HIGHER_IS_BETTER or "@" in last or any(p in ("noise", "table", "needle") for p in parts[1:-1]):
        return "↑"
    return ""


def higher_is_better(key: str) -> bool | None:
    """True / False / None (neither) for metric ``key`` (:func:`better`)."""
    return {"↑": True, "↓": False}.get(better(key))
