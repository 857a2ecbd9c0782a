#!/bin/sh
# blas.sh — the CPU runtime's matrix-product library (docs/performance.md#choosing-the-blas).
#
#   tools/blas.sh default    prints the library to build with on this CPU:
#                            the first of tools/blas.table's row for it that
#                            is installed (mkl: with MKLROOT set), openblas
#                            for a CPU the table has no row for
#   tools/blas.sh wanted     prints the Debian package tools/setup.sh
#                            installs for a faster library the row names
#   tools/blas.sh cpu        prints this CPU as the table keys it
#   tools/blas.sh measure    builds tools/blasbench.c against every library
#                            here, checks each one's products against a
#                            float64 reference and times the bench models'
#                            shapes on one thread (`make blas-bench`)
#   tools/blas.sh check      the same checks without the timing (make test)
#
# Libraries: openblas (Debian's libopenblas-dev), dnnl (oneDNN, Debian's
# libdnnl-dev), mkl (a folder MKLROOT with include/mkl.h and
# lib/libmkl_rt.so*, as PyPI's mkl-include and mkl-devel install it into a
# virtual environment). BLIS (Debian's libblis-dev) is not offered: it was
# the slowest on both CPUs measured (tools/blas.table).
set -e
cd "$(dirname "$0")/.."

cpu() {
    awk -F': *' '/^vendor_id/ && !v { v = $2 } /^cpu family/ && !f { f = $2 }
                 /^model[ \t]*:/ && !m { m = $2 }
                 END { printf "%s %s %s\n", v, f, m }' /proc/cpuinfo 2>/dev/null
}

# has LIB: the library's header and shared object are here
has() {
    case $1 in
    openblas) pkg-config --exists openblas 2>/dev/null ||
                  ls /usr/include/*/openblas*/cblas.h /usr/include/openblas/cblas.h >/dev/null 2>&1 ;;
    dnnl) [ -e /usr/include/oneapi/dnnl/dnnl.h ] && ls /usr/lib/*/libdnnl.so >/dev/null 2>&1 ;;
    mkl) [ -n "$MKLROOT" ] && [ -e "$MKLROOT/include/mkl.h" ] &&
             ls "$MKLROOT"/lib/libmkl_rt.so* >/dev/null 2>&1 ;;
    *) return 1 ;;
    esac
}

# order: this CPU's row of tools/blas.table, fastest first (empty: no row)
order() {
    set -- $(cpu)
    awk -v v="$1" -v f="$2" -v m="$3" '!/^#/ && $1 == v && $2 == f && $3 == m {
        for (i = 4; i <= NF && $i ~ /^(openblas|dnnl|mkl)$/; i++) printf "%s ", $i; exit }' \
        tools/blas.table
}

default() {
    for lib in $(order); do
        if has "$lib"; then
            echo "$lib"
            return
        fi
    done
    echo openblas
}

# wanted: the Debian package of a library the row puts before every one
# that is here (tools/setup.sh installs it); MKL is not Debian's
wanted() {
    for lib in $(order); do
        has "$lib" && return
        if [ "$lib" = dnnl ]; then
            echo libdnnl-dev
            return
        fi
    done
}

# bench MODE: build and run tools/blasbench.c per library
bench() {
    out=build/blas
    mkdir -p "$out"
    status=0
    for lib in openblas dnnl mkl; do
        if ! has "$lib"; then
            echo "blas: $lib not here, skipped"
            continue
        fi
        f=$(${MAKE:-make} -s --no-print-directory blas-flags BLAS="$lib")
        # shellcheck disable=SC2086  # flag lists
        if ! gcc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -fopenmp -Iruntime ${f%%|*} -o "$out/blasbench_$lib" \
                tools/blasbench.c runtime/blas.c ${f#*|} -lm 2>"$out/build_$lib.log"; then
            echo "blas: $lib: build failed:" >&2
            cat "$out/build_$lib.log" >&2
            status=1
            continue
        fi
        # the timings on one thread; the checks on the machine's threads (a
        # call from inside an OpenMP loop is one of them)
        if [ "$1" = time ]; then
            OMP_NUM_THREADS=1 "$out/blasbench_$lib" "$lib" time || rc=$?
        else
            "$out/blasbench_$lib" "$lib" check || rc=$?
        fi
        if [ "${rc:-0}" != 0 ]; then
            echo "FAIL blas $lib: $out/blasbench_$lib $1 exited with status $rc"
            status=1
            rc=0
        fi
    done
    return $status
}

case $1 in
default) default ;;
wanted) wanted ;;
cpu) cpu ;;
measure) echo "blas: this CPU: $(cpu) (tools/blas.table row: $(default))"; bench time ;;
check) bench check ;;
*) echo "usage: tools/blas.sh default|wanted|cpu|measure|check" >&2; exit 2 ;;
esac
