#!/usr/bin/env bash
# The oldest-versions lane of `make test`: the adapter, transformers, peft, timm and open_clip tests run a second
# time against the oldest supported releases of those pure-Python packages (constraints/oldest.txt), installed
# without their dependencies into a side folder that goes first on PYTHONPATH. torch and every compiled package stay
# those of the venv, so the lane tests exactly the lower bounds that pyproject.toml claims.
#
#   scripts/test_oldest.sh                  # uses .venv/bin/python
#   PY=/path/to/python scripts/test_oldest.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
PINS=constraints/oldest.txt
SIDE="${OLDEST_DIR:-.venv/oldest}"

if ! cmp -s "$PINS" "$SIDE/.pins" 2>/dev/null; then
    rm -rf "$SIDE"
    "$PY" -m pip install -q --no-deps --no-compile --target "$SIDE" -r "$PINS"
    cp "$PINS" "$SIDE/.pins"
fi
export PYTHONPATH="$PWD/$SIDE${PYTHONPATH:+:$PYTHONPATH}"

# The lane is only worth its minutes if the side folder really shadows the venv: check every pinned version.
"$PY" - "$PINS" <<'PY'
import sys
from importlib.metadata import version

pins = [l.split("#")[0].strip() for l in open(sys.argv[1])]
pins = [p.split("==") for p in pins if p]
got = {name: version(name) for name, _ in pins}
wrong = {n: (got[n], v) for n, v in pins if got[n] != v}
if wrong:
    sys.exit(f"oldest lane: the side folder does not shadow the venv: {wrong} (got, wanted)")
print("oldest lane:", ", ".join(f"{n} {v}" for n, v in got.items()))
PY

"$PY" -m pytest -q -p no:cacheprovider \
    tests/test_adapters.py tests/test_adapters_hf.py tests/test_adapters_peft.py tests/test_adapters_pretrained.py \
    tests/test_adapters_timm_open_clip.py tests/test_adapters_io.py tests/test_adapters_trainer.py \
    tests/test_models_timm.py tests/test_convert_open_clip.py tests/test_convert_checkpoints.py "$@"
