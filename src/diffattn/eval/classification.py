"""Classification metrics and zero-shot classification with prompt ensembles.

Zero-shot protocol (Radford et al. 2021 §3.1.4; Hammoud & Ghanem 2025 §4): each class c gets the weight

    w_c = normalise( mean_t normalise( f_text(template_t(class_c)) ) )

and an image x is assigned argmax_c ⟨normalise(f_image(x)), w_c⟩. Reported: top-1, top-5 and the mean per-class
recall (the mean over classes of the fraction of that class's images predicted correctly).

Ties. Every top-k metric here ranks the correct class pessimistically: a class counts as in the top k when fewer
than k *other* classes score greater than **or equal to** it. A constant scorer therefore gets top-k = 0 (unless
there are at most k − 1 other classes), so a model never gains from ties.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ._checks import as_tensor, check_ks

__all__ = ["DEFAULT_TEMPLATES", "topk_correct", "classification_metrics", "classification_chance",
           "zero_shot_classifier", "zero_shot_logits", "zero_shot_eval"]

#: A small prompt ensemble in the style of CLIP's ImageNet templates (Radford et al. 2021, §3.1.4).
DEFAULT_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.",
    "a photo of the {}.",
    "a picture of a {}.",
    "an image of a {}.",
    "a drawing of a {}.",
    "a close-up photo of a {}.",
)


def topk_correct(scores: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """(N,) bool: whether ``labels[i]`` is within the top ``k`` of ``scores[i]`` (ties count against it).

    The label's rank is #{j ≠ y : s_j ≥ s_y}; it is in the top k when that count is < k.
    """
    s_true = scores.gather(1, labels[:, None])  # (N, 1)
    ahead = (scores >= s_true).sum(dim=1) - 1  # (N,): others scoring ≥ the label, the label itself removed
    return ahead < k


def classification_metrics(scores, labels, ks: Sequence[int] = (1, 5), *,
                           num_classes: int | None = None) -> dict[str, float]:
    """``{"top1", "top5", …, "mean_per_class_recall"}`` for class scores (N, C) and integer labels (N,).

    top-k is the fraction of rows whose label is in the top k (ties count against the label; module docstring);
    k larger than C is clipped to C. mean_per_class_recall averages, over the classes that occur in ``labels``, the
    top-1 recall of that class. Values are fractions in [0, 1].
    """
    scores = as_tensor("scores", scores, dim=2, floating=True)
    labels = as_tensor("labels", labels, dim=1, floating=False).to(scores.device)
    ks = check_ks(ks)
    N, C = scores.shape
    if labels.shape[0] != N:
        raise ValueError(f"labels must have one entry per row of scores ({N}), got {labels.shape[0]}")
    if N == 0:
        raise ValueError("scores must hold at least one row, got 0")
    C = C if num_classes is None else num_classes
    if labels.min() < 0 or labels.max() >= scores.shape[1]:
        raise ValueError(f"labels must lie in [0, {scores.shape[1]}) (the columns of scores), got range "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    out = {f"top{k}": topk_correct(scores, labels, min(k, C)).double().mean().item() for k in ks}
    hit = topk_correct(scores, labels, 1).double()
    present = labels.unique()
    recalls = torch.stack([hit[labels == c].mean() for c in present])
    out["mean_per_class_recall"] = recalls.mean().item()
    return out


def classification_chance(group: str, metrics: dict, classes: int) -> dict[str, float]:
    """What guessing uniformly among ``classes`` classes scores on each metric of ``group``: top-k → min(k, C)/C,
    mean per-class recall → 1/C."""
    out = {}
    for key in metrics:
        if key.startswith("top") and key[3:].isdigit():
            out[f"{group}.{key}"] = min(int(key[3:]), classes) / classes
        elif key == "mean_per_class_recall":
            out[f"{group}.{key}"] = 1 / classes
    return out


@torch.no_grad()
def zero_shot_classifier(model, classnames: Sequence[str], templates: Sequence[str] = DEFAULT_TEMPLATES, *,
                         tokenizer: Callable | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """(C, E) class weights: w_c = normalise(mean_t normalise(encode_text(template_t.format(class_c)))).

    ``model`` has ``encode_text(tokens)``; ``tokenizer`` maps a list of strings to token ids (default
    ``model.tokenizer``). Radford et al. 2021 §3.1.4 (prompt ensembling).
    """
    if isinstance(classnames, str) or not len(classnames):
        raise ValueError(f"classnames must be a non-empty sequence of strings, got {classnames!r}")
    if isinstance(templates, str) or not len(templates) or any("{}" not in t for t in templates):
        raise ValueError(f"templates must be a non-empty sequence of strings each holding '{{}}', got {templates!r}")
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    device = device if device is not None else next(model.parameters()).device
    prompts = [t.format(name) for name in classnames for t in templates]  # class-major: C blocks of T prompts
    emb = torch.cat([model.encode_text(tokenizer(prompts[i:i + 256]).to(device)).float()
                     for i in range(0, len(prompts), 256)])  # (C·T, E)
    emb = F.normalize(emb, dim=-1).view(len(classnames), len(templates), -1)  # (C, T, E)
    return F.normalize(emb.mean(dim=1), dim=-1)  # (C, E)


def zero_shot_logits(image_features: torch.Tensor, classifier: torch.Tensor) -> torch.Tensor:
    """(N, C) cosine similarities between image features (N, E) and class weights (C, E)."""
    image_features = as_tensor("image_features", image_features, dim=2, floating=True)
    classifier = as_tensor("classifier", classifier, dim=2, floating=True)
    if image_features.shape[1] != classifier.shape[1]:
        raise ValueError(f"image_features (N, E={image_features.shape[1]}) and classifier (C, E) must share E, got "
                         f"classifier shape {tuple(classifier.shape)}")
    return F.normalize(image_features.float(), dim=-1) @ classifier.float().t()


@torch.no_grad()
def zero_shot_eval(model, images: torch.Tensor, labels: torch.Tensor, classnames: Sequence[str],
                   templates: Sequence[str] = DEFAULT_TEMPLATES, *, tokenizer: Callable | None = None,
                   batch_size: int = 256, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Zero-shot top-1 / top-5 / mean per-class recall of a CLIP-style ``model`` on preprocessed ``images``."""
    device = next(model.parameters()).device
    classifier = zero_shot_classifier(model, classnames, templates, tokenizer=tokenizer, device=device)
    feats = torch.cat([model.encode_image(images[i:i + batch_size].to(device)).float()
                       for i in range(0, len(images), batch_size)])
    return classification_metrics(zero_shot_logits(feats, classifier).cpu(), labels, ks,
                                  num_classes=len(classnames))
