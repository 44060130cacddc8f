"""One loader story: every folder ``diffattn train`` takes — a transformers DiffLlama folder, a released Motif folder,
a retrofit run, a diffattn byte-level run — loads through ``from_pretrained`` and ``load_run`` (eval mode, the
reference model's logits), ``diffattn eval`` (a perplexity equal to the reference model's own loss on the same text)
and ``diffattn inspect`` (the reference model's next token; the run's recorded tokenizer). The references: the
transformers model for DiffLlama, the registered converter for Motif (its match to the released code is
tests/test_convert_motif.py's), :func:`load_retrofit_run` for a retrofit run (tests/test_runs.py's), the saved
model for a diffattn run. Tiny random models in tmp_path, offline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import diffattn
from diffattn import cli, convert
from diffattn.eval.runner import evaluate
from diffattn.factory import load_retrofit_run
from diffattn.models import CausalLM
from diffattn.models.base import from_pretrained as load_saved

from .test_convert_motif import V1, released_state_dict, write_released

ROOT = Path(__file__).resolve().parents[1]
# Melville, Moby-Dick (1851), ch. 1; public domain
TEXT = ("Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and "
        "nothing particular to interest me on shore, I thought I would sail about a little and see the watery part "
        "of the world. It is a way I have of driving off the spleen and regulating the circulation. ")
#: one perplexity window (100 tokens < every model's context): the eval's loss is the reference's mean loss
EVAL = {"noise_levels": (0.0,), "corruptions": (), "severities": (1,), "episodes": 1, "max_images": 1,
        "ppl_tokens": 100, "lambada": 2, "needle_lengths": (120,), "needle_depths": (0.5,), "needle_trials": 1,
        "probe_max_iter": 1, "probe_fine_steps": 1}
IDS = "5,9,11,3,7,2,8,13,21,4,6,10"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The quick kinds: a DiffLlama folder, a Motif folder and a diffattn run of byte-level text."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    root = tmp_path_factory.mktemp("released")
    torch.manual_seed(0)
    DiffLlamaForCausalLM(DiffLlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=128)).save_pretrained(root / "diffllama")
    motif = {**V1, "vocab_size": 256, "num_hidden_layers": 2, "torch_dtype": "float32"}
    write_released(root / "motif", motif, released_state_dict(motif, dtype=torch.float32))
    diffattn.create_model("diff_lm_tiny", vocab_size=256, dim=32, depth=2, num_heads=4,
                          max_seq_len=128).save_pretrained(root / "run" / "model")
    (root / "run" / "config.yaml").write_text("data:\n  name: state_of_the_union\n  tokenizer: bytes\n")
    return {"diffllama": root / "diffllama", "motif": root / "motif", "run": root / "run"}


@pytest.fixture(scope="module")
def retrofit_run(tmp_path_factory) -> Path:
    """One optimizer step of the tiny retrofit recipe (GPT-2 with DAA and LoRA, byte-level text)."""
    run = tmp_path_factory.mktemp("retrofit") / "run"
    n = torch.get_num_threads()
    try:
        assert cli.main(["train", str(ROOT / "configs/tiny/retrofit.yaml"), "--out", str(run), "--set",
                         "data.name=sklearn_text", "--set", "run.steps=1", "--set", "run.progress=false"]) == 0
    finally:
        torch.set_num_threads(n)
    return run


def _folder(kind, folders, request) -> Path:
    return request.getfixturevalue("retrofit_run") if kind == "retrofit" else folders[kind]


def _reference(kind: str, folder: Path) -> torch.nn.Module:
    if kind == "diffllama":
        from transformers import DiffLlamaForCausalLM

        return DiffLlamaForCausalLM.from_pretrained(str(folder)).eval()
    if kind == "motif":
        return convert.from_motif(folder).eval()
    if kind == "retrofit":
        return load_retrofit_run(folder)
    return load_saved(folder / "model").eval()


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return (out if isinstance(out, torch.Tensor) else out.logits).float()


KINDS = ["diffllama", "motif", "run", pytest.param("retrofit", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("loader", ["from_pretrained", "load_run"])
def test_from_pretrained_and_load_run_take_every_folder_in_eval_mode(kind, loader, folders, request):
    folder = _folder(kind, folders, request)
    model = getattr(diffattn, loader)(folder)
    assert not any(m.training for m in model.modules())  # as transformers returns a loaded model
    ids = torch.tensor([list(TEXT.encode())[:40]])
    ref = _reference(kind, folder)
    assert (_logits(model, ids) - _logits(ref, ids)).abs().max() < 1e-5


def test_from_pretrained_of_a_save_is_in_eval_mode_through_every_entry(folders):
    save = folders["run"] / "model"
    for model in (diffattn.from_pretrained(save), CausalLM.from_pretrained(save), load_saved(save)):
        assert type(model) is CausalLM and not any(m.training for m in model.modules())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["diffllama", "motif", "run", "retrofit"])
def test_eval_takes_every_folder_and_its_perplexity_is_the_models_own_loss(kind, folders, request, tmp_path):
    folder = _folder(kind, folders, request)
    (tmp_path / "text.txt").write_text(TEXT)
    res = evaluate(folder, tmp_path / "eval", text=str(tmp_path / "text.txt"), protocol=EVAL, progress=False,
                   device="cpu")
    assert res["model"]["kind"] == "lm" and not res["skipped"]
    lang = res["language"]
    assert lang["tokenizer"] == "bytes" and lang["perplexity"]["tokens"] == 99
    ids = torch.tensor([list(TEXT.encode())[:100]])
    ref = _reference(kind, folder)
    if kind == "diffllama":  # transformers' own loss on the same bytes
        with torch.no_grad():
            loss = float(ref(input_ids=ids, labels=ids).loss)
    else:
        loss = float(F.cross_entropy(_logits(ref, ids)[0, :-1].double(), ids[0, 1:]))
    assert abs(lang["perplexity"]["nll"] - loss) < 1e-4, (lang["perplexity"]["nll"], loss)


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_takes_every_folder(kind, folders, request, tmp_path, capsys):
    folder, out = _folder(kind, folders, request), tmp_path / "out"
    assert cli.main(["inspect", str(folder), "--ids", IDS, "--needle-ids", "33,34,35", "--out", str(out),
                     "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["layers"] and summary["needle"] == {"start": 6, "end": 9, "query": 14}
    ref = _reference(kind, folder)
    assert summary["next_token"] == int(_logits(ref, torch.tensor([summary["ids"]]))[0, -1].argmax())


@pytest.mark.parametrize("tokenizer", [[], ["--tokenizer", "bytes"]])
def test_inspect_uses_the_runs_recorded_tokenizer_and_bytes_never_touches_the_hub(tokenizer, folders, tmp_path,
                                                                                   monkeypatch):
    import huggingface_hub
    import transformers

    def hub(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    for name in ("snapshot_download", "hf_hub_download"):
        monkeypatch.setattr(huggingface_hub, name, hub)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hub)
    out = tmp_path / "out"
    assert cli.main(["inspect", str(folders["run"]), "--prompt", "a cat sat on the mat", "--needle", "4711",
                     "--question", "code", "--depth", "0.5", "--out", str(out), "--no-plots", *tokenizer]) == 0
    s = json.loads((out / "summary.json").read_text())
    # "a cat sat on the mat" is 20 bytes: the needle's 4 bytes at 10, the question's 4 bytes last
    assert s["ids"] == list(b"a cat sat ") + list(b"4711") + list(b"on the mat") + list(b"code")
    assert s["needle"] == {"start": 10, "end": 14, "query": 27}
    assert "".join(s["tokens"]) == "a cat sat 4711on the matcode"


@pytest.mark.parametrize("argv,match", [
    (["--tokenizer", "no/such/tokenizer"], r"tokenizer 'no/such/tokenizer' does not exist; it takes bytes, gpt2"),
    (["--tokenizer", "{tmp}"], r"tokenizer '{tmp}' could not be loaded from '{tmp}' \(\w+Error: "),
    (["--tokenizer", "org/tok"], r"tokenizer 'org/tok' is neither a local path nor in the Hugging Face Hub's cache"),
    ([], r"has no tokenizer .*give --tokenizer \(bytes, gpt2, a folder\)"),
])
def test_a_tokenizer_failure_is_one_line(argv, match, folders, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert cli.main(["inspect", str(folders["motif"]), "--prompt", "a cat", "--needle", "b", "--out",
                     str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffattn: error:") and err.count("\n") == 1, err
    assert re.search(match.format(tmp=re.escape(str(tmp_path))), err), err
