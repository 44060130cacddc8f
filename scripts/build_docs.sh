#!/usr/bin/env bash
# The API reference (`make docs`): mkdocs + mkdocstrings render the docstrings of src/diffattn by static analysis
# (griffe; nothing is imported, so torch is not needed) into site/, with every warning an error (--strict).
# The tools are the `docs` extra of pyproject.toml, installed alone into a small venv of their own (.venv-docs),
# not with the project and its dependencies.
#
#   scripts/build_docs.sh                       # python3 creates .venv-docs if needed; site/ is the output
#   PYTHON=python3.11 DOCS_VENV=/tmp/docs SITE_DIR=public scripts/build_docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${DOCS_VENV:-.venv-docs}"
SITE="${SITE_DIR:-site}"

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
# the docs extra's requirements, read from pyproject.toml (the one place they are listed)
"$VENV/bin/python" -c "import tomllib" 2>/dev/null || "$VENV/bin/python" -m pip install -q tomli
REQS=$("$VENV/bin/python" - <<'PY'
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["docs"]))
PY
)
STAMP="$VENV/.docs-reqs"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$REQS" ]; then
    echo "$REQS" | "$VENV/bin/python" -m pip install -q -r /dev/stdin
    echo "$REQS" > "$STAMP"
fi
"$VENV/bin/python" -m mkdocs build --strict --site-dir "$SITE"
echo "API reference: $SITE/index.html"
