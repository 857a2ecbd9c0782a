#!/usr/bin/env bash
# run.sh — Hugging Face model directories against `transformers` itself
# (docs/checkpoint.md#from-a-hugging-face-model-directory): tiny random GPT-2
# and Llama models (grouped-query attention, RoPE theta 500000, SwiGLU,
# RMSNorm) made and saved by transformers in BF16 as 3 shards with their
# index; their .fsd written by `fsdpc --from-hf config.json`; a trainer built
# from it, which imports the directory (--init-from DIR --hf-names) on 1 and
# 2 ranks and logs the loss transformers computes for the same batch in fp32
# (the weights are exact, so to ~1e-7), and exports it (--steps 0
# --export-dtype bf16 --export-shard-size) as a directory that
# from_pretrained loads through the config.json the export writes (which
# says what transformers' own config says on every field that defines the
# model: tests/hf/config.py), every tensor bit for bit the original's, with
# save_pretrained's file names and index text. Hand-written .fsd files
# (tests/ckpt/hf_gpt2.fsd, hf_llama.fsd), exported as directories with
# their config.json and given random weights, load with from_pretrained and
# give the trainer's loss. A third model, a Llama with
# a tied head and biases in F16, is checked on 1 rank; a fourth, a Qwen2
# (biases on q, k and v alone, a tied head; --from-hf writes bias = qkv,
# --hf-names llama names its tensors), on 1 and 2. Then the refusals, each
# naming the file and the field: an unsupported dtype, a missing shard
# file, a shape, a truncated file, an index that is not JSON.
#
# The transformers checks need .venv (tools/venv.sh, which tools/setup.sh
# runs: transformers, safetensors and tokenizers from PyPI beside Debian's
# python3-torch); without it they are skipped, saying why, and the refusals
# run on directories the trainer exports itself (whose config.json is still
# held to tests/hf/*.json). Every check prints one
# line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

need_tools "Hugging Face tests" mpicc mpirun python3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }
PY=.venv/bin/python
HF="$PY tests/hf/hf.py"
CFG="python3 tests/hf/config.py"
have_hf=1
if ! tools/venv.sh --check; then
    have_hf=0
    echo "skip transformers checks: .venv does not import the pinned transformers with torch" \
         "(tools/venv.sh makes it from PyPI; tools/setup.sh runs it); the refusals still run"
fi
build/fsdata synth "$TMP/d96.bin" --tokens 4000 --vocab 96 >/dev/null

# ── the models: made by transformers, or (without it) exported by fsdpc ──
# model KIND: $TMP/KIND (the directory) and build/hf/KIND/train
for kind in gpt2 llama llama_tb qwen2; do
    D=$TMP/$kind
    names=${kind%%_*} ranks="1 2"
    [ $names = qwen2 ] && names=llama   # Qwen2's tensors have Llama's names
    [ $kind = llama_tb ] && ranks=1
    if [ $have_hf = 1 ]; then
        if ! $HF make $kind "$D" >"$TMP/$kind.size" 2>"$TMP/out"; then
            bad "$kind: transformers makes and saves the model" "$TMP/out"
            continue
        fi
        n=$(ls "$D"/model-*-of-*.safetensors 2>/dev/null | wc -l)
        check "$kind: save_pretrained wrote its weights as $n shards (2 or more) with model.safetensors.index.json" \
            '[ "$n" -ge 2 ] && [ -f "$D/model.safetensors.index.json" ]'
        cfg=$D/config.json
    else
        # the same configuration, as save_pretrained writes it (tests/hf/*.json)
        [ $kind = llama_tb ] && continue
        cfg=tests/hf/$kind.json
    fi
    # --seq 8: fewer positions than the model's (GPT-2's wpe has 16 rows)
    if ! build/fsdpc --from-hf "$cfg" --seq 8 -o "$TMP/$kind.fsd" 2>"$TMP/out"; then
        bad "$kind: fsdpc --from-hf $cfg" "$TMP/out"
        continue
    fi
    build_trainer "$kind: make trainer from fsdpc --from-hf's .fsd" \
        trainer FSD="$TMP/$kind.fsd" TRAINER=build/hf/$kind || continue
    ok "$kind: fsdpc --from-hf config.json --seq 8 writes a .fsd a trainer builds from without warnings"
    T=build/hf/$kind/train
    if [ $have_hf = 0 ]; then
        # a directory like the one transformers writes, from the trainer's own initialisation
        mp 1 $T --steps 0 --export "$D" --export-dtype bf16 --export-shard-size 20KB --hf-names $names \
            --quiet >"$TMP/out" 2>&1 || bad "$kind: the trainer exports a BF16 directory" "$TMP/out"
        $CFG agree "$cfg" "$D/config.json" 8 >"$TMP/v" 2>&1
        st=$?
        check "$kind: the export's config.json says what $cfg says: $(tail -n 1 "$TMP/v")" \
            '[ $st = 0 ]' "$TMP/v"
        continue
    fi
    size=$(cat "$TMP/$kind.size")
    dt=BF16 edt=bf16
    [ $kind = llama_tb ] && dt=F16 edt=fp16

    # ── the first step's loss against transformers', 1 and 2 ranks (4 sequences of 8) ──
    for w in $ranks; do
        mp $w $T --data "$TMP/d96.bin" --steps 1 --micro-batch $((4 / w)) --grad-accum 1 \
            --init-from "$D" --hf-names $names --log "$TMP/$kind.$w.json" --quiet >"$TMP/out" 2>&1 &&
            $HF loss "$D" "$TMP/d96.bin" 4 8 "$TMP/$kind.$w.json" >"$TMP/v" 2>&1
        st=$?
        check "$kind: --init-from DIR ($dt, sharded) on $w rank(s): step 0's loss is transformers' fp32 loss of the batch ($(tail -n 1 "$TMP/v"))" \
            '[ $st = 0 ]' "$TMP/v"
        [ $st = 0 ] || cat "$TMP/out" >>"$TMP/v"
    done

    # ── exported back, bit for bit, on 1 and 2 ranks ──
    for w in $ranks; do
        E=$TMP/$kind.export$w
        mp $w $T --steps 0 --init-from "$D" --hf-names $names --export "$E" --export-dtype $edt \
            --export-shard-size $size --quiet >"$TMP/out" 2>&1 && $HF same "$D" "$E" >"$TMP/v" 2>&1
        st=$?
        check "$kind: --steps 0 --export DIR --export-dtype $edt --export-shard-size $size on $w rank(s): from_pretrained loads it with the config.json written beside it; $(tail -n 1 "$TMP/v"), save_pretrained's file names and index" \
            '[ $st = 0 ]' "$TMP/v"
    done
    $CFG agree "$D/config.json" "$E/config.json" 8 >"$TMP/v" 2>&1
    st=$?
    check "$kind: the export's config.json says what transformers' own says: $(tail -n 1 "$TMP/v")" \
        '[ $st = 0 ]' "$TMP/v"
done

# ── hand-written .fsd (tests/ckpt's), exported with their config.json ──
# random weights (std 0.3, norms 1 ± 0.3) put into the exported directory;
# the trainer imports them and logs step 0's loss, which from_pretrained(DIR)
# must give to 5e-7 (fp32 throughout: ~1e-7 here): rope_theta 500000 for
# 10000 moves it 2.5e-3, gelu for gelu_new 2.9e-5, and the eps 1e-5 for
# 1e-6 (or back) 1.4e-6 (Llama) and 3.9e-6 (GPT-2)
build/fsdata synth "$TMP/d32.bin" --tokens 4000 --vocab 32 >/dev/null
for m in gpt2 llama; do
    [ $have_hf = 1 ] || break
    build_trainer "hand-written $m: make trainer FSD=tests/ckpt/hf_$m.fsd" \
        trainer FSD=tests/ckpt/hf_$m.fsd TRAINER=build/hf/hand_$m || continue
    T=build/hf/hand_$m/train E=$TMP/hand_$m
    mp 1 $T --steps 0 --export "$E" --export-shard-size 1GB --hf-names $m --quiet >"$TMP/v" 2>&1 &&
        python3 tests/ckpt/check_hf.py randomize "$E/model.safetensors" "$TMP/rnd.st" 7 >>"$TMP/v" 2>&1 &&
        mv "$TMP/rnd.st" "$E/model.safetensors" &&
        mp 1 $T --data "$TMP/d32.bin" --steps 1 --micro-batch 4 --grad-accum 1 --init-from "$E" \
            --hf-names $m --log "$TMP/hand_$m.json" --quiet >>"$TMP/v" 2>&1 &&
        $HF loss "$E" "$TMP/d32.bin" 4 8 "$TMP/hand_$m.json" 5e-7 >>"$TMP/v" 2>&1
    st=$?
    check "hand-written $m (tests/ckpt/hf_$m.fsd): --export DIR --hf-names $m writes a config.json with which from_pretrained(DIR) gives the trainer's loss ($(tail -n 1 "$TMP/v"))" \
        '[ $st = 0 ]' "$TMP/v"
done

# ── refusals: 2 ranks, status 1, the message on both, nothing trained ──
# refuse NAME EXPECTED-TEXT CMD...
refuse() {
    local name=$1 want=$2
    shift 2
    mp 2 "$@" --log "$TMP/refused.json" >"$TMP/out" 2>&1
    local st=$? n
    n=$(grep -c -F -- "$want" "$TMP/out")
    check "refuse: $name (status $st, message on $n of 2 ranks)" \
        '[ $st = 1 ] && [ "$n" = 2 ] && [ ! -s "$TMP/refused.json" ]' "$TMP/out"
}
# header FILE PYTHON: FILE's safetensors header rewritten by PYTHON (on `h`,
# the parsed header), the data left as it is
header() {
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
path, edit = sys.argv[1], sys.argv[2]
blob = open(path, "rb").read()
(n,) = struct.unpack_from("<Q", blob, 0)
h = json.loads(blob[8:8 + n])
exec(edit)
text = json.dumps(h).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + blob[8 + n:])
PY
}
L=$TMP/llama
T=build/hf/llama/train
if [ -x $T ] && [ -f "$L/model.safetensors.index.json" ]; then
    RUN=(--data "$TMP/d96.bin" --steps 1 --hf-names llama)
    first=$(ls "$L"/model-00001-of-*.safetensors) second=$(ls "$L"/model-00002-of-*.safetensors)
    # the tensors of a shard, in the index's (sorted) order
    in_shard() { python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["weight_map"]; print(" ".join(sorted(k for k in m if m[k]==sys.argv[2])))' "$L/model.safetensors.index.json" "$(basename "$1")"; }
    t1=$(in_shard "$first" | cut -d' ' -f1) t2=$(in_shard "$second" | cut -d' ' -f1)

    B=$TMP/bad-dtype; cp -r "$L" "$B"
    header "$B/$(basename "$first")" "h['$t1']['dtype'] = 'I64'"
    refuse "a tensor of dtype I64 names the file, the tensor and the dtypes accepted" \
        "$B/$(basename "$first"): tensor \`$t1\` has dtype I64; the dtypes accepted are F32, BF16 and F16" \
        $T "${RUN[@]}" --init-from "$B"

    B=$TMP/bad-missing; cp -r "$L" "$B"; rm "$B/$(basename "$second")"
    refuse "an index naming a missing shard file names the index, the file and a tensor" \
        "$B/model.safetensors.index.json: weight_map names shard file $(basename "$second") (for tensor \`$t2\`), which is missing" \
        $T "${RUN[@]}" --init-from "$B"

    B=$TMP/bad-shape; cp -r "$L" "$B"
    header "$B/$(basename "$first")" "k = 'model.layers.0.self_attn.k_proj.weight'
if k in h: h[k]['shape'] = h[k]['shape'][::-1]"
    k=model.layers.0.self_attn.k_proj.weight
    kf=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["weight_map"][sys.argv[2]])' "$L/model.safetensors.index.json" $k)
    [ "$kf" = "$(basename "$first")" ] || header "$B/$kf" "h['$k']['shape'] = h['$k']['shape'][::-1]"
    refuse "a tensor of another shape names the file, the tensor and both shapes" \
        "$B/$kf: tensor \`$k\` has shape [32, 16]; the model's is [16, 32] under --hf-names llama" \
        $T "${RUN[@]}" --init-from "$B"

    B=$TMP/bad-cut; cp -r "$L" "$B"
    truncate -s -100 "$B/$(basename "$second")"
    refuse "a truncated shard names the file and a tensor past its end" \
        "$B/$(basename "$second") is truncated, or tensor \`" $T "${RUN[@]}" --init-from "$B"

    B=$TMP/bad-index; cp -r "$L" "$B"
    sed -i 's/"weight_map": {/"weight_map": {,/' "$B/model.safetensors.index.json"
    refuse "an index that is not JSON names it and the byte" \
        "$B/model.safetensors.index.json is not valid JSON: byte" $T "${RUN[@]}" --init-from "$B"

    B=$TMP/bad-overlap; cp -r "$L" "$B"
    header "$B/$(basename "$first")" "ks = [k for k in h if k != '__metadata__']
h[ks[1]]['data_offsets'] = [h[ks[0]]['data_offsets'][0], h[ks[0]]['data_offsets'][0] + h[ks[1]]['data_offsets'][1] - h[ks[1]]['data_offsets'][0]]"
    refuse "two tensors sharing bytes name the file and both tensors" \
        "$B/$(basename "$first"): tensors \`" $T "${RUN[@]}" --init-from "$B"

    refuse "--export-shard-size that is not a size" \
        "--export-shard-size: '5 GB' is not a size" $T "${RUN[@]}" --export "$TMP/x" --export-shard-size "5 GB"
    refuse "--export-dtype that is not one" "--export-dtype: 'int8' is not one of fp32, bf16, fp16" \
        $T "${RUN[@]}" --export "$TMP/x" --export-dtype int8
    touch "$TMP/afile"
    refuse "--export-shard-size with --export naming a file" \
        "--export $TMP/afile with --export-shard-size names a directory" \
        $T "${RUN[@]}" --export "$TMP/afile" --export-shard-size 1MB
else
    bad "refusals: no llama directory and trainer to start from (see above)"
fi

done_
