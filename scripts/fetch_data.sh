#!/usr/bin/env bash
# Fetch and prepare the offline datasets into <repo>/data (git-ignored): a thin wrapper around
# `diffattn data prepare` (src/diffattn/app/prepare.py does the work), kept for `make test`, `make demo` and scripts.
#
#   scripts/fetch_data.sh                         # everything, into <repo>/data (or $DIFFATTN_DATA when set)
#   scripts/fetch_data.sh emoji moby_dick         # some of it (names: diffattn data prepare --help)
#   DATA_DIR=/elsewhere scripts/fetch_data.sh     # then point diffattn at it with DIFFATTN_DATA=/elsewhere
#   FORCE=1 scripts/fetch_data.sh                 # fetch and prepare everything again
#   PYTHON=/path/to/python scripts/fetch_data.sh  # the interpreter to run it with (default: .venv/bin/python)
#
# Each step is idempotent and independent; the exit status is 1 if any step failed (the tests that need the
# missing data skip with the reason). Debian packages are installed with apt-get as root and, without root,
# fetched with apt-get download and unpacked into the data directory (--debian extract).
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${DATA_DIR:-${DIFFATTN_DATA:-$repo_root/data}}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo_root/.venv/bin/python" ]]; then PYTHON="$repo_root/.venv/bin/python"; else PYTHON=python3; fi
fi
args=(--root "$data_dir")
[[ "${FORCE:-0}" == 1 ]] && args+=(--force)
PYTHONPATH="$repo_root/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m diffattn data prepare "${args[@]}" "$@"
