"""Saving and loading: strict loads, bounded configs, atomic file/directory writes, and SIGKILL during saves."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffattn import io as dio
from diffattn.models import CLIP, create_model, from_pretrained
from diffattn.models.vit import VisionTransformer

# ------------------------------------------------------------------------------------------ atomic_write_file


def test_atomic_write_file_replaces_whole_or_not_at_all(tmp_path):
    p = tmp_path / "a" / "f.bin"
    with dio.atomic_write_file(p) as f:
        f.write(b"old")
    assert p.read_bytes() == b"old"
    with pytest.raises(RuntimeError, match="boom"):
        with dio.atomic_write_file(p) as f:
            f.write(b"half of the new")
            raise RuntimeError("boom")
    assert p.read_bytes() == b"old"
    assert sorted(os.listdir(p.parent)) == ["f.bin"]  # the temporary file is gone
    with dio.atomic_write_file(p, "w") as f:
        f.write("new")
    assert p.read_text() == "new"


# ------------------------------------------------------------------------------------------- atomic_write_dir


def _write(d: Path, files: dict) -> None:
    for name, text in files.items():
        (d / name).write_text(text)


def _read(d: Path) -> dict:
    return {p.name: p.read_text() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-fallback"])
def test_atomic_write_dir(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(dio, "_exchange", lambda a, b: False)
    d = tmp_path / "ckpt"
    with dio.atomic_write_dir(d) as tmp:
        _write(tmp, {"a": "1", "b": "1"})
    assert _read(d) == {"a": "1", "b": "1"}
    with pytest.raises(RuntimeError):
        with dio.atomic_write_dir(d) as tmp:
            _write(tmp, {"a": "2"})
            raise RuntimeError("killed")
    assert _read(d) == {"a": "1", "b": "1"}  # the failed save left the previous checkpoint whole
    with dio.atomic_write_dir(d) as tmp:
        _write(tmp, {"a": "3"})
    assert _read(d) == {"a": "3"}  # exactly what was written: stale files are not carried over
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary or .old directory is left behind


def test_recover_dir_puts_back_a_half_swapped_directory(tmp_path):
    """Without renameat2 a save renames the old directory to <name>.old, then the new one into place; a process
    killed between the two leaves only <name>.old, which recover_dir (called by every loader) restores."""
    d, old = tmp_path / "ckpt", tmp_path / "ckpt.old"
    old.mkdir()
    _write(old, {"a": "1"})
    assert dio.recover_dir(d) == d and _read(d) == {"a": "1"} and not old.exists()
    assert dio.recover_dir(d) == d and _read(d) == {"a": "1"}  # nothing to do the second time


def test_from_pretrained_recovers_a_half_swapped_checkpoint(tmp_path):
    m = create_model("vit_nano", depth=1).eval()
    m.save_pretrained(tmp_path / "m")
    os.rename(tmp_path / "m", tmp_path / "m.old")  # as a save killed between its two renames leaves it
    back = from_pretrained(tmp_path / "m")
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.state_dict().values()))


# ----------------------------------------------------------------------------------------------- strict loads


@pytest.fixture
def saved(tmp_path) -> Path:
    create_model("diff_vit_nano", depth=2).save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_empty_weights_file_is_refused(saved):
    save_file({}, str(saved / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \d+ key\(s\): \['blocks.0.attn.diff_norm.weight'"):
        from_pretrained(saved)
    (saved / "model.safetensors").write_bytes(b"")  # a zero-byte file: not a safetensors file at all
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        from_pretrained(saved)
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        VisionTransformer.from_pretrained(saved)


def test_missing_tensor_is_named(saved):
    sd = load_file(str(saved / "model.safetensors"))
    del sd["blocks.1.attn.lambda_k2"]
    save_file(sd, str(saved / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing 1 key\(s\): \['blocks.1.attn.lambda_k2'\]"):
        from_pretrained(saved)
    with pytest.raises(ValueError, match=r"missing 1 key\(s\): \['blocks.1.attn.lambda_k2'\]"):
        VisionTransformer.from_pretrained(saved)  # the class-level entry point is strict too


def test_another_models_weights_are_refused(saved, tmp_path):
    create_model("vit_nano", depth=2).save_pretrained(tmp_path / "other")
    os.replace(tmp_path / "other" / "model.safetensors", saved / "model.safetensors")
    with pytest.raises(ValueError, match=r"does not match VisionTransformer: missing 10 key\(s\): .*lambda_q1"):
        from_pretrained(saved)


def test_config_with_one_more_block_is_refused(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["depth"] += 1
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing \d+ key\(s\): \['blocks.2.attn.diff_norm.weight'"):
        from_pretrained(saved)
    cfg["depth"] -= 2  # one block fewer: the file has tensors the model does not
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unexpected \d+ key\(s\): \['blocks.1."):
        from_pretrained(saved)


def test_mis_shaped_tensor_and_bad_config_are_refused(saved):
    sd = load_file(str(saved / "model.safetensors"))
    sd["head.weight"] = torch.zeros(11, 64)
    save_file(sd, str(saved / "model.safetensors"))
    with pytest.raises(ValueError, match=r"shape mismatch in 1 key\(s\): \['head.weight: file \(11, 64\) vs model "
                                         r"\(10, 64\)'\]"):
        from_pretrained(saved)
    cfg = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**cfg, "num_classes": 10**12}))
    with pytest.raises(ValueError, match=r"num_classes must be an integer in \[0, 1000000\], got 1000000000000"):
        from_pretrained(saved)
    (saved / "config.json").write_text(json.dumps({**cfg, "widht": 3}))
    with pytest.raises(ValueError, match=r"entries that are not arguments of VisionTransformer: \['widht'\]"):
        from_pretrained(saved)
    with pytest.raises(ValueError, match=r"entries that are not arguments of VisionTransformer: \['widht'\]"):
        VisionTransformer.from_pretrained(saved)
    (saved / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        from_pretrained(saved)
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="holds a VisionTransformer checkpoint, not a CLIP"):
        CLIP.from_pretrained(saved)
    with pytest.raises(ValueError, match="strict=False"):
        VisionTransformer.from_pretrained(saved, strict=False)


def test_tied_weights_round_trip(tmp_path):
    m = create_model("diff_lm_tiny", tie_embeddings=True).eval()
    m.save_pretrained(tmp_path / "lm")
    back = from_pretrained(tmp_path / "lm")
    assert back.lm_head.weight is back.tok_embed.weight
    ids = torch.randint(0, 512, (2, 5))
    with torch.no_grad():
        assert torch.equal(m(ids), back(ids))


# ------------------------------------------------------------------------------------------ kill during saves

_VERSIONS = 1000


def _version_model(v: int) -> VisionTransformer:
    """Checkpoint v: depth alternates 1/2 and every tensor is filled with v, so that a directory mixing two saves
    (config of one, weights of another, or weights of two) cannot load as either."""
    m = VisionTransformer(img_size=8, patch_size=4, embed_dim=16, depth=1 + v % 2, num_heads=2, num_classes=3,
                          attention="diff")
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(float(v))
    return m


def _saver(path: str, ready) -> None:  # runs in the child process, killed at a random point
    torch.set_num_threads(1)
    models = [_version_model(0), _version_model(1)]
    v = 0
    while True:
        m = models[v % 2]
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(float(v))
        m.save_pretrained(path)
        if v == 0:
            ready.set()
        v += 1


def _loaded_version(path: Path) -> int:
    m = from_pretrained(path)
    values = {float(t.flatten()[0]) for t in m.state_dict().values()}
    assert len(values) == 1, f"a mixed checkpoint loaded: values {sorted(values)}"
    v = int(values.pop())
    assert len(m.blocks) == 1 + v % 2, f"config of another save than the weights (version {v})"
    assert all(torch.equal(t, torch.full_like(t, v)) for t in m.state_dict().values())
    return v


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-fallback"])
def test_sigkill_during_saves_leaves_the_previous_or_the_new_checkpoint(tmp_path, monkeypatch, exchange):
    """A child process saves checkpoints 0, 1, 2, … into one directory in a loop and is SIGKILLed at a random moment,
    12 times (both with the renameat2 exchange and with the two-rename fallback): every load afterwards gives one
    whole checkpoint, never a mix, and never one older than a checkpoint seen before."""
    if not exchange:
        monkeypatch.setattr(dio, "_exchange", lambda a, b: False)
    ctx = mp.get_context("fork")
    rng = random.Random(0)
    path = tmp_path / "ckpt"
    seen = -1
    for _ in range(6):
        ready = ctx.Event()
        child = ctx.Process(target=_saver, args=(str(path), ready), daemon=True)
        child.start()
        assert ready.wait(60), "the saver did not complete its first save"
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        v = _loaded_version(path)
        assert v >= 0
        seen = max(seen, v)
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != "ckpt"]
        # a killed save may leave its temporary directory (hidden, dot-prefixed) or, in the fallback, the previous
        # checkpoint as ckpt.old; neither is ever read, and the next save removes ckpt.old
        assert all(n.startswith(".ckpt.") or n == "ckpt.old" for n in leftovers), leftovers


@pytest.mark.parametrize("path", ["/missing/dir", "./missing_dir", "~/nowhere", "a/b/c"])
def test_missing_local_folder_is_a_clear_error(tmp_path, path):
    """A path that is not a folder and cannot be a hub repo id says so, instead of a repo-id validation error."""
    from diffattn import from_pretrained
    from diffattn.models import VisionTransformer

    for load in (from_pretrained, VisionTransformer.from_pretrained):
        with pytest.raises(FileNotFoundError, match=f"path '{path}' does not exist; .*Hub id|does not exist; give"):
            load(path)
    weights_file = tmp_path / "model.safetensors"
    weights_file.write_bytes(b"")
    with pytest.raises(ValueError, match="model.safetensors is a checkpoint file, not a run or a saved model"):
        from_pretrained(str(weights_file))
    with pytest.raises(FileNotFoundError, match="is a file, not a folder"):
        VisionTransformer.from_pretrained(str(weights_file))


# ------------------------------------------------------------------- leftovers of killed saves, permissions


def _hold_a_save(path: str, kind: str, ready) -> None:  # child: stops in the middle of a save until killed
    if kind == "dir":
        with dio.atomic_write_dir(path) as tmp:
            (tmp / "half").write_text("written before the kill")
            ready.set()
            time.sleep(600)
    else:
        with dio.atomic_write_file(path, "w") as f:
            f.write("half")
            f.flush()
            ready.set()
            time.sleep(600)


def _start_holder(path: Path, kind: str):
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_hold_a_save, args=(str(path), kind, ready), daemon=True)
    child.start()
    assert ready.wait(60)
    return child


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("then", ["save", "load"])
def test_sigkill_during_save_then_the_next_save_or_load_leaves_no_temporary(tmp_path, then):
    path = tmp_path / "ckpt"
    _version_model(1).save_pretrained(path)
    child = _start_holder(path, "dir")
    mine = _temporaries(tmp_path)
    assert mine == [n for n in mine if n.startswith(f".ckpt.{child.pid}.")] and len(mine) == 1
    _version_model(2).save_pretrained(path)  # the writer is alive: its temporary is not touched
    assert _temporaries(tmp_path) == mine
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    if then == "save":
        _version_model(3).save_pretrained(path)
    else:
        assert _loaded_version(path) == 2
    assert _temporaries(tmp_path) == []


def test_sigkill_during_a_file_write_leaves_nothing_after_the_next_write(tmp_path):
    path = tmp_path / "results.json"
    child = _start_holder(path, "file")
    assert len(_temporaries(tmp_path)) == 1
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    with dio.atomic_write_file(path, "w") as f:
        f.write("{}")
    assert sorted(os.listdir(tmp_path)) == ["results.json"]


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                       (0o002, 0o664, 0o775)])
def test_saved_files_and_folders_follow_the_umask(tmp_path, mask, file_mode, dir_mode):
    old = os.umask(mask)
    try:
        _version_model(1).save_pretrained(tmp_path / "model")
        with dio.atomic_write_file(tmp_path / "out" / "results.json", "w") as f:
            f.write("{}")
        with dio.atomic_write_dir(tmp_path / "ckpt") as tmp:
            torch.save({"a": torch.ones(1)}, tmp / "state.pt")
            (tmp / "sub").mkdir()
            (tmp / "sub" / "x").write_text("x")
    finally:
        os.umask(old)
    for p in [tmp_path / "model", tmp_path / "ckpt", tmp_path / "ckpt" / "sub"]:
        assert p.stat().st_mode & 0o777 == dir_mode, p
    files = [*(tmp_path / "model").iterdir(), tmp_path / "out" / "results.json", tmp_path / "ckpt" / "state.pt",
             tmp_path / "ckpt" / "sub" / "x"]
    for p in files:
        assert p.stat().st_mode & 0o777 == file_mode, p


def test_load_torch_file_names_the_file_and_the_damage(tmp_path):
    torch.save({"w": torch.ones(4)}, tmp_path / "ok.pt")
    assert torch.equal(dio.load_torch_file(tmp_path / "ok.pt")["w"], torch.ones(4))
    data = (tmp_path / "ok.pt").read_bytes()
    cases = {"cut.pt": (data[: len(data) // 2], "is damaged or truncated"),
             "empty.pt": (b"", "is empty"),
             "noise.bin": (b"\x13\x37" * 64, "is not a PyTorch file")}
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=rf"{tmp_path / name} {message}"):
            dio.load_torch_file(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        dio.load_torch_file(tmp_path / "missing.pt")


# ---------------------------------------------------------------------------- local paths never go to the Hub


def test_looks_local_leaves_only_repo_ids_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    local = ["runs/diffclip_tiyn", "./x", "../x", "~/x", "/abs/x", "a/b/c", "a\\b", "org/na me", Path("org/name"), "",
             "org/..", "org/name-"]
    hub = ["org/name", "gpt2", "Org-1/model.v2_x"]
    assert [s for s in local if not dio.looks_local(s)] == []
    assert [s for s in hub if dio.looks_local(s)] == []
    (tmp_path / "org").mkdir()
    assert dio.looks_local("org/name")  # beside a folder org/, org/name is a path here


def test_a_missing_path_is_one_line_with_the_closest_names_beside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("diffclip_tiny", "lm_small", "vit"):
        (tmp_path / "runs" / name / "model").mkdir(parents=True)
    msg = str(dio.missing_path("runs/diffclip_tiyn", "path", "give a run folder"))
    assert msg == "path 'runs/diffclip_tiyn' does not exist; did you mean 'runs/diffclip_tiny'?; give a run folder"
    # the first missing part is matched, the rest kept
    assert "did you mean 'runs/diffclip_tiny/model'?" in str(dio.missing_path("runs/difclip_tiny/model", "path"))
    assert str(dio.missing_path("runs/zzz", "path")) == "path 'runs/zzz' does not exist"
    with pytest.raises(FileNotFoundError, match="'runs/vti' does not exist; did you mean 'runs/vit'"):
        dio.local_path("runs/vti", "path")
    assert dio.local_path("runs/vit", "path") == Path("runs/vit") and dio.local_path("org/name", "path") is None


def _no_network_call(*args, **kwargs):
    raise AssertionError(f"the Hub was asked: {args} {kwargs}")


@pytest.mark.parametrize("offline", [True, False])
def test_a_hub_miss_offline_is_one_line_at_once(tmp_path, monkeypatch, offline):
    """Offline (HF_HUB_OFFLINE, or an endpoint that refuses the one probe) the cache answers: no retries."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9 (discard)
    calls = []

    def cache_only(repo_id, **kwargs):  # the real download, told to stay in the cache
        calls.append(kwargs.get("local_files_only"))
        return huggingface_hub.snapshot_download(repo_id, **kwargs)

    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError) as e:
        dio.from_hub(cache_only, "org/tiny-model", "path", cache_dir=str(tmp_path / "cache"))
    assert time.perf_counter() - t0 < 5.0 and calls == [True]  # the hub's retries alone wait 1 + 2 + 4 + 8 + 8 s
    reason = "HF_HUB_OFFLINE is set" if offline else "http://127.0.0.1:9 cannot be reached"
    assert str(e.value) == (f"path 'org/tiny-model' is neither a local path nor in the Hugging Face Hub's cache, and "
                            f"the Hub was not asked ({reason})")


def test_a_hub_error_online_is_one_line(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(dio, "hub_reachable", lambda timeout=3.0: True)

    def not_found(repo_id, **kwargs):
        assert not kwargs.get("local_files_only")
        raise OSError(f"404 Client Error.\n\nRepository Not Found for url: https://huggingface.co/{repo_id}")

    with pytest.raises(dio.UsageError) as e:
        dio.from_hub(not_found, "org/none", "model.pretrained")
    assert str(e.value) == ("model.pretrained 'org/none' is not a local path, and the Hugging Face Hub did not give it "
                            "(OSError: 404 Client Error.)")
