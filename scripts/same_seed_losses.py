"""Per-step training losses of every tiny recipe, bit for bit: what a refactor of the trainer, the tasks or the model
code must leave unchanged.

    PYTHONPATH=src python scripts/same_seed_losses.py after.json                 # this checkout
    git worktree add /tmp/before REV
    PYTHONPATH=/tmp/before/src python scripts/same_seed_losses.py before.json    # the same runs at REV
    cmp before.json after.json

Each run is ``diffattn train tiny/<name>`` for 3 optimizer steps of seed 0 on the CPU (``run.device``, where the
checkout knows the key), plus three variants that take other paths of the loop: CLIP on scikit-learn's digits,
classification with validation, gradient accumulation and Mixup / CutMix, and a causal LM on scikit-learn's texts
with validation. ``tiny/finetune`` starts from a tiny DiffLlama checkpoint written with transformers (seed 0), full
and with LoRA. Each loss is written as ``float.hex`` (exact); a run that cannot start (a recipe or a key the checkout
does not have, a missing dataset) records its one-line error instead.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

#: run name → extra ``--set`` overrides of ``tiny/<name before "@">``
RUNS: dict[str, list[str]] = {
    **{n: [] for n in ("classify", "clip", "lm", "paligemma", "retrofit", "text", "vlm")},
    "clip@digits": ["data.name=digits", "model.overrides.vision_img_size=8", "model.overrides.vision_patch_size=2",
                    "model.overrides.vision_in_chans=1"],
    "classify@eval+accum2+mixup": ["eval.every=1", "run.accum_steps=2", "task.mixup=0.8", "task.cutmix=1.0"],
    "lm@sklearn_text+eval": ["data.name=sklearn_text", "eval.every=2"],
    "finetune": ["data.name=sklearn_text"],
    "finetune@lora": ["data.name=sklearn_text", "model.lora=true"],
}


def _diffllama(folder: Path) -> Path:
    """A tiny DiffLlama checkpoint (2 layers, width 32, the 256 byte ids), seed 0."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    cfg = DiffLlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=128,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    torch.manual_seed(0)
    DiffLlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def losses(out: Path) -> dict[str, list[str] | str]:
    from diffattn.train import load_config, train
    from diffattn.train.config import RunConfig

    tmp = Path(tempfile.mkdtemp())
    device = ["run.device=cpu"] if "device" in RunConfig.__dataclass_fields__ else []
    result: dict[str, list[str] | str] = {}
    for key, extra in RUNS.items():
        name = key.split("@")[0]
        if name == "finetune":
            source = tmp / "diffllama"
            extra = [*extra, f"model.pretrained={source if source.is_dir() else _diffllama(source)}"]
        try:
            cfg = load_config(f"tiny/{name}", ["run.steps=3", "run.progress=false", *device, *extra])
            res = train(cfg, out=tmp / key.replace("@", "_"))
            result[key] = [float.hex(v) for v in res["losses"]]
        except Exception as e:  # noqa: BLE001 - recorded: a run this checkout cannot make
            result[key] = f"error: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        print(key, result[key], flush=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    warnings.filterwarnings("ignore")
    losses(Path(sys.argv[1]))
