"""Fingerprint of the model registry: name → parameter count and a hash of the sorted state-dict keys and shapes.

    PYTHONPATH=src python scripts/registry_fingerprint.py tests/fixtures/model_registry_v0_1_0.json
    PYTHONPATH=src python scripts/registry_fingerprint.py --values before.json      # + seeded values, settings

Models are built on the meta device (no memory, no init), so every registered size is cheap to fingerprint.
tests/test_models_registry.py compares the live registry against the recorded file.

``--values`` adds, per name, a hash of every tensor of the model built on the CPU after ``torch.manual_seed(0)``
(bit-identical initialisation) and a hash of ``repr(model)`` and of each tower's attention settings
(``attention_spec``): what a refactor of how models are configured must leave unchanged. It builds every size for
real, which takes minutes on a CPU.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch


def _settings(model) -> dict:
    """The attention settings of every module that records them (``attention_spec``), by module name."""
    out = {}
    for name, m in model.named_modules():
        spec = getattr(m, "attention_spec", None)
        if spec is not None:
            out[name] = spec.to_dict()
    return out


def fingerprint(values: bool = False) -> dict[str, dict]:
    from diffattn.models import create_model, list_models
    from diffattn.models.summary import parameter_count

    out = {}
    for name in list_models():
        with torch.device("meta"):
            model = create_model(name)
        sd = model.state_dict()
        keys = "\n".join(f"{k}:{tuple(sd[k].shape)}" for k in sorted(sd))
        out[name] = {"params": parameter_count(model), "num_keys": len(sd),
                     "keys_sha256": hashlib.sha256(keys.encode()).hexdigest()}
        if values:
            torch.manual_seed(0)
            model = create_model(name)
            h = hashlib.sha256()
            for k, t in sorted(model.state_dict().items()):
                h.update(k.encode())
                h.update(t.detach().contiguous().cpu().numpy().tobytes())
            out[name]["values_sha256"] = h.hexdigest()
            out[name]["repr_sha256"] = hashlib.sha256(repr(model).encode()).hexdigest()
            out[name]["attention"] = hashlib.sha256(json.dumps(_settings(model), sort_keys=True).encode()).hexdigest()
            print(name, file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    values = "--values" in args
    args = [a for a in args if a != "--values"]
    data = fingerprint(values)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args:
        with open(args[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
