"""Host cost of a differential block: the aten ops one forward + backward dispatches, against the standard block.

On a GPU a training step of a small model is host-bound (docs/benchmarks.md, "GPU"): its time follows the number of
ops launched, not their FLOPs. Every op that is not a view is counted here on the CPU, so that a change that adds
ops to the differential layers fails without a GPU. Two paths are counted:

- fused: the ``triton`` backend, which a GPU takes for every layer but head width 128 from 2,048 keys on. The
  layer hands λ (from its reparam vectors or its gate's logits), the combination and the sub-norm to the kernels
  (``kernels.triton_diff.fused_layer_attention``); the Triton kernels are replaced by launchers that do nothing,
  so what is counted is every aten op the host dispatches around them (allocations included). Triton launches
  are not aten ops: one forward launches one kernel, one backward four or five.
- eager: the ``sdpa`` backend (two fused attention calls on Q and K padded to V's width, λ and the sub-norm as
  PyTorch ops), which the CPU takes and a GPU takes at head width 128 from 2,048 keys on. On the CPU the sub-norm
  is a written-out Function of 5 + 7 ops where CUDA runs one fused ``rms_norm`` each way.

A DAA retrofit (DAA 2025) of a Llama decoder layer is counted against the pretrained layer.

The goal is 1.3× the standard block; the ceilings are the counts measured when the test was written
(docs/benchmarks.md, "Host cost"). A change that lowers a count should lower its ceiling.
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

import pytest
import torch

import diffattn.ops.functional as functional
from diffattn.layers import AttentionSpec, Block
from diffattn.ops.kernels import triton_diff
from diffattn.utils import count_ops


def count_step(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Ops of one forward + backward with the gradients at None (what ``zero_grad()`` leaves), after a warm-up."""
    module(x).sum().backward()
    module.zero_grad(set_to_none=True)
    x.grad = None
    return sum(count_ops(lambda: module(x).sum().backward()).values())


class _NoKernel:
    """Stands in for a Triton kernel: ``kernel[grid](*args)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


KERNELS = [name for name in vars(triton_diff) if name.startswith("_diff_attn_") and name.endswith("_kernel")]


@contextlib.contextmanager
def fused_path():
    """Within the block, differential layers on the CPU take the path a GPU takes with the ``triton`` backend, with
    Triton kernels that launch nothing; yields the list that gets one entry per fused layer call."""
    calls = []
    real = triton_diff.fused_layer_attention
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, TRITON_INTERPRET="1"))  # CPU tensors pass the kernels' checks
        stack.enter_context(mock.patch.object(functional, "_triton_reason", lambda *a: None))
        stack.enter_context(mock.patch.object(triton_diff, "fused_layer_attention",
                                              lambda *a, **k: calls.append(1) or real(*a, **k)))
        for name in KERNELS:
            stack.enter_context(mock.patch.object(triton_diff, name, _NoKernel()))
        yield calls


def block_ops(kind: str, backend: str = "sdpa") -> int:
    torch.manual_seed(0)
    spec = AttentionSpec(kind, backend=backend) if kind != "standard" else AttentionSpec("standard", backend="sdpa")
    block = Block(64, 4, attention=spec)
    x = torch.randn(2, 16, 64, requires_grad=True)
    if backend != "triton":
        return count_step(block, x)
    with fused_path() as calls:
        n = count_step(block, x)
    assert calls, f"{kind}: the layer did not take the fused path"
    return n


# ops of a standard block's forward + backward, and the ceiling of each differential block's ratio to it
STANDARD_OPS = 40
EAGER_CEILING = {"diff": 2.1, "gated": 2.2, "diff_v2": 1.5}
FUSED_CEILING = {"diff": 1.0, "gated": 1.125, "diff_v2": 1.125}
GOAL = 1.3


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
    """The path a GPU takes: at most 1.3× the standard block (the goal), and no more than measured."""
    ratio = block_ops(kind, backend="triton") / STANDARD_OPS
    assert ratio <= min(GOAL, FUSED_CEILING[kind]), f"{kind}: {ratio:.2f}× the standard block's ops"


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


def llama_layer_ops(retrofit: str | None) -> int:
    """Ops of one Llama decoder layer's forward + backward, as the difference between a 2-layer and a 1-layer
    model (so embedding, final norm and head cancel), standard or retrofitted."""
    transformers = pytest.importorskip("transformers")
    import diffattn

    def model_ops(layers: int) -> int:
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg)
        if retrofit:
            diffattn.retrofit(model, retrofit, train="all")
        ids = torch.randint(0, 64, (2, 16))
        model(ids).logits.sum().backward()
        model.zero_grad(set_to_none=True)
        return sum(count_ops(lambda: model(ids).logits.sum().backward()).values())

    return model_ops(2) - model_ops(1)


def test_daa_retrofit_layer_ops():
    """DAA (2025) adds a second query projection and attention call to a pretrained layer: ≤ 1.3× its ops."""
    base, daa = llama_layer_ops(None), llama_layer_ops("daa")
    assert daa / base <= 1.3, f"DAA layer: {daa} ops against {base} ({daa / base:.2f}×)"
