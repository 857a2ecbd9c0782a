#!/usr/bin/env bash
# run.sh — sharded checkpoints and Hugging Face weights (docs/checkpoint.md):
# exact resume (sync and async saves), resharding 4 → 1, 2, 3 ranks, crash
# safety under SIGKILL, checksums, every refusal, keep = N, and safetensors
# with --hf-names gpt2 / llama (and llama's names for Qwen2's and Qwen3's
# attention) checked by a Python reader and a transformers-style forward
# written out in Python (check_hf.py); the config.json of a directory export
# under those names, field by field (GPT-2, Llama, Qwen3), and the warning
# for a model no config describes (Qwen2's biases with Qwen3's qk_norm).
#
# Trainers are built with `make trainer` (examples/tiny.fsd, GPT-2 shaped,
# and two very small models in this folder). Every check prints one line;
# the last line is "N passed, N failed". Ranks share the cores with one
# OpenMP thread each.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

need_tools "checkpoint tests" mpicc mpirun python3
# The trainers go to build/ckpt/, this suite's own: tests/all.sh runs suites
# side by side, and another one's `make trainer` of tiny (build/tiny/cpu)
# would relink the binary under this one's runs.
# hf_qwen3: hf_qwen without its q, k, v biases (Qwen3's attention_bias puts
# them on o too, or on none)
sed 's/bias = qkv/bias = false/; s/model hf_qwen /model hf_qwen3 /' tests/ckpt/hf_qwen.fsd >"$TMP/hf_qwen3.fsd"
for fsd in examples/tiny.fsd tests/ckpt/hf_gpt2.fsd tests/ckpt/hf_llama.fsd tests/ckpt/hf_qwen.fsd "$TMP/hf_qwen3.fsd"; do
    if ! $MAKE --no-print-directory -s trainer FSD=$fsd BACKEND=cpu TRAINER=build/ckpt/$(basename $fsd .fsd) \
            >"$TMP/build" 2>&1 ||
        grep -q "warning:" "$TMP/build"; then
        bad "build: make trainer FSD=$fsd (errors or warnings)" "$TMP/build"
        done_
    fi
done
ok "build: trainers for tiny, hf_gpt2, hf_llama, hf_qwen, hf_qwen3 without warnings"

TINY=build/ckpt/tiny/train
HFG=build/ckpt/hf_gpt2/train
HFL=build/ckpt/hf_llama/train
READ="python3 tests/ckpt/read_ckpt.py"
HF="python3 tests/ckpt/check_hf.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 60000 >/dev/null
build/fsdata synth "$TMP/d32.bin" --tokens 4000 --vocab 32 >/dev/null
# tiny on 2 ranks, 4 sequences a step; the cosine schedule spans 20 steps
RUN=(--data "$D" --steps 20 --micro-batch 1 --grad-accum 2 --quiet)

# step, loss and lr of each log line, as the text the trainer wrote
losses() { sed -E 's/^(\{"step": [0-9]+, "loss": [^,]+, "lr": [^,]+).*/\1/' "$@"; }
steps_from() { awk -v k="$2" -F'[:,]' '$2 + 0 >= k' "$1"; }
# close A B: B's steps are A's, with A's lr and A's loss to 1e-5 relative
close() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a = {x["step"]: x for x in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
assert b and all(x["step"] in a for x in b), [x["step"] for x in b]
for x in b:
    y = a[x["step"]]
    assert x["lr"] == y["lr"], (x, y)
    assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(y["loss"]), (x["step"], x["loss"], y["loss"])
PY
}
# descendants PID: every process under PID (mpirun's ranks)
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }

# ── CRC32C ──
check "crc32c: the reader's CRC32C of \"123456789\" is e3069283 (the standard check value)" \
    '[ "$($READ crc32c 123456789)" = e3069283 ]'

# ── exact resume ──
mp 2 $TINY "${RUN[@]}" --log "$TMP/straight.json" --export "$TMP/straight.st" >"$TMP/out" 2>&1 ||
    bad "straight run of 20 steps" "$TMP/out"
for mode in sync async; do
    flags=(--ckpt-dir "$TMP/$mode" --ckpt-every 10)
    [ $mode = async ] && flags+=(--ckpt-async)
    mp 2 $TINY "${RUN[@]}" "${flags[@]}" --log "$TMP/$mode.json" --export "$TMP/$mode.st" >"$TMP/out" 2>&1
    st=$?
    check "$mode save: the run that saves at steps 10 and 20 logs the same losses as one that does not" \
        '[ $st = 0 ] && [ "$(losses "$TMP/straight.json")" = "$(losses "$TMP/$mode.json")" ] && cmp -s "$TMP/straight.st" "$TMP/$mode.st"' "$TMP/out"
    check "$mode save: both checkpoints whole (sizes, CRC32C, headers: read_ckpt.py verify), latest = step_000020" \
        '$READ verify "$TMP/$mode/step_000010" >"$TMP/v" && $READ verify "$TMP/$mode/step_000020" >>"$TMP/v" && [ "$(cat "$TMP/$mode/latest")" = step_000020 ]' "$TMP/v"
    check "$mode save: the step-20 checkpoint holds exactly the weights --export wrote" \
        '$READ same-as-export "$TMP/$mode/step_000020" "$TMP/$mode.st" >"$TMP/v"' "$TMP/v"
    mp 2 $TINY "${RUN[@]}" --resume "$TMP/$mode/step_000010" --log "$TMP/$mode.resumed.json" \
        --export "$TMP/$mode.resumed.st" >"$TMP/out" 2>&1
    st=$?
    check "$mode save: 10 steps, save, resume, 10 steps = 20 straight: losses and lr as text, steps 10-19" \
        '[ $st = 0 ] && [ "$(losses "$TMP/$mode.resumed.json")" = "$(steps_from "$TMP/straight.json" 10 | losses)" ]' "$TMP/out"
    check "$mode save: ... and the final weights byte for byte" 'cmp -s "$TMP/straight.st" "$TMP/$mode.resumed.st"'
done
blk=$(grep -o '"ckpt_block_ms": [0-9.]*' "$TMP/async.json" | wc -l)
check "log: ckpt_block_ms on every step when checkpoints are on (20 of 20), never without" \
    '[ "$blk" = 20 ] && ! grep -q ckpt_block_ms "$TMP/straight.json"'

# async: the writes (slowed down: 9 sections x 100 ms) overlap training.
# A synchronous save waits out those 900 ms of sleeps on the training
# thread, however idle the machine, so blocking less than that is what an
# async save shows; a tighter bound (it was 100 ms) would hold the snapshot's
# wall-clock time to a fraction of the sleeps', which a loaded machine
# breaks.
FSD_CKPT_TEST_SLEEP_MS=100 mp 2 $TINY "${RUN[@]}" --ckpt-dir "$TMP/slow" --ckpt-every 10 --ckpt-async \
    --log "$TMP/slow.json" >"$TMP/out" 2>&1
st=$?
b9=$(sed -n 's/.*"step": 9, .*"ckpt_block_ms": \([0-9.]*\).*/\1/p' "$TMP/slow.json")
check "async save: training blocked ${b9:-?} ms at the save (< 900 ms: the 900 ms of writing ran behind it); both complete" \
    '[ $st = 0 ] && awk -v b="${b9:-1e9}" "BEGIN { exit !(b < 900) }" && [ -f "$TMP/slow/step_000010/meta.json" ] && [ -f "$TMP/slow/step_000020/meta.json" ] && [ "$(losses "$TMP/slow.json")" = "$(losses "$TMP/straight.json")" ]' "$TMP/out"

# ── resharding: saved on 4 ranks, resumed on 1, 2, 3 (12 sequences a step) ──
RS=(--data "$D" --steps 6 --grad-accum 1 --quiet)
mp 4 $TINY "${RS[@]}" --micro-batch 3 --ckpt-dir "$TMP/r4" --ckpt-every 3 --log "$TMP/r4.json" >"$TMP/out" 2>&1 ||
    bad "reshard: the 4-rank run" "$TMP/out"
for w in 1 2 3; do
    mp $w $TINY "${RS[@]}" --micro-batch $((12 / w)) --resume "$TMP/r4/step_000003" --log "$TMP/r$w.json" >"$TMP/out" 2>&1
    st=$?
    check "reshard: saved on 4 ranks, resumed on $w: steps 3-5 match the uninterrupted run to 1e-5" \
        '[ $st = 0 ] && [ "$(wc -l <"$TMP/r$w.json")" = 3 ] && close "$TMP/r4.json" "$TMP/r$w.json" >"$TMP/cmp" 2>&1' "$TMP/cmp"
done
# padding on the saving side: groups of 49,984 and 20,608 parameters pad on 3 ranks
mp 3 $TINY "${RS[@]}" --micro-batch 4 --ckpt-dir "$TMP/r3" --ckpt-every 3 --log "$TMP/r3.json" >"$TMP/out" 2>&1
mp 2 $TINY "${RS[@]}" --micro-batch 6 --resume "$TMP/r3/step_000003" --log "$TMP/r3to2.json" >>"$TMP/out" 2>&1
st=$?
check "reshard: saved on 3 ranks (padded groups), resumed on 2: steps 3-5 match to 1e-5" \
    '[ $st = 0 ] && [ "$(wc -l <"$TMP/r3to2.json")" = 3 ] && close "$TMP/r3.json" "$TMP/r3to2.json" >>"$TMP/out" 2>&1' "$TMP/out"

# ── crash safety: SIGKILL while step 10's files are being written ──
for mode in sync async; do
    K=$TMP/crash.$mode
    flags=(--ckpt-dir "$K" --ckpt-every 5 --ckpt-keep 1)
    [ $mode = async ] && flags+=(--ckpt-async)
    FSD_CKPT_TEST_SLEEP_MS=200 mp 2 $TINY "${RUN[@]}" "${flags[@]}" >"$TMP/out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do [ -d "$K/.tmp-step_000010" ] && break; sleep 0.05; done
    sleep 0.2
    kill -9 $(descendants $pid) $pid 2>/dev/null
    wait $pid 2>/dev/null
    check "crash ($mode): killed mid-save: step_000010 only as .tmp-, latest = step_000005, which keep = 1 left alone and verifies" \
        '[ -d "$K/.tmp-step_000010" ] && [ ! -e "$K/step_000010" ] && [ "$(cat "$K/latest")" = step_000005 ] && $READ verify "$K/step_000005" >"$TMP/v"' "$TMP/v"
    mp 2 $TINY "${RUN[@]}" --ckpt-dir "$K" --resume --ckpt-every 5 --log "$TMP/crash.$mode.json" >"$TMP/out" 2>&1
    st=$?
    check "crash ($mode): --resume (latest) continues from step 5 exactly; the stale .tmp- is swept" \
        '[ $st = 0 ] && [ "$(losses "$TMP/crash.$mode.json")" = "$(steps_from "$TMP/straight.json" 5 | losses)" ] && [ ! -e "$K/.tmp-step_000010" ] && [ "$(cat "$K/latest")" = step_000020 ]' "$TMP/out"
done

# ── refusals: a message on every rank, exit 1, nothing trained ──
# refuse NAME EXPECTED-TEXT CMD...: 2 ranks, status 1, the text twice, no step ran
refuse() {
    local name=$1 want=$2
    shift 2
    mp 2 "$@" --log "$TMP/refused.json" >"$TMP/out" 2>&1
    local st=$? n
    n=$(grep -c -F -- "$want" "$TMP/out")
    check "refuse: $name (status $st, message on $n of 2 ranks)" \
        '[ $st = 1 ] && [ "$n" = 2 ] && ! grep -q "^step" "$TMP/out" && [ ! -s "$TMP/refused.json" ]' "$TMP/out"
}
C=$TMP/sync/step_000010
cp -r "$C" "$TMP/bad"
refuse "another model's checkpoint" \
    "was written for model hash $(sed -n 's/.*"model_hash": "\(.*\)".*/\1/p' "$C/meta.json") (model tiny); this program's is" \
    $HFG --data "$TMP/d32.bin" --steps 2 --resume "$C"
cp "$C/rank_00001.bin" "$TMP/r1"
python3 - "$TMP/bad/rank_00001.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:   # one byte of the data, well past the header
    f.seek(5000); b = f.read(1); f.seek(5000); f.write(bytes([b[0] ^ 0x01]))
PY
refuse "one corrupt byte in a rank file" "rank file rank_00001.bin fails its checksum" \
    $TINY "${RUN[@]}" --resume "$TMP/bad"
cp "$TMP/r1" "$TMP/bad/rank_00001.bin"
rm "$TMP/bad/rank_00001.bin"
refuse "a missing rank file" "rank file rank_00001.bin is missing" $TINY "${RUN[@]}" --resume "$TMP/bad"
head -c 700000 "$TMP/r1" >"$TMP/bad/rank_00001.bin"
refuse "a truncated rank file" "rank file rank_00001.bin is truncated: 700000 bytes, meta.json says" \
    $TINY "${RUN[@]}" --resume "$TMP/bad"
cp "$TMP/r1" "$TMP/bad/rank_00001.bin"
sed -i 's/"version": 1,/"version": 2,/' "$TMP/bad/meta.json"
refuse "an unknown format version" "has format version 2; this trainer reads version 1" \
    $TINY "${RUN[@]}" --resume "$TMP/bad"
mkdir -p "$TMP/empty"
refuse "no latest to resume" "cannot resume: $TMP/empty/latest does not exist" \
    $TINY "${RUN[@]}" --ckpt-dir "$TMP/empty" --resume
refuse "a --ckpt-dir that cannot be made, before the first step" \
    "cannot create checkpoint directory $TMP/straight.st/ckpt" \
    $TINY "${RUN[@]}" --ckpt-dir "$TMP/straight.st/ckpt" --ckpt-every 5
refuse "--resume with --init-from" "--resume and --init-from both set the weights" \
    $TINY "${RUN[@]}" --resume "$C" --init-from "$TMP/straight.st"

# ── keep = N ──
K=$TMP/keep
mkdir -p "$K/.tmp-step_000003"
cp -r "$TMP/sync/step_000020" "$K/step_000050"   # a later run's, complete
# (--ckpt-overwrite: step_000050 is another lineage's, which a fresh run refuses)
mp 2 $TINY "${RUN[@]}" --steps 8 --ckpt-dir "$K" --ckpt-every 2 --ckpt-keep 2 --ckpt-overwrite >"$TMP/out" 2>&1
st=$?
check "keep = 2: step_000006 and step_000008 stay, 2 and 4 are removed, another run's step_000050 untouched, stale .tmp- swept" \
    '[ $st = 0 ] && [ "$(cd "$K" && ls -A | tr "\n" " ")" = ".lock latest step_000006 step_000008 step_000050 " ] && [ "$(cat "$K/latest")" = step_000008 ]' "$TMP/out"

# ── safetensors with Hugging Face's names ──
mp 1 $TINY --steps 0 --export "$TMP/plain.st" --quiet &&
    mp 2 $TINY --steps 0 --export "$TMP/gpt2.st" --hf-names gpt2 --quiet >"$TMP/out" 2>&1
check "--hf-names gpt2: tiny's export has GPT2LMHeadModel's names, shapes and values (Conv1D transposed, c_attn = q|k|v, no lm_head)" \
    '$HF gpt2-layout "$TMP/plain.st" "$TMP/gpt2.st" >"$TMP/v"' "$TMP/v"
mp 2 $TINY --steps 0 --init-from "$TMP/gpt2.st" --hf-names gpt2 --export "$TMP/back.st" --quiet >"$TMP/out" 2>&1
check "--hf-names gpt2: round trip: that file imported (2 ranks) and exported again is byte for byte the same" \
    'cmp -s "$TMP/gpt2.st" "$TMP/back.st"' "$TMP/out"
python3 - "$TMP/gpt2.st" "$TMP/hub.st" <<'PY'
import sys   # the Hub's gpt2 files: no `transformer.` prefix
sys.path.append("tests")
from fsdfiles import read_safetensors, write_safetensors
tensors, _ = read_safetensors(sys.argv[1])
write_safetensors(sys.argv[2], {k.removeprefix("transformer."): (t.shape, t.raw) for k, t in tensors.items()})
PY
mp 1 $TINY --steps 0 --init-from "$TMP/hub.st" --hf-names gpt2 --export "$TMP/hub.back.st" --quiet >"$TMP/out" 2>&1
check "--hf-names gpt2: import also takes the Hub's names without \`transformer.\`" \
    'cmp -s "$TMP/gpt2.st" "$TMP/hub.back.st"' "$TMP/out"
mp 2 $TINY "${RUN[@]}" --steps 5 --log "$TMP/fromhf.json" --init-from "$TMP/gpt2.st" --hf-names gpt2 >"$TMP/out" 2>&1
mp 2 $TINY "${RUN[@]}" --steps 5 --log "$TMP/frominit.json" >>"$TMP/out" 2>&1
check "--hf-names gpt2: 5 steps from the HF file give the losses of 5 steps from the initialisation, as text" \
    '[ -s "$TMP/fromhf.json" ] && [ "$(losses "$TMP/fromhf.json")" = "$(losses "$TMP/frominit.json")" ]' "$TMP/out"
# qwen: hf_qwen.fsd under llama's names, which are Qwen2's and Qwen3's
for m in gpt2 llama qwen; do
    T=build/ckpt/hf_$m/train names=$m
    [ $m = qwen ] && names=llama
    mp 1 $T --steps 0 --export "$TMP/$m.plain.st" --quiet && mp 1 $T --steps 0 --export "$TMP/$m.hf.st" --hf-names $names --quiet &&
        $HF $names-layout "$TMP/$m.plain.st" "$TMP/$m.hf.st" >"$TMP/v" 2>&1 &&
        $HF randomize "$TMP/$m.hf.st" "$TMP/$m.rnd.st" 7 >>"$TMP/v" 2>&1 &&
        mp 1 $T --data "$TMP/d32.bin" --steps 1 --init-from "$TMP/$m.rnd.st" --hf-names $names --log "$TMP/$m.json" \
            --export "$TMP/$m.again.st" --quiet >>"$TMP/v" 2>&1
    st=$?
    if [ $m = gpt2 ]; then
        check "--hf-names gpt2: a transformers-style GPT-2 forward (x·W + b) of random HF weights gives the trainer's step-0 loss (1e-5)" \
            '[ $st = 0 ] && $HF gpt2-loss "$TMP/$m.rnd.st" "$TMP/d32.bin" 2 "$TMP/$m.json" >"$TMP/v" 2>&1' "$TMP/v"
    elif [ $m = llama ]; then
        check "--hf-names llama: names and layout; a transformers-style Llama forward (rotate-half RoPE, q/k unpermuted, repeat_kv) gives the step-0 loss (1e-5)" \
            '[ $st = 0 ] && $HF llama-loss "$TMP/$m.rnd.st" "$TMP/d32.bin" 4 2 10000 8 "$TMP/$m.json" >"$TMP/v" 2>&1' "$TMP/v"
        check "--hf-names llama: ... and Meta's interleaved rotary pairing would not (the check tells them apart)" \
            '$HF llama-loss "$TMP/$m.rnd.st" "$TMP/d32.bin" 4 2 10000 8 "$TMP/$m.json" interleaved >"$TMP/v" 2>&1' "$TMP/v"
    else
        check "--hf-names llama, Qwen's attention (bias = qkv, qk_norm = rms): q_proj, k_proj, v_proj with biases, o_proj without (Qwen2), self_attn.q_norm and k_norm [head_dim] (Qwen3); a transformers-style forward (each head of q and k RMS-normed before RoPE) gives the step-0 loss (1e-5)" \
            '[ $st = 0 ] && $HF llama-loss "$TMP/$m.rnd.st" "$TMP/d32.bin" 4 2 10000 8 "$TMP/$m.json" >"$TMP/v" 2>&1' "$TMP/v"
        mp 2 $T --steps 0 --init-from "$TMP/$m.hf.st" --hf-names llama --export "$TMP/$m.back.st" --quiet >"$TMP/out" 2>&1
        check "--hf-names llama, Qwen's attention: round trip: imported (2 ranks) and exported again, byte for byte the same" \
            'cmp -s "$TMP/$m.hf.st" "$TMP/$m.back.st"' "$TMP/out"
    fi
done
mp 2 $HFL --steps 0 --init-from "$TMP/llama.hf.st" --hf-names llama --export "$TMP/llama.back.st" --quiet >"$TMP/out" 2>&1
check "--hf-names llama: round trip: imported (2 ranks) and exported again, byte for byte the same" \
    'cmp -s "$TMP/llama.hf.st" "$TMP/llama.back.st"' "$TMP/out"
# ── config.json beside a directory export (docs/checkpoint.md#the-config) ──
# each field from the .fsd (hf_gpt2: dim 16, 2 heads, MLP 64, LayerNorm eps
# 1e-5; hf_llama: 4 heads, 2 kv heads, RoPE 10000, RMSNorm eps 1e-6, an
# untied head; hf_qwen3: qk_norm), the dtype from --export-dtype
CFG="python3 tests/hf/config.py"
# cfg NAME TRAINER NAMES DTYPE KEY=JSON...: a directory export's config.json
cfg() {
    local name=$1 t=$2 names=$3 dt=$4
    shift 4
    rm -rf "$TMP/cfg"
    mp 2 $t --steps 0 --export "$TMP/cfg" --export-shard-size 1GB --export-dtype $dt --hf-names $names \
        --quiet >"$TMP/out" 2>&1 && $CFG expect "$TMP/cfg/config.json" "$@" >"$TMP/v" 2>&1
    local st=$?
    cat "$TMP/out" >>"$TMP/v"
    check "config.json: $name ($(head -n 1 "$TMP/v"))" '[ $st = 0 ] && [ ! -s "$TMP/out" ]' "$TMP/v"
}
cfg "hf_gpt2 as GPT2LMHeadModel, tanh gelu as gelu_new, no dropout" $HFG gpt2 fp32 \
    'architectures=["GPT2LMHeadModel"]' 'model_type="gpt2"' vocab_size=32 n_positions=8 n_embd=16 \
    n_layer=2 n_head=2 n_inner=64 'activation_function="gelu_new"' layer_norm_epsilon=1e-05 \
    tie_word_embeddings=true resid_pdrop=0.0 embd_pdrop=0.0 attn_pdrop=0.0 'torch_dtype="float32"'
cfg "hf_llama as LlamaForCausalLM, untied, bf16" $HFL llama bf16 \
    'architectures=["LlamaForCausalLM"]' 'model_type="llama"' vocab_size=32 hidden_size=16 \
    intermediate_size=24 num_hidden_layers=2 num_attention_heads=4 num_key_value_heads=2 \
    'hidden_act="silu"' rms_norm_eps=1e-06 rope_theta=10000.0 rope_scaling=null max_position_embeddings=8 \
    tie_word_embeddings=false attention_bias=false mlp_bias=false 'torch_dtype="bfloat16"'
cfg "hf_qwen3 (qk_norm) as Qwen3ForCausalLM with its head_dim, fp16" build/ckpt/hf_qwen3/train llama fp16 \
    'architectures=["Qwen3ForCausalLM"]' 'model_type="qwen3"' hidden_size=16 num_attention_heads=4 \
    num_key_value_heads=2 head_dim=4 rms_norm_eps=1e-06 attention_bias=false use_sliding_window=false \
    tie_word_embeddings=false 'torch_dtype="float16"'
# hf_qwen: q, k, v biases (Qwen2's) and qk_norm (Qwen3's): no model has both
rm -rf "$TMP/cfg"
mp 2 build/ckpt/hf_qwen/train --steps 0 --export "$TMP/cfg" --export-shard-size 1GB --hf-names llama \
    --quiet >"$TMP/out" 2>&1
st=$?
check "config.json: hf_qwen (bias = qkv and qk_norm) gets its weights alone, and one warning naming the layer" \
    '[ $st = 0 ] && [ -f "$TMP/cfg/model.safetensors" ] && [ ! -e "$TMP/cfg/config.json" ] &&
     [ "$(grep -c warning "$TMP/out")" = 1 ] &&
     grep -qF -- "train: warning: --export $TMP/cfg gets the weights without config.json: \`layers.0.attn\` has biases on q, k and v alone (bias = qkv) and qk_norm: Qwen2 has no qk_norm, and Qwen3'"'"'s attention_bias is on q, k, v and o alike" "$TMP/out"' "$TMP/out"
refuse "--hf-names llama for a GPT-2-shaped model names what does not fit" \
    "--hf-names llama: \`blocks.0.mlp\` is a gelu/relu MLP (fc, proj); Llama's MLP is gate, up, down" \
    $TINY --steps 0 --export "$TMP/x.st" --hf-names llama
refuse "--hf-names gpt2 for a Llama-shaped model names what does not fit" \
    "--hf-names gpt2: \`layers.0.mlp\` is a swiglu MLP" $HFL --steps 0 --export "$TMP/x.st" --hf-names gpt2

done_
