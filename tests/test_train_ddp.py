"""Two gloo processes give the losses and gradients of one process holding the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
CLIP = dict(vision_img_size=8, vision_patch_size=2, vision_in_chans=1, text_context_length=8, embed_dim=32)


def _model_and_batch():
    from diffattn.models import create_model

    torch.manual_seed(0)
    model = create_model("diffclip_tiny", **CLIP)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(8, 1, 8, 8, generator=g)
    tokens = torch.randint(1, 400, (8, 8), generator=g)
    tokens[:, -1] = 49407  # end-of-text, where the text tower reads its features
    return model, images, tokens


def _clip_loss(model, images, tokens):
    from diffattn.train.config import config_from_dict
    from diffattn.train.tasks.clip import ClipTask

    task = ClipTask(config_from_dict({"task": {"name": "clip"}, "model": {"name": "diffclip_tiny"},
                                      "run": {"steps": 1}}))
    return task.loss(model, (images, tokens))


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, images, tokens = _model_and_batch()
    ddp = DDP(model)
    b = images.shape[0] // world
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = _clip_loss(ddp, images[rank * b:(rank + 1) * b], tokens[rank * b:(rank + 1) * b])
        loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    Path(f"{out}/warnings{rank}.txt").write_text("\n".join(str(w.message) for w in caught))
    torch.save({"loss": loss.detach(), "grads": grads}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_clip_global_negatives_two_processes_equal_one(tmp_path):
    torch.set_num_threads(1)
    model, images, tokens = _model_and_batch()
    loss = _clip_loss(model, images, tokens)
    loss.backward()
    ref = {n: p.grad for n, p in model.named_parameters()}
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r = [torch.load(tmp_path / f"rank{i}.pt", weights_only=True) for i in range(2)]
    # the mean of the ranks' losses is the global-batch loss (each scores its pairs against all 8)
    torch.testing.assert_close((r[0]["loss"] + r[1]["loss"]) / 2, loss.detach(), atol=1e-6, rtol=1e-6)
    local_only = _clip_loss(model, images[:4], tokens[:4])  # without global negatives the loss differs
    assert abs(float(local_only) - float(r[0]["loss"])) > 1e-3
    for n, g in ref.items():  # DDP's averaged gradient equals the one-process gradient, on both ranks
        torch.testing.assert_close(r[0]["grads"][n], g, atol=2e-6, rtol=1e-4, msg=n)
        torch.testing.assert_close(r[1]["grads"][n], g, atol=2e-6, rtol=1e-4, msg=n)
    assert ref["logit_scale"].abs() > 0
    for i in range(2):  # the gather uses the current torch.distributed API: no deprecation warning on any rank
        assert "deprecated" not in (tmp_path / f"warnings{i}.txt").read_text()


#: the tiny CLIP recipe on scikit-learn's digits (always installed) instead of the emoji set
DIGITS = ["--set", "data.name=digits", "--set", "model.overrides.vision_img_size=8", "--set",
          "model.overrides.vision_patch_size=2", "--set", "model.overrides.vision_in_chans=1"]


def _run(args: list[str], nproc: int, out: Path) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)] if nproc > 1 else \
        [sys.executable]
    cmd = base + ["-m", "diffattn", "train", "tiny/clip", "--out", str(out),
                  "--set", "run.steps=3", "--set", "run.log_every=1", "--set", "run.progress=false"] + DIGITS + args
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_torchrun_two_processes_match_one(tmp_path):
    """The whole loop under torchrun (sampler split, DDP and FSDP2, metric reduction) against one process."""
    one = _run([], 1, tmp_path / "one")
    for strategy in ("ddp", "fsdp2"):
        two = _run(["--set", f"run.distributed={strategy}"], 2, tmp_path / strategy)
        assert len(one) == len(two) == 3
        assert one == pytest.approx(two, abs=1e-4), strategy
        assert (tmp_path / strategy / "model" / "model.safetensors").is_file()
