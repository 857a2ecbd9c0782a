#!/usr/bin/env python3
"""config.py — the config.json an --hf-names directory export writes
(docs/checkpoint.md#the-config), held to what it must say; standard library
only, so it runs without .venv:

    config.py agree ORIG.json WRITTEN.json SEQ
        WRITTEN (fsdpc's, for a model `fsdpc --from-hf ORIG.json --seq SEQ`
        made) says what ORIG says on every field that defines the model
        (FIELDS below, by model_type; a key absent from ORIG takes
        transformers' default for its class, as from_pretrained would), and
        its max_position_embeddings (Llama, Qwen) is at least SEQ.
    config.py expect WRITTEN.json KEY=JSON ...
        each KEY of WRITTEN is the JSON value given, and the type too
        (1e-05 is not 1e-06; 10000.0 is not "10000").

Each prints one line saying what it compared, or why it failed (exit 1).
"""
import json
import sys

# the fields that define each model (weights' shapes, the computation),
# with transformers' default for a key its config leaves out
FIELDS = {
    "gpt2": {"model_type": None, "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
             "n_layer": 12, "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
             "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
             "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False},
    "llama": {"model_type": None, "vocab_size": 32000, "hidden_size": 4096,
              "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": None, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False},
    "qwen2": {"model_type": None, "vocab_size": 151936, "hidden_size": 4096,
              "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": None, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False,
              "use_sliding_window": False},
}


def value(cfg, kind, key):
    v = cfg.get(key)
    if v is None:
        v = FIELDS[kind][key]
    # defaults that follow other keys; GPT-2's two names of its tanh GELU
    if v is None and key == "n_inner":
        v = 4 * value(cfg, kind, "n_embd")
    if v is None and key == "num_key_value_heads":
        v = value(cfg, kind, "num_attention_heads")
    if key == "activation_function" and v == "gelu_pytorch_tanh":
        v = "gelu_new"
    return v


def die(msg):
    print(msg)
    sys.exit(1)


def agree(orig_path, written_path, seq):
    orig, written = json.load(open(orig_path)), json.load(open(written_path))
    kind = orig["model_type"]
    if written.get("model_type") != kind:
        die(f"model_type: {orig_path} says {kind}, {written_path} {written.get('model_type')}")
    for key in FIELDS[kind]:
        a, b = value(orig, kind, key), value(written, kind, key)
        if a != b or type(a) is not type(b) and not {type(a), type(b)} <= {int, float}:
            die(f"{key}: {orig_path} says {a!r}, {written_path} {b!r}")
    if orig.get("architectures") and orig["architectures"] != written.get("architectures"):
        die(f"architectures: {orig['architectures']} and {written.get('architectures')}")
    if kind != "gpt2" and not written.get("max_position_embeddings", 0) >= seq:
        die(f"max_position_embeddings {written.get('max_position_embeddings')} < seq {seq}")
    print(f"{len(FIELDS[kind])} fields of {kind} agree: {', '.join(FIELDS[kind])}")


def expect(written_path, pairs):
    written = json.load(open(written_path))
    for pair in pairs:
        key, text = pair.split("=", 1)
        want = json.loads(text)
        got = written.get(key, "(absent)")
        if got != want or type(got) is not type(want):
            die(f"{written_path}: {key} is {json.dumps(got)}, expected {text}")
    print(f"{len(pairs)} keys as expected")


def main(argv):
    if len(argv) >= 5 and argv[1] == "agree":
        agree(argv[2], argv[3], int(argv[4]))
    elif len(argv) >= 4 and argv[1] == "expect":
        expect(argv[2], argv[3:])
    else:
        die(__doc__)


if __name__ == "__main__":
    main(sys.argv)
