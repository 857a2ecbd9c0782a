#!/usr/bin/env bash
# demo.sh — what `make demo` shows:
#   1. every example through the front end, summarised;
#   2. tiny.fsd compiled to train.cu and built against the CPU runtime;
#   3. a synthetic corpus with learnable structure (tools/fsdata);
#   4. sharded training of tiny on 2 MPI ranks, the loss falling.
set -eu
cd "$(dirname "$0")/.."
FSDPC=${FSDPC:-build/fsdpc}
MAKE=${MAKE:-make}

echo "== the examples"
for f in examples/*.fsd; do
    "$FSDPC" "$f" --check
    "$FSDPC" "$f" --dump-model | awk -v f="$f" '
        /^model /      { name = $2 }
        /^  parameters/ { params = $2 }
        /^shard groups/ { g = 1; next }
        g && NF == 0    { g = 0 }
        g              { groups++ }
        END { printf "  %-26s %-12s %15s parameters  %3d shard groups\n", f, name, params, groups }'
done

echo
echo "== compile examples/tiny.fsd and build its CPU trainer"
$MAKE --no-print-directory -s trainer FSD=examples/tiny.fsd BACKEND=cpu
mkdir -p build/demo
build/fsdata synth build/demo/synth.bin --tokens 400000 --seed 1

mpiflags="--oversubscribe"
[ "$(id -u)" = 0 ] && mpiflags="$mpiflags --allow-run-as-root"
echo
echo "== train tiny on 2 ranks: mpirun -np 2 build/tiny/cpu/train --data build/demo/synth.bin"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} mpirun $mpiflags -np 2 \
    build/tiny/cpu/train --data build/demo/synth.bin --steps 60 --log build/demo/log.json
echo
awk -F'"loss": ' 'NR == 1 { split($2, a, ","); first = a[1] } { split($2, a, ","); last = a[1] }
    END { printf "loss %.4f -> %.4f over %d steps (log: build/demo/log.json)\n", first, last, NR }' \
    build/demo/log.json
echo "Inspect the plan: $FSDPC examples/tiny.fsd --world 2 --dump-schedule --dump-memory"
