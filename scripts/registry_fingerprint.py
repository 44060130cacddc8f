"""Fingerprint of the model registry: name → parameter count and a hash of the sorted state-dict keys and shapes.

    PYTHONPATH=src python scripts/registry_fingerprint.py tests/fixtures/model_registry_v0_1_0.json

Models are built on the meta device (no memory, no init), so every registered size is cheap to fingerprint.
tests/test_models_registry.py compares the live registry against the recorded file.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch


def fingerprint() -> dict[str, dict]:
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
    return out


if __name__ == "__main__":
    data = fingerprint()
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
