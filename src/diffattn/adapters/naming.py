"""Parameter names of a retrofitted model as if no wrapper were around it, so that a peft-wrapped model saves the
same adapter file as the bare model and loads one strictly.

peft renames what it wraps:

- ``PeftModel`` puts the model under ``base_model.model.``;
- a LoRA (or other tuner) layer keeps the wrapped layer as ``<name>.base_layer`` and adds its own weights
  (``<name>.lora_A.default.weight`` …), which belong to peft, not to the retrofit;
- ``modules_to_save`` keeps the original as ``<name>.original_module`` (frozen) and trains a copy as
  ``<name>.modules_to_save.<adapter>``.

:func:`key_map` maps each canonical name (the bare model's) to the tensor name in the wrapped model: the trained copy
of a ``modules_to_save`` module, never its frozen original; peft's own weights have no canonical name. Nothing here
imports peft: wrappers are recognised by their structure.
"""

from __future__ import annotations

import torch.nn as nn

__all__ = ["is_wrapped", "canonical_name", "key_map", "module_map"]

_PEFT_PREFIX = "base_model.model."


def is_wrapped(model: nn.Module) -> bool:
    """True for a peft model (``PeftModel`` or a model holding tuner layers / ``modules_to_save`` wrappers)."""
    return any(_is_tuner(m) or _is_saved_copy(m) for m in model.modules())


def _is_tuner(m: nn.Module) -> bool:  # peft BaseTunerLayer: LoRA, IA3, … keep the wrapped layer as base_layer
    return isinstance(getattr(m, "base_layer", None), nn.Module) and "base_layer" in m._modules


def _is_saved_copy(m: nn.Module) -> bool:  # peft ModulesToSaveWrapper
    return "original_module" in m._modules and isinstance(m._modules.get("modules_to_save"), nn.ModuleDict)


def _active_copy(wrapper: nn.Module, copies: nn.ModuleDict) -> str | None:
    """The name of the copy a ``modules_to_save`` wrapper runs (its ``active_adapter``; else its first copy)."""
    try:
        active = wrapper.active_adapter
    except Exception:  # not a peft wrapper after all
        active = None
    if isinstance(active, (list, tuple)):
        active = active[0] if active else None
    return active if active in copies else next(iter(copies.keys()), None)


def _peft_root(model: nn.Module) -> str:
    """``base_model.model.`` for a ``PeftModel`` (recognised by its class name along the MRO, without importing
    peft), else "". A transformers model inside one also has ``peft_config`` and a ``base_model`` property (its
    backbone), so those attributes alone would misread the bare model as the wrapper."""
    return _PEFT_PREFIX if any(c.__name__ == "PeftModel" for c in type(model).__mro__) else ""


def _walk(model: nn.Module) -> dict[str, tuple[str, int]]:
    """Module name → (canonical name, rank): rank 0 = the active module, 1 = the frozen original of a
    ``modules_to_save`` module, −1 = peft's own (no canonical name)."""
    out: dict[str, tuple[str, int]] = {}

    def visit(m: nn.Module, name: str, canon: str, rank: int) -> None:
        out[name] = (canon, rank)
        tuner, saved = _is_tuner(m), _is_saved_copy(m)
        for child_name, child in m._modules.items():
            if child is None:
                continue
            full = f"{name}.{child_name}" if name else child_name
            if rank < 0 or (tuner and child_name != "base_layer"):
                visit(child, full, "", -1)  # peft's own weights (lora_A, lora_B, …)
            elif tuner:
                visit(child, full, canon, rank)  # the wrapped layer stands for the tuner layer
            elif saved and child_name == "original_module":
                visit(child, full, canon, 1)
            elif saved and child_name == "modules_to_save":
                out[full] = ("", -1)
                active = _active_copy(m, child)
                for k, copy in child.items():  # the active copy is the one that runs and trains
                    visit(copy, f"{full}.{k}", canon, rank if k == active else -1)
            else:
                visit(child, full, f"{canon}.{child_name}" if canon else child_name, rank)

    visit(model, "", "", 0)
    root = _peft_root(model)
    if root:  # PeftModel: base_model.model.<name> is the bare model's <name>
        for name, (canon, rank) in out.items():
            if rank < 0:
                continue
            if canon.startswith(root):
                out[name] = (canon[len(root):], rank)
            elif root.startswith(canon + ".") or not canon:
                out[name] = ("", rank if canon + "." == root else -1)  # the wrappers around the bare model
            else:
                out[name] = ("", -1)
    return out


def module_map(model: nn.Module) -> dict[str, str]:
    """Canonical module name → module name in ``model`` (the active copy where peft keeps two)."""
    best: dict[str, tuple[int, str]] = {}
    for name, (canon, rank) in _walk(model).items():
        if rank < 0:
            continue
        if canon not in best or rank < best[canon][0]:
            best[canon] = (rank, name)
    return {c: n for c, (_, n) in best.items()}


def canonical_name(model: nn.Module, name: str) -> str | None:
    """The bare model's name for the module or tensor ``name`` of ``model``; None for peft's own weights (and for
    the frozen original of a ``modules_to_save`` module)."""
    walk = _walk(model)
    mod, _, leaf = name.rpartition(".")
    if name in walk:
        canon, rank = walk[name]
        return canon if rank == 0 else None
    if mod not in walk:
        return None
    canon, rank = walk[mod]
    if rank != 0:
        return None
    return f"{canon}.{leaf}" if canon else leaf


def key_map(model: nn.Module, keys=None) -> dict[str, str]:
    """Canonical tensor name → tensor name in ``model`` for every state-dict key (or ``keys``) that has one.

    For a model without wrappers this is the identity on its state-dict keys."""
    walk = _walk(model)
    out: dict[str, str] = {}
    for k in (model.state_dict().keys() if keys is None else keys):
        mod, _, leaf = k.rpartition(".")
        canon, rank = walk.get(mod, ("", -1))
        if rank != 0:
            continue
        out[f"{canon}.{leaf}" if canon else leaf] = k
    return out


def active_modules(model: nn.Module, cls: type) -> list[tuple[str, str, nn.Module]]:
    """(canonical name, name in ``model``, module) for every active module of type ``cls``, in module order (the
    trained copy of a ``modules_to_save`` module, not its frozen original)."""
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, cls)]
    if not mods or not is_wrapped(model):
        return [(n, n, m) for n, m in mods]
    walk = _walk(model)
    return [(walk[n][0], n, m) for n, m in mods if walk[n][1] == 0]
