#!/usr/bin/env bash
# run.sh — fsdpc's test runner: golden dumps, the error catalogue, CLI
# behaviour and published parameter counts. `make test` runs it; with
# --regen it rewrites the golden and expected files instead of comparing
# (read `git diff tests/` before committing what it wrote).
#
# Every test prints one line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/.."

FSDPC=${FSDPC:-build/fsdpc}
REGEN=0
[ "${1:-}" = "--regen" ] && REGEN=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

# compare NAME EXPECTED_FILE ACTUAL_FILE
compare() {
    if [ $REGEN = 1 ]; then
        cp "$3" "$2"
        ok "$1 (regenerated)"
    elif [ ! -f "$2" ]; then
        bad "$1: no expected file $2"
    elif diff -u "$2" "$3" >"$TMP/diff"; then
        ok "$1"
    else
        bad "$1" "$TMP/diff"
    fi
}

# ── golden dumps of every example, and of the layer options' model the
# PyTorch reference trains (tests/oracle/tiny_variants.fsd) ──
for f in examples/*.fsd tests/oracle/tiny_variants.fsd; do
    name=$(basename "$f" .fsd)
    for dump in ast model; do
        if "$FSDPC" "$f" --dump-$dump >"$TMP/out" 2>"$TMP/err"; then
            compare "golden $name.$dump" "tests/golden/$name.$dump" "$TMP/out"
        else
            bad "golden $name.$dump: fsdpc failed" "$TMP/err"
        fi
    done
done

# ── the emitted program: tiny's train.cu, tensors by name, one line per op.
# The pasted templates are left out of the golden file (their text is
# templates/*.h's own, and their length moves every #line after them), so
# kernel edits do not touch it; the #line check below holds the numbers. ──
strip_templates() {
    awk '/^#line 1 "templates\// { print; print "/* (the template text, left out of the golden file) */"; skip = 1; next }
         skip && /^#line [0-9]+ "train.cu"$/ { skip = 0; sub(/[0-9]+/, "N"); print; next }
         !skip'
}
if "$FSDPC" examples/tiny.fsd -o "$TMP/train.cu" 2>"$TMP/err"; then
    strip_templates <"$TMP/train.cu" >"$TMP/out"
    compare "golden tiny.train.cu" tests/golden/tiny.train.cu "$TMP/out"
else
    bad "golden tiny.train.cu: fsdpc failed" "$TMP/err"
fi

# ── #line: an error planted in a pasted template is reported at the
# template's own line, one planted after it at train.cu's ──
# (after it: the first embed pos op, the step's; eval_forward has one too)
if [ $REGEN = 0 ] && [ -s "$TMP/train.cu" ]; then
    tl=$(grep -n '^LAUNCHER void gelu_fwd' templates/act.h | cut -d: -f1)
    pl=$(grep -n '^LAUNCHER void gelu_fwd' "$TMP/train.cu" | cut -d: -f1)
    ol=$(grep -n -m1 '^    OP("embed pos"' "$TMP/train.cu" | cut -d: -f1)
    if [ -z "$tl" ] || [ -z "$pl" ] || [ -z "$ol" ]; then
        bad "#line: gelu_fwd in templates/act.h or the embed pos op in tiny's train.cu not found"
    else
        # each planted line replaces one, so no line moves
        sed "$((pl + 2))s/.*/    planted_in_template = 1;/; ${ol}s/.*/    planted_in_train = 1;/" \
            "$TMP/train.cu" >"$TMP/planted.cu"
        ${CC:-cc} -std=c11 -fsyntax-only -Iruntime $(pkg-config --cflags openblas 2>/dev/null) \
            -x c "$TMP/planted.cu" >"$TMP/planted.log" 2>&1
        if grep -q "^templates/act.h:$((tl + 2)):[0-9]*: error: .*planted_in_template" "$TMP/planted.log" &&
                grep -q "^train.cu:$ol:[0-9]*: error: .*planted_in_train" "$TMP/planted.log"; then
            ok "#line: errors point at templates/act.h:$((tl + 2)) and train.cu:$ol"
        else
            bad "#line: expected errors at templates/act.h:$((tl + 2)) and train.cu:$ol" "$TMP/planted.log"
        fi
    fi
fi

# ── golden plans: the plan, one step's schedule and the memory plan of every
# example (and tests/plan/*.fsd) at world sizes 1, 2, 3 (uneven shards), 8
# and 64. Only padding, bytes and memory change with the world size; the
# events themselves do not, which these files show side by side. ──
mkdir -p tests/golden/plans
for f in examples/*.fsd tests/plan/*.fsd; do
    name=$(basename "$f" .fsd)
    for w in 1 2 3 8 64; do
        if "$FSDPC" "$f" --world $w --dump-plan --dump-schedule --dump-memory >"$TMP/out" 2>"$TMP/err"; then
            compare "golden plans/$name.w$w" "tests/golden/plans/$name.w$w" "$TMP/out"
        else
            bad "golden plans/$name.w$w: fsdpc failed" "$TMP/err"
        fi
    done
done

# ── the mesh: tiny under HSDP (replicate = 2) planned at worlds 4 and 8,
# and simulated on two nodes of 8 H100s (a replica a node: all-gathers and
# reduce-scatters over NVLink, the replica all-reduce across the nodes),
# its trace's tracks per mesh dimension among the simulator's golden JSON ──
mkdir -p tests/golden/mesh
for w in 4 8; do
    if "$FSDPC" tests/mesh/tiny_hsdp.fsd --world $w --dump-plan --dump-schedule --dump-memory >"$TMP/out" 2>"$TMP/err"; then
        compare "golden mesh/tiny_hsdp.w$w" "tests/golden/mesh/tiny_hsdp.w$w" "$TMP/out"
    else
        bad "golden mesh/tiny_hsdp.w$w: fsdpc failed" "$TMP/err"
    fi
done
if "$FSDPC" tests/mesh/tiny_hsdp.fsd --sim h100:nodes=2 --trace "$TMP/mesh_trace.json" >"$TMP/out" 2>"$TMP/err" &&
        python3 -c "import json,sys; print(*[e['args']['name'] for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('name') == 'thread_name'], sep='\n')" \
            "$TMP/mesh_trace.json" >>"$TMP/out"; then
    compare "golden mesh/tiny_hsdp.sim" "tests/golden/mesh/tiny_hsdp.sim" "$TMP/out"
else
    bad "golden mesh/tiny_hsdp.sim: fsdpc failed" "$TMP/err"
fi

# ── partial resharding: tiny_partial (replicate = 2, the blocks with
# reshard_after_forward = 2) planned at world 8 (shard groups of 4, copies
# over 2), its model dump showing the per-target setting, and simulated on
# two nodes of 8 H100s (the gathers from the copies within 2 GPUs) ──
if "$FSDPC" tests/mesh/tiny_partial.fsd --world 8 --dump-model --dump-plan --dump-schedule --dump-memory >"$TMP/out" 2>"$TMP/err"; then
    compare "golden mesh/tiny_partial.w8" "tests/golden/mesh/tiny_partial.w8" "$TMP/out"
else
    bad "golden mesh/tiny_partial.w8: fsdpc failed" "$TMP/err"
fi
if "$FSDPC" tests/mesh/tiny_partial.fsd --sim h100:nodes=2 >"$TMP/out" 2>"$TMP/err"; then
    compare "golden mesh/tiny_partial.sim" "tests/golden/mesh/tiny_partial.sim" "$TMP/out"
else
    bad "golden mesh/tiny_partial.sim: fsdpc failed" "$TMP/err"
fi

# ── recomputation: the training graph of a plan that recomputes (the
# recompute ops, marked, and the tensors they write, each naming the value
# it computes again) and its model dump (the settings as written); its
# plans, schedules and memory are among the golden plans above ──
for dump in ir model; do
    if "$FSDPC" tests/plan/tiny_recompute.fsd --dump-$dump >"$TMP/out" 2>"$TMP/err"; then
        compare "golden tiny_recompute.$dump" "tests/golden/tiny_recompute.$dump" "$TMP/out"
    else
        bad "golden tiny_recompute.$dump: fsdpc failed" "$TMP/err"
    fi
done

# ── per-target mixed precision: the model dump shows each line's setting as
# written (its plans, with each group's dtypes, are among the golden plans) ──
if "$FSDPC" tests/plan/tiny_mixed.fsd --dump-model >"$TMP/out" 2>"$TMP/err"; then
    compare "golden tiny_mixed.model" "tests/golden/tiny_mixed.model" "$TMP/out"
else
    bad "golden tiny_mixed.model: fsdpc failed" "$TMP/err"
fi

# ── fully_shard auto: the chosen bucket size is the fastest the simulator
# found, and no larger than the target ──
for w in 8 64; do
    "$FSDPC" tests/plan/gpt2_auto.fsd --world $w --dump-plan >"$TMP/auto" 2>&1
    if awk '/^    bucket / { n++; t = $NF == "chosen" ? $(NF-3) : $NF; sub(/ms/, "", t)
                              if ($0 ~ /<- chosen/) { c++; chosen = $(NF-3) }
                              step[n] = ($0 ~ /<- chosen/) ? $(NF-3) : $(NF-1) }
            END { if (n < 2 || c != 1) exit 1
                  for (i = 1; i <= n; i++) if (step[i] + 0 < chosen + 0) exit 1 }' "$TMP/auto"; then
        ok "auto buckets at W=$w: the simulator's fastest of $(grep -c '^    bucket ' "$TMP/auto") sizes is chosen"
    else
        bad "auto buckets at W=$w" "$TMP/auto"
    fi
done

# ── fully_shard auto with a tied head that has a bias: matmul_bias reads the
# tied weight (pinned to the root) and the bias in one op, and the schedule
# gathers one group per op, so the bias must follow the weight to the root ──
sed 's/Linear(dim, vocab, bias = false, tie = tok)/Linear(dim, vocab, bias = true, tie = tok)/' \
    tests/plan/gpt2_auto.fsd >"$TMP/tied_bias.fsd"
if ! grep -q 'bias = true, tie = tok' "$TMP/tied_bias.fsd"; then
    bad "auto buckets, tied head with a bias: tests/plan/gpt2_auto.fsd no longer has the tied head this test edits"
elif "$FSDPC" "$TMP/tied_bias.fsd" --world 8 --dump-plan >"$TMP/tied" 2>&1 &&
     awk '/^  group [0-9]+ / { g = $3 } NF >= 3 && $(NF-2) == "head.bias" { print g }' \
         "$TMP/tied" | grep -qx 'root:'; then
    ok "auto buckets, tied head with a bias: head.bias goes to the root with the tied weight"
else
    bad "auto buckets, tied head with a bias: head.bias is not in the root group" "$TMP/tied"
fi

# ── grad_accum does not grow the compiler: a step is planned as a pattern
# of micro-batches, the middle one written once
# (docs/compiler.md#the-micro-batch-pattern), so tiny with grad_accum =
# 1000000 (8.4 GB to emit, 16.8 GB with --sim, before the pattern: about
# 10 KB a micro-batch) plans, dumps, simulates and emits in a few MB. The
# bound is on the peak resident memory the kernel measured for the child
# (getrusage), never on time; and the step moves 1000000 times the bytes of
# a step of one micro-batch, all of them alike under tiny's policy. ──
maxrss() { # fsdpc ARGS...: prints its exit status and peak resident KiB
    python3 -c 'import resource, subprocess, sys
st = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(st, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$@"
}
step_bytes() { # SCHEDULE-DUMP: prints its all-gather and reduce-scatter bytes a step
    sed -n 's/^  per rank per step: all-gather \([0-9,]*\) bytes, reduce-scatter \([0-9,]*\) bytes$/\1 \2/p' \
        "$1" | tr -d ,
}
for k in 1 1000000; do
    sed "s/grad_accum *= *[0-9]*/grad_accum = $k/" examples/tiny.fsd >"$TMP/tiny_ga$k.fsd"
done
if ! grep -q 'grad_accum = 1000000' "$TMP/tiny_ga1000000.fsd"; then
    bad "grad_accum = 1000000: examples/tiny.fsd no longer has the grad_accum line this test edits"
else
    for what in "--dump-schedule --dump-memory --sim h100 --trace $TMP/ga.json" "-o $TMP/ga.cu"; do
        read -r st kb < <(maxrss "$FSDPC" "$TMP/tiny_ga1000000.fsd" $what)
        if [ "$st" = 0 ] && [ "$kb" -lt 204800 ]; then
            ok "grad_accum = 1000000: fsdpc ${what%% $TMP*} peaks at $((kb / 1024)) MiB resident (bound 200)"
        else
            bad "grad_accum = 1000000: fsdpc ${what%% $TMP*} exits $st, peaks at ${kb:-?} KiB resident (bound 200 MiB)"
        fi
    done
    "$FSDPC" "$TMP/tiny_ga1.fsd" --dump-schedule >"$TMP/ga1.sched" 2>&1
    "$FSDPC" "$TMP/tiny_ga1000000.fsd" --dump-schedule >"$TMP/ga1m.sched" 2>&1
    read -r ag1 rs1 < <(step_bytes "$TMP/ga1.sched")
    read -r ag rs < <(step_bytes "$TMP/ga1m.sched")
    if [ -n "${ag1:-}" ] && [ "${ag:-}" = $((ag1 * 1000000)) ] && [ "${rs:-}" = $((rs1 * 1000000)) ]; then
        ok "grad_accum = 1000000: all-gather $ag and reduce-scatter $rs bytes a step, 1000000 times one micro-batch's"
    else
        bad "grad_accum = 1000000: all-gather ${ag:-?} and reduce-scatter ${rs:-?} bytes a step; one micro-batch moves ${ag1:-?} and ${rs1:-?}"
    fi
fi

# ── the error catalogue: exact diagnostics, exit status, no output ──
# A case is NAME.fsd (or NAME.gen, a script that writes the input to stdout)
# with NAME.expected holding stderr exactly. A first line `# exit: N` in the
# .fsd sets the expected status (default 1).
mkdir -p build/errors
for f in tests/errors/*.fsd tests/errors/*.gen; do
    [ -e "$f" ] || continue
    name=$(basename "${f%.*}")
    input=$f
    if [ "${f##*.}" = gen ]; then
        input=build/errors/$name.fsd
        "$f" >"$input"
    fi
    want=1
    first=$(head -c 200 "$input" | head -n 1 | tr -d '\0')
    case "$first" in "# exit: "*) want=${first#\# exit: } ;; esac
    # the time limit only turns a hang into a failure: a case takes about a
    # second, but 20 s once ran out on a loaded machine (big_file, beside
    # the other suites); 300 s is far beyond any slowdown a load causes
    rm -f "$TMP/o.txt"
    timeout 300 "$FSDPC" "$input" --dump-model -o "$TMP/o.txt" >/dev/null 2>"$TMP/err"
    status=$?
    if [ $status != "$want" ]; then
        bad "error $name: exit status $status, expected $want" "$TMP/err"
        continue
    fi
    if [ "$want" != 0 ] && [ -e "$TMP/o.txt" ]; then
        bad "error $name: wrote -o output despite errors"
        continue
    fi
    if ls "$TMP"/o.txt.tmp.* >/dev/null 2>&1; then
        bad "error $name: left a temporary file"
        rm -f "$TMP"/o.txt.tmp.*
        continue
    fi
    compare "error $name" "tests/errors/$name.expected" "$TMP/err"
done
# ── fsdpc --from-hf: a Hugging Face config.json → .fsd ──
# NAME.json with NAME.fsd, the .fsd written exactly (which must compile), or
# NAME.expected, stderr exactly for a config fsdpc refuses (exit 1, no -o).
for f in tests/fromhf/*.json; do
    name=$(basename "$f" .json)
    rm -f "$TMP/o.fsd"
    "$FSDPC" --from-hf "$f" -o "$TMP/o.fsd" 2>"$TMP/err"
    status=$?
    if [ $REGEN = 1 ]; then
        rm -f "tests/fromhf/$name.fsd" "tests/fromhf/$name.expected"
        if [ $status = 0 ]; then cp "$TMP/o.fsd" "tests/fromhf/$name.fsd"; else cp "$TMP/err" "tests/fromhf/$name.expected"; fi
        ok "from-hf $name (regenerated)"
    elif [ -f "tests/fromhf/$name.fsd" ]; then
        if [ $status != 0 ]; then
            bad "from-hf $name: exit status $status" "$TMP/err"
        elif ! "$FSDPC" "$TMP/o.fsd" --check 2>"$TMP/err"; then
            bad "from-hf $name: the .fsd written does not compile" "$TMP/err"
        else
            compare "from-hf $name" "tests/fromhf/$name.fsd" "$TMP/o.fsd"
        fi
    elif [ $status != 1 ] || [ -e "$TMP/o.fsd" ]; then
        bad "from-hf $name: exit status $status (expected 1), or -o written" "$TMP/err"
    else
        compare "from-hf $name" "tests/fromhf/$name.expected" "$TMP/err"
    fi
done
# ── memory_budget with `recompute = auto`: tests/budget/*.fsd planned at
# worlds 8 and 64, the --dump-plan (units and the assignments weighed) as a
# golden file, and the choice held to its rule by check_choice.py: it fits,
# and no assignment that fits is faster. ──
mkdir -p tests/golden/budget
for f in tests/budget/*.fsd; do
    name=$(basename "$f" .fsd)
    budget=$(sed -n 's/^  memory_budget = \([0-9]*\)GiB$/\1/p' "$f")
    for w in 8 64; do
        if "$FSDPC" "$f" --world $w --dump-plan >"$TMP/out" 2>"$TMP/err"; then
            compare "golden budget/$name.w$w" "tests/golden/budget/$name.w$w" "$TMP/out"
            if python3 tests/budget/check_choice.py "$TMP/out" $((budget << 30)) >"$TMP/why" 2>&1; then
                ok "budget $name at world $w: $(cat "$TMP/why")"
            else
                bad "budget $name at world $w: the choice breaks the rule" "$TMP/why"
            fi
        else
            bad "budget $name at world $w: fsdpc failed" "$TMP/err"
        fi
    done
done

# ── replicate = auto: tests/meshplan/*.fsd planned with --sim h100 on the
# nodes each names (`# nodes: 2 8`), --dump-plan and --sim as a golden file,
# and the choice held to its rule by check_mesh.py: the meshes of whole
# nodes weighed, the chosen one fits, none that fits is faster, and it is
# the plan written. Then the cases around it: no mesh fits the budget (the
# error names replicate = auto), and no world given (the default world,
# said in the dump). ──
mkdir -p tests/golden/meshplan
for f in tests/meshplan/*.fsd; do
    name=$(basename "$f" .fsd)
    for n in $(sed -n 's/^# nodes: //p' "$f"); do
        if "$FSDPC" "$f" --sim h100:nodes=$n --dump-plan >"$TMP/out" 2>"$TMP/err"; then
            compare "golden meshplan/$name.nodes$n" "tests/golden/meshplan/$name.nodes$n" "$TMP/out"
            if python3 tests/meshplan/check_mesh.py "$TMP/out" $n >"$TMP/why" 2>&1; then
                ok "replicate = auto $name on $n nodes: $(cat "$TMP/why")"
            else
                bad "replicate = auto $name on $n nodes: the choice breaks the rule" "$TMP/why"
            fi
        else
            bad "replicate = auto $name on $n nodes: fsdpc failed" "$TMP/err"
        fi
    done
done
# ── memory_budget's partial resharding: tests/meshplan/llama3_8b_partial.fsd
# under each budget and --sim cluster its `# budget G SPEC: POLICY` lines
# name, --dump-memory (the policies weighed, reshard_after_forward = N among
# them) as a golden file, the choice held to its rule by check_choice.py
# (it fits, none that fits is faster, a tie to the earlier), and the policy
# chosen the one the line names: partial resharding where it wins, and not
# where it does not. ──
f=tests/meshplan/llama3_8b_partial.fsd
name=$(basename "$f" .fsd)
while read -r g spec want; do
    want=${want# }
    gold=tests/golden/meshplan/$name.b$g
    [ "$spec" = h100:nodes=8 ] || gold=$gold.$(echo "$spec" | tr -d ':,=')
    sed "s/^  memory_budget = .*/  memory_budget = ${g}GiB/" "$f" >"$TMP/$name.fsd"
    if "$FSDPC" "$TMP/$name.fsd" --sim "$spec" --dump-memory >"$TMP/out" 2>"$TMP/err"; then
        compare "golden ${gold#tests/golden/}" "$gold" "$TMP/out"
        if python3 tests/budget/check_choice.py "$TMP/out" $((g << 30)) >"$TMP/why" 2>&1 &&
            grep -q "^ *[0-9]*\. $want *peak .*<- chosen$" "$TMP/out"; then
            ok "partial resharding's candidates at memory_budget ${g}GiB on $spec: $(cat "$TMP/why")"
        else
            echo "expected: $want" >>"$TMP/why"
            bad "partial resharding's candidates at memory_budget ${g}GiB on $spec" "$TMP/why"
        fi
    else
        bad "partial resharding at memory_budget ${g}GiB on $spec: fsdpc failed" "$TMP/err"
    fi
done < <(sed -n 's/^# budget \([0-9]*\) \([^:]*:[^:]*\):\(.*\)/\1 \2 \3/p' "$f")
f=tests/meshplan/llama3_8b_mesh_budget.fsd
line=$(grep -n "^  replicate = auto" $f | cut -d: -f1)
"$FSDPC" $f --sim h100:nodes=2 --dump-plan >"$TMP/out" 2>"$TMP/err"
st=$?
if [ $st = 1 ] && [ ! -s "$TMP/out" ] && grep -q "^$f:$line:15: error: \`replicate = auto\` weighed 2 meshes on 16 ranks and none fits" "$TMP/err" &&
    grep -q "error: memory_budget 20.00 GiB is less than the leanest plan needs on 16 ranks" "$TMP/err"; then
    ok "replicate = auto: no mesh fits the budget on 2 nodes, refused at $f:$line:15 with replicate = 1's numbers"
else
    bad "replicate = auto: no mesh fits the budget on 2 nodes (status $st)" "$TMP/err"
fi
sed 's/^shard {/shard {\n  replicate = auto/' examples/tiny.fsd >"$TMP/tiny_rauto.fsd"
"$FSDPC" "$TMP/tiny_rauto.fsd" --dump-plan >"$TMP/out" 2>"$TMP/err" &&
    "$FSDPC" "$TMP/tiny_rauto.fsd" --world 16 --dump-plan >"$TMP/out16" 2>>"$TMP/err"
if grep -q "^plan tiny for world 8$" "$TMP/out" && grep -q "(no --world or --sim: planned for the default world of 8;" "$TMP/out" &&
    grep -q "replicate 1: the only candidate" "$TMP/out" && ! grep -q "no --world" "$TMP/out16" &&
    grep -q "mesh: replicate = auto, the simulator's choice on 2 nodes x 8 H100 SXM 80GB (world 16)" "$TMP/out16"; then
    ok "replicate = auto without --world: the default world 8 (one node: replicate 1), said in the dump; --world 16 weighs 2 nodes"
else
    cat "$TMP/out" "$TMP/out16" >>"$TMP/err"
    bad "replicate = auto without --world" "$TMP/err"
fi

# ── the memory plan: tests/memory/check.py, a suite of its own, counted here ──
# Figures computed by hand from the models' shapes, memory_budget's choices
# and errors, and golden --dump-memory files (rewritten by --regen).
mem_args=""
[ $REGEN = 1 ] && mem_args=--regen
python3 tests/memory/check.py "$FSDPC" $mem_args >"$TMP/mem" 2>&1
mem_last=$(tail -n 1 "$TMP/mem")
sed '$d' "$TMP/mem"
case "$mem_last" in
*" passed, "*" failed")
    pass=$((pass + ${mem_last%% passed*}))
    mem_f=${mem_last#*, }
    fail=$((fail + ${mem_f%% failed}))
    ;;
*) echo "$mem_last"; bad "tests/memory/check.py ended without a summary" ;;
esac

[ $REGEN = 1 ] && { echo "$pass passed, $fail failed"; exit 0; }

# ── published parameter counts ──
count() { "$FSDPC" "$1" --dump-model | sed -n 's/^  parameters .*(\([0-9]*\))$/\1/p'; }
expect_count() {
    got=$(count "$1")
    if [ "$got" = "$2" ]; then ok "params $3 = $2"; else bad "params $3: got '$got', expected $2"; fi
}
expect_count examples/gpt2.fsd 124475904 "gpt2 (vocab 50304)"
sed 's/vocab = 50304/vocab = 50257/' examples/gpt2.fsd >"$TMP/gpt2_50257.fsd"
expect_count "$TMP/gpt2_50257.fsd" 124439808 "gpt2 (vocab 50257)"
expect_count examples/llama3_8b.fsd 8030261248 "llama3_8b"
# the same two, from their Hugging Face configs (fsdpc --from-hf)
expect_count tests/fromhf/gpt2_124m.fsd 124439808 "gpt2 from its config.json (fsdpc --from-hf)"
expect_count tests/fromhf/llama3_8b.fsd 8030261248 "llama3_8b from its config.json (fsdpc --from-hf)"
# Qwen2 (q, k and v biases) and Qwen3 (qk_norm) shapes, counted by hand:
# L·(2C² + C + 2(C·kv + kv) + 3C·I + 2C) + V·C + C with kv = kv_heads·C/heads
# (Qwen2, tied); Qwen3 the same without biases, with 2·C/heads for q_norm and k_norm
expect_count tests/fromhf/qwen2_small.fsd 494032768 "a Qwen2 config, 896 wide, 24 layers (fsdpc --from-hf)"
expect_count tests/fromhf/qwen3_small.fsd 1720574976 "a Qwen3 config, 2048 wide, 28 layers (fsdpc --from-hf)"

# ── train settings: each lr_schedule form and eval(...), as --dump-model prints
# them and train.cu's table carries them (tests/eval runs them) ──
train_case() { # SETTINGS DUMP_LINE TABLE_LINE: SETTINGS replace tiny's lr_schedule line
    sed "s/^  lr_schedule = .*/  $1/" examples/tiny.fsd >"$TMP/train.fsd"
    if "$FSDPC" "$TMP/train.fsd" --dump-model >"$TMP/train.txt" 2>&1 &&
            "$FSDPC" "$TMP/train.fsd" -o "$TMP/train.cu" 2>>"$TMP/train.txt" &&
            grep -qxF "  $2" "$TMP/train.txt" && grep -qF "$3" "$TMP/train.cu"; then
        ok "train setting $1"
    else
        bad "train setting $1: expected '$2' in --dump-model and '$3' in train.cu" "$TMP/train.txt"
    fi
}
train_case "lr_schedule = constant(warmup = 5)" "lr_schedule = constant(warmup = 5)" \
    "FSD_LR_CONSTANT, 5, 0, 0, 1,  /* schedule, warmup, min_lr, decay, grad_clip */"
train_case "lr_schedule = linear(warmup = 4, min_lr = 1e-4)" "lr_schedule = linear(warmup = 4, min_lr = 0.0001)" \
    "FSD_LR_LINEAR, 4, 0.0001, 0, 1,"
train_case "lr_schedule = wsd(warmup = 3, decay = 0.25, min_lr = 0)" "lr_schedule = wsd(warmup = 3, decay = 0.25, min_lr = 0)" \
    "FSD_LR_WSD, 3, 0, 0.25, 1,"
train_case "eval(every = 7, sequences = 33)" "eval(every = 7, sequences = 33)" \
    "7, 33,  /* eval_every, eval_sequences */"
train_case "eval(every = 7)" "eval(every = 7)" "7, 0,  /* eval_every, eval_sequences */"
# only the cross-entropy the forward returns is the loss: one computed and not
# returned runs, and adds nothing to the step's loss or evaluation's
sed 's/^    return cross_entropy(head(ln_f(x)), targets)$/    y = head(ln_f(x))\n    z = cross_entropy(y, idx)\n    return cross_entropy(y, targets)/' \
    examples/tiny.fsd >"$TMP/two_losses.fsd"
if "$FSDPC" "$TMP/two_losses.fsd" -o "$TMP/two_losses.cu" 2>"$TMP/two_losses.err" &&
        [ "$(grep -c 'OP("cross_entropy ' "$TMP/two_losses.cu")" = 4 ] &&
        [ "$(grep -c 'fsdrt_add_loss_tensor(r, ' "$TMP/two_losses.cu")" = 1 ] &&
        [ "$(grep -c 'fsdrt_eval_loss_tensor(r, ' "$TMP/two_losses.cu")" = 1 ]; then
    ok "a cross_entropy the forward does not return runs, and is not the loss"
else
    bad "a cross_entropy the forward does not return: expected one fsdrt_add_loss_tensor and one fsdrt_eval_loss_tensor" "$TMP/two_losses.err"
fi

# ── command line ──
check_cli() { # NAME EXPECTED_STATUS PATTERN CMD...
    local name=$1 want=$2 pat=$3
    shift 3
    "$@" >"$TMP/cli" 2>&1
    local st=$?
    if [ $st = "$want" ] && grep -q -- "$pat" "$TMP/cli"; then ok "cli $name"; else bad "cli $name (status $st)" "$TMP/cli"; fi
}
check_cli help 0 "usage: fsdpc" "$FSDPC" --help
check_cli version 0 "^fsdpc [0-9]" "$FSDPC" --version
check_cli unknown-option 1 "unknown option --frobnicate" "$FSDPC" examples/tiny.fsd --frobnicate
check_cli no-input 1 "no input file" "$FSDPC" --check
check_cli missing-file 1 "cannot read nonexistent.fsd: No such file" "$FSDPC" nonexistent.fsd --check
check_cli two-inputs 1 "more than one input" "$FSDPC" examples/tiny.fsd examples/mlp.fsd
check_cli o-needs-arg 1 "-o needs a file name" "$FSDPC" examples/tiny.fsd -o
check_cli from-hf-seq-too-long 1 "--seq 2048 is longer than the model's 1024 positions (\`n_positions\`)" \
    "$FSDPC" --from-hf tests/fromhf/gpt2_124m.json --seq 2048
check_cli from-hf-seq 0 "const n_positions = 1024, seq = 256" "$FSDPC" --from-hf tests/fromhf/gpt2_124m.json --seq 256
check_cli from-hf-missing 1 "cannot read nope.json: No such file" "$FSDPC" --from-hf nope.json
check_cli from-hf-and-input 1 "takes only --seq and -o" "$FSDPC" --from-hf tests/fromhf/gpt2_124m.json examples/tiny.fsd
check_cli seq-without-from-hf 1 "--seq is --from-hf's sequence length" "$FSDPC" examples/tiny.fsd --seq 8

# -o writes the dump; an error leaves an existing output untouched
"$FSDPC" examples/tiny.fsd --dump-model -o "$TMP/model.txt"
if cmp -s "$TMP/model.txt" tests/golden/tiny.model; then ok "cli -o writes the dump"; else bad "cli -o writes the dump"; fi
echo "keep me" >"$TMP/keep.txt"
"$FSDPC" tests/errors/undefined_name.fsd --dump-model -o "$TMP/keep.txt" 2>/dev/null
if [ "$(cat "$TMP/keep.txt")" = "keep me" ]; then ok "cli error keeps existing -o file"; else bad "cli error keeps existing -o file"; fi
# -o to a pipe or device writes it directly; renaming a temporary file over
# it would replace it (as root, -o /dev/null replaced /dev/null)
mkfifo "$TMP/fifo"
timeout 120 cat "$TMP/fifo" >"$TMP/fifo.out" &
reader=$!
"$FSDPC" examples/tiny.fsd --dump-model -o "$TMP/fifo"
wait $reader
if [ -p "$TMP/fifo" ] && cmp -s "$TMP/fifo.out" tests/golden/tiny.model; then
    ok "cli -o writes a pipe in place"
else
    bad "cli -o writes a pipe in place"
fi

# every example passes --check with no warnings
for f in examples/*.fsd; do
    "$FSDPC" "$f" --check 2>"$TMP/err"
    st=$?
    if [ $st = 0 ] && [ ! -s "$TMP/err" ]; then ok "check $(basename "$f")"; else bad "check $(basename "$f")" "$TMP/err"; fi
done

# ── the simulator: tests/sim.sh, a suite of its own, counted here ──
FSDPC="$FSDPC" tests/sim.sh >"$TMP/sim" 2>&1
sim_last=$(tail -n 1 "$TMP/sim")
sed '$d' "$TMP/sim"
case "$sim_last" in
*" passed, "*" failed")
    pass=$((pass + ${sim_last%% passed*}))
    sim_f=${sim_last#*, }
    fail=$((fail + ${sim_f%% failed}))
    ;;
*) echo "$sim_last"; bad "tests/sim.sh ended without a summary" ;;
esac

echo "$pass passed, $fail failed"
[ $fail = 0 ]
