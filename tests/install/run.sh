#!/usr/bin/env bash
# run.sh — `make install` into a temporary prefix, then build and run an
# emitted trainer outside the repository with only what was installed
# (fsdpc, fsdata, fsdrt.h, the runtime library and its pkg-config file).
# Prints one line per check and "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=30
. tests/lib.sh

if make --no-print-directory -s install PREFIX="$TMP/prefix" >"$TMP/log" 2>&1; then
    ok "install: make install PREFIX=..."
else
    bad "install: make install failed" "$TMP/log"
    echo "$pass passed, $fail failed"
    exit 1
fi
for f in bin/fsdpc bin/fsdata include/fsdpc/fsdrt.h lib/libfsdrt_cpu.a lib/libfsdrt_cpu64.a \
         lib/pkgconfig/fsdrt-cpu.pc lib/pkgconfig/fsdrt-cpu64.pc; do
    if [ -e "$TMP/prefix/$f" ]; then ok "install: $f"; else bad "install: $f missing"; fi
done

mkdir "$TMP/outside"
cp examples/mlp.fsd "$TMP/outside/"
(
    cd "$TMP/outside" || exit 1
    export PATH="$TMP/prefix/bin:$PATH" PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig"
    fsdpc mlp.fsd -o train.cu &&
        mpicc -x c train.cu -x none $(pkg-config --cflags --libs fsdrt-cpu) -o train &&
        fsdata synth data.bin --tokens 20000 >/dev/null &&
        OMP_NUM_THREADS=1 ./train --data data.bin --steps 2 --quiet --log log.json
) >"$TMP/out" 2>&1
if [ $? = 0 ] && [ "$(wc -l <"$TMP/outside/log.json")" = 2 ]; then
    ok "install: an emitted trainer builds and trains outside the repository"
else
    bad "install: building outside the repository failed" "$TMP/out"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
