"""The vision-language recipes on the offline Tux Paint questions: Differential PaliGemma (retrofit + LoRA) trains,
saves its adapter, LoRA and tokenizer and reloads exactly; LLaVA's stage 1 / stage 2 runs through ``diffattn
train``, keeping the CLIP tower it was given."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffattn.data import DATASETS, SETUP_COMMAND, default_root

REPO = Path(__file__).resolve().parents[1]
ROOT = default_root()
pytestmark = [pytest.mark.data, pytest.mark.skipif(
    not DATASETS["tuxpaint_captions"].installed(ROOT),
    reason=f"tuxpaint_captions not installed under {ROOT}: run `{SETUP_COMMAND}`")]

FAST = ["run.log_every=1", "run.progress=false", f"data.path={ROOT}", "task.base.kinds=[what, pope]"]


def _cfg(name: str, *extra: str):
    from diffattn.train import load_config

    return load_config(f"tiny/{name}", [*FAST, *extra])


def test_word_tokenizer_round_trip(tmp_path):
    from transformers import AutoTokenizer

    from diffattn.models.paligemma import paligemma_batch, word_tokenizer

    tok = word_tokenizer(["what", "is", "this", "?", "frog"])
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    text = "What is “this”?\n frog zebra"
    assert back(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"] \
        == [6, 7, 8, 9, 5, 10, 3]  # what is this ? \n frog <unk>
    b = paligemma_batch(tok, 4, 3, ["what is this?", "is this?"], ["frog", "frog"])
    assert b["input_ids"][0].tolist() == [4, 4, 4, 2, 6, 7, 8, 9, 5, 10, 1]
    assert b["token_type_ids"][0].tolist() == [0] * 9 + [1, 1]
    assert b["labels"][0].tolist() == [-100] * 9 + [10, 1]
    assert b["attention_mask"][1].tolist() == [1] * 10 + [0] and b["labels"][1, -1] == -100


@pytest.mark.slow
@pytest.mark.parametrize("method", ["shared_qk", "split_heads"])
def test_paligemma_lora_trains_saves_and_reloads_exactly(tmp_path, method, one_thread):
    import diffattn.adapters as A
    from diffattn.eval.paligemma import answer_paligemma, load_paligemma
    from diffattn.models.paligemma import paligemma_batch
    from diffattn.train import train
    from diffattn.train.checkpoint import latest_checkpoint, load_checkpoint
    from diffattn.train.tasks.paligemma import PaliGemmaTask

    cfg = _cfg("paligemma", "run.steps=12", "run.batch_size=8", "run.ckpt_every=12", "optim.lr=3e-3",
               f"task.method={method}", "task.anneal_steps=40")
    res = train(cfg, out=tmp_path)
    assert sum(res["losses"][-3:]) < sum(res["losses"][:3])
    assert {p.name for p in tmp_path.iterdir()} >= {"adapter", "lora", "tokenizer"}

    task = PaliGemmaTask(cfg)  # the trained model, rebuilt from the last checkpoint
    trained = task.own_model()
    trained.load_state_dict(load_checkpoint(latest_checkpoint(tmp_path))["model"])  # λ schedule step included
    trained.eval()
    model, tok = load_paligemma(tmp_path)
    lams = [r["lambda"] for r in A.lambda_summary(model)]
    assert lams == [r["lambda"] for r in A.lambda_summary(trained)] and 0 < lams[0] < 0.8  # mid-anneal: t matters
    assert len(A.adapters(model)) == 2  # the Gemma decoder only, not the SigLIP tower
    cfg_pg = model.base_model.model.config
    batch = paligemma_batch(tok, cfg_pg.image_token_index, 16, ["what is this?"], ["frog"])
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = trained(pixel_values=x, **batch).logits
        got = model(pixel_values=x, **batch).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert len(answer_paligemma(model, tok, x.expand(2, -1, -1, -1), ["what is this?", "is it?"], 3)) == 2


@pytest.mark.slow
def test_llava_stages_through_diffattn_train(tmp_path, one_thread):
    from diffattn.models import create_model, from_pretrained
    from diffattn.train import train

    torch.manual_seed(3)
    clip = create_model("diffclip_tiny")
    clip.save_pretrained(tmp_path / "clip")
    s1 = train(_cfg("vlm", "task.train=projector", f"task.base.clip={tmp_path / 'clip'}", "run.steps=4",
                    "run.batch_size=8", "run.ckpt_every=4"), out=tmp_path / "s1")
    m1 = from_pretrained(tmp_path / "s1" / "model")
    torch.manual_seed(0)  # run.seed: the model diffattn train builds before stage 1
    fresh = create_model("llava_diffclip_tiny", vocab=m1.vocab)
    for k, v in clip.visual.state_dict().items():
        assert torch.equal(m1.visual.state_dict()[k], v), k
    assert all(torch.equal(m1.lm.state_dict()[k], v) for k, v in fresh.lm.state_dict().items())
    train(_cfg("vlm", f"task.base.init={tmp_path / 's1' / 'model'}", "run.steps=4", "run.batch_size=8",
               "run.ckpt_every=4"), out=tmp_path / "s2")
    m2 = from_pretrained(tmp_path / "s2" / "model")
    assert all(torch.equal(m2.visual.state_dict()[k], v) for k, v in clip.visual.state_dict().items())
    assert not torch.equal(m2.lm.blocks[0].attn.q_proj.weight, m1.lm.blocks[0].attn.q_proj.weight)
    assert len(s1["losses"]) == 4


def test_bad_vlm_config_values_are_named():
    from diffattn.train import load_config

    with pytest.raises(ValueError, match="task.train must be 'projector'"):
        load_config("tiny/vlm", ["task.train=adapters"])
    with pytest.raises(ValueError, match="task.method must be one of \\('shared_qk', 'split_heads', 'none'\\)"):
        load_config("tiny/paligemma", ["task.method=daa"])


@pytest.mark.slow
def test_paligemma_full_fine_tuning_is_the_base_of_a_lora_run(tmp_path, one_thread):
    """``lora_r: 0`` trains every weight and saves ``model/`` with its tokenizer; a LoRA run then starts from it
    through ``task.base.path``, as from a downloaded checkpoint, and starts at exactly its function."""
    from diffattn.eval.paligemma import load_paligemma
    from diffattn.models.paligemma import build_paligemma, paligemma_batch
    from diffattn.train import train
    from diffattn.train.tasks.paligemma import PaliGemmaTask
    from diffattn.train.tasks.vlm import DATA_KEYS

    pre = train(_cfg("paligemma", "run.steps=4", "run.batch_size=4", "run.ckpt_every=4", "task.method=none",
                     "task.lora_r=0", "optim.lr=3e-3"), out=tmp_path / "pre")
    assert pre["losses"][-1] < pre["losses"][0]
    assert {p.name for p in (tmp_path / "pre" / "model").iterdir()} >= {"config.json", "model.safetensors",
                                                                         "tokenizer.json"}
    full, tok = load_paligemma(tmp_path / "pre")
    start = build_paligemma(_cfg("paligemma").task.base, len(tok), extra_keys=DATA_KEYS)  # what the run started from
    trained = dict(full.named_parameters())
    changed = [n for n, p in start.named_parameters() if not torch.equal(p, trained[n])]
    assert any("vision_tower" in n for n in changed) and any("language_model" in n for n in changed)
    base = f"task.base.path={tmp_path / 'pre' / 'model'}"
    cfg = _cfg("paligemma", base, "run.steps=2", "run.batch_size=4", "run.ckpt_every=2", "task.method=shared_qk")
    lora = PaliGemmaTask(cfg).own_model().eval()  # retrofit (λ(0) = 0) + LoRA (B = 0): the base's function
    batch = paligemma_batch(tok, full.config.image_token_index, 16, ["what is this?"], ["frog"])
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(lora(pixel_values=x, **batch).logits, full(pixel_values=x, **batch).logits,
                                   atol=1e-5, rtol=1e-5)
    train(cfg, out=tmp_path / "lora")
    model, _ = load_paligemma(tmp_path / "lora")
    assert type(model).__name__ == "PeftModel"


@pytest.mark.slow
def test_paligemma_image_attention_is_unchanged_by_an_exact_retrofit(tmp_path, one_thread):
    """At step 0 (λ(0) = 0) the shared-QK and split-heads retrofits compute the base model's attention, so the share
    of the last prompt position's attention on the image tokens is the base's; the model's attention backend is
    restored after the call."""
    import diffattn.adapters as A
    from diffattn.eval.paligemma import paligemma_image_attention
    from diffattn.models.paligemma import build_paligemma, word_tokenizer
    from diffattn.train.tasks.vlm import DATA_KEYS

    cfg = _cfg("paligemma")
    tok = word_tokenizer(["what", "is", "this", "?", "frog", "there", "a", "in", "the", "image"])
    qs = ["what is this?", "is there a frog in the image?", "what?"]
    x = torch.randn(3, 3, 32, 32)
    base = build_paligemma(cfg.task.base, len(tok), extra_keys=DATA_KEYS).eval()
    ref = paligemma_image_attention(base, tok, x, qs)
    assert base.config.text_config._attn_implementation == "sdpa"
    assert len(ref) == 2 and all(0 < s < 1 for s in ref)
    with pytest.raises(ValueError, match=r"images must be a \(B, 3, H, W\) tensor with one image per question "
                       r"\(B = 3\), got \(2, 3, 32, 32\)"):
        paligemma_image_attention(base, tok, x[:2], qs)
    for method in ("shared_qk", "split_heads"):
        model = build_paligemma(cfg.task.base, len(tok), extra_keys=DATA_KEYS).eval()
        A.retrofit(model, method, lambda_init=0.8, anneal_steps=10, layers=lambda i, n: "language_model" in n)
        assert paligemma_image_attention(model, tok, x, qs) == pytest.approx(ref, abs=1e-5)


@pytest.mark.slow
def test_llava_compare_takes_each_seeds_own_tower(tmp_path, one_thread):
    import json

    from diffattn.models import create_model
    from diffattn.studies.llava import llava_compare

    for seed in (0, 1):
        torch.manual_seed(seed)
        create_model("diffclip_tiny").save_pretrained(tmp_path / f"s{seed}" / "model")
    rows = llava_compare({"diffclip": str(tmp_path / "s{seed}" / "model")}, (0, 1), stage1_steps=1, stage2_steps=1,
                         batch_size=2, root=ROOT, needle_count=2, out=tmp_path / "cmp", log=lambda *a: None)
    assert [r["clip"] for r in rows] == [str(tmp_path / "s0" / "model"), str(tmp_path / "s1" / "model")]
    saved = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert [r["seed"] for r in saved] == [0, 1]
    for r in saved:
        assert set(r["pope"]) == {"random", "popular", "adversarial"} and 0 <= r["vqa"]["category"] <= 1
        assert len(r["image_attention"]) == 2
    assert "| POPE adversarial: yes-ratio |" in (tmp_path / "cmp" / "results.md").read_text()


def test_llava_table_means_and_stds():
    from diffattn.studies.llava import llava_table

    def row(tower, seed, what, loss):
        return {"tower": tower, "seed": seed, "vqa": {"what": what, "category": 0.5}, "final_loss": loss,
                "total_s": 10.0, "image_attention": [0.25, 0.5],
                "pope": {s: {"accuracy": 0.5, "f1": 0.0, "yes_ratio": 0.0} for s in ("random", "popular")},
                "mmneedle": {"existence": 0.5, "index": None, "exact": None, "location": None, "cells": {}}}

    table = llava_table([row("clip", 0, 0.1, 1.0), row("clip", 1, 0.3, 2.0), row("diffclip", 0, 0.2, 1.5),
                         row("diffclip", 1, 0.2, 1.5)])
    lines = table.splitlines()
    assert lines[0] == "| metric (test split, %, mean ± std over seeds 0, 1) | clip | diffclip |"
    assert "| VQA score, what is this? | 20.0 ± 14.1 | 20.0 ± 0.0 |" in lines
    assert "| final training loss | 1.500 ± 0.707 | 1.500 ± 0.000 |" in lines
    assert "| decoder attention on image tokens, layer 1 | 50.0 ± 0.0 | 50.0 ± 0.0 |" in lines
    assert "| MMNeedle index | – | – |" in lines  # undefined without a needle: not averaged
    assert not any(line.startswith("| POPE adversarial") for line in lines)


def test_moved_names_warn_and_resolve_to_their_new_modules():
    """The PaliGemma builder and tokenizer moved to diffattn.models.paligemma, its inference to
    diffattn.eval.paligemma: the old names still work, warning. The LLaVA comparison moved to
    diffattn.studies.llava without an alias (a recipe module never imports the studies)."""
    import diffattn.train.tasks.vlm as old
    from diffattn.eval import paligemma as ev
    from diffattn.models import paligemma as pg
    from diffattn.studies import llava
    from diffattn.train import llava as train_llava

    for name, module in [("word_tokenizer", pg), ("paligemma_batch", pg), ("paligemma_transform", pg),
                         ("PALIGEMMA_SPECIAL", pg), ("load_paligemma", ev), ("answer_paligemma", ev),
                         ("paligemma_image_attention", ev)]:
        with pytest.warns(FutureWarning, match=rf"vlm\.{name} is deprecated .*; use {module.__name__}\.{name} "):
            assert getattr(old, name) is getattr(module, name)
    with pytest.warns(FutureWarning, match="diffattn.models.paligemma.build_paligemma"):
        build = old.build_paligemma
    with pytest.raises(ValueError, match="unknown config keys task.base.colour; valid: type, config, path, kinds"):
        build({"type": "paligemma", "colour": 1})
    with pytest.raises(ValueError, match="unknown config keys task.base.kinds; valid: type, config, path"):
        pg.build_paligemma({"type": "paligemma", "kinds": ["what"]})
    assert not hasattr(old, "no_such_name")
    for name in ("llava_compare", "llava_table", "train_llava"):  # moved without an alias
        assert not hasattr(old, name) and callable(getattr(llava if name != "train_llava" else train_llava, name))


def test_llava_study_config_and_missing_towers(tmp_path):
    from diffattn.studies import load_study, run_study

    cfg = load_study("llava", {"seeds": [0, 1], "out": str(tmp_path)})
    assert cfg["variants"] == ["clip", "diffclip"] and cfg["stage2_steps"] == 250
    with pytest.raises(ValueError, match=r"towers in .* must map every variant \(clip, diffclip\)"):
        load_study("llava", {"towers": {"clip": "random"}})
    with pytest.raises(ValueError, match="stage1_steps \\+ stage2_steps in .* must be >= 1, got 0"):
        load_study("llava", {"stage1_steps": 0, "stage2_steps": 0})
    cfg = load_study("llava", {"seeds": [0, 1], "out": str(tmp_path),
                               "towers": {"clip": "random", "diffclip": str(tmp_path / "s{seed}" / "model")}})
    with pytest.raises(FileNotFoundError, match=r"towers.diffclip in the llava study: .*s0/model holds no trained "
                                                r"CLIP .*diffattn study diffclip"):
        run_study(cfg, progress=False)
