#!/usr/bin/env bash
# run.sh — activation recomputation end to end (docs/design.md#activation-recomputation):
# trainers compiled with `recompute` against the same model compiled
# without it, built with `make trainer` against the CPU runtime and run on
# 1, 2 and 3 MPI ranks for 10 steps each:
#
#   1. the same training, bit for bit: every step's loss and grad_norm as
#      the trainer logs them (--log) are the strings the `none` trainer logs,
#      and the weights it exports after the last step are the same bytes;
#   2. the plan holds: the measured memory peak (mem_peak_bytes) equals
#      fsdpc --dump-memory's peak for that world (what the runtime
#      allocates), and is below `none`'s;
#   3. the recomputing trainers do recompute: their train.cu has recompute
#      ops (`OP("... (recompute)", ...)`), the `none` ones have none.
#
# Variants (shard-wide `recompute = MODE`, or a per-target argument, added
# to the examples with sed): tiny none, full, selective, every(2);
# tiny_llama none, full, selective, every(2); mlp none and `fully_shard fc1 (recompute
# = full)`, whose output only ReLU's backward reads again; on 2 ranks, tiny
# in bf16 (mixed_precision(param = bf16)), none and full, and the oracle's
# tiny_variants (bias-free LayerNorms, q/k/v biases only, qk_norm, GPT-2's
# scaled init), none, full and selective.
#
# Trainers and variants go to build/recompute/. Every test prints one line;
# the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
OUT=build/recompute
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=30
. tests/lib.sh

need_tools "recompute tests" mpicc mpirun python3
t0=$(date +%s)
mkdir -p $OUT
build_base
FSDPC=build/fsdpc
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }

# ── the variants: NAME SOURCE SED ──
shard_set() { echo "s/^shard {/shard {\\n  $1/"; }
VARIANTS=(
    "tiny_none examples/tiny.fsd s/^//"
    "tiny_full examples/tiny.fsd $(shard_set 'recompute = full')"
    "tiny_selective examples/tiny.fsd $(shard_set 'recompute = selective')"
    "tiny_every2 examples/tiny.fsd $(shard_set 'recompute = every(2)')"
    "tiny_llama_none examples/tiny_llama.fsd s/^//"
    "tiny_llama_full examples/tiny_llama.fsd $(shard_set 'recompute = full')"
    "tiny_llama_selective examples/tiny_llama.fsd $(shard_set 'recompute = selective')"
    "tiny_llama_every2 examples/tiny_llama.fsd $(shard_set 'recompute = every(2)')"
    "mlp_none examples/mlp.fsd s/^//"
    "mlp_fc1_full examples/mlp.fsd s/^  fully_shard fc1\$/  fully_shard fc1 (recompute = full)/"
    "tiny_bf16_none examples/tiny.fsd $(shard_set 'mixed_precision(param = bf16, reduce = fp32)')"
    "tiny_bf16_full examples/tiny.fsd $(shard_set 'mixed_precision(param = bf16, reduce = fp32)\n  recompute = full')"
    "variants_none tests/oracle/tiny_variants.fsd s/^//"
    "variants_full tests/oracle/tiny_variants.fsd $(shard_set 'recompute = full')"
    "variants_selective tests/oracle/tiny_variants.fsd $(shard_set 'recompute = selective')"
)
for v in "${VARIANTS[@]}"; do
    read -r name src script <<<"$v"
    sed "$script" "$src" >"$OUT/$name.fsd"
done
# a variant whose sed found nothing to change would test `none` against itself
for v in tiny_full tiny_selective tiny_every2 tiny_llama_full tiny_llama_selective tiny_llama_every2 mlp_fc1_full \
         tiny_bf16_full variants_full variants_selective; do
    grep -q "recompute" "$OUT/$v.fsd" || bad "variant $v: the sed script set no recompute (the example changed?)"
done

# ── the trainers, two builds at a time (the first alone: it brings fsdpc and
# the runtime up to date) ──
build_one() {
    $MAKE --no-print-directory -s trainer FSD="$OUT/$1.fsd" TRAINER="$OUT/$1" >"$TMP/build.$1" 2>&1
    echo $? >"$TMP/status.$1"
}
names=()
for v in "${VARIANTS[@]}"; do names+=("${v%% *}"); done
build_one "${names[0]}"
i=0
for n in "${names[@]:1}"; do
    build_one "$n" &
    i=$((i + 1))
    [ $((i % 2)) = 0 ] && wait
done
wait
built=0
for n in "${names[@]}"; do
    if [ "$(cat "$TMP/status.$n")" != 0 ] || [ ! -x "$OUT/$n/train" ]; then
        bad "build: make trainer FSD=$OUT/$n.fsd" "$TMP/build.$n"
    elif grep -q "warning:" "$TMP/build.$n"; then
        bad "build: $n has warnings" "$TMP/build.$n"
    else
        built=$((built + 1))
    fi
done
[ $built = ${#names[@]} ] || done_
ok "build: ${#names[@]} trainers without warnings ($(($(date +%s) - t0)) s)"

# 3. recompute ops in the programs that recompute, none in the others
for n in "${names[@]}"; do
    c=$(grep -c '^    OP("[^"]* (recompute)"' "$OUT/$n/train.cu")
    case $n in
    *_none) check "program $n: no recompute op" "[ $c = 0 ]" ;;
    *) check "program $n: $c recompute op lines in train.cu" "[ $c -gt 0 ]" ;;
    esac
done

D=$TMP/data.bin
build/fsdata synth "$D" --tokens 60000 --seed 3 >/dev/null

# run NAME W: 10 steps of NAME's trainer on W ranks, its log and exported
# weights in $TMP; the plan's memory for W beside them
run() {
    local n=$1 w=$2
    $FSDPC "$OUT/$n.fsd" --world "$w" --dump-memory >"$TMP/$n.w$w.mem" 2>&1 ||
        { bad "$n: fsdpc --world $w --dump-memory" "$TMP/$n.w$w.mem"; return 1; }
    mp "$w" "$OUT/$n/train" --data "$D" --steps 10 --log "$TMP/$n.w$w.log" \
        --export "$TMP/$n.w$w.st" --quiet >"$TMP/$n.w$w.out" 2>&1 ||
        { bad "$n on $w rank(s): the run failed" "$TMP/$n.w$w.out"; return 1; }
}

# compare NONE MODE W: checks 1 and 2 of MODE's run against NONE's
compare() {
    local none=$1 n=$2 w=$3 res
    if res=$(python3 - "$TMP/$none.w$w.log" "$TMP/$n.w$w.log" <<'EOF'
import re, sys
def fields(path):
    # the strings the trainer printed, not their values: equal strings, equal doubles to 9 digits
    out = []
    for line in open(path):
        m = re.search(r'"loss": ([^,]+), .*"grad_norm": ([^,]+),', line)
        if m:
            out.append(m.groups())
    return out
a, b = fields(sys.argv[1]), fields(sys.argv[2])
if len(a) != 10 or a != b:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"{len(a)} and {len(b)} steps; first difference at step {i}: "
          f"{a[i] if i < len(a) else None} vs {b[i] if i < len(b) else None}")
    sys.exit(1)
print(f"10 steps, loss {a[0][0]} -> {a[-1][0]}, grad_norm {a[-1][1]} at the last")
EOF
    ); then
        if cmp -s "$TMP/$none.w$w.st" "$TMP/$n.w$w.st"; then
            ok "bits $n = $none on $w rank(s): the same loss and grad_norm strings ($res) and exported weights"
        else
            bad "bits $n vs $none on $w rank(s): the logs agree ($res) but the exported weights differ"
        fi
    else
        bad "bits $n vs $none on $w rank(s): $res"
    fi
    local plan got base
    plan=$(sed -n 's/^  peak  *\([0-9,]*\) .*the trainer.s mem_peak_bytes/\1/p' "$TMP/$n.w$w.mem" | tr -d ,)
    got=$(sed -n 's/.*"mem_peak_bytes": \([0-9]*\).*/\1/p' "$TMP/$n.w$w.log" | tail -n 1)
    base=$(sed -n 's/.*"mem_peak_bytes": \([0-9]*\).*/\1/p' "$TMP/$none.w$w.log" | tail -n 1)
    if [ -n "$plan" ] && [ "$got" = "$plan" ] && [ "$got" -lt "$base" ]; then
        ok "memory $n on $w rank(s): measured peak $got bytes = the plan's, below $none's $base"
    else
        bad "memory $n on $w rank(s): measured peak ${got:-?} bytes, plan ${plan:-?}, $none's ${base:-?} (want = plan, < $none's)" "$TMP/$n.w$w.mem"
    fi
}

for w in 1 2 3; do
    for n in tiny_none tiny_full tiny_selective tiny_every2 tiny_llama_none tiny_llama_full \
             tiny_llama_selective tiny_llama_every2 mlp_none mlp_fc1_full; do
        run $n $w
    done
    # the none trainers' own peaks against their plans, so a plan that is off
    # for every mode alike is caught too
    for n in tiny_none tiny_llama_none mlp_none; do
        plan=$(sed -n 's/^  peak  *\([0-9,]*\) .*the trainer.s mem_peak_bytes/\1/p' "$TMP/$n.w$w.mem" | tr -d ,)
        got=$(sed -n 's/.*"mem_peak_bytes": \([0-9]*\).*/\1/p' "$TMP/$n.w$w.log" | tail -n 1)
        check "memory $n on $w rank(s): measured peak ${got:-?} bytes = the plan's ${plan:-?}" \
            "[ -n \"$plan\" ] && [ \"$got\" = \"$plan\" ]"
    done
    for n in tiny_full tiny_selective tiny_every2; do compare tiny_none $n $w; done
    for n in tiny_llama_full tiny_llama_selective tiny_llama_every2; do compare tiny_llama_none $n $w; done
    compare mlp_none mlp_fc1_full $w
done
# bf16 compute: the recompute ops round what they store as forward did
run tiny_bf16_none 2 && run tiny_bf16_full 2 && compare tiny_bf16_none tiny_bf16_full 2
# the layer options: bias-free norms, qk_norm's per-head RMSNorms run again
if run variants_none 2; then
    for n in variants_full variants_selective; do run $n 2 && compare variants_none $n 2; done
fi

echo "     (recompute took $(($(date +%s) - t0)) s)" >&2
done_
