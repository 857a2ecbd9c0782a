#!/usr/bin/env bash
# sim.sh — tests of the cost model and simulator (compiler/sim.c: --sim and
# --trace). tests/run.sh runs it as one of its sections; it runs alone too
# (FSDPC=build/fsdpc tests/sim.sh). Like run.sh, every test prints one line
# and the last line is "N passed, N failed".
#
#   a. prefetching never predicts more exposed communication than not
#      prefetching, for every example on 2, 8 and 64 ranks;
#   b. the collective bytes per step that --sim and --dump-schedule report
#      equal the FSDP formula, computed here from --dump-model's parameter
#      counts and the plan's padding rules, for several worlds and policies;
#   c. --trace writes valid JSON (python3 -m json.tool) with one track per
#      stream, whose slices do not overlap on any track;
#   d. plausibility: GPT-2 124M on one H100 predicts an MFU of 20-80%;
#   e. contention: on one rank every op takes exactly its roofline time;
#      beside collectives no op runs faster than that, nor slower than the
#      most the collectives can take from it over the time they overlap it;
#   f. recomputation: GPT-2 with `recompute = full` counts the same model
#      FLOPs for MFU as without it, more for HFU, takes longer and peaks
#      lower, and its trace names the recompute ops;
#   g. the links: with one NIC a node, all-gathers and reduce-scatters
#      together never move more bytes in a step than that NIC carries; one
#      communicator runs its collectives one at a time, two communicators'
#      collectives share the links (docs/simulator.md#the-links);
#   and the --sim command line: its errors, and a variant of a preset's GPU
#   (hbm_gbs, hbm_gib, nvlink_gbs).
set -u
cd "$(dirname "$0")/.."

FSDPC=${FSDPC:-build/fsdpc}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

# field LABEL FILE: the first number after LABEL in a --sim summary, commas
# dropped ("  exposed comm      3.234 ms" → 3.234)
field() { sed -n "s/^  $1  *\([0-9][0-9.,]*\).*/\1/p" "$2" | head -n 1 | tr -d ,; }
# bytes LABEL FILE: the "N bytes per rank" of the all-gather or
# reduce-scatter line of a --sim summary
bytes() { sed -n "s/^  $1 .* \([0-9][0-9,]*\) bytes per rank$/\1/p" "$2" | tr -d ,; }

# The --sim spec for W ranks: one node up to 8, nodes of 8 beyond.
spec() { if [ "$1" -le 8 ]; then echo "h100:gpus=$1"; else echo "h100:nodes=$(($1 / 8))"; fi; }

# variant IN OUT SED-SCRIPT...: a copy of an example with its shard section
# edited; `set NAME = VALUE` lines are added right after `shard {`.
variant() {
    local in=$1 out=$2
    shift 2
    sed "$@" "$in" >"$out"
}

# ── a. prefetch never exposes more communication ──
# Prefetching issues the same all-gathers in the same order, only earlier.
# Were compute's times fixed the replay would be monotone and no wait could
# grow; as collectives slow the compute beside them (section e), compute
# that an earlier all-gather slows issues its reduce-scatters later, so
# this is a property of these examples rather than a theorem. The examples'
# own prefetch lines are replaced (or added when they have none).
for f in examples/*.fsd; do
    name=$(basename "$f" .fsd)
    for pf in 0 1 2; do
        variant "$f" "$TMP/$name.p$pf.fsd" -e '/^[[:space:]]*prefetch[[:space:]]*(/d' \
            -e "s/^shard {/shard {\n  prefetch(forward = $pf, backward = $pf)/"
    done
    if ! grep -q "prefetch(forward = 0, backward = 0)" "$TMP/$name.p0.fsd"; then
        bad "sim prefetch $name: no shard section to set prefetch in"
        continue
    fi
    for W in 2 8 64; do
        e=()
        err=""
        for pf in 0 1 2; do
            if "$FSDPC" "$TMP/$name.p$pf.fsd" --sim "$(spec $W)" >"$TMP/out" 2>"$TMP/err"; then
                e[$pf]=$(field "exposed comm" "$TMP/out")
            else
                err="prefetch $pf: fsdpc failed"
            fi
        done
        if [ -n "$err" ]; then
            bad "sim prefetch $name W=$W: $err" "$TMP/err"
        elif [ -z "${e[0]}" ] || [ -z "${e[1]}" ] || [ -z "${e[2]}" ]; then
            bad "sim prefetch $name W=$W: no exposed comm in the summary" "$TMP/out"
        elif awk -v a="${e[0]}" -v b="${e[1]}" -v c="${e[2]}" 'BEGIN { exit !(b <= a && c <= a) }'; then
            ok "sim prefetch $name W=$W: exposed comm ${e[2]} (2 ahead), ${e[1]} (1) <= ${e[0]} ms (none)"
        else
            bad "sim prefetch $name W=$W: exposed comm ${e[2]} (2 ahead), ${e[1]} (1), ${e[0]} ms (none)"
        fi
    done
done
# ... and the comparison is not vacuous: on 8 H100s GPT-2's all-gathers
# are hidden by prefetching and exposed without it.
"$FSDPC" "$TMP/gpt2.p0.fsd" --sim h100 >"$TMP/p0" 2>&1
"$FSDPC" "$TMP/gpt2.p1.fsd" --sim h100 >"$TMP/p1" 2>&1
a=$(field "exposed comm" "$TMP/p0")
b=$(field "exposed comm" "$TMP/p1")
if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { exit !(b < a) }'; then
    ok "sim prefetch gpt2 W=8 hides communication: $b < $a ms"
else
    bad "sim prefetch gpt2 W=8 hides communication: '$b' vs '$a' ms" "$TMP/p0"
fi

# ── b. bytes on the wire equal the FSDP formula ──
# From --dump-model alone: each group's flat size is the sum of its
# parameters' sizes, each rounded up to 16 elements (PARAM_ALIGN_ELEMS), then
# padded to a multiple of W. A ring all-gather or reduce-scatter moves
# (W-1)/W of it per rank: padded - padded/W elements, in the param dtype for
# all-gathers and the reduce dtype for reduce-scatters. Per micro-batch a
# group is all-gathered once in forward and, if it reshards after forward
# (non-root groups unless reshard_after_forward = false), once more in
# backward; every example's groups hold a Linear, whose weight backward
# reads. Reduce-scatters: once per micro-batch accumulating sharded, once
# per step accumulating unsharded.
expected() { # MODEL_DUMP W → "allgather_bytes reduce_scatter_bytes"
    awk -v W="$2" '
    function dtb(t) { return t == "fp32" ? 4 : 2 }
    NF >= 4 && $(NF - 1) == "group" && /\[/ {
        n = $(NF - 3); gsub(",", "", n)
        flat[$NF] += int((n + 15) / 16) * 16
    }
    /^  reshard_after_forward = / { reshard = $3 }
    /^  mixed_precision\(/ {
        s = $0; sub(/.*param = /, "", s); sub(/[,)].*/, "", s); pdt = s
        s = $0; sub(/.*reduce = /, "", s); sub(/[,)].*/, "", s); rdt = s
    }
    /^  accumulate = / { acc = $3 }
    /^  grad_accum = / { micro = $3 }
    END {
        for (g in flat) {
            padded = int((flat[g] + W - 1) / W) * W
            moved = padded - padded / W
            gathers = (reshard != "false" && g != "root") ? 2 : 1
            ag += moved * dtb(pdt) * gathers * micro
            rs += moved * dtb(rdt) * (acc == "unsharded" ? 1 : micro)
        }
        printf "%.0f %.0f\n", ag, rs
    }' "$1"
}
for f in examples/*.fsd; do
    name=$(basename "$f" .fsd)
    cp "$f" "$TMP/$name.default.fsd"
    variant "$f" "$TMP/$name.keep.fsd" -e '/^[[:space:]]*reshard_after_forward/d' \
        -e 's/^shard {/shard {\n  reshard_after_forward = false/'
    variant "$f" "$TMP/$name.unsharded.fsd" -e '/^[[:space:]]*accumulate[[:space:]]*=/d' \
        -e '/^[[:space:]]*grad_accum[[:space:]]*=/d' \
        -e 's/^shard {/shard {\n  accumulate = unsharded/' \
        -e 's/^train {/train {\n  grad_accum = 3/'
    for v in default keep unsharded; do
        in=$TMP/$name.$v.fsd
        if ! "$FSDPC" "$in" --dump-model >"$TMP/model" 2>"$TMP/err"; then
            bad "sim bytes $name ($v): --dump-model failed" "$TMP/err"
            continue
        fi
        for W in 2 3 8 64; do
            read -r want_ag want_rs < <(expected "$TMP/model" $W)
            "$FSDPC" "$in" --sim "$(spec $W)" >"$TMP/sim" 2>"$TMP/err"
            "$FSDPC" "$in" --dump-schedule --world $W >"$TMP/sched" 2>>"$TMP/err"
            got_ag=$(bytes all-gather "$TMP/sim")
            got_rs=$(bytes reduce-scatter "$TMP/sim")
            sched=$(sed -n 's/^  per rank per step: all-gather \([0-9,]*\) bytes, reduce-scatter \([0-9,]*\) bytes$/\1 \2/p' \
                "$TMP/sched" | tr -d ,)
            if [ "$got_ag $got_rs" = "$want_ag $want_rs" ] && [ "$sched" = "$want_ag $want_rs" ]; then
                ok "sim bytes $name ($v) W=$W: all-gather $want_ag, reduce-scatter $want_rs"
            else
                echo "expected (formula): $want_ag $want_rs" >"$TMP/why"
                echo "--sim reports:      $got_ag $got_rs" >>"$TMP/why"
                echo "--dump-schedule:    $sched" >>"$TMP/why"
                cat "$TMP/err" >>"$TMP/why"
                bad "sim bytes $name ($v) W=$W" "$TMP/why"
            fi
        done
    done
done

# ── c. the trace: valid JSON, one track per stream ──
if ! command -v python3 >/dev/null 2>&1; then
    echo "skip sim trace tests: python3 not found (it checks the JSON)"
else
    cat >"$TMP/check_trace.py" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
assert names == {0: "compute", 1: "all-gather", 2: "reduce-scatter"}, names
slices = [e for e in ev if e["ph"] == "X"]
assert all(e["pid"] == 0 and e["tid"] in names for e in slices)
assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in slices)
for tid in names:
    track = sorted((e for e in slices if e["tid"] == tid), key=lambda e: e["ts"])
    assert track, "no slices on track %s" % names[tid]
    for a, b in zip(track, track[1:]):   # one thing at a time on a stream
        assert b["ts"] >= a["ts"] + a["dur"] - 0.002, (a, b)
counts = {tid: sum(1 for e in slices if e["tid"] == tid) for tid in names}
gathers = sum(1 for e in slices if e["name"].startswith("all_gather "))
reduces = sum(1 for e in slices if e["name"].startswith("reduce_scatter "))
assert all("bytes" in e["args"] for e in slices if e["tid"] != 0)
print(counts[0], gathers, reduces, d["traceEvents"][0]["args"]["name"])
PY
    for f in examples/*.fsd; do
        name=$(basename "$f" .fsd)
        rm -f "$TMP/trace.json"
        if ! "$FSDPC" "$f" --sim h100 --trace "$TMP/trace.json" >/dev/null 2>"$TMP/err"; then
            bad "sim trace $name: fsdpc failed" "$TMP/err"
        elif ! python3 -m json.tool "$TMP/trace.json" >/dev/null 2>"$TMP/err"; then
            bad "sim trace $name: not valid JSON" "$TMP/err"
        elif ! python3 "$TMP/check_trace.py" "$TMP/trace.json" >"$TMP/counts" 2>"$TMP/err"; then
            bad "sim trace $name: tracks" "$TMP/err"
        else
            # as many collective slices as the schedule has collectives
            "$FSDPC" "$f" --dump-schedule >"$TMP/sched"
            ag=$(grep -c ' all_gather ' "$TMP/sched")
            rs=$(grep -c ' reduce_scatter ' "$TMP/sched")
            read -r nc nag nrs _ <"$TMP/counts"
            if [ "$nag $nrs" = "$ag $rs" ]; then
                ok "sim trace $name: valid JSON, 3 tracks, $nc compute, $nag all-gather, $nrs reduce-scatter slices"
            else
                bad "sim trace $name: $nag all-gather and $nrs reduce-scatter slices; the schedule has $ag and $rs"
            fi
        fi
    done
    # without --sim: h100 nodes of 8 at the --world size
    "$FSDPC" examples/tiny.fsd --world 12 --trace "$TMP/t12.json" --dump-plan -o "$TMP/plan" >"$TMP/out" 2>&1
    if [ $? = 0 ] && [ ! -s "$TMP/out" ] && python3 "$TMP/check_trace.py" "$TMP/t12.json" >"$TMP/counts" 2>&1 &&
        grep -q "on 2 x 8 H100 SXM 80GB (world 12)" "$TMP/counts"; then
        ok "sim trace without --sim: 2 nodes of 8 H100s at --world 12"
    else
        bad "sim trace without --sim" "$TMP/counts"
    fi
fi
# an error writes no trace
rm -f "$TMP/none.json"
"$FSDPC" examples/tiny.fsd --sim h900 --trace "$TMP/none.json" >/dev/null 2>&1
if [ ! -e "$TMP/none.json" ] && ! ls "$TMP"/none.json.tmp.* >/dev/null 2>&1; then
    ok "sim trace: an error writes no trace"
else
    bad "sim trace: an error wrote a trace"
fi

# ── d. plausibility ──
# GPT-2 124M on one H100: a model predicting outside 20-80% MFU is broken
# (a unit slip, a wrong peak, FLOPs counted per sample instead of per step).
"$FSDPC" examples/gpt2.fsd --sim h100:gpus=1 >"$TMP/g1" 2>&1
mfu=$(field MFU "$TMP/g1")
if [ -n "$mfu" ] && awk -v m="$mfu" 'BEGIN { exit !(m >= 20 && m <= 80) }'; then
    ok "sim plausible: gpt2 on 1 H100 predicts MFU $mfu%"
else
    bad "sim plausible: gpt2 on 1 H100 predicts MFU '$mfu'% (expected 20-80%): the cost model is absurd" "$TMP/g1"
fi
# one rank: no collective costs anything, nothing is exposed
if [ "$(field "exposed comm" "$TMP/g1")" = "0.000" ] && [ "$(bytes all-gather "$TMP/g1")" = 0 ] &&
    [ "$(bytes reduce-scatter "$TMP/g1")" = 0 ]; then
    ok "sim one rank: no communication"
else
    bad "sim one rank: communication on one rank" "$TMP/g1"
fi
# more, faster GPUs: B200 predicts a shorter step than A100 for Llama 3 8B
"$FSDPC" examples/llama3_8b.fsd --sim a100 >"$TMP/a" 2>&1
"$FSDPC" examples/llama3_8b.fsd --sim b200 >"$TMP/b" 2>&1
a=$(field step "$TMP/a")
b=$(field step "$TMP/b")
if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { exit !(b < a) }'; then
    ok "sim presets: llama3_8b steps in $b ms on 8 B200s, $a ms on 8 A100s"
else
    bad "sim presets: llama3_8b '$b' ms on B200, '$a' ms on A100" "$TMP/a"
fi

# ── e. contention: collectives slow the compute beside them ──
# From the trace alone: each op slice's roofline time on an H100 (bf16; the
# rates and efficiencies of docs/simulator.md) from its FLOPs and bytes, and
# the time it overlaps the collective slices. An op that overlaps nothing
# takes exactly its roofline time; one that does never less, and never more
# than S_MAX of the overlapped time: an all-gather and a reduce-scatter
# together hold 2 x 24 of the 132 SMs, and their HBM traffic takes at most
# one NVLink ring's 3 bytes per byte received, 3 x 0.8 x 450 GB/s of the
# 0.8 x 3.35 TB/s. Prints the ops' total slowdown in ms.
if ! command -v python3 >/dev/null 2>&1; then
    echo "skip sim contention tests: python3 not found (it reads the trace)"
else
    cat >"$TMP/check_contention.py" <<'PY'
import bisect, json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
S_MAX = max(2 * 24 / 132, 3 * 0.8 * 450e9 / (0.8 * 3.35e12))
HBM = 0.8 * 3.35e12
def rate(kind):   # FLOP/s
    if kind.startswith("matmul"):
        return 0.65 * 989.5e12   # MATMUL_EFFICIENCY
    if kind.startswith("attention"):
        return 0.35 * 989.5e12   # ATTENTION_EFFICIENCY_H100
    return 0.50 * 67e12
spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] != 0)
merged = []
for a, b in spans:
    if merged and a <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], b)
    else:
        merged.append([a, b])
starts = [a for a, _ in merged]
def overlap(a, b):
    i, t = max(bisect.bisect_right(starts, a) - 1, 0), 0.0
    while i < len(merged) and merged[i][0] < b:
        t += max(0.0, min(b, merged[i][1]) - max(a, merged[i][0]))
        i += 1
    return t
slow, ops = 0.0, 0
for e in ev:
    if e["tid"] != 0 or "op" not in e["args"]:
        continue
    ops += 1
    x = e["args"]
    base = max(x["flops"] / rate(e["name"].split()[0]), x["bytes"] / HBM, 2e-6) * 1e6
    extra = e["dur"] - base
    most = S_MAX * overlap(e["ts"], e["ts"] + e["dur"])
    assert -0.002 <= extra <= most + 0.002, (e, base, most)
    slow += extra
assert ops > 0
print("%.3f" % (slow / 1e3))
PY
    # one rank: no collective, so the old model's times exactly
    "$FSDPC" examples/gpt2.fsd --sim h100:gpus=1 --trace "$TMP/c1.json" >"$TMP/c1" 2>&1
    if python3 "$TMP/check_contention.py" "$TMP/c1.json" >"$TMP/slow" 2>"$TMP/err" &&
        [ "$(cat "$TMP/slow")" = 0.000 ] && [ "$(field contention "$TMP/c1")" = 0.000 ] &&
        [ "$(field step "$TMP/c1")" = "$(field compute "$TMP/c1")" ]; then
        ok "sim contention one rank: every op at its roofline time, no contention"
    else
        cat "$TMP/c1" >>"$TMP/err"
        bad "sim contention one rank" "$TMP/err"
    fi
    # one node of 8: slowed where collectives overlap, by no more than they take
    for name in gpt2 llama3_8b; do
        "$FSDPC" examples/$name.fsd --sim h100 --trace "$TMP/c8.json" >"$TMP/c8" 2>&1
        total=$(field contention "$TMP/c8")
        if ! python3 "$TMP/check_contention.py" "$TMP/c8.json" >"$TMP/slow" 2>"$TMP/err"; then
            bad "sim contention $name W=8: an op outside its bounds" "$TMP/err"
        elif [ -n "$total" ] && awk -v s="$(cat "$TMP/slow")" -v t="$total" \
            'BEGIN { exit !(s > 0 && s <= t + 0.001) }'; then
            ok "sim contention $name W=8: ops slowed $(cat "$TMP/slow") ms of the $total ms reported, each within its bound"
        else
            bad "sim contention $name W=8: ops slowed $(cat "$TMP/slow") ms, summary says '$total' ms" "$TMP/c8"
        fi
    done
fi

# ── the command line ──
check_cli() { # NAME EXPECTED_STATUS PATTERN CMD...
    local name=$1 want=$2 pat=$3
    shift 3
    "$@" >"$TMP/cli" 2>&1
    local st=$?
    if [ $st = "$want" ] && grep -q -- "$pat" "$TMP/cli"; then ok "sim cli $name"; else bad "sim cli $name (status $st)" "$TMP/cli"; fi
}
check_cli unknown-preset 1 "unknown preset \`h900\`; the presets are a100, h100, h200, b200" \
    "$FSDPC" examples/tiny.fsd --sim h900
check_cli unknown-setting 1 "unknown setting \`racks=2\`" "$FSDPC" examples/tiny.fsd --sim h100:racks=2
check_cli bad-nodes 1 "\`nodes\` must be a whole number" "$FSDPC" examples/tiny.fsd --sim h100:nodes=0
check_cli bad-gpus 1 "\`gpus\` must be a whole number from 1 to 8" "$FSDPC" examples/tiny.fsd --sim h100:gpus=9
check_cli world-disagrees 1 "fsdpc: --world 4 disagrees with --sim h100:nodes=2, which has 16 ranks" \
    "$FSDPC" examples/tiny.fsd --sim h100:nodes=2 --world 4
check_cli world-agrees 0 "world 16" "$FSDPC" examples/tiny.fsd --sim h100:nodes=2 --world 16
check_cli sim-needs-arg 1 "--sim needs a cluster preset" "$FSDPC" examples/tiny.fsd --sim
check_cli trace-needs-arg 1 "--trace needs a file name" "$FSDPC" examples/tiny.fsd --trace
check_cli preset-case 0 "on 2 nodes x 4 A100 SXM 80GB (world 8)" \
    "$FSDPC" examples/tiny.fsd --sim A100:nodes=2,gpus=4
check_cli help-mentions-sim 0 "--sim PRESET" "$FSDPC" --help
check_cli bad-hbm-gib 1 "\`hbm_gib\` must be a whole number from 1 to 65536 (the GPU's memory in GiB)" \
    "$FSDPC" examples/tiny.fsd --sim h100:hbm_gib=95.5
check_cli bad-nvlink 1 "\`nvlink_gbs\` must be a positive number" \
    "$FSDPC" examples/tiny.fsd --sim h100:nvlink_gbs=-400

# A variant of a preset's GPU: hbm_gib moves the capacity the plan is held
# to, hbm_gbs the memory-bound ops' time, nvlink_gbs (both directions, as
# datasheets print it) the collectives' within a node; the title says so.
"$FSDPC" examples/gpt2.fsd --sim h100:gpus=1 >"$TMP/v0" 2>&1
"$FSDPC" examples/gpt2.fsd --sim h100:gpus=1,hbm_gbs=1675,hbm_gib=4 >"$TMP/v1" 2>&1
# memops FILE: the memory-bound ops' milliseconds in the compute line
memops() { sed -n 's/^  compute .*memory-bound ops \([0-9.]*\),.*/\1/p' "$1"; }
if grep -q "^simulation gpt2 on 1 node x 1 H100 SXM 80GB (hbm_gbs=1675, hbm_gib=4) (world 1)$" "$TMP/v1" &&
    grep -q "HBM 1.675 TB/s" "$TMP/v1" && grep -q "peak of 4.00 GiB HBM per GPU  -- DOES NOT FIT$" "$TMP/v1" &&
    ! grep -q "DOES NOT FIT" "$TMP/v0" &&
    awk -v a="$(memops "$TMP/v0")" -v b="$(memops "$TMP/v1")" 'BEGIN { exit !(a > 0 && b >= 1.9 * a && b <= 2 * a * (1 + 1e-9)) }'; then
    ok "sim variant: hbm_gbs=1675 takes the memory-bound ops $(memops "$TMP/v0") -> $(memops "$TMP/v1") ms; hbm_gib=4 does not fit gpt2's plan; the title names both"
else
    bad "sim variant: hbm_gbs / hbm_gib" "$TMP/v1"
fi
"$FSDPC" examples/gpt2.fsd --sim h100 >"$TMP/n0" 2>&1
"$FSDPC" examples/gpt2.fsd --sim h100:nvlink_gbs=400 >"$TMP/n1" 2>&1
# busy TRACK FILE: a collective stream's busy milliseconds
busy() { sed -n "s/^  $1  *\([0-9.]*\) ms busy.*/\1/p" "$2"; }
if grep -q "NVLink 200 GB/s per direction" "$TMP/n1" &&
    awk -v a="$(busy all-gather "$TMP/n0")" -v b="$(busy all-gather "$TMP/n1")" 'BEGIN { exit !(a > 0 && b > 1.5 * a) }'; then
    ok "sim variant: nvlink_gbs=400 (an H800's) takes gpt2's all-gathers on 8 GPUs $(busy all-gather "$TMP/n0") -> $(busy all-gather "$TMP/n1") ms"
else
    bad "sim variant: nvlink_gbs=400" "$TMP/n1"
fi

# ── f. recomputation: MFU counts the model's FLOPs, HFU what runs ──
variant examples/gpt2.fsd "$TMP/gpt2_rc.fsd" -e 's/^shard {/shard {\n  recompute = full/'
"$FSDPC" examples/gpt2.fsd --sim h100 >"$TMP/rc0" 2>&1
"$FSDPC" "$TMP/gpt2_rc.fsd" --sim h100 --trace "$TMP/rc.json" >"$TMP/rc1" 2>&1
# flops LABEL FILE: the FLOPs in parentheses after MFU or HFU ("26.54 TFLOP")
flops() { sed -n "s/^  $1 .*(\([0-9.]* [TPG]FLOP\) .*/\1/p" "$2"; }
m0=$(flops MFU "$TMP/rc0") h0=$(flops HFU "$TMP/rc0") m1=$(flops MFU "$TMP/rc1") h1=$(flops HFU "$TMP/rc1")
if [ -n "$m0" ] && [ "$m0" = "$h0" ] && [ "$m1" = "$m0" ] && [ -n "$h1" ] && [ "$h1" != "$m1" ] &&
    awk -v a="$(field HFU "$TMP/rc1")" -v b="$(field MFU "$TMP/rc1")" 'BEGIN { exit !(a > b) }'; then
    ok "sim recompute: gpt2 counts $m1 model FLOPs with or without recomputation (MFU), $h1 run with it (HFU $(field HFU "$TMP/rc1")% > MFU $(field MFU "$TMP/rc1")%)"
else
    bad "sim recompute: MFU FLOPs $m0 / $m1, HFU FLOPs $h0 / $h1 without / with recompute = full" "$TMP/rc1"
fi
s0=$(field step "$TMP/rc0") s1=$(field step "$TMP/rc1")
g0=$(field memory "$TMP/rc0") g1=$(field memory "$TMP/rc1")
if [ -n "$s1" ] && [ -n "$g1" ] && awk -v s0="$s0" -v s1="$s1" -v g0="$g0" -v g1="$g1" \
        'BEGIN { exit !(s1 > s0 && g1 < g0) }'; then
    ok "sim recompute: gpt2's step $s0 -> $s1 ms, peak $g0 -> $g1 GiB with recompute = full"
else
    bad "sim recompute: step $s0 -> $s1 ms, peak $g0 -> $g1 GiB with recompute = full" "$TMP/rc1"
fi
if n=$(python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['traceEvents']; print(sum(1 for x in e if x.get('name','').endswith(' (recompute)')))" "$TMP/rc.json") &&
    [ "$n" -gt 0 ]; then
    ok "sim recompute: the trace names $n recompute op slices"
else
    bad "sim recompute: no recompute op in the trace ('${n:-}')"
fi

# ── g. collectives in flight together share the links ──
# Llama 3 8B at sequence 2048, plain FSDP over 8 nodes of 8 GPUs behind one
# NIC a node: every ring crosses that NIC, so the two streams' bus bytes over
# the step are bounded by its rate (nic_gbps / 8 x 0.96, IB_EFFICIENCY), and a
# model that let both streams run at full speed beside each other would
# exceed it.
variant examples/llama3_8b.fsd "$TMP/l2048.fsd" -e 's/seq = 8192/seq = 2048/'
for preset in h100:nodes=8,nics=1 a100:nodes=8,nics=1; do
    gbps=400
    [ "${preset%%:*}" = a100 ] && gbps=200
    if "$FSDPC" "$TMP/l2048.fsd" --sim "$preset" >"$TMP/links" 2>&1 &&
        st=$(field step "$TMP/links") && ag=$(bytes all-gather "$TMP/links") &&
        rs=$(bytes reduce-scatter "$TMP/links") && [ -n "$st" ] && [ -n "$ag" ] && [ -n "$rs" ] &&
        awk -v st="$st" -v ag="$ag" -v rs="$rs" -v g="$gbps" \
            'BEGIN { exit !((ag + rs) / (st / 1e3) <= g / 8 * 0.96 * 1e9 * (1 + 1e-9)) }'; then
        ok "sim links $preset: all-gathers and reduce-scatters move $(awk -v st="$st" -v ag="$ag" -v rs="$rs" 'BEGIN { printf "%.1f", (ag + rs) / (st / 1e3) / 1e9 }') GB/s over the step, within one NIC's $(awk -v g=$gbps 'BEGIN { print g / 8 * 0.96 }') GB/s"
    else
        bad "sim links $preset: all-gather $ag + reduce-scatter $rs bytes in $st ms exceed one NIC" "$TMP/links"
    fi
done

# and in the trace (args.alone_us: a collective's time with the links to
# itself): under plain FSDP all-gathers and reduce-scatters share one
# communicator, which runs them one at a time, so their slices never
# overlap; under HSDP the replica all-reduce has a communicator of its own
# and runs beside the shard group's collectives, sharing the one NIC: each
# then takes longer than alone, but never more than twice (two sharing get
# at least half each).
variant tests/meshplan/llama3_8b_mesh.fsd "$TMP/hsdp4.fsd" -e 's/^  replicate = auto/  replicate = 2/' \
    -e 's/seq = 8192/seq = 2048/'
"$FSDPC" "$TMP/l2048.fsd" --sim h100:nodes=8,nics=1 --trace "$TMP/links.json" >/dev/null 2>&1
"$FSDPC" "$TMP/hsdp4.fsd" --sim h100:nodes=4,nics=1 --trace "$TMP/hsdp4.json" >/dev/null 2>&1
# links_trace FILE: slices, overlapping gather/reduce pairs, shorter than alone, most stretched
links_trace() {
    python3 - "$1" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
c = [e for e in ev if "alone_us" in e.get("args", {})]
ag = [e for e in c if e["tid"] == 1]
rs = [e for e in c if e["tid"] == 2]
both = sum(1 for a in ag for r in rs
           if min(a["ts"] + a["dur"], r["ts"] + r["dur"]) - max(a["ts"], r["ts"]) > 1e-3)
fast = sum(1 for e in c if e["dur"] < e["args"]["alone_us"] * (1 - 1e-9) - 1e-3)
worst = max((e["dur"] / e["args"]["alone_us"] for e in c if e["args"]["alone_us"] > 0), default=0)
print(f"{len(c)} {both} {fast} {worst:.3f}")
PY
}
if r=$(links_trace "$TMP/links.json") && set -- $r && [ "$1" -gt 0 ] && [ "$2" = 0 ] && [ "$3" = 0 ]; then
    ok "sim links trace, plain FSDP: $1 collective slices, no all-gather beside a reduce-scatter (one communicator), none shorter than alone"
else
    bad "sim links trace, plain FSDP: slices, gather/reduce overlaps, shorter than alone, most stretched: ${r:-none}"
fi
if r=$(links_trace "$TMP/hsdp4.json") && set -- $r && [ "$1" -gt 0 ] && [ "$3" = 0 ] &&
    awk -v w="$4" 'BEGIN { exit !(w >= 1.5 && w <= 2 + 1e-6) }'; then
    ok "sim links trace, HSDP 2 x 16 on one NIC a node: $1 collective slices, none shorter than alone, the most stretched ${4}x (at most 2)"
else
    bad "sim links trace, HSDP: slices, gather/reduce overlaps, shorter than alone, most stretched: ${r:-none}"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
