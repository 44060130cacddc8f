"""Run a vision-language model on the offline questions of :mod:`diffattn.data.vqa` and score it: the VQA score,
POPE per split, MMNeedle with its per-cell heat map, and the decoder's attention on the image tokens.

A model is seen through an *answerer*: ``answer(images, questions) -> list[str]`` with ``images`` a (B, 3, H, W)
tensor, already transformed. :func:`llava_answerer` wraps a :class:`~diffattn.models.vlm.VisionLanguageModel`;
a PaliGemma is wrapped by ``diffattn.eval.paligemma.answer_paligemma`` with its tokenizer.

- VQA score (Goyal et al. 2017): :func:`~diffattn.eval.vlm.vqa_score` of each answer against the question's ten
  reference answers, averaged per question kind (``what``, ``category``).
- POPE (Li et al. 2023 (POPE), §4): :func:`~diffattn.eval.vlm.pope_metrics` per negative-sampling split.
- MMNeedle (Wang et al. 2024 (MMNeedle), §3) with M = 1 and the two-step location of Li et al. 2025, §5.1: a grid's
  prediction is None when the model answers "no" to "is it in the image?", else (0, row, col) from its
  "top or bottom?" and "left or right?" answers (row 0 and column 0 stand in when the needle is absent, where no
  location is asked); :func:`~diffattn.eval.vlm.mmneedle_metrics` gives existence, index and exact accuracy.
  ``location`` is the accuracy of the two-step location alone (Li et al. 2025 report it, never asking existence),
  and ``cells`` is that accuracy per needle cell: the heat map of their Figure 2 (:func:`plot_needle_cells`).
- Attention on the image (:func:`image_attention`): the share of the decoder's attention that the position
  predicting the first answer token puts on the image tokens, per layer, from the maps
  :func:`diffattn.diagnostics.capture_attention` records. Differential maps are signed (A1 − λA2): the share is
  Σ_image a / Σ_all a of the signed combined map, which is the fraction of the layer's output that comes from the
  image (rows of A1 − λA2 sum to 1 − λ, hence the normalisation).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..diagnostics import capture_attention
from ..io import atomic_write_file
from .vlm import mmneedle_metrics, normalize_vqa_answer, pope_metrics, vqa_score

__all__ = ["llava_answerer", "evaluate_vlm", "needle_predictions", "image_attention", "plot_needle_cells"]

Answerer = Callable[[torch.Tensor, Sequence[str]], list[str]]


def llava_answerer(model, max_new_tokens: int = 8) -> Answerer:
    """An answerer of a :class:`~diffattn.models.vlm.VisionLanguageModel` (greedy, KV cache)."""
    def answer(images: torch.Tensor, questions: Sequence[str]) -> list[str]:
        return model.answer(images, questions, max_new_tokens)

    return answer


def _first_word(text: str) -> str:
    words = normalize_vqa_answer(text).split()
    return words[0] if words else ""


def needle_predictions(questions: Sequence[dict], answers: Sequence[str]) -> dict:
    """MMNeedle predictions and targets per grid from the answered ``needle_*`` questions (module docstring):
    ``{"predictions", "targets", "location": [(target cell, correct)]}``."""
    grids: dict[int, dict] = defaultdict(dict)
    for q, a in zip(questions, answers):
        if q["kind"].startswith("needle"):
            grids[q["sample"]][q["kind"]] = (q, _first_word(a), a)
    preds, targets, location = [], [], []
    for s in sorted(grids):
        g = grids[s]
        if "needle_exists" not in g or ("needle_row" in g) != ("needle_col" in g):
            raise ValueError(f"questions must hold every question of a needle grid (needle_exists, and needle_row "
                             f"with needle_col when the needle is there); grid {s} has only {sorted(g)}")
        q, said, _ = g["needle_exists"]
        target = q["needle"]
        targets.append(None if target is None else tuple(target))
        if target is None:
            preds.append(None if said != "yes" else (0, 0, 0))
            continue
        if "needle_row" in g:
            row = int(g["needle_row"][1] == "bottom")
            col = int(g["needle_col"][1] == "right")
            ok = g["needle_row"][1] == ("top", "bottom")[target[1]] and \
                g["needle_col"][1] == ("left", "right")[target[2]]
        else:  # larger grids: "row r column c", 1-based
            nums = [int(w) - 1 for w in normalize_vqa_answer(g["needle_cell"][2]).split() if w.isdigit()] + [0, 0]
            row, col = max(nums[0], 0), max(nums[1], 0)
            ok = (row, col) == tuple(target[1:])
        location.append(((target[1], target[2]), ok))
        preds.append(None if said != "yes" else (0, row, col))
    return {"predictions": preds, "targets": targets, "location": location}


@torch.no_grad()
def evaluate_vlm(answer: Answerer, dataset, transform: Callable | None = None, batch_size: int = 64) -> dict:
    """Answer every question of ``dataset`` (a :class:`~diffattn.data.vqa.VQADataset`, or anything with its
    ``questions`` list and ``image(question)`` method; images through ``transform``) and score them (module
    docstring). Returns ``{"vqa": {kind: score}, "pope": {split: metrics},
    "mmneedle": {existence, index, exact, location, cells}, "n_questions", "answers"}``."""
    if not (hasattr(dataset, "questions") and callable(getattr(dataset, "image", None))):
        raise TypeError(f"dataset must be a diffattn.data.vqa.VQADataset (questions and image()), got "
                        f"{type(dataset).__name__}")
    qs = dataset.questions
    if not qs:
        raise ValueError("dataset holds no questions")
    cache: dict[tuple, torch.Tensor] = {}

    def image(q):
        key = tuple(q["images"])
        if key not in cache:
            im = dataset.image(q)
            cache[key] = transform(im) if transform is not None else im
        return cache[key]

    answers: list[str] = []
    for i in range(0, len(qs), batch_size):
        chunk = qs[i:i + batch_size]
        images = torch.stack([image(q) for q in chunk])
        answers += answer(images, [q["question"] for q in chunk])
    out: dict = {"n_questions": len(qs), "answers": answers}
    vqa = defaultdict(list)
    pope = defaultdict(lambda: ([], []))
    for q, a in zip(qs, answers):
        if q["kind"] in ("what", "category"):
            vqa[q["kind"]].append(vqa_score(a, q["answers"]))
        elif q["kind"] == "pope":
            pope[q["split"]][0].append(_first_word(a) == "yes")
            pope[q["split"]][1].append(q["answer"] == "yes")
    out["vqa"] = {k: sum(v) / len(v) for k, v in vqa.items()}
    out["pope"] = {s: pope_metrics(p, y) for s, (p, y) in pope.items()}
    if any(q["kind"].startswith("needle") for q in qs):
        n = needle_predictions(qs, answers)
        m = mmneedle_metrics(n["predictions"], n["targets"])
        cells = defaultdict(list)
        for cell, ok in n["location"]:
            cells[cell].append(ok)
        m["location"] = sum(ok for _, ok in n["location"]) / len(n["location"]) if n["location"] else None
        m["cells"] = {f"{r},{c}": sum(v) / len(v) for (r, c), v in sorted(cells.items())}
        out["mmneedle"] = m
    return out


@torch.no_grad()
def image_attention(model, images: torch.Tensor, questions: Sequence[str]) -> list[float]:
    """Per decoder layer of a :class:`~diffattn.models.vlm.VisionLanguageModel`: the mean share of attention
    (signed combined map, averaged over heads and samples) that the last prompt position puts on the image tokens
    (module docstring)."""
    batch = model.collate(list(questions))
    P = model.num_image_tokens
    names = [f"lm.blocks.{i}.attn" for i in range(len(model.lm.blocks))]
    with capture_attention(model, names=names) as cap:
        model(images, batch["input_ids"].to(images.device), batch["attention_mask"].to(images.device))
    last = batch["attention_mask"].sum(-1) - 1 + P  # (B,) the position predicting the first answer token
    return [image_token_share(layer.combined, last, P) for layer in cap.layers]


def image_token_share(a: torch.Tensor, query: torch.Tensor, num_image_tokens: int) -> float:
    """Σ_image a / Σ_all a of the rows ``query`` (B,) of one layer's map ``a`` (B, heads, Nq, Nk) whose first
    ``num_image_tokens`` keys are the image, averaged over heads and samples (a zero row sum counts as 1)."""
    rows = a[torch.arange(a.shape[0]), :, query].float()  # (B, heads, Nk)
    total = rows.sum(-1)
    return float((rows[..., :num_image_tokens].sum(-1) / total.where(total.abs() > 1e-12, torch.ones_like(total)))
                 .mean())


def plot_needle_cells(cells: dict[str, float], n: int, path: str | Path, *, title: str = "MMNeedle") -> Path:
    """The per-cell location accuracy (``evaluate_vlm(...)["mmneedle"]["cells"]``) as an ``n``×``n`` heat map,
    red 0 to green 1, each cell labelled (Li et al. 2025, Figure 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = torch.full((n, n), float("nan"))
    for key, v in cells.items():
        r, c = (int(x) for x in key.split(","))
        grid[r, c] = v
    fig, ax = plt.subplots(figsize=(1.2 * n + 1, 1.2 * n))
    im = ax.imshow(grid.numpy(), cmap="RdYlGn", vmin=0, vmax=1)
    for r in range(n):
        for c in range(n):
            v = grid[r, c].item()
            ax.text(c, r, "–" if v != v else f"{v:.2f}", ha="center", va="center")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    with atomic_write_file(path) as f:
        fig.savefig(f, format=path.suffix.lstrip(".") or "png", bbox_inches="tight")
    plt.close(fig)
    return path
