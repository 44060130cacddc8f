"""Each tiny recipe trains on its offline data and its loss goes down; a LoRA retrofit saves and reloads."""

from pathlib import Path

import pytest
import torch

from diffattn.train import load_config, train
from diffattn.train.checkpoint import latest_checkpoint, load_checkpoint


def _train(name: str, out: Path, *extra: str) -> dict:
    cfg = load_config(f"tiny/{name}",
                      ["run.steps=30", "run.log_every=1", "run.ckpt_every=30", "run.progress=false", *extra])
    from diffattn.data import DatasetNotInstalledError

    try:
        return train(cfg, out=out)
    except DatasetNotInstalledError as e:
        pytest.skip(f"tiny/{name} needs its dataset: {e}")


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.parametrize("name", ["classify", "clip", "lm"])
def test_tiny_config_loss_goes_down(tmp_path, name, one_thread):
    res = _train(name, tmp_path)
    losses = res["losses"]
    assert len(losses) == 30 and all(map(lambda v: v == v, losses))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.05, (first, last)
    from diffattn.models import from_pretrained

    model = from_pretrained(tmp_path / "model")  # what `diffattn eval RUN_DIR` loads
    assert sum(p.numel() for p in model.parameters()) > 0
    assert (tmp_path / "config.yaml").is_file() and any((tmp_path / "tensorboard").iterdir())
    import json

    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"step", "loss", "lr", "lambda"} <= set(row) and row["step"] == 30
    assert len(row["lambda"]) >= 2 and all(0 < v < 1 for v in row["lambda"])


@pytest.mark.slow
@pytest.mark.data
def test_lora_retrofit_saves_and_reloads_adapter(tmp_path, one_thread):
    from diffattn.train.config import load_config as lc
    from diffattn.train.tasks.retrofit import RetrofitTask, build_base_model, load_retrofit

    res = _train("retrofit", tmp_path)
    losses = res["losses"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.05
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["adapter", "base", "checkpoints", "lora",
                                                                         "tensorboard"]
    cfg = lc(tmp_path / "config.yaml")
    trained = RetrofitTask(cfg).own_model()
    trained.load_state_dict(load_checkpoint(latest_checkpoint(tmp_path))["model"])
    base = build_base_model(cfg.task.base)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = base(input_ids=x).logits
        reloaded = load_retrofit(base, tmp_path).eval()
        trained.eval()
        want, got = trained(input_ids=x).logits, reloaded(input_ids=x).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (want - plain).abs().max() > 1e-3  # the adapters and LoRA changed the function
    from diffattn.adapters import lambda_summary

    assert all(r["step"] == 30 for r in lambda_summary(reloaded))  # λ schedule stepped once per optimizer step
