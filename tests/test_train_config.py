"""Config loading, overrides and the errors a user sees; the optimizer groups and the lr schedule."""

import math

import pytest
import torch

from diffattn.train.config import apply_overrides, config_from_dict, load_config
from diffattn.train.data import StepBatchSampler, local_batch_size
from diffattn.train.optim import EMA, param_groups, warmup_cosine

BASE = {"task": {"name": "classify"}, "model": {"name": "vit_nano"}, "run": {"steps": 4}}


def test_unknown_key_names_key_and_valid_ones():
    with pytest.raises(ValueError, match=r"optim\.learning_rate.*valid keys in 'optim': lr, weight_decay"):
        config_from_dict({**BASE, "optim": {"learning_rate": 1e-3}})
    with pytest.raises(ValueError, match=r"unknown config section 'optimizer'.*task, model, data, optim, run"):
        config_from_dict({**BASE, "optimizer": {}})


@pytest.mark.parametrize("section,key,value,msg", [
    ("task", "name", "regression",
     r"task\.name must be one of \('classify', 'clip', 'lm', 'paligemma', 'retrofit', 'vlm'\)"),
    ("run", "batch_size", 0, r"run\.batch_size must be an integer >= 1, got 0"),
    ("run", "precision", "fp8", r"run\.precision must be one of"),
    ("run", "distributed", "zero3", r"run\.distributed must be one of \('ddp', 'fsdp2'\)"),
    ("optim", "lr", -1.0, r"optim\.lr must be a number > 0, got -1.0"),
    ("run", "ema_decay", 1.5, r"run\.ema_decay must be None or in \(0, 1\)"),
    ("run", "compile", "fast", r"run\.compile must be true, false or a torch\.compile mode .*got 'fast'"),
    ("run", "compile", 1, r"run\.compile must be true, false"),
])
def test_bad_values(section, key, value, msg):
    d = {**BASE, section: {**BASE.get(section, {}), key: value}}
    with pytest.raises(ValueError, match=msg):
        config_from_dict(d)


def test_steps_xor_epochs_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"exactly one of them"):
        config_from_dict({**BASE, "run": {"steps": 3, "epochs": 1}})
    with pytest.raises(ValueError, match=r"config file .*nope\.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_set_overrides_parse_yaml_values(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("task: {name: classify}\nmodel: {name: vit_nano}\nrun: {steps: 4}\n")
    cfg = load_config(p, ["optim.lr=3e-4", "run.ema_decay=0.99", "model.overrides.depth=1", "optim.betas=[0.9, 0.95]"])
    assert cfg.optim.lr == 3e-4 and cfg.run.ema_decay == 0.99 and cfg.model.overrides == {"depth": 1}
    assert cfg.optim.betas == [0.9, 0.95]
    assert load_config(p, ["run.compile=reduce-overhead"]).run.compile == "reduce-overhead"  # CUDA graphs on a GPU
    assert load_config(p, ["run.compile=true"]).run.compile is True
    with pytest.raises(ValueError, match=r"--set takes section.key=value, got 'optim.lr'"), \
            pytest.warns(FutureWarning, match=r"apply_overrides is deprecated .*; use diffattn.configs.apply_sets"):
        apply_overrides({}, ["optim.lr"])
    with pytest.raises(ValueError, match=r"unknown config key run\.stpes"):
        load_config(p, ["run.stpes=3"])


def test_world_size_must_divide_global_batch():
    assert local_batch_size(32, 2, 4) == 4
    with pytest.raises(ValueError, match=r"divisible by world_size × run.accum_steps = 3 × 1 = 3, got 32"):
        local_batch_size(32, 3, 1)


def test_sampler_global_batch_is_split_over_ranks_and_micro_batches():
    one = list(StepBatchSampler(100, 8, seed=3, total_steps=5))
    r0 = list(StepBatchSampler(100, 8, world_size=2, rank=0, accum_steps=2, seed=3, total_steps=5))
    r1 = list(StepBatchSampler(100, 8, world_size=2, rank=1, accum_steps=2, seed=3, total_steps=5))
    assert len(one) == 5 and len(r0) == 10 and all(len(b) == 2 for b in r0)
    for s in range(5):  # micro-batch a of rank r = slice (a, r) of the same global batch
        assert one[s] == r0[2 * s] + r1[2 * s] + r0[2 * s + 1] + r1[2 * s + 1]
    resumed = list(StepBatchSampler(100, 8, seed=3, start_step=3, total_steps=5))
    assert resumed == one[3:]
    ep = StepBatchSampler(100, 8, seed=3, total_steps=13)  # 12 steps per epoch: a new permutation at step 12
    assert sorted(sum((ep.global_batch(s).tolist() for s in range(12)), [])) == sorted(set(
        sum((ep.global_batch(s).tolist() for s in range(12)), [])))


def test_warmup_cosine_values():
    assert warmup_cosine(0, 100, 10) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert warmup_cosine(100, 100, 10, 0.1) == pytest.approx(0.1)


@pytest.mark.parametrize("name", ["diff_vit_nano", "dg_vit_nano"])
def test_no_weight_decay_on_lambdas_gates_norms_biases(name):
    from diffattn.models import create_model

    model = create_model(name, img_size=8, patch_size=2, in_chans=1, num_classes=10, depth=1)
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    nd = {names[id(p)] for p in no_decay["params"]}
    d = {names[id(p)] for p in decay["params"]}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.05
    special = "lambda" if name.startswith("diff") else "attn.lambda_fn.gate_proj.weight"  # the gate is a λ form
    assert any(special in n for n in nd) and not any(special in n for n in d)
    assert any("norm" in n for n in nd) and not any(k in n for n in d for k in ("lambda", "norm", "bias"))
    assert "blocks.0.attn.q_proj.weight" in d and "head.weight" in d
    assert all(p.ndim >= 2 for p in decay["params"]) and len(d) + len(nd) == len(names)


def test_ema_update_equation():
    m = torch.nn.Linear(2, 1)
    ema = EMA(m, 0.9)
    w0 = m.weight.detach().clone()
    with torch.no_grad():
        m.weight.add_(1.0)
    ema.update(m)
    torch.testing.assert_close(ema.shadow["weight"], 0.9 * w0 + 0.1 * (w0 + 1.0))


def test_classify_standardises_like_eval(tmp_path):
    """A classifier trained on a set with an image array sees (pixels/255 − mean) / std of the train split: the
    inputs ``diffattn eval`` gives it (no silent shift between training and evaluation)."""
    import numpy as np

    from diffattn.data import DatasetNotInstalledError, get_dataset, pixel_stats
    from diffattn.train.build import build_run_model
    from diffattn.train.tasks import build_task

    try:
        test = get_dataset("fashion_mnist", split="test")
        train = get_dataset("fashion_mnist", split="train")
    except DatasetNotInstalledError as e:
        pytest.skip(str(e))
    cfg = config_from_dict({"task": {"name": "classify"}, "data": {"name": "fashion_mnist", "split": "test"},
                            "model": {"name": "diff_vit_nano",
                                      "overrides": {"img_size": 28, "patch_size": 4, "in_chans": 1}},
                            "run": {"steps": 1, "batch_size": 8}})
    task = build_task(cfg)
    x, y = task.dataset(build_run_model(task, cfg.model))[3]
    mean, std = pixel_stats(train.images)
    expected = (torch.tensor(np.asarray(test.images[3]), dtype=torch.float32) / 255.0 - mean) / std
    assert int(y) == int(test.labels[3])
    torch.testing.assert_close(x[0], expected, atol=1e-6, rtol=0)


def test_the_task_list_comes_from_the_recipe_registry():
    """One list of tasks (diffattn.train.tasks.TASKS); each recipe class declares the task keys it reads, and the
    config records exactly those (the table config.yaml and resume digests used before the classes declared them)."""
    import diffattn.train.config as C
    import diffattn.train.tasks as T
    from diffattn.errors import UsageError
    from diffattn.train.tasks import TASKS, build_task, task_class

    assert sorted(TASKS) == ["classify", "clip", "lm", "paligemma", "retrofit", "vlm"]
    assert T.TASK_KEYS == {
        "clip": ("name",), "classify": ("name", "label_smoothing", "mixup", "cutmix"), "lm": ("name",),
        "retrofit": ("name", "base", "method", "lambda_init", "anneal_steps", "train", "lora", "lora_r", "lora_alpha",
                     "lora_targets"),
        "vlm": ("name", "base", "train"),
        "paligemma": ("name", "base", "method", "lambda_init", "anneal_steps", "lora_r", "lora_alpha",
                      "lora_targets")}
    for name in TASKS:
        assert task_class(name).name == name
    cfg = C.load_config("tiny/clip")
    assert type(build_task(cfg)).__name__ == "ClipTask"
    assert C.run_config_dict(cfg)["task"] == {"name": "clip"}
    with pytest.raises(ValueError, match=r"task.name must be one of \['classify', 'clip', 'lm', 'paligemma', "
                                         r"'retrofit', 'vlm'\], got 'vit'"):
        task_class("vit")
    with pytest.raises(UsageError, match=r"task.name must be one of \('classify', 'clip', 'lm', 'paligemma', "
                                         r"'retrofit', 'vlm'\), got 'vit'"):
        C.config_from_dict({**cfg.to_dict(), "task": {"name": "vit"}})
    with pytest.warns(FutureWarning, match=r"use tuple\(diffattn.train.tasks.TASKS\)"):
        from diffattn.train.tasks import TASK_CLASSES
    assert TASK_CLASSES == tuple(TASKS)
