"""The tiny recipes driven through ``diffattn train`` → ``eval`` → ``compare`` as a user would, with the mistakes a
user makes: every mistake exits with status 2 and one line ``diffattn: error: …`` that names the file, key or
argument, nothing is left behind, and results written before are byte-identical afterwards."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from diffattn import cli

ROOT = Path(__file__).resolve().parents[1]
CLASSIFY = str(ROOT / "configs/tiny/classify.yaml")
LM = str(ROOT / "configs/tiny/lm.yaml")
FAST = ["--set", "run.steps=4", "--set", "run.ckpt_every=2", "--set", "run.log_every=1", "--set",
        "run.progress=false", "--set", "model.overrides.depth=1",
        "--set", "optim.warmup_steps=1"]  # below the 4 steps: no warning line beside the errors tested here


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file below ``folder``: relative path → (SHA-256, mode)."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error(capsys, *names: str) -> str:
    """The one stderr line of a refused command; it names every one of ``names``."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("diffattn: error: "), err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    """A tiny DiffViT run on the digits trained (4 steps, checkpoints at 2 and 4) and evaluated through the CLI."""
    import torch

    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("user") / "run"
    mask = os.umask(0o022)
    try:
        assert cli.main(["train", CLASSIFY, "--out", str(run), *FAST]) == 0
        assert cli.main(["eval", str(run), "--quick", "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
        os.umask(mask)
    return run


@pytest.fixture(autouse=True)
def _keep_threads(one_thread):
    """In-process runs set torch's thread count (run.threads); ``one_thread`` restores it after each test."""


@pytest.fixture
def run_copy(evaluated, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(evaluated, dst)
    return dst


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFATTN_DATA", str(tmp_path / "no-data"))


# --------------------------------------------------------------------------------- the flow and its outputs


@pytest.mark.slow
def test_train_eval_compare(evaluated, tmp_path, capsys):
    for name in ("config.yaml", "metrics.jsonl", "model/model.safetensors", "eval/results.json", "eval/report.md"):
        assert (evaluated / name).is_file(), name
    other = tmp_path / "other"
    shutil.copytree(evaluated, other)
    capsys.readouterr()
    assert cli.main(["compare", str(evaluated), str(other), "--labels", "A", "B"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "| metric | better | chance | A (n=1) | B (n=1) | Δ B |"
    assert lines[2].startswith("| vision.classification.top1 | ↑ | 0.1000 | ") and lines[2].endswith(" | +0.0000 |")
    assert "\nn = 1 for A, B: one evaluated run (one seed) per column. At this size single seeds vary by several " \
           "points" in out


@pytest.mark.slow
def test_run_files_follow_the_umask(evaluated):
    """Under umask 022 weights, config.yaml, metrics, checkpoints and eval outputs are 0644, folders 0755."""
    paths = [evaluated, *evaluated.rglob("*")]
    assert {oct(p.stat().st_mode & 0o777) for p in paths if p.is_dir()} == {"0o755"}
    assert {oct(p.stat().st_mode & 0o777) for p in paths if p.is_file()} == {"0o644"}


# --------------------------------------------------------------------- 1. no run is overwritten by accident


@pytest.mark.slow
def test_train_into_a_finished_run_is_refused_and_changes_nothing(run_copy, capsys):
    before = snapshot(run_copy)
    assert cli.main(["train", CLASSIFY, "--out", str(run_copy), *FAST]) == 2
    one_error(capsys, str(run_copy), "--resume auto", "--overwrite")
    assert snapshot(run_copy) == before


@pytest.mark.slow
def test_overwrite_replaces_the_previous_run(run_copy, capsys):
    assert cli.main(["train", CLASSIFY, "--out", str(run_copy), *FAST, "--set", "run.steps=2", "--overwrite"]) == 0
    assert "replaced the previous run" in capsys.readouterr().err
    assert not (run_copy / "eval").exists()  # the old run's evaluation went with it
    assert len(list((run_copy / "tensorboard").iterdir())) == 1  # one event file, not two stacked
    rows = [json.loads(r) for r in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # --overwrite never deletes a folder that is not a run
    stranger = run_copy.parent / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    assert cli.main(["train", CLASSIFY, "--out", str(stranger), *FAST, "--overwrite"]) == 2
    one_error(capsys, str(stranger), "config.yaml")
    assert (stranger / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_resume_auto_of_a_finished_run_says_so_and_changes_nothing(run_copy, capsys):
    before = snapshot(run_copy)
    assert cli.main(["train", CLASSIFY, "--out", str(run_copy), *FAST, "--resume", "auto"]) == 0
    out = capsys.readouterr().out
    final = json.loads((run_copy / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
    assert "already finished at step 4" in out and f"final loss {final:.4f}" in out and "nan" not in out
    assert snapshot(run_copy) == before


@pytest.mark.slow
def test_eval_that_skips_keeps_the_finished_results(run_copy, no_data, capsys):
    before = snapshot(run_copy / "eval")
    assert cli.main(["eval", str(run_copy), "--dataset", "fashion_mnist", "--quick", "--no-progress"]) == 2
    one_error(capsys, "fashion_mnist", "make data", "kept")
    assert snapshot(run_copy / "eval") == before
    assert sorted(p.name for p in run_copy.iterdir() if p.name.startswith(".")) == []  # no temporary left


@pytest.mark.slow
def test_compare_of_runs_without_shared_metrics_is_an_error(evaluated, tmp_path, capsys):
    lm = tmp_path / "lm" / "eval"
    lm.mkdir(parents=True)
    (lm / "results.json").write_text(json.dumps({"model": {}, "language": {"perplexity": {"ppl": 3.5}}}))
    assert cli.main(["compare", str(evaluated), str(tmp_path / "lm")]) == 2
    one_error(capsys, "share no metric")


# ------------------------------------------------------------------ 3. a finished run can be extended


def _rows(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.fixture
def short_run(tmp_path) -> Path:
    """A finished 4-step run whose cosine decay is past its warm-up (2 steps), so a new total changes its lr."""
    run = tmp_path / "short"
    assert cli.main(["train", CLASSIFY, "--out", str(run), *FAST, "--set", "optim.warmup_steps=2"]) == 0
    return run


def test_resume_with_more_steps_extends_a_finished_run(short_run, capsys):
    from diffattn.train.optim import warmup_cosine

    before = _rows(short_run)
    capsys.readouterr()
    assert cli.main(["train", CLASSIFY, "--out", str(short_run), *FAST, "--set", "optim.warmup_steps=2",
                     "--resume", "auto", "--set", "run.steps=8"]) == 0
    captured = capsys.readouterr()
    assert "trained 8 steps (resumed from step 4, extended from 4 steps)" in captured.out
    assert "extended the run from 4 to 8 steps: from step 5 on the lr follows the warm-up + cosine schedule of a " \
           "8-step run (lr 0.00225 at step 5)" in captured.err
    rows = _rows(short_run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert [r["loss"] for r in rows[:4]] == [r["loss"] for r in before]  # bit-identical first 4 steps
    assert rows[3]["lr"] == 3e-3 * warmup_cosine(3, 4, 2)  # 1.5e-3: the old schedule up to the checkpoint
    assert [r["lr"] for r in rows[4:]] == [3e-3 * warmup_cosine(s, 8, 2) for s in range(4, 8)]  # the new one after
    assert sorted(p.name for p in (short_run / "checkpoints").iterdir())[-1] == "step_00000008"
    assert "8 optimizer steps" in (short_run / "model" / "README.md").read_text()


def test_resume_with_another_config_names_each_key_and_changes_nothing(short_run, capsys):
    before = snapshot(short_run)
    capsys.readouterr()
    assert cli.main(["train", CLASSIFY, "--out", str(short_run), *FAST, "--resume", "auto", "--set",
                     "run.steps=8", "--set", "optim.lr=6e-3", "--set", "model.overrides.depth=2"]) == 2
    line = one_error(capsys, "optim.lr 0.003 → 0.006", "optim.warmup_steps 2 → 1",
                     "model.overrides.depth 1 → 2", "run.steps", "--overwrite", "--out")
    assert "run.steps 4" not in line  # the step budget may change; it is not listed as a difference
    assert cli.main(["train", CLASSIFY, "--out", str(short_run), *FAST, "--set", "optim.warmup_steps=2",
                     "--resume", "auto", "--set", "run.steps=3"]) == 2
    one_error(capsys, "3 steps", "step 4", "run.steps >= 4")
    assert snapshot(short_run) == before


# ------------------------------------------------------------------------ 2. one line for every user error


def _bad_yaml(tmp_path: Path) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text("task:\n  name: classify\nmodel: {name: diff_vit_nano\ndata: {name: digits}\n")
    return str(path)


MISTAKES = {
    "model typo": (["--set", "model.name=diff_vit_nanoo"], ["model.name", "diff_vit_nanoo"]),
    "dataset typo": (["--set", "data.name=digitz"], ["data.name", "digitz"]),
    "unknown key": (["--set", "run.stepz=3"], ["run.stepz"]),
    "missing data path": (["--set", "data.name=imagefolder", "--set", "data.path=/nonexistent/x.bin"],
                          ["data.path", "/nonexistent/x.bin"]),
    "missing dataset": (["--set", "data.name=fashion_mnist"], ["fashion_mnist", "make data"]),
    "bad resume path": (["--resume", "/nonexistent/run"], ["--resume", "/nonexistent/run"]),
    "bad --set": (["--set", "optim.lr"], ["--set", "optim.lr"]),
    "bad --set value": (["--set", "optim.betas=[0.9,"], ["--set", "optim.betas"]),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_train_mistakes_are_one_line_and_leave_nothing(mistake, tmp_path, no_data, capsys):
    extra, names = MISTAKES[mistake]
    out = tmp_path / "new_run"
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, *extra]) == 2
    one_error(capsys, *names)
    assert not out.exists()


def test_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys):
    bad = _bad_yaml(tmp_path)
    assert cli.main(["train", bad, "--out", str(tmp_path / "r")]) == 2
    line = one_error(capsys, f"{bad}:4:")
    assert "<unicode string>" not in line and not (tmp_path / "r").exists()
    (tmp_path / "eval.yaml").write_text("model: [unclosed\n")
    assert cli.main(["eval", str(tmp_path / "eval.yaml")]) == 2
    one_error(capsys, f"{tmp_path / 'eval.yaml'}:2:")
    (tmp_path / "study.yaml").write_text("study: diffclip\nseeds: [0, 1\n")
    assert cli.main(["study", str(tmp_path / "study.yaml")]) == 2
    one_error(capsys, f"{tmp_path / 'study.yaml'}:3:")


@pytest.mark.slow
@pytest.mark.parametrize("argv, names", [
    (["eval", "{run}", "--dataset", "fashon_mnist"], ["--dataset", "fashon_mnist"]),
    (["eval", "{tmp}/nothing"], ["{tmp}/nothing"]),
    (["eval", "{run}", "--text", "{tmp}/missing.txt"], ["--text", "missing.txt"]),
    (["compare", "{run}", "{tmp}"], ["diffattn eval"]),
    (["compare", "{run}", "{tmp}/nothing"], ["{tmp}/nothing"]),
])
def test_eval_and_compare_mistakes(argv, names, run_copy, tmp_path, capsys):
    tmp = tmp_path / "empty"
    tmp.mkdir()
    before = snapshot(run_copy)

    def fill(s):
        return s.format(run=run_copy, tmp=tmp)

    assert cli.main([fill(a) for a in argv]) == 2
    one_error(capsys, *map(fill, names))
    assert snapshot(run_copy) == before


def test_debug_shows_the_traceback(tmp_path, monkeypatch, capsys):
    from diffattn.errors import UsageError

    argv = ["train", CLASSIFY, "--out", str(tmp_path / "r"), "--set", "model.name=nope"]
    for args in (["--debug", *argv], [*argv, "--debug"]):
        with pytest.raises(UsageError, match="model.name"):
            cli.main(args)
    monkeypatch.setenv("DIFFATTN_DEBUG", "1")
    with pytest.raises(UsageError, match="model.name"):
        cli.main(argv)


def test_under_torchrun_one_rank_prints(tmp_path, monkeypatch, capsys):
    argv = ["train", CLASSIFY, "--out", str(tmp_path / "r"), "--set", "model.name=nope"]
    monkeypatch.setenv("RANK", "1")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert cli.main(argv) == 2
    one_error(capsys, "model.name")


def test_argument_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", CLASSIFY, "--resume", "auto", "--overwrite"])
    assert e.value.code == 2
    one_error(capsys, "--overwrite", "--resume")


# ------------------------------------------------------------------- 4. damaged files, resume fall-back


@pytest.mark.slow
def test_truncated_last_checkpoint_resumes_from_the_previous_one_exactly(evaluated, run_copy, capsys):
    last = run_copy / "checkpoints" / "step_00000004" / "state.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    shutil.rmtree(run_copy / "model")  # the run was killed before its final save
    assert cli.main(["train", CLASSIFY, "--out", str(run_copy), *FAST, "--resume", "auto"]) == 0
    captured = capsys.readouterr()
    assert f"skipped checkpoint {last.parent}" in captured.err and "damaged or truncated" in captured.err
    assert "resumed from step 2 of 4" in captured.err and "resumed from step 2" in captured.out

    def losses(run):
        return [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if "loss" in r]

    assert losses(run_copy) == losses(evaluated)  # bit-identical losses of steps 3 and 4
    ref = evaluated / "model" / "model.safetensors"
    assert (run_copy / "model" / "model.safetensors").read_bytes() == ref.read_bytes()


@pytest.mark.slow
def test_damaged_checkpoint_named_explicitly_is_an_error(run_copy, capsys):
    state = run_copy / "checkpoints" / "step_00000004" / "state.pt"
    state.write_bytes(b"\x00" * 64)
    before = snapshot(run_copy)
    assert cli.main(["train", CLASSIFY, "--out", str(run_copy), *FAST, "--resume", str(state.parent)]) == 2
    one_error(capsys, str(state), "not a PyTorch file")
    assert snapshot(run_copy) == before


@pytest.mark.slow
def test_truncated_weights_are_named_and_no_eval_folder_is_made(run_copy, capsys):
    shutil.rmtree(run_copy / "eval")
    weights = run_copy / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert cli.main(["eval", str(run_copy), "--quick", "--no-progress"]) == 2
    one_error(capsys, str(weights))
    assert not (run_copy / "eval").exists()
    assert [p.name for p in run_copy.iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
def test_invalid_config_json_is_named_not_missing(run_copy, capsys):
    cfg = run_copy / "model" / "config.json"
    cfg.write_text('{"architecture": "VisionTransformer",')
    before = snapshot(run_copy / "eval")
    assert cli.main(["eval", str(run_copy), "--quick", "--no-progress"]) == 2
    line = one_error(capsys, str(cfg), "not valid JSON")
    assert "no model saved" not in line
    assert snapshot(run_copy / "eval") == before


def test_hf_checkpoint_with_bad_architectures_or_random_bin_is_named(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import diffattn

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    diffattn.retrofit(model, "daa")
    model.save_pretrained(tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    cfg["architectures"] = [["GPT2LMHeadModel"]]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"ckpt: config.json's 'architectures' must be a list of class names"):
        diffattn.from_pretrained_retrofit(tmp_path / "ckpt")
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    junk = tmp_path / "ckpt" / "pytorch_model.bin"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()[1:] + b"\x00")
    with pytest.raises(ValueError, match=rf"{junk} is not a PyTorch file") as e:
        diffattn.from_pretrained_retrofit(tmp_path / "ckpt")
    assert "weights_only" not in str(e.value)
    from diffattn.convert import read_checkpoint

    with pytest.raises(ValueError, match=rf"{junk} is not a PyTorch file"):
        read_checkpoint(junk)
    torch.save({"w": torch.ones(3)}, tmp_path / "ok.pt")
    data = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{tmp_path / 'cut.pt'} is damaged or truncated"):
        read_checkpoint(tmp_path / "cut.pt")


# ----------------------------------------------------------------- 5. data and model agree before the first step


def test_token_file_of_another_vocabulary_is_refused_before_the_run(tmp_path, capsys):
    from diffattn.data import write_token_memmap

    tokens = tmp_path / "gpt2.bin"
    write_token_memmap(np.arange(5000) % 300, tokens, vocab_size=50257, tokenizer="gpt2")
    out = tmp_path / "lm_run"
    assert cli.main(["train", LM, "--out", str(out), *FAST, "--set", "data.name=tokens",
                     "--set", f"data.path={tokens}"]) == 2
    one_error(capsys, str(tokens), "50257", "256", "model.overrides.vocab_size")
    assert not out.exists()


def test_ids_beyond_the_vocabulary_and_a_too_long_block_are_refused(tmp_path, capsys):
    tokens = tmp_path / "raw.bin"
    (np.arange(20000) % 400).astype(np.uint16).tofile(tokens)  # no sidecar: the largest id is checked
    out = tmp_path / "lm_run"
    base = ["train", LM, "--out", str(out), *FAST, "--set", "data.name=tokens", "--set", f"data.path={tokens}"]
    assert cli.main(base) == 2
    one_error(capsys, "token id 399", "256")
    assert cli.main([*base, "--set", "model.overrides.vocab_size=512", "--set", "data.block_size=4096"]) == 2
    one_error(capsys, "data.block_size 4096")
    assert not out.exists()


@pytest.mark.parametrize("extra, names", [
    (["--set", "model.overrides.num_classes=5"], ["num_classes=5", "labels in [0, 9]"]),
    (["--set", "data.img_size=16"], ["1×16×16", "1×8×8", "data.img_size"]),
])
def test_images_and_classes_that_do_not_fit_the_model_are_refused(extra, names, tmp_path, capsys):
    out = tmp_path / "r"
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, *extra]) == 2
    one_error(capsys, *names)
    assert not out.exists()


# ------------------------------------------------------------------- 6. one call loads any run or save


@pytest.mark.slow
def test_load_run_and_from_pretrained_take_the_run_folder_eval_takes(evaluated):
    import torch

    import diffattn

    model = diffattn.load_run(evaluated)
    ref = diffattn.from_pretrained(evaluated / "model")
    assert type(model).__name__ == "VisionTransformer" and not model.training
    for other in (ref, diffattn.from_pretrained(evaluated), diffattn.models.from_pretrained(evaluated)):
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


@pytest.fixture
def saves(tmp_path) -> dict[str, Path]:
    """One folder of each kind a user may hand to the wrong loader."""
    import torch

    import diffattn

    out = {"save": tmp_path / "save", "diffllama": tmp_path / "diffllama", "gpt2": tmp_path / "gpt2",
           "adapter": tmp_path / "adapter", "ckpt": tmp_path / "run" / "checkpoints" / "step_00000004"}
    diffattn.create_model("diff_lm_tiny", depth=1, vocab_size=64).save_pretrained(out["save"])
    for name, cfg in (("diffllama", {"architectures": ["DiffLlamaForCausalLM"], "model_type": "diffllama"}),
                      ("gpt2", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})):
        out[name].mkdir()
        (out[name] / "config.json").write_text(json.dumps(cfg))
    out["adapter"].mkdir()
    (out["adapter"] / "diffattn_adapter.json").write_text("{}")
    out["ckpt"].mkdir(parents=True)
    torch.save({"step": 4}, out["ckpt"] / "state.pt")
    return out


def _loaders():
    import torch

    import diffattn

    return {"from_pretrained": diffattn.from_pretrained, "load_run": diffattn.load_run,
            "from_pretrained_retrofit": diffattn.from_pretrained_retrofit,
            "load_adapter": lambda p: diffattn.load_adapter(torch.nn.Linear(2, 2), p),
            "from_diffllama": diffattn.convert.from_diffllama}


@pytest.mark.parametrize("loader, kind, names", [
    ("from_pretrained", "diffllama", ["DiffLlama checkpoint (architectures ['DiffLlamaForCausalLM'])",
                                      "that transformers cannot load", "model.safetensors"]),
    ("from_pretrained", "gpt2", ["transformers checkpoint", "diffattn.retrofit(model, method)"]),
    ("from_pretrained", "adapter", ["adapter folder", "diffattn.load_adapter(base_model, path)"]),
    ("load_run", "diffllama", ["DiffLlama checkpoint", "that transformers cannot load"]),
    ("load_run", "adapter", ["diffattn.load_adapter(base_model, path)"]),
    ("load_run", "ckpt", ["a training checkpoint (state.pt)", "diffattn.load_run('{tmp}/run')", "--resume"]),
    ("from_pretrained_retrofit", "save", ["a diffattn save_pretrained folder", "diffattn.from_pretrained(path)"]),
    ("from_pretrained_retrofit", "diffllama", ["diffattn.convert.from_diffllama(path)"]),
    ("load_adapter", "save", ["a diffattn save_pretrained folder", "diffattn.load_run(path)"]),
    ("from_diffllama", "save", ["not a transformers DiffLlama checkpoint", "diffattn.from_pretrained(path)"]),
])
def test_every_loader_names_the_loader_a_wrong_path_needs(loader, kind, names, saves, tmp_path):
    with pytest.raises(ValueError) as e:
        _loaders()[loader](saves[kind])
    msg = str(e.value)
    assert msg.startswith(f"{saves[kind]} is ") and "\n" not in msg, msg
    for name in names:
        assert name.format(tmp=tmp_path) in msg, (name, msg)


@pytest.mark.parametrize("architecture, names", [
    (["CausalLM"], ["'architecture' ['CausalLM']", "name of a diffattn model class", "from_diffllama"]),
    (["DiffLlamaForCausalLM"], ["DiffLlama checkpoint (architecture ['DiffLlamaForCausalLM'])",
                                "that transformers cannot load", "ignore_mismatched_sizes"]),
])
def test_from_pretrained_of_a_list_architecture_is_a_value_error(architecture, names, saves):
    import diffattn

    cfg = saves["save"] / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "architecture": architecture}))
    with pytest.raises(ValueError) as e:  # was TypeError: unhashable type: 'list'
        diffattn.from_pretrained(saves["save"])
    for name in names:
        assert name in str(e.value), (name, str(e.value))


# ------------------------------------------------------------------------------------- 8. honest metadata


@pytest.mark.slow
def test_config_yaml_is_the_config_that_ran_and_the_card_says_what_the_model_is(evaluated):
    import yaml

    cfg = yaml.safe_load((evaluated / "config.yaml").read_text())
    assert cfg["run"]["out"] == str(evaluated)  # the real --out, not the recipe's run.out
    assert list(cfg["task"]) == ["name", "label_smoothing", "mixup", "cutmix"]  # no retrofit/LoRA keys
    from diffattn.train import load_config

    assert load_config(evaluated / "config.yaml").to_dict()["task"]["name"] == "classify"
    card = (evaluated / "model" / "README.md").read_text()
    assert "# diff_vit_nano" in card and "`DiffAttention`" in card and "Trained with `diffattn train`" in card
    assert "4 optimizer steps" in card and "More Information Needed" not in card and "pushed to the Hub" not in card


@pytest.mark.slow
def test_epoch_lines_show_lambda_only_for_differential_models(tmp_path, capsys):
    epoch = ["--set", "run.batch_size=512", "--set", "run.steps=2"]
    assert cli.main(["train", CLASSIFY, "--out", str(tmp_path / "std"), *FAST, *epoch,
                     "--set", "model.name=vit_nano"]) == 0
    err = capsys.readouterr().err
    assert "epoch 1: loss" in err and "λ" not in err
    assert cli.main(["train", CLASSIFY, "--out", str(tmp_path / "diff"), *FAST, *epoch]) == 0
    assert "  λ [0." in capsys.readouterr().err


# ------------------------------------------------------------------------------- 9. reports state chance


@pytest.mark.slow
def test_eval_report_states_chance_and_flags_results_at_or_below_it(evaluated):
    res = json.loads((evaluated / "eval" / "results.json").read_text())
    v = res["vision"]
    assert v["chance"] == {"classification.top1": 0.1, "classification.top5": 0.5,
                           "classification.mean_per_class_recall": 0.1}
    report = (evaluated / "eval" / "report.md").read_text()
    assert "| metric | value | chance |" in report and "| top1 | " in report
    low = v["classification"]["top1"] <= 0.1
    assert ("**At or below chance:** classification.top1" in report) == low
    assert ("(at or below chance)" in report) == (low or v["classification"]["top5"] <= 0.5
                                                 or v["classification"]["mean_per_class_recall"] <= 0.1)


# ------------------------------------------------------------- 10. known before the first step: size, backend

RETROFIT = str(ROOT / "configs/tiny/retrofit.yaml")
SMALL_LLAMA = "task.base.config={vocab_size: 256, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 1, " \
              "num_attention_heads: 4}"


def test_retrofit_base_keys_of_another_model_are_named(tmp_path, no_data, capsys):
    """GPT-2's keys given to LlamaConfig were ignored and its 7B default built until the kernel killed it."""
    out = tmp_path / "r"
    assert cli.main(["train", RETROFIT, "--out", str(out), "--set", "task.base.type=llama"]) == 2
    line = one_error(capsys, "task.base.config keys n_layer, n_embd, n_head, n_positions are not arguments of "
                     "LlamaConfig", "n_layer → num_hidden_layers", "n_embd → hidden_size", "n_head → "
                     "num_attention_heads", "n_positions → max_position_embeddings")
    assert "takes" not in line  # every key has its llama spelling: no list of arguments
    assert cli.main(["train", RETROFIT, "--out", str(out), "--set", "task.base.type=llama",
                     "--set", "task.base.config={vocab_size: 256, n_layerz: 1}"]) == 2
    one_error(capsys, "key n_layerz is not an argument of LlamaConfig", "LlamaConfig takes vocab_size, hidden_size, "
              "intermediate_size, num_hidden_layers")
    assert cli.main(["train", RETROFIT, "--out", str(out), "--set", "task.base.type=llama", "--set", SMALL_LLAMA]) == 2
    one_error(capsys, "task.lora_targets ['c_attn', 'c_proj', 'c_fc'] name no layer of the llama base", "q_proj")
    assert not out.exists()


def test_model_too_large_for_the_memory_is_refused_before_it_is_built(tmp_path, no_data, capsys, monkeypatch):
    out = tmp_path / "r"
    huge = ["--set", "task.base.config.n_layer=4", "--set", "task.base.config.n_embd=81920"]  # 4 wide blocks: fast
    assert cli.main(["train", RETROFIT, "--out", str(out), *huge]) == 2  # 329B parameters: 1.3 TB of weights alone
    one_error(capsys, "the model has 329.04B parameters and needs at least 2.7 TB to train", "a copy of the base",
              "available", "(task.base.config)")
    from diffattn.train import memory

    monkeypatch.setattr(memory, "available_memory", lambda device: 1_000_000)
    assert cli.main(["train", LM, "--out", str(out), *FAST, "--set", "data.name=sklearn_text"]) == 2
    # 82,208 float32 parameters (one block) × (weight + gradient + 2 AdamW states) × 4 bytes = 1,315,328 bytes
    one_error(capsys, "the model has 0.08M parameters and needs at least 1.3 MB to train", "the machine has 1.0 MB "
              "available", "(model.overrides)")
    assert not out.exists()


def test_triton_backend_on_the_cpu_is_refused_and_the_retry_needs_no_overwrite(tmp_path, capsys):
    out = tmp_path / "r"
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--device", "cpu",
                     "--set", "model.overrides.attention.backend=triton"]) == 2
    one_error(capsys, "model.overrides.attention.backend 'triton'", "needs a CUDA device, but the run is on cpu",
              "'sdpa'")
    assert not out.exists()
    with pytest.warns(FutureWarning) as record:  # the loose key of before: its one warning, the error names today's
        assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--device", "cpu",
                         "--set", "model.overrides.backend=triton"]) == 2
    assert len(record) == 1 and "attention={'backend': 'triton'}" in str(record[0].message)
    assert "--set model.overrides.attention.backend=triton" in str(record[0].message)
    assert "model.overrides.backend" not in one_error(capsys, "model.overrides.attention.backend 'triton'")
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--set", "run.steps=1"]) == 0


def test_an_attention_override_updates_the_recipes_model(tmp_path, capsys):
    """``--set model.overrides.attention.lambda_init=0.5`` on tiny/classify (a DiffViT) trains a DiffViT with
    λ_init 0.5: the setting updates the registered spec, whose kind and other settings stay."""
    import diffattn
    from diffattn.layers import AttentionSpec, DiffAttention
    from diffattn.models import model_config

    out = tmp_path / "r"
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--set", "run.steps=1", "--set",
                     "optim.warmup_steps=0", "--set", "model.overrides.attention.lambda_init=0.5"]) == 0
    model = diffattn.load_run(out)
    assert model.attention_spec == AttentionSpec("diff", lambda_init=0.5)
    assert model_config("diff_vit_nano")["attention"] == {"kind": "diff"}  # the registered spec
    assert [m.lambda_init for m in model.modules() if isinstance(m, DiffAttention)] == [0.5]  # depth 1: one layer


# ------------------------------------------------------------------------------------- 11. the device


@pytest.mark.parametrize("argv, names", [
    (["--device", "gpu"], ["argument --device", "'cpu', 'cuda' or 'cuda:N'", "'gpu'"]),
    (["--device", "cuda:x"], ["argument --device", "'cuda:x'"]),
    (["--set", "run.device=gpu"], ["run.device", "'cpu', 'cuda' or 'cuda:N'", "'gpu'"]),
])
def test_bad_device_names_are_one_line(argv, names, tmp_path, capsys):
    out = tmp_path / "r"
    try:
        code = cli.main(["train", CLASSIFY, "--out", str(out), *FAST, *argv])
    except SystemExit as e:  # argparse's own error
        code = e.code
    assert code == 2
    one_error(capsys, *names)
    assert not out.exists()


def test_unavailable_cuda_is_named_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import torch

    out = tmp_path / "r"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for cmd in (["train", CLASSIFY, "--out", str(out), *FAST], ["eval", str(tmp_path / "no-run")]):
        assert cli.main([*cmd, "--device", "cuda"]) == 2
        one_error(capsys, "--device 'cuda' needs a CUDA GPU, but torch sees none (CUDA_VISIBLE_DEVICES='')",
                  "use --device cpu")
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--set", "run.device=cuda"]) == 2
    one_error(capsys, "run.device 'cuda' needs a CUDA GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--device", "cuda:2"]) == 2
    one_error(capsys, "--device 'cuda:2': torch sees 2 CUDA GPUs (cuda:0 to cuda:1)")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--device", "cuda:1"]) == 2
    one_error(capsys, "--device 'cuda:1' names one GPU, but torchrun started 2 processes", "CUDA_VISIBLE_DEVICES")
    assert not out.exists()


def test_device_cpu_is_recorded_by_train_and_eval(tmp_path):
    import yaml

    out = tmp_path / "r"
    assert cli.main(["train", CLASSIFY, "--out", str(out), *FAST, "--set", "run.steps=1", "--device", "cpu"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["run"]["device"] == "cpu"


# --------------------------------------------------------- 12. every dataset eval offers, for every kind of model

TINY_PROTOCOL = {"noise_levels": (0.0, 0.5), "corruptions": ("gaussian_noise",), "severities": (1,), "episodes": 5,
                 "max_images": 24, "ppl_tokens": 256, "lambada": 2, "needle_lengths": (128,),
                 "needle_depths": (0.5,), "needle_trials": 1, "probe_max_iter": 10, "probe_fine_steps": 1}
#: one tiny run of each kind, on data that is always there (digits, scikit-learn's texts)
KIND_RUNS = {
    "vit": [CLASSIFY],
    "clip": [str(ROOT / "configs/tiny/clip.yaml"), "--set", "data.name=digits", "--set",
             "model.overrides.vision_img_size=8", "--set", "model.overrides.vision_patch_size=2", "--set",
             "model.overrides.vision_in_chans=1"],
    "lm": [LM, "--set", "data.name=sklearn_text"],
}
#: the headline number of each kind's results: (suite, dotted key, lowest sensible value, highest)
HEADLINE = {"vit": ("vision", "classification.top1", 0.0, 1.0), "clip": ("clip", "zero_shot.top1", 0.0, 1.0),
            "lm": ("language", "perplexity.ppl", 1.0, 1e4)}


@pytest.fixture(scope="module")
def kind_runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny run of each kind, trained 2 steps through the CLI."""
    import torch

    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("kinds")
    try:
        for kind, argv in KIND_RUNS.items():
            assert cli.main(["train", *argv, "--out", str(root / kind), *FAST, "--set", "run.steps=2"]) == 0
    finally:
        torch.set_num_threads(threads)
    return {kind: root / kind for kind in KIND_RUNS}


def _offered(capsys) -> dict[str, list[str]]:
    """What ``diffattn eval``'s error for a misspelled --dataset offers: {kind of model: [datasets]}."""
    assert cli.main(["eval", "unused", "--dataset", "fashon_mnist"]) == 2
    line = one_error(capsys, "--dataset 'fashon_mnist' is not a dataset diffattn eval evaluates on")
    offered = {}
    for part in line.split("per kind of model: ", 1)[1].split("; "):
        kind, names = part.split(": ")
        offered[kind] = names.split(", ")
    return offered


def test_the_error_offers_exactly_the_datasets_each_kind_is_evaluated_on(capsys):
    from diffattn.eval.runner import EVAL_DATASETS, KIND_NAMES

    assert _offered(capsys) == {KIND_NAMES[k]: list(v) for k, v in EVAL_DATASETS.items()}
    assert set(KIND_RUNS) == set(EVAL_DATASETS)  # the test below trains a run of every kind the error offers


def _pairs(fit: bool) -> list[tuple[str, str]]:
    from diffattn.eval.runner import EVAL_DATASETS

    names = sorted({d for v in EVAL_DATASETS.values() for d in v})
    return [(k, d) for k in EVAL_DATASETS for d in names if (d in EVAL_DATASETS[k]) == fit]


@pytest.mark.slow
@pytest.mark.parametrize("kind, dataset", _pairs(fit=True))
def test_eval_runs_every_offered_dataset_for_its_kind(kind, dataset, kind_runs, tmp_path, monkeypatch):
    from diffattn.data import DATASETS
    from diffattn.eval import report, runner

    if not DATASETS[dataset].installed():
        pytest.skip(f"dataset {dataset!r} is not prepared (diffattn data prepare {dataset}; DIFFATTN_DATA)")
    for key, value in TINY_PROTOCOL.items():
        monkeypatch.setitem(runner.QUICK, key, value)
    out = tmp_path / "eval"
    assert cli.main(["eval", str(kind_runs[kind]), "--dataset", dataset, "--quick", "--no-progress",
                     "--device", "cpu", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    suite, key, lo, hi = HEADLINE[kind]
    assert res["skipped"] == {} and res["device"] == "cpu"
    assert res[suite].get("dataset", res[suite].get("text", "").split(" ")[0]) == dataset
    value = report.nested_get(res[suite], key)
    assert lo <= value <= hi, (key, value)


@pytest.mark.slow
@pytest.mark.parametrize("kind, dataset", _pairs(fit=False))
def test_eval_on_a_dataset_of_another_kind_is_one_line(kind, dataset, kind_runs, tmp_path, capsys):
    from diffattn.eval.runner import EVAL_DATASETS, KIND_NAMES

    out = tmp_path / "eval"
    assert cli.main(["eval", str(kind_runs[kind]), "--dataset", dataset, "--out", str(out)]) == 2
    one_error(capsys, f"dataset {dataset!r} is for a", f"but this run is a {KIND_NAMES[kind]}",
              ", ".join(EVAL_DATASETS[kind]))
    assert not out.exists()
