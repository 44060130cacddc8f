"""Hand-computed cases for the evaluation metrics: classification, retrieval, probe, few-shot, VQA, POPE, MMNeedle."""

from __future__ import annotations

import math

import pytest
import torch

from diffattn.eval.classification import classification_metrics, topk_correct, zero_shot_classifier, zero_shot_logits
from diffattn.eval.probe import few_shot, linear_probe, prototype_accuracy
from diffattn.eval.retrieval import recall_at_k
from diffattn.eval.vlm import mmneedle_metrics, normalize_vqa_answer, pope_metrics, vqa_score

# ------------------------------------------------------------------------------------------ classification


def test_classification_metrics_hand_computed():
    scores = torch.tensor([[0.9, 0.05, 0.05, 0.0],  # label 0: rank 1
                           [0.1, 0.2, 0.7, 0.0],  # label 1: rank 2
                           [0.5, 0.3, 0.1, 0.1],  # label 2: rank 3 (tie with col 3 counts against it)
                           [0.4, 0.3, 0.2, 0.1]])  # label 2: rank 3
    labels = torch.tensor([0, 1, 2, 2])
    m = classification_metrics(scores, labels, ks=(1, 2, 3))
    assert m["top1"] == pytest.approx(0.25)
    assert m["top2"] == pytest.approx(0.5)
    assert m["top3"] == pytest.approx(0.75)  # row 2's label ties with column 3: pessimistic rank 4
    # per class top-1 recall: class 0: 1/1, class 1: 0/1, class 2: 0/2 → mean 1/3
    assert m["mean_per_class_recall"] == pytest.approx(1 / 3)


def test_topk_ties_count_against_label():
    scores = torch.zeros(3, 5)
    assert not topk_correct(scores, torch.tensor([0, 2, 4]), 4).any()  # four others tie: rank 5
    assert topk_correct(scores, torch.tensor([0, 2, 4]), 5).all()


def test_classification_metrics_rejects_bad_input():
    with pytest.raises(ValueError, match="labels must lie in"):
        classification_metrics(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="one entry per row"):
        classification_metrics(torch.zeros(2, 3), torch.tensor([0]))
    with pytest.raises(TypeError, match="labels must be an integer"):
        classification_metrics(torch.zeros(2, 3), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="NaN"):
        classification_metrics(torch.full((2, 3), float("nan")), torch.tensor([0, 1]))


class _BagOfCharsModel(torch.nn.Module):
    """encode_text: a count of 'a' and 'b' in each prompt; tokens are the prompts' character codes."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def encode_text(self, tokens):
        return torch.stack([(tokens == ord("a")).sum(1), (tokens == ord("b")).sum(1)], dim=1).float() + 0.0


def _char_tokenizer(texts):
    n = max(len(t) for t in texts)
    return torch.tensor([[ord(c) for c in t] + [0] * (n - len(t)) for t in texts])


def test_zero_shot_classifier_is_normalised_mean_of_normalised_prompts():
    model = _BagOfCharsModel()
    w = zero_shot_classifier(model, ["aa", "b"], ["{}", "x{}b"], tokenizer=_char_tokenizer)
    # class "aa": prompts "aa" → (2, 0) → (1, 0); "xaab" → (2, 1) → (2, 1)/√5; mean then normalise
    e = torch.tensor([1.0, 0.0]) + torch.tensor([2.0, 1.0]) / math.sqrt(5)
    torch.testing.assert_close(w[0], e / e.norm())
    # class "b": prompts "b" → (0, 1); "xbb" → (0, 2) → (0, 1): weight (0, 1)
    torch.testing.assert_close(w[1], torch.tensor([0.0, 1.0]))
    logits = zero_shot_logits(torch.tensor([[3.0, 0.0], [0.0, 5.0]]), w)
    assert logits.argmax(1).tolist() == [0, 1]


# ----------------------------------------------------------------------------------------------- retrieval


def test_recall_at_k_multiple_captions_hand_computed():
    # 3 images on the axes; 5 captions: image 0 has captions 0, 1; image 1 has 2; image 2 has 3, 4
    image = torch.eye(3)
    text = torch.tensor([[0.0, 1.0, 0.0],  # caption 0 (of image 0) looks like image 1
                         [0.6, 0.0, 0.8],  # caption 1 (of image 0): ranks image 2 first, image 0 second
                         [0.0, 1.0, 0.0],  # caption 2 (of image 1): right
                         [0.0, 0.0, 1.0],  # caption 3 (of image 2): right
                         [1.0, 0.0, 0.0]])  # caption 4 (of image 2) looks like image 0
    t2i = torch.tensor([0, 0, 1, 2, 2])
    r = recall_at_k(image, text, t2i, ks=(1, 2))
    # text → image top-1: captions 2, 3 right → 2/5; top-2: + caption 1 → 3/5
    assert r["text_to_image@1"] == pytest.approx(2 / 5)
    assert r["text_to_image@2"] == pytest.approx(3 / 5)
    # image → text. image 0 scores captions (0, 0.6, 0, 0, 1): best own caption is 1 (0.6), one wrong caption (4)
    # above it → rank 2. image 1 scores (1, 0, 1, 0, 0): own caption 2 ties with wrong caption 0 → rank 2.
    # image 2 scores (0, 0.8, 0, 1, 0): own caption 3 first → rank 1.
    assert r["image_to_text@1"] == pytest.approx(1 / 3)
    assert r["image_to_text@2"] == pytest.approx(1.0)


def test_recall_at_k_ties_and_constant_scores():
    image = torch.ones(4, 2)
    text = torch.ones(4, 2)
    r = recall_at_k(image, text, torch.arange(4), ks=(1, 3, 4))
    assert r["image_to_text@1"] == 0.0 and r["text_to_image@3"] == 0.0  # three wrong items tie
    assert r["image_to_text@4"] == 1.0 and r["text_to_image@4"] == 1.0


def test_recall_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="images \\[1\\] have none"):
        recall_at_k(torch.eye(2), torch.eye(2), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="text_emb must have E=2"):
        recall_at_k(torch.eye(2), torch.eye(3), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="ks must be positive"):
        recall_at_k(torch.eye(2), torch.eye(2), torch.tensor([0, 1]), ks=(0,))


# ----------------------------------------------------------------------------------------- probe, few-shot


def test_prototype_accuracy_hand_computed():
    support = torch.tensor([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [10.0, 2.0]])
    labels = torch.tensor([3, 3, 7, 7])  # prototypes (1, 0) and (10, 1)
    query = torch.tensor([[5.0, 0.0], [6.0, 0.0], [0.0, 5.0]])  # distances to p3: 4, 5, √26; p7: √26, √17, √116
    acc = prototype_accuracy(support, labels, query, torch.tensor([3, 3, 3]))
    assert acc == pytest.approx(2 / 3)  # (6, 0) is nearer to (10, 1)


def test_few_shot_separable_and_chance():
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(8) * 10
    labels = torch.arange(8).repeat_interleave(12)
    feats = centres[labels] + 0.1 * torch.randn(len(labels), 8, generator=g)
    r = few_shot(feats, labels, episodes=50)
    assert r["mean"] == 1.0 and r["std"] == 0.0 and r["episodes"] == 50
    assert (r["way"], r["shot"], r["queries"]) == (5, 5, 6)  # what the tables name and chance 1/way needs
    noise = torch.randn(len(labels), 8, generator=g)  # no class signal → near chance 1/5
    r = few_shot(noise, labels, episodes=400)
    assert 0.12 < r["mean"] < 0.28 and r["std"] > 0.05
    with pytest.raises(ValueError, match="n_way=5 needs"):
        few_shot(feats[:40], labels[:40], episodes=1)


def test_linear_probe_sweep_and_refit():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x[:600] / 16.0)
    y = torch.tensor(y[:600])
    r = linear_probe(x[:400], y[:400], x[400:], y[400:], coarse_c=(1e-4, 1e-2, 1, 100), fine_decades=1.0,
                     fine_steps=3, max_iter=200)
    assert r["accuracy"] > 0.8 and r["val_accuracy"] > 0.95  # measured: 0.835 and 0.9875 (C = 10)
    assert 1e-5 <= r["C"] <= 1e3
    assert set(r["sweep"]) >= {1e-4, 1e-2, 1.0, 100.0}
    assert r["sweep"][1e-4] < r["val_accuracy"]  # heavy regularisation underfits
    with pytest.raises(ValueError, match="test_features must have 64"):
        linear_probe(x[:400], y[:400], x[400:, :10], y[400:])


# --------------------------------------------------------------------------------------------- VQA, POPE


@pytest.mark.parametrize("raw, norm", [
    ("The cat.", "cat"),  # article dropped, final period removed
    ("a dog", "dog"),
    ("Two", "2"),  # number word
    ("none", "0"),
    ("dont know", "don't know"),  # contraction gets its apostrophe
    ("yes!", "yes"),  # punctuation without a space is replaced by a space, then split away
    ("red, white", "red white"),  # ',' before a space is removed
    ("1,000", "1000"),  # digit-comma-digit: punctuation removed
    ("3.5", "3.5"),  # a period before a digit stays
    ("left-hand", "left hand"),
    ("  Isnt\tHere\n", "isn't here"),  # tabs, newlines, case
])
def test_normalize_vqa_answer(raw, norm):
    assert normalize_vqa_answer(raw) == norm


def test_vqa_contraction_table_keys_are_lower_case_matched():
    # the official table holds "Im" with a capital; answers are lower-cased first, so "im" stays as is
    assert normalize_vqa_answer("Im") == "im"
    assert normalize_vqa_answer("isnt") == "isn't"


def test_vqa_score_leave_one_out():
    answers = ["2"] * 2 + ["3"] * 8
    # matches with prediction "two" → "2": leaving out one of the two "2"s leaves 1 match (1/3), twice;
    # leaving out a "3" leaves 2 matches (2/3), eight times: (2·1/3 + 8·2/3) / 10 = 0.6
    assert vqa_score("two", answers) == pytest.approx(0.6)
    assert vqa_score("Three.", answers) == pytest.approx(1.0)  # ≥ 3 matches in every subset
    assert vqa_score("four", answers) == 0.0
    four = ["a cat"] * 4 + ["dog"] * 6  # 4 matches: leave a match out → 3 → 1; leave other → 4 → 1
    assert vqa_score("the cat", four) == pytest.approx(1.0)
    three = ["cat"] * 3 + ["dog"] * 7  # leave a match out (3×): 2/3; else 1 (7×) → (2 + 7) / 10
    assert vqa_score("cat", three) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="answers must be a sequence"):
        vqa_score("x", "cat")


def test_pope_metrics_hand_computed():
    preds = ["Yes, there is.", "no", "yes", "No, there is not.", "yes", "no"]
    labels = ["yes", "yes", "no", "no", "yes", "no"]  # tp 2, fn 1, fp 1, tn 2
    m = pope_metrics(preds, labels)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    assert m["yes_ratio"] == pytest.approx(0.5)
    none = pope_metrics([False, False], [True, False])
    assert none["precision"] == 0.0 and none["f1"] == 0.0 and none["accuracy"] == 0.5
    with pytest.raises(TypeError, match="predictions must hold"):
        pope_metrics([2], [1])


def test_mmneedle_metrics_hand_computed():
    preds = [(0, 1, 1), (1, 0, 0), None, (2, 0, 1), None]
    targets = [(0, 1, 1), (1, 1, 0), None, None, (0, 0, 0)]
    m = mmneedle_metrics(preds, targets)
    assert m["existence"] == pytest.approx(3 / 5)  # samples 0, 1, 2
    assert m["index"] == pytest.approx(2 / 3)  # needles at 0, 1, 4: index right for 0, 1
    assert m["exact"] == pytest.approx(1 / 3)
    assert mmneedle_metrics([None], [None]) == {"existence": 1.0, "index": None, "exact": None}
    with pytest.raises(ValueError, match="targets entries"):
        mmneedle_metrics([None], [(0, 1)])
