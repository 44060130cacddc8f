"""Offline visual question answering built from real captioned images (the Tux Paint stamps, after
``diffattn data prepare tuxpaint_captions``).

Four kinds of question, all derived deterministically from an image's human caption and category:

- ``what``: "what is this?" → the caption's head noun (:func:`head_noun`). Ten reference answers, as in VQAv2
  (Goyal et al. 2017): seven give the head noun and three the whole noun phrase (articles dropped), so the VQA
  score (``diffattn.eval.vlm.vqa_score``) gives 1 to the head noun and 0.9 to the phrase when they differ.
- ``category``: "what category is this?" → one of the 16 Tux Paint categories (ten identical answers).
- ``pope``: "is there a {object} in the image?" → yes / no. POPE's construction (Li et al. 2023 (POPE), §4): each
  image is asked about its ground-truth object (yes) and about one absent object (no), so the set is balanced;
  the absent object is sampled at *random* from all objects, from the most *popular* objects (highest
  frequency over the set) or *adversarially* (POPE: the objects that co-occur most with the ground truth; a stamp
  shows one object, so here: the most frequent objects of the same category, the closest stand-in). An image's
  object is its caption's head noun.
- ``needle``: the multimodal needle in a haystack (Wang et al. 2024 (MMNeedle), §3) with M = 1 image made of an
  N×N grid of stamps and one caption. ``needle_exists`` asks whether the captioned stamp is in the grid (half the
  grids hold it); on grids that hold it, ``needle_row`` asks "top or bottom?" and ``needle_col`` "left or right?"
  (2×2 grids, in the two steps of Li et al. 2025, §5.1); larger grids ask ``needle_cell`` "which row and
  column?" (answer "row r column c", 1-based).

Splits are those of the image set (:class:`~diffattn.data.images.CaptionImages`: by a hash of the normalised
caption), so no test image, and no caption of a test image, is seen in training. Negatives and distractors are
drawn from the same split. Everything depends only on the split and ``seed``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence

from torch.utils.data import Dataset

from .images import CaptionImages
from .tokenizers import split_words  # the VLM tokenizer's word split: one definition

__all__ = ["QUESTION_KINDS", "POPE_SPLITS", "WHAT_QUESTION", "CATEGORY_QUESTION", "head_noun", "noun_phrase",
           "split_words", "what_questions", "category_questions", "pope_questions", "needle_samples", "compose_grid",
           "VQADataset", "vqa_vocabulary"]

QUESTION_KINDS = ("what", "category", "pope", "needle")
POPE_SPLITS = ("random", "popular", "adversarial")
WHAT_QUESTION = "what is this?"
CATEGORY_QUESTION = "what category is this?"
POPE_TEMPLATE = "is there a {} in the image?"
NEEDLE_EXISTS = "{} is it in the image?"
NEEDLE_ROW = "{} where is the caption? top or bottom?"
NEEDLE_COL = "{} where is the caption? left or right?"
NEEDLE_CELL = "{} where is the caption? which row and column?"

_ARTICLES = ("a", "an", "the", "some", "two", "three", "four")
# a phrase is cut at the first of these: a clause, a verb or a prepositional phrase follows the head noun
_CUT = re.compile(r"[(),;:!?\u2014\u2026]| - |\.(?!\d)| (?:in|inside|on|with|for|from|that|which|who|used|made|of|at|"
                  r"to|as|and|or|by|like|is|are|was|were|means|can|will|has|have|than|gets|says|stands|this|lets|saw|"
                  r"carry|carries|resembles|called)(?= )")
# "a pair of shoes": the head is the noun after "of"
_QUANTITIES = frozenset({"pair", "piece", "head", "slice", "bunch", "bottle", "glass", "box", "bag", "loaf", "bowl",
                         "plate", "jar", "pile", "stack", "group", "set", "couple", "handful", "bundle", "kind",
                         "type", "sort"})
_QUOTES = re.compile(r"[\"\u201c\u201d\u2018\u2019']")
_WORD = re.compile(r"[a-z0-9\u00c0-\u024f]+(?:-[a-z0-9\u00c0-\u024f]+)*")


def _words(text: str) -> list[str]:
    return _WORD.findall(_QUOTES.sub("", text.lower()))


def noun_phrase(caption: str) -> str:
    """The caption's first noun phrase, lower-cased, without leading articles: the text before the first
    punctuation mark, preposition or verb ("An albino peahen (a female…)" → "albino peahen"; "A European coin of
    2 euros" → "european coin"); a quantity takes its complement ("A pair of shoes" → "shoes"); a present
    participle after the noun starts a clause ("A spider playing games" → "spider")."""
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError(f"caption must be a non-empty str, got {caption!r}")
    text = _QUOTES.sub("", caption.strip().lower())
    for _ in range(3):
        m = _CUT.search(text)
        head = text[:m.start()] if m and m.start() > 0 else text
        words = [w for w in _words(head)]
        while len(words) > 1 and words[0] in _ARTICLES:
            words = words[1:]
        if m and words and words[-1] in _QUANTITIES and text[m.start():].startswith(" of "):
            text = text[m.start() + 4:]  # "a pair of shoes" → "shoes"
            continue
        break
    words = words or _words(text)
    for k in range(1, len(words) - 1):  # "spider playing computer games" → "spider"
        if words[k].endswith("ing"):
            words = words[:k]
            break
    return " ".join(words)


def head_noun(caption: str) -> str:
    """The head noun of the caption's first noun phrase (:func:`noun_phrase`): its last word ("A little rabbit." →
    "rabbit", "10 Japanese yen." → "yen"), except "letter"/"number" + symbol phrases, whose head is the first word
    ("The letter q." → "letter")."""
    words = noun_phrase(caption).split()
    if len(words) >= 2 and words[0] in ("letter", "number", "numeral", "digit", "sign"):
        return words[0]
    return words[-1]


def _hash(*parts) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")


def _pick(options: Sequence[str], *key) -> str:
    return options[_hash(*key) % len(options)]


def what_questions(rows: Sequence[dict]) -> list[dict]:
    """One "what is this?" question per image row (``{"key", "caption", …}``); module docstring."""
    out = []
    for i, r in enumerate(rows):
        noun, phrase = head_noun(r["caption"]), noun_phrase(r["caption"])
        answers = [noun] * 7 + [phrase] * 3
        out.append({"kind": "what", "images": [i], "question": WHAT_QUESTION, "answer": noun, "answers": answers})
    return out


def category_questions(rows: Sequence[dict]) -> list[dict]:
    """One "what category is this?" question per image row; the answer is its category name."""
    return [{"kind": "category", "images": [i], "question": CATEGORY_QUESTION, "answer": r["category"],
             "answers": [r["category"]] * 10} for i, r in enumerate(rows)]


def pope_questions(rows: Sequence[dict], split: str, seed: int = 0) -> list[dict]:
    """POPE's yes/no existence questions (Li et al. 2023 (POPE), §4) for every image of ``rows``: one about its
    object (yes) and one about an absent object (no) chosen by ``split`` (``random``, ``popular``,
    ``adversarial``; module docstring). Objects are head nouns; negatives come from the objects of ``rows``."""
    if split not in POPE_SPLITS:
        raise ValueError(f"split must be one of {POPE_SPLITS}, got {split!r}")
    objects = [head_noun(r["caption"]) for r in rows]
    counts = Counter(objects)
    if len(counts) < 2:
        raise ValueError(f"rows must show at least 2 different objects to draw negatives, got {sorted(counts)}")
    by_freq = sorted(counts, key=lambda o: (-counts[o], o))
    by_cat: dict[str, Counter] = {}
    for r, o in zip(rows, objects):
        by_cat.setdefault(r["category"], Counter())[o] += 1
    out = []
    for i, (r, obj) in enumerate(zip(rows, objects)):
        if split == "random":
            pool = [o for o in sorted(counts) if o != obj]
        elif split == "popular":
            pool = [o for o in by_freq if o != obj][:3]  # POPE: the top-k frequent objects (k = 3 per question)
        else:
            cat = by_cat[r["category"]]
            pool = [o for o in sorted(cat, key=lambda o: (-cat[o], o)) if o != obj][:3]
            if not pool:  # a category with a single object: fall back to the popular objects
                pool = [o for o in by_freq if o != obj][:3]
        neg = _pick(pool, "pope", split, seed, r["key"])
        out.append({"kind": "pope", "split": split, "images": [i], "question": POPE_TEMPLATE.format(obj),
                    "answer": "yes", "answers": ["yes"] * 10, "object": obj})
        out.append({"kind": "pope", "split": split, "images": [i], "question": POPE_TEMPLATE.format(neg),
                    "answer": "no", "answers": ["no"] * 10, "object": neg})
    return out


def needle_samples(rows: Sequence[dict], n: int = 2, count: int = 200, seed: int = 0,
                   exists_fraction: float = 0.5) -> list[dict]:
    """MMNeedle grids (Wang et al. 2024 (MMNeedle), §3) with M = 1: ``count`` grids of ``n``×``n`` stamps from
    ``rows`` and one caption each. A fraction ``exists_fraction`` holds the captioned stamp (the needle) at a
    uniformly drawn cell; the others are built from stamps whose caption differs from the needle's.

    Each grid gives a ``needle_exists`` question and, when the needle is there, its location questions: for
    n = 2 ``needle_row`` (top / bottom) and ``needle_col`` (left / right), asked in that order (Li et al. 2025,
    §5.1), otherwise ``needle_cell``. Each question carries ``grid`` (its stamp rows, row-major), ``needle``
    ((0, row, col) or None, the target of ``diffattn.eval.vlm.mmneedle_metrics``) and ``sample`` (the grid id).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if len(rows) < n * n + 1:
        raise ValueError(f"rows must hold more than n*n = {n * n} images to fill a grid, got {len(rows)}")
    if not 0 <= exists_fraction <= 1:
        raise ValueError(f"exists_fraction must be in [0, 1], got {exists_fraction!r}")
    out = []
    for s in range(count):
        needle = _hash("needle", seed, n, s) % len(rows)
        caption = rows[needle]["caption"]
        others = [j for j in range(len(rows)) if rows[j]["caption"] != caption]
        if len(others) < n * n:
            raise ValueError(f"rows must hold at least n*n = {n * n} images whose caption differs from the needle's "
                             f"({caption!r}), got {len(others)}")
        picks = sorted(others, key=lambda j: _hash("grid", seed, n, s, j))[:n * n]  # distinct, deterministic
        exists = (_hash("exists", seed, n, s) % 10_000) < exists_fraction * 10_000
        cell = _hash("cell", seed, n, s) % (n * n)
        if exists:
            picks[cell] = needle
        target = (0, cell // n, cell % n) if exists else None
        text = caption.strip()
        base = {"kind": "needle", "images": picks, "grid": n, "needle": target, "sample": s, "caption": text}
        yes_no = "yes" if exists else "no"
        out.append({**base, "kind": "needle_exists", "question": NEEDLE_EXISTS.format(text), "answer": yes_no,
                    "answers": [yes_no] * 10})
        if not exists:
            continue
        r, c = target[1], target[2]
        if n == 2:
            row, col = ("top", "bottom")[r], ("left", "right")[c]
            out.append({**base, "kind": "needle_row", "question": NEEDLE_ROW.format(text), "answer": row,
                        "answers": [row] * 10})
            out.append({**base, "kind": "needle_col", "question": NEEDLE_COL.format(text), "answer": col,
                        "answers": [col] * 10})
        else:
            ans = f"row {r + 1} column {c + 1}"
            out.append({**base, "kind": "needle_cell", "question": NEEDLE_CELL.format(text), "answer": ans,
                        "answers": [ans] * 10})
    return out


def compose_grid(images: Sequence, n: int, size: int | None = None):
    """Paste ``n``×``n`` PIL images row-major into one RGB image of ``size`` pixels (default: the first image's
    width), each resized to ``size // n`` (bilinear), on white."""
    from PIL import Image

    if len(images) != n * n:
        raise ValueError(f"images must hold n*n = {n * n} images, got {len(images)}")
    size = images[0].size[0] if size is None else size
    cell = size // n
    canvas = Image.new("RGB", (cell * n, cell * n), "white")
    for k, im in enumerate(images):
        canvas.paste(im.convert("RGB").resize((cell, cell), Image.BILINEAR), ((k % n) * cell, (k // n) * cell))
    return canvas


class VQADataset(Dataset):
    """Questions of ``kinds`` about the images of one split of a caption set (default the Tux Paint stamps).

    ``kinds``: any of ``what``, ``category``, ``pope``, ``needle``; ``pope_splits``: which POPE negatives (all
    three by default); ``needle_grid``, ``needle_count``: the MMNeedle grids. A sample is a dict
    ``{"image", "question", "answer", "answers", "kind", …}`` with ``image`` a PIL image (a composed grid for the
    needle questions) or ``transform(image)``. ``questions`` holds every question without loading images.
    """

    def __init__(self, split: str = "train", kinds: Sequence[str] = ("what", "category", "pope"),
                 root: str | os.PathLike | None = None, transform: Callable | None = None, *,
                 name: str = "tuxpaint_captions", pope_splits: Sequence[str] = POPE_SPLITS, needle_grid: int = 2,
                 needle_count: int = 200, seed: int = 0) -> None:
        if isinstance(kinds, str) or not kinds or any(k not in QUESTION_KINDS for k in kinds):
            raise ValueError(f"kinds must be a non-empty sequence of {QUESTION_KINDS}, got {kinds!r}")
        self.images = CaptionImages(name, split, root=root)
        self.split, self.transform, self.kinds = split, transform, tuple(kinds)
        rows = self.images.rows
        qs: list[dict] = []
        if "what" in kinds:
            qs += what_questions(rows)
        if "category" in kinds:
            qs += category_questions(rows)
        if "pope" in kinds:
            for s in pope_splits:
                qs += pope_questions(rows, s, seed)
        if "needle" in kinds:
            qs += needle_samples(rows, needle_grid, needle_count, seed)
        self.questions = qs
        self._img_size = None

    def __len__(self) -> int:
        return len(self.questions)

    def image(self, q: dict):
        """The PIL image a question is about: the stamp, or the composed needle grid."""
        if len(q["images"]) == 1:
            return self.images.load_image(q["images"][0])
        return compose_grid([self.images.load_image(j) for j in q["images"]], q["grid"])

    def __getitem__(self, i: int) -> dict:
        q = self.questions[i]
        image = self.image(q)
        return {**q, "image": self.transform(image) if self.transform else image}

    def webdataset_samples(self):
        """(key, {extension: bytes}) per question for ``diffattn data export``: ``png`` (the stamp's prepared PNG,
        or the composed grid), ``txt`` (the question) and ``json`` (the question's other fields)."""
        import io
        import json

        for i, q in enumerate(self.questions):
            if len(q["images"]) == 1:
                png = (self.images.folder / self.images.rows[q["images"][0]]["image"]).read_bytes()
            else:
                buf = io.BytesIO()
                self.image(q).save(buf, format="PNG")
                png = buf.getvalue()
            meta = {k: v for k, v in q.items() if k not in ("question", "images")}
            meta["image_keys"] = [self.images.rows[j]["key"] for j in q["images"]]
            yield f"{i:06d}", {"png": png, "txt": q["question"].encode(),
                               "json": json.dumps(meta, ensure_ascii=False).encode()}


def vqa_vocabulary(questions: Sequence[dict], extra: Sequence[str] = ()) -> list[str]:
    """The sorted word list (:func:`split_words`) of the questions, answers and needle captions of ``questions``
    and of the ``extra`` texts, with "?"."""
    words: set[str] = {"?"}
    for q in questions:
        for text in (q["question"], *q["answers"], q.get("caption", "")):
            words.update(split_words(text))
    for text in extra:
        words.update(split_words(text))
    return sorted(words)
