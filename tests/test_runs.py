"""Runs rebuilt from their directory alone (retrofits included, and ``diffattn eval`` on them) and validation while
training (``eval.every``: metrics logged, ``best/`` kept, exact on resume). Data-free tiny configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from diffattn import cli

ROOT = Path(__file__).resolve().parents[1]
RETROFIT = str(ROOT / "configs/tiny/retrofit.yaml")
CLIP = str(ROOT / "configs/tiny/clip.yaml")
CLASSIFY = str(ROOT / "configs/tiny/classify.yaml")
QUIET = ["--set", "run.progress=false", "--set", "run.log_every=1"]
CLIP_DIGITS = ["--set", "data.name=digits", "--set", "model.overrides.vision_img_size=8", "--set",
               "model.overrides.vision_patch_size=2", "--set", "model.overrides.vision_in_chans=1"]
PROSE = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
         "of a wife. However little known the feelings or views of such a man may be on his first entering a "
         "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
         "considered the rightful property of some one or other of their daughters. ") * 4


@pytest.fixture(autouse=True)
def _keep_threads(one_thread):
    """In-process runs set torch's thread count (run.threads); ``one_thread`` restores it."""


def _rows(run: Path, key: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if key in r]


# ------------------------------------------------------------------------------ 3. retrofit runs stand alone


@pytest.mark.slow
def test_retrofit_run_reloads_from_its_directory_and_evaluates(tmp_path, capsys):
    from safetensors.torch import load_file

    from diffattn.train.checkpoint import latest_checkpoint, load_checkpoint
    from diffattn.train.config import load_config
    from diffattn.train.tasks.retrofit import RetrofitTask, build_base_model, load_retrofit_run

    run = tmp_path / "run"
    assert cli.main(["train", RETROFIT, "--out", str(run), *QUIET, "--set", "data.name=sklearn_text",
                     "--set", "run.steps=3", "--set", "run.ckpt_every=3", "--set", "run.seed=7"]) == 0
    assert json.loads((run / "retrofit.json").read_text())["base"] == "base"
    cfg = load_config(run / "config.yaml")
    initial = build_base_model(cfg.task.base)  # the base as built at the start of the run
    saved = load_file(run / "base" / "model.safetensors")  # its weights before training, kept in the run
    assert saved and all(torch.equal(saved[k], initial.state_dict()[k]) for k in saved)
    trained = RetrofitTask(cfg).own_model()
    trained.load_state_dict(load_checkpoint(latest_checkpoint(run))["model"])
    trained.eval()
    torch.manual_seed(12345)  # the reload must not depend on the RNG (nor on how transformers initialises)
    with torch.no_grad():
        reloaded = load_retrofit_run(run)
        x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(reloaded(input_ids=x).logits, trained(input_ids=x).logits, rtol=0, atol=0)
        import diffattn

        one_call = diffattn.load_run(run)  # the public loader of any run: the retrofitted base model
        assert not one_call.training
        torch.testing.assert_close(one_call(input_ids=x).logits, reloaded(input_ids=x).logits, rtol=0, atol=0)

    (tmp_path / "prose.txt").write_text(PROSE)
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--text", str(tmp_path / "prose.txt"), "--quick", "--no-progress"]) == 0
    res = json.loads((run / "eval" / "results.json").read_text())
    assert res["model"]["kind"] == "lm" and res["model"]["name"] == "gpt2 retrofitted with daa + LoRA"
    assert res["language"]["tokenizer"] == "bytes" and res["language"]["perplexity"]["ppl"] > 1
    assert not res["skipped"]


# ------------------------------------------------------------------------- 7. validation while training


@pytest.mark.slow
def test_clip_run_with_eval_every_keeps_best_and_resumes_exactly(tmp_path, capsys):
    args = ["train", CLIP, *QUIET, *CLIP_DIGITS, "--set", "run.steps=6", "--set", "run.ckpt_every=2",
            "--set", "eval.every=2", "--set", "eval.max_samples=64", "--set", "eval.metric=loss"]
    ref = tmp_path / "ref"
    assert cli.main([*args, "--out", str(ref)]) == 0
    evals = _rows(ref, "eval")
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert set(evals[0]["eval"]) == {"loss", "r@1", "i2t@1", "t2i@1"}
    best = min(evals, key=lambda r: r["eval"]["loss"])
    record = json.loads((ref / "best" / "best.json").read_text())
    assert record == {"step": best["step"], "metric": "loss", "value": best["eval"]["loss"]}
    from diffattn.models import from_pretrained

    assert from_pretrained(ref / "best").model_name == "diffclip_tiny"  # what `diffattn eval` finds in best/
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(ref / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("val/loss")] == [2, 4, 6]

    # killed after step 4 (its checkpoint lost), resumed from step 2: the same evaluations and the same best/
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    for name in ("step_00000004", "step_00000006"):
        shutil.rmtree(run / "checkpoints" / name)
    shutil.rmtree(run / "model")
    assert cli.main([*args, "--out", str(run), "--resume", "auto"]) == 0
    assert _rows(run, "eval") == evals
    assert [r["loss"] for r in _rows(run, "loss")] == [r["loss"] for r in _rows(ref, "loss")]
    assert (run / "best" / "best.json").read_text() == (ref / "best" / "best.json").read_text()
    assert (run / "best" / "model.safetensors").read_bytes() == (ref / "best" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_classify_validation_metrics_and_best(tmp_path):
    run = tmp_path / "run"
    assert cli.main(["train", CLASSIFY, "--out", str(run), *QUIET, "--set", "run.steps=4", "--set",
                     "eval.every=2", "--set", "model.overrides.depth=1"]) == 0
    evals = _rows(run, "eval")
    assert [r["step"] for r in evals] == [2, 4] and set(evals[0]["eval"]) == {"loss", "top1"}
    assert all(0 <= r["eval"]["top1"] <= 1 for r in evals)
    best = json.loads((run / "best" / "best.json").read_text())
    assert best["metric"] == "top1" and best["value"] == max(r["eval"]["top1"] for r in evals)


@pytest.mark.parametrize("extra, names", [
    (["--set", "eval.every=0"], ["eval.every"]),
    (["--set", "eval.metric=bleu"], ["eval.metric", "bleu", "top1"]),
    (["--set", "eval.split=nope"], ["eval:", "nope"]),
])
def test_validation_config_errors(extra, names, tmp_path, capsys):
    out = tmp_path / "r"
    assert cli.main(["train", CLASSIFY, "--out", str(out), *QUIET, "--set", "eval.every=2", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("diffattn: error:")
    assert all(n in err for n in names), err
    assert not out.exists()


@pytest.mark.slow
def test_lm_validation_on_a_held_out_file(tmp_path):
    train_text, held_out = tmp_path / "train.txt", tmp_path / "held_out.txt"
    train_text.write_text(PROSE * 6)
    held_out.write_text(PROSE[::-1] * 2)
    run = tmp_path / "run"
    lm = str(ROOT / "configs/tiny/lm.yaml")
    assert cli.main(["train", lm, "--out", str(run), *QUIET, "--set", "data.name=text", "--set",
                     f"data.path={train_text}", "--set", "run.steps=4", "--set", "eval.every=2", "--set",
                     f"eval.path={held_out}", "--set", "run.batch_size=8"]) == 0
    evals = _rows(run, "eval")
    assert [r["step"] for r in evals] == [2, 4]
    import math

    assert all(r["eval"]["ppl"] == pytest.approx(math.exp(r["eval"]["loss"])) for r in evals)
    assert json.loads((run / "best" / "best.json").read_text())["metric"] == "loss"
    assert len(_rows(run, "loss")) == 4  # the training rows are there too
