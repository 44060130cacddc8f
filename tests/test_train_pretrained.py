"""A released differential model as the start of ``diffattn train`` (``model.pretrained``): a tiny DiffLlama
(transformers) and a tiny Motif checkpoint (the released layout), built here in tmp_path, offline, are fine-tuned
through the CLI for 3 steps, fully and with LoRA; the loss is finite and changes, and the result reloads in its
original layout (``DiffLlamaForCausalLM.from_pretrained``, ``from_motif``) with the logits of the trained diffattn
model (``RUN/model``), to float32 tolerance (max |Δ| ≤ 1e-5 on logits of size ~1). A folder of another layout is one
line and exit status 2."""

from __future__ import annotations

import json
import math

import pytest
import torch

from diffattn import cli
from diffattn.convert import from_motif
from diffattn.factory import load_run
from diffattn.train.build import LAMBDA_VECTORS

from .test_convert_motif import V1, released_state_dict, write_released

pytestmark = pytest.mark.usefixtures("one_thread")

#: float32: the converters permute or rename tensors (no arithmetic), so only the kernels' order of sums differs
TOL = 1e-5
FAST = ["--set", "data.name=sklearn_text", "--set", "run.progress=false"]


@pytest.fixture(scope="module")
def diffllama_dir(tmp_path_factory):
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    cfg = DiffLlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                          max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("released") / "diffllama"
    DiffLlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def motif_dir(tmp_path_factory):
    cfg = {**V1, "vocab_size": 256, "num_hidden_layers": 2, "torch_dtype": "float32"}
    return write_released(tmp_path_factory.mktemp("released") / "motif", cfg,
                          released_state_dict(cfg, dtype=torch.float32))


def _train(source, run, *extra) -> list[float]:
    assert cli.main(["train", "tiny/finetune", "--out", str(run), "--set", f"model.pretrained={source}", *FAST,
                     *extra]) == 0
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def _check_losses(losses):
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), losses
    assert len(set(losses)) > 1, losses


def _ids():
    return torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_diffllama_fine_tune_reloads_in_transformers(diffllama_dir, tmp_path, lora):
    from transformers import DiffLlamaForCausalLM

    run = tmp_path / "run"
    _check_losses(_train(diffllama_dir, run, *(["--set", "model.lora=true"] if lora else [])))
    ours = load_run(run)  # the diffattn save (LoRA merged)
    hf = DiffLlamaForCausalLM.from_pretrained(run / "model" / "diffllama").eval()
    start = DiffLlamaForCausalLM.from_pretrained(diffllama_dir).eval()
    ids = _ids()
    with torch.no_grad():
        got, ref = hf(ids).logits, ours(ids)
        assert (got - ref).abs().max().item() <= TOL
        assert (start(ids).logits - ref).abs().max().item() > 1e-4  # it trained
    if lora:  # only LoRA (merged into the projections) and λ changed: the norms are the checkpoint's
        sd0, sd1 = start.state_dict(), hf.state_dict()
        assert all(torch.equal(sd0[k], sd1[k]) for k in sd0 if "norm" in k)
        assert any(not torch.equal(sd0[k], sd1[k]) for k in sd0 if k.endswith(LAMBDA_VECTORS))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_motif_fine_tune_reloads_in_the_released_layout(motif_dir, tmp_path, lora):
    run = tmp_path / "run"
    extra = ["--set", "model.lora=true", "--set", "model.freeze_lambda=true"] if lora else []
    _check_losses(_train(motif_dir, run, *extra))
    ours = load_run(run)
    released = from_motif(run / "model" / "motif")
    cfg = json.loads((run / "model" / "motif" / "config.json").read_text())
    assert cfg["model_type"] == "motif" and cfg["bos_token_id"] == 0 and cfg["torch_dtype"] == "float32"
    ids = _ids()
    with torch.no_grad():
        assert (released(ids) - ours(ids)).abs().max().item() <= TOL
        assert (from_motif(motif_dir)(ids) - ours(ids)).abs().max().item() > 1e-4
    if lora:  # model.freeze_lambda: λ as loaded
        start = from_motif(motif_dir).state_dict()
        for k, v in released.state_dict().items():
            if k.endswith(LAMBDA_VECTORS):
                assert torch.equal(v, start[k]), k


def test_a_diffattn_run_starts_another(diffllama_dir, tmp_path):
    first = tmp_path / "first"
    _train(diffllama_dir, first)
    _check_losses(_train(first, tmp_path / "second"))
    assert not (tmp_path / "second" / "model" / "diffllama").exists()  # its layout is diffattn's own


def test_another_layout_is_one_line_and_exit_2(tmp_path, capsys):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder, found in ((gpt2, "is a transformers checkpoint (architectures ['GPT2LMHeadModel'])"),
                          (empty, "holds no config.json")):
        capsys.readouterr()
        assert cli.main(["train", "tiny/finetune", "--out", str(tmp_path / "run"), "--set",
                         f"model.pretrained={folder}", *FAST]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and found in err and "DiffLlama checkpoint" in err, err
        assert "Motif checkpoint" in err
        assert not (tmp_path / "run").exists()


def test_config_checks(diffllama_dir, tmp_path, capsys):
    for sets, msg in ((["model.name=diff_lm_tiny"], "model.name must be empty with model.pretrained"),
                      (["model.overrides.lambda_init=0.5"], "model.overrides must be only {attention: {backend"),
                      (["model.dtype=float16"], "model.dtype must be one of"),
                      (["task.name=classify", "data.name=digits"], "model.pretrained must be null for task")):
        capsys.readouterr()
        args = [a for s in sets for a in ("--set", s)]
        assert cli.main(["train", "tiny/finetune", "--out", str(tmp_path / "run"), "--set",
                         f"model.pretrained={diffllama_dir}", *FAST, *args]) == 2
        assert msg in capsys.readouterr().err, sets


def test_the_backend_of_a_released_checkpoint_is_an_attention_setting(diffllama_dir, tmp_path):
    """``model.overrides.attention.backend`` sets the backend of a released checkpoint's model; the loose
    ``model.overrides.backend`` of before does the same with one FutureWarning naming today's key."""
    _train(diffllama_dir, tmp_path / "a", "--set", "model.overrides.attention.backend=math", "--set", "run.steps=1")
    assert load_run(tmp_path / "a").attention_spec.backend == "math"
    with pytest.warns(FutureWarning) as record:
        _train(diffllama_dir, tmp_path / "b", "--set", "model.overrides.backend=math", "--set", "run.steps=1")
    assert [str(w.message) for w in record] == [
        "model.overrides.backend is deprecated since diffattn 0.2.0 and removed in diffattn 0.3.0; use "
        "model.overrides.attention.backend (--set model.overrides.attention.backend=math) instead"]
    assert load_run(tmp_path / "b").attention_spec.backend == "math"


def test_the_recipes_load_and_name_what_they_need(diffllama_dir):
    from diffattn.errors import UsageError
    from diffattn.train import load_config

    motif = load_config("finetune/motif")
    assert motif.model.pretrained == "Motif-Technologies/Motif-2.6B" and motif.model.lora
    full = load_config("finetune/diffllama", [f"model.pretrained={diffllama_dir}"])
    assert not full.model.lora and full.model.dtype == "float32"
    with pytest.raises(UsageError, match="or give model.pretrained"):
        load_config("finetune/diffllama")


def test_a_hub_id_goes_through_snapshot_download(diffllama_dir, monkeypatch, tmp_path):
    """Offline: the hub call is replaced by one that returns the local folder (real users have internet)."""
    import huggingface_hub

    from diffattn.factory import released_layout, resolve_source

    calls = []

    def fake(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(diffllama_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    path = resolve_source("org/tiny-diffllama")
    assert path == diffllama_dir and released_layout(path) == "diffllama"
    assert calls[0][0] == "org/tiny-diffllama" and "*.safetensors" in calls[0][1]["allow_patterns"]
    with pytest.raises(FileNotFoundError, match="missing/folder' does not exist; it takes a released model folder"):
        resolve_source(str(tmp_path / "missing" / "folder"))  # a local path: never sent to the Hub
    assert len(calls) == 1


def test_a_checkpoint_of_a_small_vocabulary_gets_advice_that_works(tmp_path, capsys):
    """A released checkpoint fixes its vocabulary (model.overrides takes only the backend with model.pretrained):
    byte-level data with ids beyond it is refused with advice to give a token file of the checkpoint's ids, never
    to set model.overrides.vocab_size; following the advice trains."""
    from diffattn.data.tokens import write_token_memmap

    cfg = {**V1, "num_hidden_layers": 2, "torch_dtype": "float32"}  # a 61-token vocabulary
    folder = write_released(tmp_path / "motif", cfg, released_state_dict(cfg, dtype=torch.float32))
    run = tmp_path / "run"
    assert cli.main(["train", "tiny/finetune", "--out", str(run), "--set", f"model.pretrained={folder}", *FAST]) == 2
    err = capsys.readouterr().err
    assert "model.overrides.vocab_size" not in err, err
    assert "the model embeds 61 ids; model.pretrained fixes the model's vocabulary" in err
    assert "give token ids below 61" in err and "data.name=tokens" in err
    assert not run.exists()

    ids = torch.randint(0, 61, (4096,), generator=torch.Generator().manual_seed(0))
    tokens = write_token_memmap(ids, tmp_path / "tokens.bin", vocab_size=61)
    _check_losses(_train(folder, run, "--set", "data.name=tokens", "--set", f"data.path={tokens}"))
