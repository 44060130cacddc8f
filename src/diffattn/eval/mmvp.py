"""MMVP-VLM (Tong et al. 2024 §4): 9 visual patterns × 15 "CLIP-blind" image pairs, scored on the benchmark's
published layout.

Layout (as released)::

    <root>/Questions.csv                         header, then rows: question id, pattern (type), statement
    <root>/MLLM_VLM Images/<pattern>/<id>.jpg    one image per question id

Consecutive rows form a pair (ids 2i−1 and 2i): two images and two statements, where the odd id's statement
describes the first image and the even id's statement the second. For each image the model scores both prompts
"a photo of " + statement (softmax over the two statements of the image–text logits); statement s picks the
image that gives it the higher probability. A pair counts only when both statements pick their own image, so
chance is 25%. Reported per pattern and averaged over the pairs (Hammoud & Ghanem 2025 §4 use this protocol).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ..progress import progress as progress_bar

__all__ = ["IMAGE_DIR", "QUESTIONS_FILE", "PROMPT_PREFIX", "read_mmvp", "mmvp_pair_correct", "mmvp_eval"]

IMAGE_DIR = "MLLM_VLM Images"
QUESTIONS_FILE = "Questions.csv"
PROMPT_PREFIX = "a photo of "
_EXTENSIONS = (".jpg", ".jpeg", ".png")


def read_mmvp(root: str | Path) -> list[dict]:
    """The pairs of an MMVP-VLM folder: ``[{"pattern", "ids": (id1, id2), "statements": (s1, s2),
    "images": (path1, path2)}]`` in file order."""
    root = Path(root)
    csv_path = root / QUESTIONS_FILE
    if not csv_path.is_file():
        raise FileNotFoundError(f"{root} is not an MMVP-VLM folder: {QUESTIONS_FILE} is missing")
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r][1:]
    if len(rows) % 2:
        raise ValueError(f"{csv_path} must hold an even number of question rows (pairs), got {len(rows)}")

    def image(pattern: str, qid: int) -> Path:
        for ext in _EXTENSIONS:
            p = root / IMAGE_DIR / pattern / f"{qid}{ext}"
            if p.is_file():
                return p
        raise FileNotFoundError(f"image for question {qid} not found under {root / IMAGE_DIR / pattern}")

    pairs = []
    for a, b in zip(rows[0::2], rows[1::2]):
        if len(a) < 3 or len(b) < 3:
            raise ValueError(f"{csv_path}: each row needs (question id, pattern, statement), got {a} / {b}")
        (i1, p1, s1), (i2, _, s2) = a[:3], b[:3]
        i1, i2 = int(i1), int(i2)
        pairs.append({"pattern": p1.strip(), "ids": (i1, i2), "statements": (s1.strip(), s2.strip()),
                      "images": (image(p1.strip(), i1), image(p1.strip(), i2))})
    return pairs


def mmvp_pair_correct(logits: torch.Tensor, ids: tuple[int, int] = (1, 2)) -> bool:
    """Pair scoring from image–text logits (2 images × 2 statements): p = softmax over statements per image;
    statement j picks image argmax_i p[i, j]; the pair is correct when both pick their own image (odd id ↔ first
    image). Ties pick the first image."""
    if logits.shape != (2, 2):
        raise ValueError(f"logits must be (2 images, 2 statements), got {tuple(logits.shape)}")
    p = F.softmax(logits.double(), dim=1)  # (image, statement)
    picks = [0 if p[0, j] >= p[1, j] else 1 for j in range(2)]
    truth = [0 if q % 2 == 1 else 1 for q in ids]
    return picks == truth


@torch.no_grad()
def mmvp_eval(model, root: str | Path, *, transform: Callable | None = None, tokenizer: Callable | None = None,
              progress: bool = True) -> dict:
    """MMVP-VLM pair accuracy of a CLIP-style ``model`` (``encode_image``, ``encode_text``) on the folder ``root``.

    transform: PIL image → (C, H, W) tensor (default ``model.eval_transform``); tokenizer: list of str → ids
    (default ``model.tokenizer``). Returns ``{"accuracy", "pairs", "per_pattern": {pattern: accuracy}}``.
    """
    from PIL import Image

    transform = transform if transform is not None else model.eval_transform
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    device = next(model.parameters()).device
    pairs = read_mmvp(root)
    hits: dict[str, list[bool]] = {}
    for pair in progress_bar(pairs, desc="MMVP-VLM", disable=not progress, leave=False):
        imgs = torch.stack([transform(Image.open(p).convert("RGB")) for p in pair["images"]]).to(device)
        toks = tokenizer([PROMPT_PREFIX + s for s in pair["statements"]]).to(device)
        u = F.normalize(model.encode_image(imgs).float(), dim=-1)
        v = F.normalize(model.encode_text(toks).float(), dim=-1)
        scale = model.scale().float() if hasattr(model, "scale") else torch.tensor(100.0)
        hits.setdefault(pair["pattern"], []).append(mmvp_pair_correct(scale * u @ v.t(), pair["ids"]))
    all_hits = [h for v in hits.values() for h in v]
    return {"accuracy": sum(all_hits) / len(all_hits), "pairs": len(all_hits),
            "per_pattern": {k: sum(v) / len(v) for k, v in hits.items()}}
