#!/usr/bin/env bash
# check_doc_refs.sh — the project's documentation references hold:
#
#   1. every `docs/<file>.md#<anchor>` in compiler/ runtime/ templates/ tests/
#      tools/ bench/ docs/ README.md and Makefile names a file that exists
#      and has a heading with that anchor;
#   2. every relative link `](<file>.md#<anchor>)` in docs/*.md does too;
#   3. no source or document cites an outside design page by section
#      number any more (the phrase is built below, so this file does not
#      contain it); docs/design.md is the reference to cite.
#
# Anchors follow GitHub's rules: the heading's text, lowercased, every
# character but letters, digits, spaces, '-' and '_' dropped, spaces turned
# into '-'; a repeated heading gets -1, -2, ... Headings inside ``` fences
# do not count. (Non-ASCII letters are dropped here, where GitHub keeps
# them: keep headings that are cited in ASCII.)
#
# Like the other suites: one line per check, "ok   ..." or "FAIL ...", and
# "N passed, N failed" last; exit status 1 when any failed.
set -u
cd "$(dirname "$0")/.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

# anchors FILE: the GitHub anchors of FILE's headings, one a line
anchors() {
    awk '
        /^ *(```|~~~)/ { fence = !fence; next }
        fence { next }
        /^ *#+[ \t]/ {
            h = $0
            sub(/^[ ]*#+[ \t]+/, "", h)
            sub(/[ \t]+#+[ \t]*$/, "", h)     # closing #s
            sub(/[ \t]+$/, "", h)
            h = tolower(h)
            gsub(/[^a-z0-9 _-]/, "", h)
            gsub(/ /, "-", h)
            a = h
            if (h in seen) a = h "-" seen[h]
            seen[h]++
            print a
        }' "$1"
}

# check WHERE DOC ANCHOR: one reference
check() {
    local where=$1 doc=$2 anchor=$3
    if [ ! -f "$doc" ]; then
        bad "$where: $doc#$anchor: no file $doc"
        return
    fi
    local list="$TMP/anchors.$(echo "$doc" | tr / _)"
    [ -f "$list" ] || anchors "$doc" >"$list"
    if grep -qxF -- "$anchor" "$list"; then
        ok "$where: $doc#$anchor"
    else
        bad "$where: $doc#$anchor: $doc has no heading with this anchor"
    fi
}

# ── 1. docs/<file>.md#<anchor> anywhere in the project's sources and documents ──
paths=()
for p in compiler runtime templates tests tools bench docs README.md Makefile; do
    [ -e "$p" ] && paths+=("$p")
done
grep -rnoIE --exclude-dir=build 'docs/[A-Za-z0-9_./-]+\.md#[A-Za-z0-9_-]+' "${paths[@]}" \
    >"$TMP/refs" || true
while IFS= read -r line; do
    file=${line%%:*}
    rest=${line#*:}
    lineno=${rest%%:*}
    ref=${rest#*:}
    check "$file:$lineno" "${ref%%#*}" "${ref#*#}"
done <"$TMP/refs"

# ── 2. relative links between the pages of docs/ ──
for md in docs/*.md; do
    grep -noE '\]\([A-Za-z0-9_.-]+\.md#[A-Za-z0-9_-]+\)' "$md" | while IFS= read -r line; do
        echo "$md:$line"
    done
done >"$TMP/links"
while IFS= read -r line; do
    file=${line%%:*}
    rest=${line#*:}
    lineno=${rest%%:*}
    ref=${rest#*:}
    ref=${ref#](}
    ref=${ref%)}
    check "$file:$lineno" "docs/${ref%%#*}" "${ref#*#}"
done <"$TMP/links"

# ── 3. no citation of numbered sections of a design page outside the project ──
phrase="design"
phrase="$phrase section"
grep -rniI --exclude-dir=build --exclude-dir=.git -- "$phrase" . >"$TMP/phrase" || true
if [ -s "$TMP/phrase" ]; then
    while IFS= read -r line; do
        bad "\"$phrase\" cited (use docs/design.md#<anchor>): ${line#./}"
    done <"$TMP/phrase"
else
    ok "no \"$phrase\" citations outside build/ and .git/"
fi

[ -s "$TMP/refs" ] || bad "no docs/<file>.md#<anchor> reference found at all: is the pattern right?"

done_
