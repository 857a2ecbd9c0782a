#!/usr/bin/env bash
# demo.sh — what `make demo` shows: every example compiled by the front end,
# with its typed model summarised. (Training the tiny model on two CPU ranks
# joins this demo when the trainer lands.)
set -eu
cd "$(dirname "$0")/.."
FSDPC=${FSDPC:-build/fsdpc}
for f in examples/*.fsd; do
    "$FSDPC" "$f" --check
    "$FSDPC" "$f" --dump-model | awk -v f="$f" '
        /^model /      { name = $2 }
        /^  parameters/ { params = $2 }
        /^shard groups/ { g = 1; next }
        g && NF == 0    { g = 0 }
        g              { groups++ }
        END { printf "%-26s %-12s %15s parameters  %3d shard groups\n", f, name, params, groups }'
done
echo
echo "Inspect one model in full with: $FSDPC examples/tiny.fsd --dump-model"
