"""diffattn.train.step.fit: the optimizer step of the package for callers with their own batches, checked against
the loop written out by hand (same losses and weights, bit for bit) and for its hooks and argument checks."""

from __future__ import annotations

import pytest
import torch

from diffattn.train.step import fit, optimizer_step


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)) for _ in range(6)]
    return model, opt, sched, batches


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def test_fit_is_the_hand_written_loop():
    model, opt, sched, batches = _setup()
    ref_losses = []
    for b in batches:  # the loops fit replaced (retrofit study, LLaVA stages), in their order of operations
        loss = _loss(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.5)
        opt.step()
        sched.step()
        ref_losses.append(loss.item())
    ref = {k: v.clone() for k, v in model.state_dict().items()}

    model, opt, sched, batches = _setup()
    seen = []
    losses = fit(model, opt, sched, iter(batches), _loss, grad_clip=0.5, after_step=[lambda m: seen.append(m)])
    assert losses == ref_losses and len(losses) == 6
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())
    assert len(seen) == 6 and all(m is model for m in seen)
    assert sched.last_epoch == 6 and opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 7)


def test_fit_logs_and_checks_its_arguments():
    model, opt, sched, batches = _setup()
    lines = []
    fit(model, opt, None, batches, _loss, log=lines.append, log_every=2, desc="stage 1 step")
    assert [line.split(" loss ")[0] for line in lines] == ["stage 1 step 2/6", "stage 1 step 4/6", "stage 1 step 6/6"]
    with pytest.raises(ValueError, match="grad_clip must be None or > 0, got 0"):
        fit(model, opt, sched, batches, _loss, grad_clip=0)
    with pytest.raises(TypeError, match="loss_fn must be a callable \\(model, batch\\) -> loss, got str"):
        fit(model, opt, sched, batches, "mse")


def test_optimizer_step_returns_the_norm_before_clipping():
    model, opt, _, batches = _setup()
    _loss(model, batches[0]).backward()
    params = list(model.parameters())
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    got = optimizer_step(model, opt, None, params, 1e-3)
    assert got.item() == pytest.approx(norm.item(), rel=1e-6)
    assert optimizer_step(model, opt, None, params, None).item() == 0.0
