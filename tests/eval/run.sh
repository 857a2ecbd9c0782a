#!/usr/bin/env bash
# run.sh — evaluation (--eval-every, --eval-sequences) and the learning-rate
# schedules, on the CPU trainers of examples/tiny.fsd and tiny_llama.fsd:
#
#   - val_loss is the same, to the last bit, on 1, 2, 3 and 4 ranks: 10
#     validation sequences in micro-batches of 4 make chunks of 4, 4 and 2,
#     so ranks run short chunks and padding (runtime/eval.c); the runs are at
#     their starting weights (--lr 0), which no rank count changes;
#   - after real training, where the weights of runs on 1, 2 and 4 ranks with
#     the same global batch drift apart in the last bits, within 1e-5;
#   - val_loss is logged after every N-th step and after the last, and only
#     then; training with evaluation logs the same losses, learning rates,
#     norms, memory peak and bytes as without, and exports the same weights;
#   - against PyTorch: tests/oracle's model of each example, from weights far
#     from the initialisation (oracle.py weights), computes the mean loss over
#     the first K sequences; fp32 trainers within 1e-6, tiny's float64 build
#     within 1e-12;
#   - a run resumed from a checkpoint evaluates at the same steps, with the
#     same results, as the run that did not stop;
#   - a validation file shorter than --eval-sequences, --eval-every
#     without validation data, and --eval-sequences without --eval-every
#     are refused at start-up with the file and the
#     numbers;
#   - every lr_schedule form, built into a small model's trainer, logs at
#     every step the rate torch.optim.lr_scheduler gives (LinearLR,
#     CosineAnnealingLR, ConstantLR chained by SequentialLR) within 1e-12,
#     also for a --steps shorter than the schedule was written for.
#
# Needs MPI and a Python with torch and numpy (as tests/oracle); without
# them it says so and skips. Every check prints one line; the last line is
# "N passed, N failed". About 40 s on two cores (41 s with other work beside it).
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
FSDPC=${FSDPC:-build/fsdpc}
OUT=build/eval
SHOW_LINES=30
. tests/lib.sh

need_torch eval
need_tools "eval" mpicc mpirun

rm -rf "$OUT"
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh   # again: MPIRUN keeps Open MPI's session directory in $TMP
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
CHECK="$PY tests/eval/check.py"
# mp W CMD...: CMD on W ranks (alone for one), with a time limit so a hang fails
mp() {
    local w=$1
    shift
    if [ "$w" = 1 ]; then timeout 120 "$@"; else timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; fi
}

if ! $MAKE --no-print-directory -s build/fsdata >"$OUT/build.txt" 2>&1; then
    bad "build: make build/fsdata" "$OUT/build.txt"
    done_
fi
DATA=$OUT/train.bin   # training tokens
VAL=$OUT/val.bin      # 641 tokens: 10 whole sequences of 64 (+ 1)
build/fsdata synth "$DATA" --tokens 40000 --seed 3 >/dev/null
build/fsdata synth "$VAL" --tokens 641 --seed 4 >/dev/null
K=10

for m in tiny tiny_llama; do
    build_trainer "$m: make trainer" trainer FSD=examples/$m.fsd BACKEND=cpu TRAINER="$OUT/$m/cpu" || continue
    d=$OUT/$m
    T=$d/cpu/train

    # ── the same val_loss on any number of ranks ──
    ref="" same=1 runs=""
    for w in 1 2 3 4; do
        if ! mp $w "$T" --data "$DATA" --val-data "$VAL" --steps 4 --eval-every 2 --eval-sequences $K \
                --lr 0 --log "$d/w$w.log" --quiet >"$d/w$w.out" 2>&1; then
            bad "$m: $w ranks with evaluation" "$d/w$w.out"
            same=0
            continue
        fi
        $CHECK vals "$d/w$w.log" >"$d/w$w.vals"
        runs="$runs $(tr '\n' ' ' <"$d/w$w.vals")|"
        if [ -z "$ref" ]; then ref=$d/w$w.vals; elif ! cmp -s "$ref" "$d/w$w.vals"; then same=0; fi
    done
    check "$m: val_loss after steps 1 and 3 equal to the last bit on 1, 2, 3 and 4 ranks ($(head -n 1 "$d/w1.vals" 2>/dev/null | cut -d' ' -f2))" \
        "[ $same = 1 ] && [ \"\$(cut -d' ' -f1 '$d/w1.vals' | tr '\n' ' ')\" = '1 3 ' ]" "$d/w1.vals"

    # ── against PyTorch, from weights far from the initialisation ──
    "$FSDPC" examples/$m.fsd --dump-model >"$d/model.txt"
    "$PY" tests/oracle/oracle.py weights "$d/model.txt" "$d/far.safetensors"
    if mp 2 "$T" --data "$DATA" --val-data "$VAL" --steps 2 --eval-every 1 --eval-sequences $K \
            --lr 0 --init-from "$d/far.safetensors" --log "$d/far.log" --quiet >"$d/far.out" 2>&1 &&
            $CHECK oracle "$d/model.txt" "$d/far.safetensors" "$VAL" $K f32 1e-6 "$d/far.log" >"$d/far.cmp" 2>&1; then
        ok "$m: val_loss from far weights against PyTorch: $(cat "$d/far.cmp")"
    else
        cat "$d/far.out" >>"$d/far.cmp"
        bad "$m: val_loss from far weights against PyTorch" "$d/far.cmp"
    fi
done

d=$OUT/tiny
T=$d/cpu/train
if [ -x "$T" ]; then
    # ── after training: 1, 2 and 4 ranks with one global batch (8 sequences) ──
    ok_runs=1
    for wk in 1:4 2:2 4:1; do
        w=${wk%:*} k=${wk#*:}
        mp $w "$T" --data "$DATA" --val-data "$VAL" --steps 6 --eval-every 3 --eval-sequences $K \
            --micro-batch 2 --grad-accum $k --log "$d/g$w.log" --quiet >"$d/g$w.out" 2>&1 || ok_runs=0
        $CHECK vals "$d/g$w.log" >"$d/g$w.vals"
    done
    if [ $ok_runs = 1 ] && paste "$d/g1.vals" "$d/g2.vals" "$d/g4.vals" | awk '
            { for (i = 4; i <= 6; i += 2) { e = ($i - $2) / $2; e = e < 0 ? -e : e; if (e > worst) worst = e }
              if ($1 != $3 || $1 != $5) bad = 1; n++ }
            END { printf "%d evaluations, largest relative difference %.1e\n", n, worst; exit !(n == 2 && !bad && worst <= 1e-5) }' >"$d/g.cmp"; then
        ok "tiny: val_loss after 6 steps of training on 1, 2 and 4 ranks (global batch 8): $(cat "$d/g.cmp")"
    else
        cat "$d"/g*.vals "$d"/g*.out >>"$d/g.cmp" 2>/dev/null
        bad "tiny: val_loss after training on 1, 2 and 4 ranks" "$d/g.cmp"
    fi

    # ── the steps, and training unchanged by evaluation ──
    mp 2 "$T" --data "$DATA" --val-data "$VAL" --steps 7 --eval-every 3 --eval-sequences $K \
        --ckpt-dir "$d/ckpt" --ckpt-every 3 --log "$d/e.log" --export "$d/e.safetensors" --quiet >"$d/e.out" 2>&1
    mp 2 "$T" --data "$DATA" --val-data "$VAL" --steps 7 \
        --log "$d/n.log" --export "$d/n.safetensors" --quiet >"$d/n.out" 2>&1
    $CHECK vals "$d/e.log" >"$d/e.vals"
    check "tiny: --steps 7 --eval-every 3 evaluates after steps 2, 5 and 6 (the last), only then" \
        "[ \"\$(cut -d' ' -f1 '$d/e.vals' | tr '\n' ' ')\" = '2 5 6 ' ]" "$d/e.out"
    if $CHECK same "$d/e.log" "$d/n.log" >"$d/same.txt" 2>&1 && cmp -s "$d/e.safetensors" "$d/n.safetensors"; then
        ok "tiny: training with evaluation is training without: $(cat "$d/same.txt"), the same exported weights"
    else
        bad "tiny: evaluation changed training" "$d/same.txt"
    fi

    # ── resume: the same evaluations at the same steps ──
    cp "$d/e.log" "$d/r.log"
    if mp 2 "$T" --data "$DATA" --val-data "$VAL" --steps 7 --eval-every 3 --eval-sequences $K \
            --ckpt-dir "$d/ckpt" --ckpt-every 3 --resume "$d/ckpt/step_000003" --log "$d/r.log" \
            --quiet >"$d/r.out" 2>&1; then
        $CHECK vals "$d/r.log" >"$d/r.vals"
        check "tiny: resumed from step 3, evaluates after steps 5 and 6 as the run that did not stop, to the last bit" \
            "cmp -s '$d/e.vals' '$d/r.vals'" "$d/r.vals"
    else
        bad "tiny: resume from step 3 with evaluation" "$d/r.out"
    fi

    # ── the float64 build against float64 PyTorch ──
    if build_trainer "tiny: make trainer BACKEND=cpu64" trainer FSD=examples/tiny.fsd BACKEND=cpu64 TRAINER="$d/cpu64"; then
        if mp 3 "$d/cpu64/train" --data "$DATA" --val-data "$VAL" --steps 1 --eval-every 1 --eval-sequences 7 \
                --lr 0 --init-from "$d/far.safetensors" --log "$d/f64.log" --quiet >"$d/f64.out" 2>&1 &&
                $CHECK oracle "$d/model.txt" "$d/far.safetensors" "$VAL" 7 f64 1e-12 "$d/f64.log" >"$d/f64.cmp" 2>&1; then
            ok "tiny: float64 build on 3 ranks, 7 sequences, against float64 PyTorch: $(cat "$d/f64.cmp")"
        else
            cat "$d/f64.out" >>"$d/f64.cmp"
            bad "tiny: float64 val_loss against PyTorch" "$d/f64.cmp"
        fi
    fi

    # ── refused at start-up ──
    mp 2 "$T" --data "$DATA" --val-data "$VAL" --steps 2 --eval-every 1 --eval-sequences 11 >"$d/short.out" 2>&1
    st=$?
    check "tiny: a validation file of 10 sequences with --eval-sequences 11 is refused at start-up, naming both" \
        "[ $st = 1 ] && grep -q 'validation file $VAL holds 10 whole sequences of 65 tokens (641 tokens), fewer than the 11' '$d/short.out' && ! grep -q '^step' '$d/short.out'" \
        "$d/short.out"
    mp 1 "$T" --data "$DATA" --steps 2 --eval-every 1 >"$d/noval.out" 2>&1
    st=$?
    check "tiny: --eval-every without validation data is refused" \
        "[ $st = 1 ] && grep -q 'evaluation (--eval-every 1, .*) needs validation data: pass --val-data FILE' '$d/noval.out'" "$d/noval.out"
    mp 1 "$T" --data "$DATA" --val-data "$VAL" --steps 2 --eval-sequences 4 >"$d/noevery.out" 2>&1
    st=$?
    check "tiny: --eval-sequences without --eval-every (nothing would evaluate) is refused, saying what to add" \
        "[ $st = 1 ] && grep -q -- '--eval-sequences 4 asks for an evaluation, but none runs: add --eval-every N' '$d/noevery.out' && ! grep -q '^step' '$d/noevery.out'" \
        "$d/noevery.out"
fi

# ── the schedules against torch.optim.lr_scheduler ──
# sched_case NAME SCHEDULE STEPS [RUN_STEPS]: a small model's trainer with
# lr_schedule = SCHEDULE written for STEPS steps, run for RUN_STEPS (default
# STEPS); every step's lr against PyTorch's for the run's steps. The
# trainer is built once per schedule (NAME).
S=$OUT/sched
mkdir -p "$S"
build/fsdata synth "$S/data.bin" --tokens 4000 --vocab 16 --seed 5 >/dev/null
sched_case() {
    local name=$1 sched=$2 steps=$3 run=${4:-$3} kind warmup min_lr decay args
    if [ ! -x "$S/$name/train" ]; then
        cat >"$S/$name.fsd" <<EOF
model sched {
  const vocab = 16, dim = 8, seq = 4
  tok  = Embedding(vocab, dim)
  head = Linear(dim, vocab)
  forward(idx, targets) {
    return cross_entropy(head(tok(idx)), targets)
  }
}
train {
  steps       = $steps
  optimizer   = adamw(lr = 0.01)
  lr_schedule = $sched
}
EOF
        build_trainer "schedule $sched: make trainer" trainer FSD="$S/$name.fsd" BACKEND=cpu TRAINER="$S/$name" || return
    fi
    kind=${sched%%(*}
    args=${sched#*(}
    warmup=$(sed -n 's/.*warmup = \([0-9]*\).*/\1/p' <<<"$args")
    min_lr=$(sed -n 's/.*min_lr = \([0-9.e-]*\).*/\1/p' <<<"$args")
    decay=$(sed -n 's/.*decay = \([0-9.]*\).*/\1/p' <<<"$args")
    if mp 1 "$S/$name/train" --data "$S/data.bin" --steps "$run" --log "$S/$name-$run.log" --quiet \
            >"$S/$name-$run.out" 2>&1 &&
            $CHECK lr "$S/$name-$run.log" "$kind" 0.01 "$run" "${warmup:-0}" "${min_lr:-0}" "${decay:-0}" \
            >"$S/$name-$run.cmp" 2>&1; then
        ok "lr_schedule = $sched, --steps $run, against PyTorch: $(cat "$S/$name-$run.cmp")"
    else
        cat "$S/$name-$run.out" >>"$S/$name-$run.cmp"
        bad "lr_schedule = $sched, --steps $run, against PyTorch" "$S/$name-$run.cmp"
    fi
}
sched_case constant "constant(warmup = 5)" 20
sched_case cosine "cosine(warmup = 5, min_lr = 1e-4)" 30
sched_case linear "linear(warmup = 5, min_lr = 1e-4)" 30
sched_case linear "linear(warmup = 5, min_lr = 1e-4)" 30 12
sched_case wsd "wsd(warmup = 5, decay = 0.3, min_lr = 1e-4)" 40
sched_case wsd "wsd(warmup = 5, decay = 0.3, min_lr = 1e-4)" 40 12
sched_case wsd0 "wsd(warmup = 4, decay = 0.8, min_lr = 0)" 20
done_
