"""Host cost of a differential block: the aten ops one forward + backward dispatches, against the standard block.

On a GPU a training step of a small model is host-bound (docs/benchmarks.md, "GPU"): its time follows the number of
ops launched, not their FLOPs. Every op that is not a view is counted here on the CPU, so that a change that adds
ops to the differential layers fails without a GPU. Two paths are counted:

- eager: the ``sdpa`` backend (two fused attention calls on Q and K padded to V's width), which a GPU takes where
  the fused kernel does not apply (head width 128 from 2,048 keys on);
- fused: the ``triton`` backend with its launchers replaced by functions that allocate the same outputs, which
  is what runs around the kernel on a GPU.

The ceilings are the counts measured when the test was written (docs/benchmarks.md, "Host cost"); the goal is
1.3× the standard block. A change that lowers a count should lower its ceiling.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import diffattn.functional as functional
from diffattn.kernels import triton_diff
from diffattn.layers import AttentionSpec, Block
from diffattn.utils import count_ops


def count_step(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Ops of one forward + backward with the gradients at None (what ``zero_grad()`` leaves), after a warm-up."""
    module(x).sum().backward()
    module.zero_grad(set_to_none=True)
    x.grad = None
    return sum(count_ops(lambda: module(x).sum().backward()).values())


def _fake_fwd(q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches, tiles=None):
    B, H, Nq, _ = q1.shape
    o = torch.empty(B, H, Nq, v.shape[-1], dtype=v.dtype)
    return o, torch.empty_like(o), torch.empty_like(o), torch.empty(2, B, H, Nq)


def _fake_bwd(do, q1, k1, q2, k2, v, o1, o2, lse, lam, w1, key_bias, is_causal, scale, tiles=None):
    B, H, Nq, _ = q1.shape
    return (torch.zeros(2, *q1.shape, dtype=q1.dtype), torch.zeros(2, *k1.shape, dtype=k1.dtype),
            torch.zeros(v.shape, dtype=v.dtype), torch.zeros(2, B, H, Nq))


def block_ops(kind: str, backend: str = "sdpa") -> int:
    torch.manual_seed(0)
    spec = AttentionSpec(kind, backend=backend) if kind != "standard" else AttentionSpec("standard", backend="sdpa")
    block = Block(64, 4, attention=spec)
    x = torch.randn(2, 16, 64, requires_grad=True)
    if backend != "triton":
        return count_step(block, x)
    with mock.patch.object(functional, "_triton_reason", lambda *a: None), \
            mock.patch.object(triton_diff, "_fwd_impl", _fake_fwd), \
            mock.patch.object(triton_diff, "_bwd_impl", _fake_bwd):
        return count_step(block, x)


# ops of a standard block's forward + backward, and the ceiling of each differential block's ratio to it
STANDARD_OPS = 40
EAGER_CEILING = {"diff": 2.3, "gated": 2.4, "diff_v2": 1.55}
FUSED_CEILING = {"diff": 2.2, "gated": 2.15, "diff_v2": 1.65}


def test_counter_counts_what_runs():
    a = torch.randn(3, 4, requires_grad=True)
    ops = count_ops(lambda: (a * 2).t().sum().backward())  # backward: ones_like, expand (a view), mul
    assert ops == {"mul": 2, "sum": 1, "ones_like": 1}


def test_standard_block_ops():
    assert block_ops("standard") == STANDARD_OPS


@pytest.mark.parametrize("kind", sorted(EAGER_CEILING))
def test_differential_block_ops_eager(kind):
    ratio = block_ops(kind) / STANDARD_OPS
    assert ratio <= EAGER_CEILING[kind], f"{kind}: {ratio:.2f}× the standard block's ops"


@pytest.mark.parametrize("kind", sorted(FUSED_CEILING))
def test_differential_block_ops_fused_kernel(kind):
    ratio = block_ops(kind, backend="triton") / STANDARD_OPS
    assert ratio <= FUSED_CEILING[kind], f"{kind}: {ratio:.2f}× the standard block's ops"


def test_reparam_lambda_ops_and_gradient():
    """λ = exp(q1·k1) − exp(q2·k2) + λ_init (Ye et al. 2024, eq. 2): 6 ops forward, 7 backward, and the gradient
    of the plain expression."""
    from diffattn.lambdas import reparam_lambda

    ps = [torch.randn(8, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    ops = count_ops(lambda: reparam_lambda(*ps, 0.3).backward())
    assert sum(ops.values()) == 6 + 7 + 1  # + the ones_like of backward()
    got = [p.grad.clone() for p in ps]
    for p in ps:
        p.grad = None
    q1, k1, q2, k2 = ps
    (torch.exp((q1 * k1).sum()) - torch.exp((q2 * k2).sum()) + 0.3).backward()
    for g, p in zip(got, ps):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=1e-15)
