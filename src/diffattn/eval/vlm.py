"""Vision-language metrics: the VQAv2 score, POPE and the multimodal needle-in-a-haystack accuracies.

VQA score (Goyal et al. 2017; Antol et al. 2015's evaluation code). With 10 human answers a_1 … a_10 and a
normalised prediction p,

    score(p) = 1/10 · Σ_{i=1}^{10} min(1, #{j ≠ i : a_j = p} / 3)

the mean over the 10 leave-one-out subsets of nine answers. Normalisation (the official ``vqaEval.py``): newlines
and tabs become spaces; punctuation ``; / [ ] " { } ( ) = + \\ _ - > < @ ` , ? !`` is removed when it touches a
space (or when the answer holds a digit-comma-digit group) and is otherwise replaced by a space; a period not
followed by a digit is removed; then the answer is lower-cased and split on whitespace, number words zero … ten
(and "none") become digits, the articles a / an / the are dropped, and apostrophe-less contractions get their
apostrophe ("dont" → "don't"). Difference from the official script: it skips normalisation when all ten human
answers are identical; we always normalise both sides, so "two" and "2" match in every case.

POPE (Li et al. 2023 §4): yes/no answers on object existence; "yes" is the positive class.

MMNeedle (Wang et al. 2024 §3): M images, each an N×N grid of sub-images; given a caption, the model says whether
the described sub-image exists and where (image index m, row r, column c). Existence accuracy scores the yes/no,
index accuracy scores m on samples whose needle exists, exact accuracy scores (m, r, c) on those samples.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["CONTRACTIONS", "NUMBER_WORDS", "ARTICLES", "normalize_vqa_answer", "vqa_score", "vqa_accuracy",
           "pope_metrics", "mmneedle_metrics"]

NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = frozenset({"a", "an", "the"})
_PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")  # as written in the official script (a lookahead, not a lookbehind)
_COMMA_NUM = re.compile(r"(\d)(,)(\d)")

# The official table: "from to" pairs, one mapping per entry (whitespace-separated pairs joined by '|').
_CONTRACTION_TABLE = (
    "aint ain't|arent aren't|cant can't|couldve could've|couldnt couldn't|couldn'tve couldn't've|"
    "couldnt've couldn't've|didnt didn't|doesnt doesn't|dont don't|hadnt hadn't|hadnt've hadn't've|"
    "hadn'tve hadn't've|hasnt hasn't|havent haven't|hed he'd|hed've he'd've|he'dve he'd've|hes he's|howd how'd|"
    "howll how'll|hows how's|Id've I'd've|I'dve I'd've|Im I'm|Ive I've|isnt isn't|itd it'd|itd've it'd've|"
    "it'dve it'd've|itll it'll|let's let's|maam ma'am|mightnt mightn't|mightnt've mightn't've|"
    "mightn'tve mightn't've|mightve might've|mustnt mustn't|mustve must've|neednt needn't|notve not've|"
    "oclock o'clock|oughtnt oughtn't|ow's'at 'ow's'at|'ows'at 'ow's'at|'ow'sat 'ow's'at|shant shan't|"
    "shed've she'd've|she'dve she'd've|she's she's|shouldve should've|shouldnt shouldn't|"
    "shouldnt've shouldn't've|shouldn'tve shouldn't've|somebody'd somebodyd|somebodyd've somebody'd've|"
    "somebody'dve somebody'd've|somebodyll somebody'll|somebodys somebody's|someoned someone'd|"
    "someoned've someone'd've|someone'dve someone'd've|someonell someone'll|someones someone's|"
    "somethingd something'd|somethingd've something'd've|something'dve something'd've|somethingll something'll|"
    "thats that's|thered there'd|thered've there'd've|there'dve there'd've|therere there're|theres there's|"
    "theyd they'd|theyd've they'd've|they'dve they'd've|theyll they'll|theyre they're|theyve they've|twas 'twas|"
    "wasnt wasn't|wed've we'd've|we'dve we'd've|weve we've|werent weren't|whatll what'll|whatre what're|"
    "whats what's|whatve what've|whens when's|whered where'd|wheres where's|whereve where've|whod who'd|"
    "whod've who'd've|who'dve who'd've|wholl who'll|whos who's|whove who've|whyll why'll|whyre why're|"
    "whys why's|wont won't|wouldve would've|wouldnt wouldn't|wouldnt've wouldn't've|wouldn'tve wouldn't've|"
    "yall y'all|yall'll y'all'll|y'allll y'all'll|yall'd've y'all'd've|y'alld've y'all'd've|"
    "y'all'dve y'all'd've|youd you'd|youd've you'd've|you'dve you'd've|youll you'll|youre you're|youve you've"
)
CONTRACTIONS: dict[str, str] = dict(pair.split(" ") for pair in _CONTRACTION_TABLE.split("|"))


def _punctuation(text: str) -> str:
    out = text
    comma_num = _COMMA_NUM.search(text) is not None
    for p in _PUNCT:
        if p + " " in text or " " + p in text or comma_num:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD.sub("", out)


def _digits_articles(text: str) -> str:
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in ARTICLES]
    return " ".join(CONTRACTIONS.get(w, w) for w in words)


def normalize_vqa_answer(answer: str) -> str:
    """The official VQA answer normalisation (module docstring): "Two dogs!" → "2 dogs", "the cat." → "cat"."""
    if not isinstance(answer, str):
        raise TypeError(f"answer must be a str, got {type(answer).__name__}")
    answer = answer.replace("\n", " ").replace("\t", " ").strip()
    return _digits_articles(_punctuation(answer))


def vqa_score(prediction: str, answers: Sequence[str]) -> float:
    """VQA accuracy of one prediction against the human answers (usually 10): the mean over the leave-one-out
    subsets of min(1, matches / 3) after normalising both sides (module docstring)."""
    if isinstance(answers, str) or len(answers) < 2:
        raise ValueError(f"answers must be a sequence of at least 2 human answers (VQAv2 has 10), got {answers!r}")
    p = normalize_vqa_answer(prediction)
    gts = [normalize_vqa_answer(a) for a in answers]
    scores = [min(1.0, sum(g == p for j, g in enumerate(gts) if j != i) / 3.0) for i in range(len(gts))]
    return sum(scores) / len(scores)


def vqa_accuracy(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> float:
    """Mean :func:`vqa_score` over questions."""
    if len(predictions) != len(answers) or not predictions:
        raise ValueError(f"predictions and answers must be non-empty and of equal length, got {len(predictions)} "
                         f"and {len(answers)}")
    return sum(vqa_score(p, a) for p, a in zip(predictions, answers)) / len(predictions)


def _yes_no(name: str, values: Sequence) -> list[bool]:
    out = []
    for v in values:
        if isinstance(v, bool):
            out.append(v)
        elif isinstance(v, str):
            # POPE's answer parsing: the first word decides; "no" / "not" anywhere in it means no
            words = re.sub(r"[^a-z ]", " ", v.lower()).split()
            out.append(bool(words) and not ({"no", "not"} & set(words)) and words[0] == "yes")
        elif isinstance(v, int) and v in (0, 1):
            out.append(bool(v))
        else:
            raise TypeError(f"{name} must hold bools, 0/1 or 'yes'/'no' strings, got {v!r}")
    return out


def pope_metrics(predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """``{"accuracy", "precision", "recall", "f1", "yes_ratio"}`` for yes/no ``predictions`` against ``labels``
    (bools, 0/1 or answer strings; a string is "yes" when its first word is yes and it holds no "no"/"not").
    "yes" is the positive class; precision and F1 are 0 when nothing is predicted "yes" (Li et al. 2023 §4)."""
    if len(predictions) != len(labels) or not len(labels):
        raise ValueError(f"predictions and labels must be non-empty and of equal length, got {len(predictions)} "
                         f"and {len(labels)}")
    p, y = _yes_no("predictions", predictions), _yes_no("labels", labels)
    tp = sum(a and b for a, b in zip(p, y))
    fp = sum(a and not b for a, b in zip(p, y))
    fn = sum(b and not a for a, b in zip(p, y))
    tn = len(y) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"accuracy": (tp + tn) / len(y), "precision": precision, "recall": recall, "f1": f1,
            "yes_ratio": (tp + fp) / len(y)}


def mmneedle_metrics(predictions: Sequence[tuple[int, int, int] | None],
                     targets: Sequence[tuple[int, int, int] | None]) -> dict[str, float | None]:
    """``{"existence", "index", "exact"}`` accuracies (Wang et al. 2024 §3).

    Each prediction and target is ``None`` (no needle) or ``(image, row, col)`` (0-based). existence: fraction
    of samples where (prediction is None) equals (target is None); index: among samples with a needle, fraction
    whose predicted image index is right; exact: among those, fraction with image, row and column all right.
    index and exact are None when no target holds a needle.
    """
    if len(predictions) != len(targets) or not len(targets):
        raise ValueError(f"predictions and targets must be non-empty and of equal length, got {len(predictions)} "
                         f"and {len(targets)}")
    for name, seq in (("predictions", predictions), ("targets", targets)):
        for v in seq:
            if v is not None and (len(v) != 3 or not all(isinstance(i, int) and i >= 0 for i in v)):
                raise ValueError(f"{name} entries must be None or (image, row, col) non-negative ints, got {v!r}")
    existence = sum((p is None) == (t is None) for p, t in zip(predictions, targets)) / len(targets)
    pos = [(p, t) for p, t in zip(predictions, targets) if t is not None]
    if not pos:
        return {"existence": existence, "index": None, "exact": None}  # undefined without a needle
    index = sum(p is not None and p[0] == t[0] for p, t in pos) / len(pos)
    exact = sum(p is not None and tuple(p) == tuple(t) for p, t in pos) / len(pos)
    return {"existence": existence, "index": index, "exact": exact}
