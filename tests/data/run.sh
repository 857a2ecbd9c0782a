#!/usr/bin/env bash
# tests/data/run.sh — data as people have it: token shards read by pattern,
# --shuffle, and text tokenized by tools/fstokens.py, up to the README's
# walk from a config.json and a text corpus to an exported model.
#
#   - test_shuffle: --shuffle's permutation alone (tests/data/test_shuffle.c);
#   - tiny's trainer reads --data 'DIR/sp_*.bin' (a file's sequences cut
#     into shards) with the very losses of the file itself, on 1 and 2 ranks;
#   - --shuffle: the same losses at world 1, 2 and 4 with the same global
#     batch (1e-5), not those of the file order; past an epoch, and resumed
#     from a checkpoint, the run that did not stop to the last bit;
#   - refusals naming the pattern or file: a pattern matching nothing, a
#     shard with a bad header, shards all shorter than a sequence; a short
#     shard among good ones adds nothing and says so; ranks whose patterns
#     match other shards, or with --shuffle on one alone, are refused, and
#     the same shards in another directory accepted;
#   - with .venv (tools/venv.sh; skipped, saying why, without it):
#     fstokens.py trains a byte-level BPE on generated text, encodes it into
#     train and val shards (decode == text, shard sizes, the split), a
#     vocabulary over 65,536 gives uint32 (version 2) files, text that is not
#     UTF-8 is refused with its file and line; and the README's walk: fsdpc
#     --from-hf config.json, fstokens.py, a trainer on 2 ranks with --data
#     and --val-data patterns, --shuffle and evaluation, --export, loaded by
#     transformers' from_pretrained, whose loss on the validation sequences
#     is the trainer's last val_loss.
# Every check prints one line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
OUT=build/data
SHOW_LINES=20
. tests/lib.sh
need_tools "data tests" mpicc mpirun python3

rm -rf "$OUT"
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh   # again: MPIRUN keeps Open MPI's session directory in $TMP
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }
losses() { grep -o '"loss": [^,]*' "$1"; }
TOK="python3 tests/data/tokens.py"

$MAKE --no-print-directory -s build/fsdata build/data/test_shuffle >"$TMP/build" 2>&1 ||
    { bad "make build/fsdata build/data/test_shuffle" "$TMP/build"; done_; }
suite "shuffle: " build/data/test_shuffle
build_trainer "tiny: make trainer" trainer FSD=examples/tiny.fsd TRAINER=$OUT/tiny || done_
T=$OUT/tiny/train

# ── shards by pattern: a file's 31 sequences as shards of 10, 10, 10, 1 ──
D=$TMP/d
mkdir -p "$D"
build/fsdata synth "$D/all.bin" --tokens 2000 --vocab 256 >/dev/null
$TOK split "$D/all.bin" 64 10 "$D/sp" >/dev/null
for w in 1 2; do
    mp $w $T --data "$D/all.bin" --steps 10 --micro-batch $((4 / w)) --log "$TMP/file$w.log" --quiet \
        >"$TMP/out" 2>&1 || bad "tiny: --data FILE on $w rank(s)" "$TMP/out"
    mp $w $T --data "$D/sp_*.bin" --steps 10 --micro-batch $((4 / w)) --log "$TMP/pat$w.log" --quiet \
        >"$TMP/out" 2>&1 || bad "tiny: --data PATTERN on $w rank(s)" "$TMP/out"
    check "tiny: --data '$D/sp_*.bin' (4 shards) on $w rank(s): the file's 10 losses, to the last bit, past the end of the data twice" \
        "[ \"\$(losses $TMP/file$w.log)\" = \"\$(losses $TMP/pat$w.log)\" ] && [ \$(losses $TMP/pat$w.log | wc -l) = 10 ]" \
        "$TMP/pat$w.log"
done

# ── --shuffle: the same order at any world size, reshuffled each epoch ──
for w in 1 2 4; do
    mp $w $T --data "$D/sp_*.bin" --steps 10 --micro-batch $((4 / w)) --shuffle --log "$TMP/sh$w.log" \
        --ckpt-dir "$TMP/ck$w" --ckpt-every 5 --quiet >"$TMP/out" 2>&1 ||
        bad "tiny: --shuffle on $w rank(s)" "$TMP/out"
done
cat >"$TMP/close.py" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
d = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) == 10 else float("inf")
print("largest difference %.3g" % d)
sys.exit(0 if d <= float(sys.argv[3]) else 1)
PY
for w in 2 4; do
    check "tiny: --shuffle, 8 sequences a step: $w ranks' 10 losses are 1 rank's to 1e-5 ($(python3 "$TMP/close.py" "$TMP/sh1.log" "$TMP/sh$w.log" 1e-5))" \
        "python3 '$TMP/close.py' '$TMP/sh1.log' '$TMP/sh$w.log' 1e-5 >/dev/null" "$TMP/sh$w.log"
done
check "tiny: --shuffle reads another order than the file's: its losses differ from step 1 on" \
    "! python3 '$TMP/close.py' '$TMP/pat1.log' '$TMP/sh1.log' 1e-3 >/dev/null" "$TMP/sh1.log"
mp 1 $T --data "$D/sp_*.bin" --steps 10 --micro-batch 4 --shuffle --seed 7 --log "$TMP/seed7.log" \
    --quiet >"$TMP/out" 2>&1 || bad "tiny: --shuffle --seed 7" "$TMP/out"
check "tiny: --shuffle with another --seed reads another order" \
    "! python3 '$TMP/close.py' '$TMP/sh1.log' '$TMP/seed7.log' 1e-3 >/dev/null" "$TMP/seed7.log"
# resumed at step 5 (of 10; 8 sequences a step, so the second pass over the 31 ends in step 7)
head -n 5 "$TMP/sh2.log" >"$TMP/res.log"
if mp 2 $T --data "$D/sp_*.bin" --steps 10 --micro-batch 2 --shuffle --ckpt-dir "$TMP/ck2" \
        --resume "$TMP/ck2/step_000005" --log "$TMP/res.log" --quiet >"$TMP/out" 2>&1; then
    check "tiny: --shuffle resumed from step 5 on 2 ranks: steps 5-9 (into the next epoch) the run's that did not stop, to the last bit" \
        "[ \"\$(losses $TMP/sh2.log)\" = \"\$(losses $TMP/res.log)\" ]" "$TMP/res.log"
else
    bad "tiny: --shuffle resumed from step 5" "$TMP/out"
fi

mp 1 $T --data "$D/sp_*.bin" --steps 6 --micro-batch 4 --ckpt-dir "$TMP/ck1" \
    --resume "$TMP/ck1/step_000005" >"$TMP/out" 2>&1
check "tiny: a --shuffle checkpoint (data.shuffle true) resumed without --shuffle: a note says the order changes" \
    "grep -q '\"shuffle\": true' '$TMP/ck1/step_000005/meta.json' && grep -qF 'note: checkpoint $TMP/ck1/step_000005 was written by a run with --shuffle; this run reads in file order, so from sequence 40 on' '$TMP/out' && grep -q '^step *5/6' '$TMP/out'" \
    "$TMP/out"

# ── refusals and notes ──
refuse() {   # refuse NAME TEXT CMD...: CMD exits 1 before step 0, printing TEXT
    local name=$1 text=$2
    shift 2
    "$@" >"$TMP/r.out" 2>&1
    local st=$?
    check "$name: refused ($text)" \
        "[ $st = 1 ] && grep -qF -- \"\$text\" '$TMP/r.out' && ! grep -q '^step' '$TMP/r.out'" "$TMP/r.out"
}
refuse "a --data pattern that matches nothing" "train: --data $D/nope_*.bin: the pattern matches no file" \
    $T --data "$D/nope_*.bin" --steps 1
refuse "a --val-data pattern that matches nothing" "train: --val-data $D/v[0-9].bin: the pattern matches no file" \
    $T --data "$D/all.bin" --val-data "$D/v[0-9].bin" --steps 1
mkdir -p "$D/bad"
cp "$D/sp_000.bin" "$D/bad/b_000.bin"
printf 'XXXX' | cat - <(tail -c +5 "$D/sp_001.bin") >"$D/bad/b_001.bin"
refuse "a shard with a bad magic number, on 2 ranks" "data file $D/bad/b_001.bin: wrong magic number" \
    mp 2 $T --data "$D/bad/b_*.bin" --steps 1
mkdir -p "$D/short"
build/fsdata synth "$D/short/s_001.bin" --tokens 40 --vocab 256 >/dev/null
cp "$D/short/s_001.bin" "$D/short/s_000.bin"
refuse "shards that hold no whole sequence" \
    "--data $D/short/s_*.bin: its 2 files hold no whole sequence of 65 tokens" $T --data "$D/short/s_*.bin" --steps 1
cp "$D/sp_000.bin" "$D/short/s_002.bin"
mp 2 $T --data "$D/short/s_*.bin" --steps 1 >"$TMP/out" 2>&1
check "a shard shorter than a sequence among good ones adds nothing, with a note naming it" \
    "grep -qF 'note: --data $D/short/s_*.bin: shard $D/short/s_001.bin holds 40 tokens, less than one sequence' '$TMP/out' && grep -q '^step *0/1' '$TMP/out'" \
    "$TMP/out"

# ranks started with other shards: refused, naming --data; the same shards
# under another directory (and --shuffle on one rank only) as for one file
mkdir -p "$D/three" "$D/copy"
cp "$D"/sp_00[012].bin "$D/three/"
cp "$D"/sp_*.bin "$D/copy/"
mpmd() {   # mpmd FLAGS0 -- FLAGS1: rank 0 and rank 1 with their own flags
    local a=() b=()
    while [ "$1" != -- ]; do a+=("$1"); shift; done
    shift
    timeout 60 "${MPIRUN[@]}" -np 1 $T --steps 1 "${a[@]}" : -np 1 $T --steps 1 "$@" >"$TMP/m.out" 2>&1
}
mpmd --data "$D/sp_*.bin" -- --data "$D/three/sp_*.bin"
st=$?
check "ranks whose --data patterns match other shards (4 and 3): refused by both, naming the pattern and its files" \
    "[ $st != 0 ] && [ \$(grep -cF 'train: rank 1 runs with --data $D/three/sp_*.bin (3 files, ' '$TMP/m.out') = 2 ] && ! grep -q '^step' '$TMP/m.out'" \
    "$TMP/m.out"
mpmd --data "$D/sp_*.bin" -- --data "$D/copy/sp_*.bin"
check "ranks whose patterns match the same shards in other directories: accepted" "[ $? = 0 ]" "$TMP/m.out"
mpmd --data "$D/sp_*.bin" --shuffle -- --data "$D/sp_*.bin"
st=$?
check "--shuffle on one rank only: refused by both" \
    "[ $st != 0 ] && [ \$(grep -cF 'train: rank 1 runs with --shuffle off, rank 0 with on' '$TMP/m.out') = 2 ]" "$TMP/m.out"

# ── tools/fstokens.py and the README's walk (.venv) ──
if ! tools/venv.sh --check; then
    echo "skip fstokens.py checks: .venv does not import the pinned tokenizers and transformers" \
         "(tools/venv.sh makes it from PyPI; tools/setup.sh runs it)"
    done_
fi
PY=.venv/bin/python
FT="$PY tools/fstokens.py"
C=$TMP/corpus
$PY tests/data/tokens.py gen "$C" 1 60
if $FT train-bpe --vocab 300 --out "$TMP/tokenizer.json" "$C" >"$TMP/out" 2>&1 &&
        $FT encode --tokenizer "$TMP/tokenizer.json" --out "$TMP/shards" --val-fraction 0.1 \
            --shard-tokens 2000 "$C" >"$TMP/enc.out" 2>"$TMP/enc.err" &&
        $PY tests/data/tokens.py shards "$TMP/tokenizer.json" "$C" "$TMP/shards" 0.1 2000 >"$TMP/out" 2>&1; then
    ok "fstokens.py: a BPE of 300 trained on 60 generated documents; encoded: $(cat "$TMP/out")"
else
    bad "fstokens.py: train-bpe, encode, and the shards against the text" "$TMP/out"
fi
check "fstokens.py: no progress bar when standard error is not a terminal" "[ ! -s '$TMP/enc.err' ]" "$TMP/enc.err"
$FT encode --tokenizer "$TMP/tokenizer.json" --out "$TMP/prog" --shard-tokens 2000 --progress "$C" \
    >/dev/null 2>"$TMP/prog.err"
check "fstokens.py --progress: the bar on standard error" "grep -q '100.0%' '$TMP/prog.err'" "$TMP/prog.err"
refuse "fstokens.py encode into a directory holding shards" "already holds token shards" \
    $FT encode --tokenizer "$TMP/tokenizer.json" --out "$TMP/shards" "$C"
printf 'good line\nbad \xff byte\n' >"$TMP/latin.txt"
refuse "fstokens.py on text that is not UTF-8" "$TMP/latin.txt:2: not UTF-8 (byte 0xff at offset 14)" \
    $FT encode --tokenizer "$TMP/tokenizer.json" --out "$TMP/x" "$TMP/latin.txt"
# a word-level vocabulary of 70,000: ids past 65,535 need uint32
$PY - "$TMP/big.json" <<'PY'
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
t = Tokenizer(models.WordLevel({("w%d" % i): i for i in range(70000)}, unk_token="w0"))
t.pre_tokenizer = pre_tokenizers.Whitespace()
t.save(sys.argv[1])
PY
printf 'w1 w69999 w2\n' >"$TMP/big.txt"
$FT encode --tokenizer "$TMP/big.json" --out "$TMP/big" "$TMP/big.txt" >"$TMP/out" 2>&1
build/fsdata info "$TMP/big/train_000000.bin" >"$TMP/info" 2>&1
check "fstokens.py: a vocabulary of 70,000 writes version 2 (uint32) tokens, 69999 among them" \
    "grep -q 'version  2' '$TMP/info' && grep -q 'max id   69999' '$TMP/info'" "$TMP/info"
refuse "the trainer on uint32 tokens past its vocabulary" \
    "data file $TMP/big/train_000000.bin: token 69999 at position 1 is not below the model's vocabulary size 256" \
    $T --data "$TMP/big/train_*.bin" --steps 1

# the README's walk, on tiny inputs
W=$TMP/walk
mkdir -p "$W"
$PY - tests/hf/gpt2.json "$W/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(vocab_size=300, n_positions=32, bos_token_id=299, eos_token_id=299)
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
if build/fsdpc --from-hf "$W/config.json" -o "$W/model.fsd" >"$TMP/out" 2>&1 &&
        build_trainer "walk: make trainer from the .fsd" trainer FSD="$W/model.fsd" TRAINER=$OUT/walk &&
        $FT encode --tokenizer "$TMP/tokenizer.json" --out "$W/tokens" --val-fraction 0.1 --shard-tokens 4000 \
            "$C" >"$TMP/out" 2>&1 &&
        mp 2 $OUT/walk/train --data "$W/tokens/train_*.bin" --val-data "$W/tokens/val_*.bin" --shuffle \
            --steps 12 --micro-batch 2 --lr 3e-3 --eval-every 6 --eval-sequences 4 --log "$W/log.json" \
            --export "$W/out" --export-shard-size 5GB --hf-names gpt2 >"$TMP/out" 2>&1 &&
        cp "$W/config.json" "$TMP/tokenizer.json" "$W/out/" &&
        $PY tests/data/tokens.py walk "$W/out" "$W/tokens/val_000000.bin" 32 4 "$W/log.json" >"$TMP/out" 2>&1; then
    ok "walk: --from-hf, fstokens.py, 2 ranks on shards with --shuffle and val_loss, --export, from_pretrained: $(tail -n 1 "$TMP/out")"
else
    bad "walk: config.json and a corpus to a model from_pretrained loads" "$TMP/out"
fi
done_
