"""diffattn.eval.vlm_bench: VQA score / POPE / MMNeedle from answers (an oracle, a yes-sayer, a known mix), the
heat map, the decoder's image attention, and the whole evaluation on a tiny trained VLM over the real stamps."""

from __future__ import annotations

import pytest
import torch

from diffattn.data import DATASETS, SETUP_COMMAND, default_root
from diffattn.data.vqa import needle_samples, pope_questions, what_questions
from diffattn.eval.vlm_bench import evaluate_vlm, image_attention, needle_predictions, plot_needle_cells

ROOT = default_root()
ROWS = [{"key": f"k{i}", "caption": f"A {w}.", "category": c} for i, (w, c) in enumerate(
    [("frog", "animals"), ("lion", "animals"), ("toad", "animals"), ("apple", "food"), ("pear", "food"),
     ("bus", "vehicles"), ("car", "vehicles"), ("tram", "vehicles")])]


class FakeSet:
    """questions + image(): what evaluate_vlm needs from a VQADataset."""

    def __init__(self, questions):
        self.questions = questions
        for i, q in enumerate(questions):
            q["images"] = [1000 + i]  # a distinct "image" per question, so an answerer can tell them apart

    def image(self, q):
        return torch.full((1,), float(q["images"][0] - 1000))  # the question's index


def _set():
    return FakeSet(what_questions(ROWS) + pope_questions(ROWS, "random") + pope_questions(ROWS, "popular")
                   + needle_samples(ROWS, n=2, count=12, seed=0))


def _by_question(ds, fn):
    return lambda images, questions: [fn(ds.questions[int(i)]) for i in images]


def test_oracle_scores_perfectly():
    ds = _set()
    r = evaluate_vlm(_by_question(ds, lambda q: q["answer"]), ds, batch_size=7)
    assert r["vqa"] == {"what": 1.0} and r["n_questions"] == len(ds.questions)
    for m in r["pope"].values():
        assert m == {"accuracy": 1.0, "precision": 1.0, "recall": 1.0, "f1": 1.0, "yes_ratio": 0.5}
    assert r["mmneedle"]["existence"] == r["mmneedle"]["index"] == r["mmneedle"]["exact"] == 1.0
    assert r["mmneedle"]["location"] == 1.0 and set(r["mmneedle"]["cells"].values()) == {1.0}


def test_yes_sayer_and_known_mix():
    ds = _set()
    r = evaluate_vlm(lambda images, qs: ["yes"] * len(qs), ds)
    assert r["vqa"]["what"] == 0.0
    assert r["pope"]["random"] == {"accuracy": 0.5, "precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3),
                                   "yes_ratio": 1.0}
    n = sum(q["kind"] == "needle_exists" for q in ds.questions)
    n_pos = sum(q["kind"] == "needle_exists" and q["needle"] is not None for q in ds.questions)
    assert r["mmneedle"]["existence"] == pytest.approx(n_pos / n)
    assert r["mmneedle"]["index"] == 1.0  # M = 1: saying yes on a grid with the needle finds its image
    # "yes" as a location answer is neither top/bottom nor left/right: row 0 / col 0 stand in, wrong elsewhere
    cells = [tuple(q["needle"][1:]) for q in ds.questions if q["kind"] == "needle_exists" and q["needle"]]
    assert r["mmneedle"]["exact"] == pytest.approx(sum(c == (0, 0) for c in cells) / len(cells))
    assert r["mmneedle"]["location"] == 0.0  # "yes" is never the right word


def test_needle_predictions_two_steps():
    qs = needle_samples(ROWS, n=2, count=6, seed=2, exists_fraction=1.0)
    answers = []
    for q in qs:  # right row, always "left": right exactly when the needle is in column 0
        if q["kind"] == "needle_exists":
            answers.append("Yes.")
        elif q["kind"] == "needle_row":
            answers.append(("top", "bottom")[q["needle"][1]])
        else:
            answers.append("left")
    n = needle_predictions(qs, answers)
    targets = [tuple(q["needle"]) for q in qs if q["kind"] == "needle_exists"]
    assert n["targets"] == targets
    assert n["predictions"] == [(0, t[1], 0) for t in targets]
    assert [ok for _, ok in n["location"]] == [t[2] == 0 for t in targets]
    with pytest.raises(ValueError, match="every question of a needle grid"):
        needle_predictions(qs[1:], answers[1:])


def test_plot_needle_cells(tmp_path):
    path = plot_needle_cells({"0,0": 1.0, "0,1": 0.25, "1,0": 0.5, "1,1": 0.0}, 2, tmp_path / "cells.png")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_image_attention_is_the_row_share_on_image_tokens():
    from diffattn.diagnostics import capture_attention
    from diffattn.models import create_model

    torch.manual_seed(0)
    m = create_model("llava_clip_tiny", vocab=["what", "is", "this", "?"]).eval()
    x = torch.randn(2, 3, 32, 32)
    qs = ["what is this?", "this?"]
    shares = image_attention(m, x, qs)
    assert len(shares) == 2 and all(0 < s < 1 for s in shares)
    b = m.collate(qs)
    with capture_attention(m) as cap:  # independent: the standard maps' rows sum to 1
        m(x, **b)
    P = m.num_image_tokens
    lm_maps = [layer.combined for layer in cap.layers if layer.name.startswith("lm.")]
    for s, a in zip(shares, lm_maps):
        ref = [float(a[i, :, P + int(b["attention_mask"][i].sum()) - 1, :P].sum(-1).mean()) for i in range(2)]
        assert s == pytest.approx(sum(ref) / 2, abs=1e-5)


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.skipif(not DATASETS["tuxpaint_captions"].installed(ROOT),
                    reason=f"tuxpaint_captions not installed under {ROOT}: run `{SETUP_COMMAND}`")
def test_end_to_end_on_a_tiny_trained_vlm(one_thread):
    from diffattn.data.vqa import QUESTION_KINDS, VQADataset
    from diffattn.eval.vlm_bench import llava_answerer
    from diffattn.models import create_model
    from diffattn.train.llava import train_llava
    from diffattn.train.tasks.vlm import QuestionImages, vlm_vocabulary

    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = create_model("llava_diffclip_tiny", vocab=vlm_vocabulary(ROOT))
    tf = m.image_transform()
    train = VQADataset("train", ("category", "pope"), root=ROOT)
    losses = train_llava(m, QuestionImages(train, tf), stage1_steps=0, stage2_steps=25, batch_size=16,
                         stage2_lr=3e-3)
    assert losses[-1] < losses[0]
    test = VQADataset("test", QUESTION_KINDS, root=ROOT, needle_count=8)
    keep = [q for q in test.questions if q["kind"] in ("what", "category")][::3]
    test.questions = keep + [q for q in test.questions if q.get("split") == "adversarial" or
                             q["kind"].startswith("needle")]
    r = evaluate_vlm(llava_answerer(m, 4), test, tf)
    assert set(r["vqa"]) == {"what", "category"} and set(r["pope"]) == {"adversarial"}
    assert {"existence", "index", "exact", "location", "cells"} <= set(r["mmneedle"])
    assert all(0 <= v <= 1 for v in r["pope"]["adversarial"].values())
    assert r["n_questions"] == len(r["answers"]) == len(test.questions)
    assert all(set(a.split()) <= set(m.vocab) for a in r["answers"])  # decoded words of the vocabulary
    assert evaluate_vlm(llava_answerer(m, 4), test, tf)["answers"] == r["answers"]  # greedy: deterministic
