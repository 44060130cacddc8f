#!/usr/bin/env bash
# Install diffattn the way a user does and use it from outside the checkout:
#   1. build the wheel from a clean copy of the working tree (tracked + untracked, not ignored files);
#   2. check it ships the LICENSE and the packaged recipes;
#   3. create a clean venv (no system site-packages), install torch from TORCH_SPEC, then the wheel with [train];
#   4. from an empty temporary folder, with DIFFATTN_DATA in a temporary folder and no PYTHONPATH:
#      `diffattn --version`, `diffattn data prepare emoji`, `diffattn data list`, the README's "Quick start"
#      Python block, and `diffattn train tiny/clip` for a few steps on the emoji just prepared.
#
#   scripts/check_wheel.sh                 # exit status 0 when every step passed, else the failing step's
#   KEEP=1 scripts/check_wheel.sh          # keep the temporary folder (printed) to look at
#   PYTHON=python3.12 scripts/check_wheel.sh          # the interpreter for the build and the venv
#   TORCH_SPEC="torch==2.14.1 torchvision==0.29.1"     # what is installed first (default: the Makefile's pin)
#   TORCH_FROM=.venv/bin/python scripts/check_wheel.sh  # instead, hard-link the torch and torchvision installed
#                                          # for that interpreter (same Python version) and the packages they require
#                                          # into the clean venv: no ~4 GB download and unpack; everything else still
#                                          # comes from the wheel's own requirements
#   DEBIAN=auto scripts/check_wheel.sh     # how `data prepare` gets the Debian packages (default extract: no root,
#                                          # nothing outside the temporary folder changes)
#   TRAIN_STEPS=10                         # steps of the tiny training run
#
# Offline here: pip resolves torch and the extras from the local wheels and index that pip.conf names; the
# Debian packages come from the configured apt mirror.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
DEBIAN="${DEBIAN:-extract}"
TRAIN_STEPS="${TRAIN_STEPS:-10}"
work="$(mktemp -d "${TMPDIR:-/tmp}/diffattn-wheel.XXXXXX")"
step_name="setup"
t_start=$SECONDS
t_step=$SECONDS

finish() {
    local rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "check_wheel: FAILED at step '$step_name' (exit $rc) after $((SECONDS - t_start)) s" >&2
    fi
    if [[ "${KEEP:-0}" == 1 || $rc -ne 0 ]]; then
        echo "check_wheel: files kept in $work" >&2
    else
        rm -rf "$work"
    fi
    exit $rc
}
trap finish EXIT

step() {
    if [[ "$step_name" != setup ]]; then echo "check_wheel: $step_name: ok ($((SECONDS - t_step)) s)"; fi
    step_name="$1"
    t_step=$SECONDS
    echo "check_wheel: $step_name ..."
}

# ---------------------------------------------------------------------------------------------------- build
step "build the wheel"
mkdir -p "$work/src" "$work/dist"
(cd "$repo_root" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) \
    | tar -xf - -C "$work/src"
"$PYTHON" -m pip wheel -q --no-deps -w "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
    || { tail -n 30 "$work/build.log" >&2; exit 1; }
wheel="$(ls "$work"/dist/diffattn-*.whl)"
echo "check_wheel: built $(basename "$wheel")"

step "check the wheel's contents"
"$PYTHON" - "$wheel" "$repo_root" <<'EOF'
import sys, zipfile
from pathlib import Path

wheel, repo = sys.argv[1], Path(sys.argv[2])
names = set(zipfile.ZipFile(wheel).namelist())
licenses = [n for n in names if n.endswith("LICENSE") and ".dist-info/" in n]
assert licenses, "no LICENSE in the wheel's .dist-info"
text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
assert "Apache License" in text and "Version 2.0" in text, "the wheel's LICENSE is not the Apache-2.0 text"
recipes = sorted(p.relative_to(repo / "src").as_posix() for p in (repo / "src/diffattn/configs").rglob("*.yaml"))
missing = [r for r in recipes if r not in names]
assert not missing, f"recipes missing from the wheel: {missing}"
assert "diffattn/detect/cfg/yolo26n-diffattn.yaml" in names, "the YOLO model YAMLs are missing"
assert "diffattn/ops/dispatch.json" in names, "backend='auto''s dispatch table (diffattn/ops/dispatch.json) is missing"
print(f"check_wheel: {len(recipes)} recipes and {licenses[0]} in the wheel")
EOF

# -------------------------------------------------------------------------------------------------- install
step "install into a clean venv"
"$PYTHON" -m venv "$work/venv"
venv_py="$work/venv/bin/python"
# --no-compile: byte-compiling all of torch and transformers up front costs minutes on a small machine; Python
# compiles what a command imports when it imports it
if [[ -n "${TORCH_FROM:-}" ]]; then
    # link torch, torchvision and what they require (recursively, as installed there) file by file from RECORD
    site="$("$venv_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$TORCH_FROM" - "$site" "$("$venv_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" <<'PY'
import importlib.metadata as md
import os
import re
import shutil
import sys
from pathlib import Path

target, version = Path(sys.argv[1]), sys.argv[2]
if "%d.%d" % sys.version_info[:2] != version:
    sys.exit(f"check_wheel: TORCH_FROM runs Python {sys.version_info[0]}.{sys.version_info[1]}, the venv {version}")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


installed = {norm(d.metadata["Name"]): d for d in md.distributions()}
todo, done, seen = [("torch", ""), ("torchvision", "")], set(), set()
while todo:  # (distribution, one of its extras or ""): follow its requirements, those of that extra too
    name, extra = todo.pop()
    name = norm(name)
    if (name, extra) in done or name not in installed:
        continue
    done.add((name, extra))
    seen.add(name)
    for req in installed[name].requires or []:
        marker = re.search(r"""\bextra\s*==\s*["']([^"']+)""", req)
        if (marker.group(1) if marker else "") != extra:  # base requirements go with (name, ""), an extra's with it
            continue
        m = re.match(r"([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", req)
        todo += [(m.group(1), "")] + [(m.group(1), e.strip()) for e in (m.group(2) or "").split(",") if e.strip()]
if {"torch", "torchvision"} - seen:
    sys.exit(f"check_wheel: {sys.executable} has no {' or '.join(sorted({'torch', 'torchvision'} - seen))}")
n = 0
for name in sorted(seen):
    dist = installed[name]
    for rel in dist.files or []:
        src = Path(dist.locate_file(rel))
        if ".." in Path(rel).parts or not src.is_file():  # console scripts in bin/ name the other interpreter
            continue
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:  # another file system
            shutil.copy2(src, dest)
        n += 1
print(f"check_wheel: linked {n} files of {len(seen)} distributions from {sys.executable}: {', '.join(sorted(seen))}")
PY
else
    # shellcheck disable=SC2086  # TORCH_SPEC is a list of requirements
    "$venv_py" -m pip install -q --no-compile $TORCH_SPEC >"$work/install.log" 2>&1 \
        || { tail -n 30 "$work/install.log" >&2; exit 1; }
fi
"$venv_py" -m pip install -q --no-compile "${wheel}[train]" >>"$work/install.log" 2>&1 \
    || { tail -n 30 "$work/install.log" >&2; exit 1; }

# ------------------------------------------------------------------------------------- use it from elsewhere
mkdir -p "$work/run" "$work/data"
cd "$work/run"
unset PYTHONPATH
export DIFFATTN_DATA="$work/data" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PATH="$work/venv/bin:$PATH"

step "diffattn --version"
version="$(diffattn --version)"
expected="diffattn $("$venv_py" -c 'import importlib.metadata as m; print(m.version("diffattn"))')"
[[ "$version" == "$expected" ]] || { echo "check_wheel: got '$version', expected '$expected'" >&2; exit 1; }
where="$("$venv_py" -c 'import diffattn; print(diffattn.__file__)')"
[[ "$where" == "$work/venv/"* ]] || { echo "check_wheel: diffattn imported from $where, not the venv" >&2; exit 1; }
echo "check_wheel: $version from $where"

step "diffattn data prepare emoji"
diffattn data prepare emoji --debian "$DEBIAN"
diffattn data list | tee "$work/list.txt"
grep -q "^data directory: $work/data (from \$DIFFATTN_DATA)" "$work/list.txt"
grep -qE "^emoji +captions +yes " "$work/list.txt"

step "README quick start"
"$venv_py" - "$repo_root/README.md" > quick_start.py <<'EOF'
import re, sys

text = open(sys.argv[1], encoding="utf-8").read()
section = text[text.index("## Quick start"):]
print(re.search(r"```python\n(.*?)```", section, re.S).group(1))
EOF
"$venv_py" quick_start.py
test -f runs/diffclip_tiny/config.json

step "diffattn train tiny/clip ($TRAIN_STEPS steps)"
diffattn train tiny/clip --out runs/tiny_clip --set "run.steps=$TRAIN_STEPS" --set "run.ckpt_every=$TRAIN_STEPS" \
    --set run.log_every=1 --set run.progress=false --set optim.warmup_steps=2  # a budget shorter than the recipe's warm-up
for f in config.yaml metrics.jsonl model/config.json; do
    test -f "runs/tiny_clip/$f" || { echo "check_wheel: runs/tiny_clip/$f missing" >&2; exit 1; }
done
ls runs/tiny_clip/tensorboard/events.* >/dev/null
[[ "$(wc -l < runs/tiny_clip/metrics.jsonl)" -eq "$TRAIN_STEPS" ]]

step "done"
echo "check_wheel: all steps passed in $((SECONDS - t_start)) s"
