"""diffattn.train.memory: the bytes training a model needs at least (weights, gradients, AdamW's two states) and the
check that refuses a model the machine or the GPU cannot hold, before any weight is allocated."""

from __future__ import annotations

import pytest
import torch

from diffattn.errors import UsageError
from diffattn.train import memory
from diffattn.train.memory import check_memory, training_bytes


def test_training_bytes_counts_a_gradient_and_two_adamw_states_per_trained_weight():
    lin = torch.nn.Linear(4, 3)  # 12 + 3 float32 weights: 60 bytes
    assert training_bytes(lin) == (15, 60, 60 + 3 * 60)
    lin.bias.requires_grad_(False)  # frozen: weights only
    assert training_bytes(lin) == (15, 60, 60 + 3 * 48)
    half = torch.nn.Linear(4, 3).to(torch.bfloat16)
    assert training_bytes(half) == (15, 30, 30 + 3 * 30)
    tied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight  # one tensor, counted once
    assert training_bytes(tied) == (40, 160, 160 + 3 * 160)
    with torch.device("meta"):
        big = torch.nn.Linear(1000, 1000)
    assert training_bytes(big) == (1_001_000, 4_004_000, 16_016_000)


def test_check_memory_refuses_what_the_machine_cannot_hold(monkeypatch):
    lin = torch.nn.Linear(4, 3)  # needs 240 bytes to train on the CPU
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(memory, "available_memory", lambda device: 240)
    check_memory(lin, torch.device("cpu"), "model.overrides")  # just fits
    monkeypatch.setattr(memory, "available_memory", lambda device: None)  # unknown: not checked
    check_memory(lin, torch.device("cpu"), "model.overrides")
    monkeypatch.setattr(memory, "available_memory", lambda device: 239)
    with pytest.raises(UsageError, match=r"^the model has 0.00M parameters and needs at least 240 B to train "
                                         r"\(weights, gradients and AdamW's two states\), but the machine has 239 B "
                                         r"available; make it smaller \(model.overrides\) or use a larger machine$"):
        check_memory(lin, torch.device("cpu"), "model.overrides")
    # a retrofit keeps a copy of its base on the machine: 8 + 3 · 8 + 1000 bytes
    with pytest.raises(UsageError, match=r"needs at least 1.0 kB to train \(weights, gradients and AdamW's two "
                                         r"states, and a copy of the base\)"):
        check_memory(torch.nn.Linear(1, 1), torch.device("cpu"), "task.base.config", extra_host_bytes=1000)


def test_check_memory_counts_every_process_torchrun_starts_on_the_machine(monkeypatch):
    lin = torch.nn.Linear(4, 3)
    monkeypatch.setattr(memory, "available_memory", lambda device: 300)
    check_memory(lin, torch.device("cpu"), "model.overrides")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 2 × 240 bytes
    with pytest.raises(UsageError, match=r"needs at least 480 B × 2 processes to train"):
        check_memory(lin, torch.device("cpu"), "model.overrides")
