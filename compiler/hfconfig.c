/*
 * hfconfig.c — `fsdpc --from-hf config.json [--seq N]`: the .fsd of a
 * Hugging Face GPT-2, Llama, Qwen2 or Qwen3 model, from the config.json
 * `transformers` saves beside its weights, so that a trainer built from it
 * imports those weights with `--init-from DIR --hf-names gpt2|llama` (Qwen2
 * and Qwen3 use Llama's tensor names: runtime/hfnames.c)
 * (docs/checkpoint.md#from-a-hugging-face-model-directory).
 *
 * It sits beside the pipeline, not in it: it writes .fsd text, which
 * main.c then parses and checks like any input before writing it out (a
 * text fsdpc cannot compile is this file's bug). The names are the
 * examples' (tok, pos, blocks.N.{ln1,attn,ln2,mlp}, ln_f, head for GPT-2;
 * tok, layers.N.{attn_norm,attn,mlp_norm,mlp}, norm, head for Llama),
 * which is what runtime/hfnames.c maps onto Hugging Face's tensors.
 *
 * A key absent from the file takes transformers' default for that model
 * class (GPT2Config, LlamaConfig, Qwen2Config, Qwen3Config): save_pretrained leaves out values equal
 * to the defaults, and from_pretrained fills them in the same way. What
 * fsdpc cannot express is refused naming the key: rope_scaling, a sliding
 * window that is in use (Qwen's use_sliding_window false leaves it
 * unused), an activation other than GPT-2's tanh GELU (or ReLU) or Llama's
 * SiLU, scaled or cross attention, an untied GPT-2 head, a head_dim other
 * than hidden_size / heads. Dropout, which fsdpc does not have, is not
 * refused: the .fsd's comments say it is not applied.
 *
 * The sequence length is --seq N, by default the model's positions
 * (n_positions, max_position_embeddings), and never more: GPT-2's wpe has
 * that many rows (the .fsd's pos embedding keeps all of them, so the
 * weights import whatever the sequence), and Llama was trained to that
 * length.
 */
#include "fsdpc.h"
#include "../runtime/json.h"   /* the runtime's JSON reader, libc only */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct Cfg {
    const char *path;
    JVal root;
    FILE *err;
    int errors;
} Cfg;

static void refuse(Cfg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(Cfg *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(c->err, "fsdpc: %s: ", c->path);
    vfprintf(c->err, fmt, ap);
    fputc('\n', c->err);
    va_end(ap);
    c->errors++;
}

/* The key's value, or NULL when absent or null (transformers' default). */
static const JVal *key(const Cfg *c, const char *k)
{
    const JVal *v = json_get(&c->root, k);
    return v && v->type != J_NULL ? v : NULL;
}

/* A whole number ≥ 1 under `k`, or dflt when absent. */
static int64_t count(Cfg *c, const char *k, int64_t dflt)
{
    const JVal *v = key(c, k);
    int64_t n;
    if (!v)
        return dflt;
    if (!json_count(v, &n) || n < 1 || n > ((int64_t)1 << 40)) {
        refuse(c, "`%s` must be a whole number of at least 1", k);
        return 1;
    }
    return n;
}

/* A positive number under `k`, or dflt when absent. */
static double positive(Cfg *c, const char *k, double dflt)
{
    const JVal *v = key(c, k);
    if (!v)
        return dflt;
    if (v->type != J_NUM || !(v->num > 0) || !isfinite(v->num)) {
        refuse(c, "`%s` must be a positive number", k);
        return dflt;
    }
    return v->num;
}

static bool flag(Cfg *c, const char *k, bool dflt)
{
    const JVal *v = key(c, k);
    if (!v)
        return dflt;
    if (v->type != J_BOOL) {
        refuse(c, "`%s` must be true or false", k);
        return dflt;
    }
    return v->num != 0;
}

static const char *text(Cfg *c, const char *k, const char *dflt)
{
    const JVal *v = key(c, k);
    if (!v)
        return dflt;
    if (v->type != J_STR) {
        refuse(c, "`%s` must be a string", k);
        return dflt;
    }
    return v->str;
}

/* The shortest decimal that reads back as v, in a form the .fsd lexer
 * takes (1e-05, 0.02, 500000). */
static const char *num(double v)
{
    if (v == floor(v) && fabs(v) < 1e15)
        return arena_printf("%.0f", v);
    for (int p = 1; p < 17; p++) {
        char *s = arena_printf("%.*g", p, v);
        if (strtod(s, NULL) == v)
            return s;
    }
    return arena_printf("%.17g", v);
}

/* Dropout keys set above 0: listed in the .fsd's header, not applied. */
static const char *dropouts(Cfg *c, const char *const *keys)
{
    const char *list = "";
    for (int i = 0; keys[i]; i++) {
        const JVal *v = key(c, keys[i]);
        if (v && v->type == J_NUM && v->num > 0)
            list = arena_printf("%s%s%s = %s", list, *list ? ", " : "", keys[i], num(v->num));
    }
    return list;
}

/* --seq against the model's positions. */
static int64_t sequence(Cfg *c, int64_t seq, const char *k, int64_t positions)
{
    if (seq > positions)
        refuse(c, "--seq %lld is longer than the model's %lld positions (`%s`)", (long long)seq,
               (long long)positions, k);
    return seq > 0 ? seq : positions;
}

static void header(FILE *o, Cfg *c, const char *kind, const char *cls, const char *names,
                   const char *dropped)
{
    fprintf(o, "# %s, written by `fsdpc --from-hf %s` from a Hugging Face config.json\n", kind,
            c->path);
    fprintf(o, "# (transformers' %s). Its weights, as save_pretrained writes them (one\n", cls);
    fprintf(o, "# model.safetensors, or shards with model.safetensors.index.json; F32, BF16\n");
    fprintf(o, "# or F16), load with\n");
    fprintf(o, "#   train --init-from MODEL_DIR --hf-names %s --data tokens.bin\n", names);
    fprintf(o, "# and --export DIR --export-dtype bf16 --export-shard-size 5GB --hf-names %s\n",
            names);
    fprintf(o, "# writes them back for from_pretrained (docs/checkpoint.md). Tokens come from\n");
    fprintf(o, "# the model's own tokenizer, in llm.c's token file format (README, Data).\n");
    if (*dropped)
        fprintf(o, "# Not applied: dropout (%s); fsdpc has none.\n", dropped);
}

/* The shard and train sections: one group per block, and settings for
 * fine-tuning a pretrained model. */
static void sections(FILE *o, const char *array)
{
    fprintf(o, "\nshard {\n");
    fprintf(o, "  fully_shard %-12s  # one shard group per block, gathered in turn\n",
            arena_printf("%s[*]", array));
    fprintf(o, "  fully_shard %-12s  # the embeddings, final norm and head\n", "root");
    fprintf(o, "  # On GPUs, bf16 compute with fp32 masters and reductions (FSDP2's\n");
    fprintf(o, "  # param_dtype): half the all-gather bytes and activation memory.\n");
    fprintf(o, "  # mixed_precision(param = bf16, reduce = fp32)\n");
    fprintf(o, "}\n\n");
    fprintf(o, "train {\n");
    fprintf(o, "  micro_batch = 1                   # sequences per rank per micro-batch\n");
    fprintf(o, "  grad_accum  = 8                   # micro-batches per step\n");
    fprintf(o, "  steps       = 1000\n");
    fprintf(o, "  # fine-tuning pretrained weights: a small peak learning rate, warmed up\n");
    fprintf(o, "  optimizer   = adamw(lr = 2e-5, betas = (0.9, 0.95), eps = 1e-8, weight_decay = 0)\n");
    fprintf(o, "  lr_schedule = cosine(warmup = 50, min_lr = 2e-6)\n");
    fprintf(o, "  grad_clip   = 1.0\n");
    fprintf(o, "  # checkpoint(every = 200, dir = \"ckpt\", keep = 2)   # or --ckpt-dir, --ckpt-every\n");
    fprintf(o, "}\n");
}

/* GPT2LMHeadModel: learned positions, pre-norm LayerNorm blocks, fused qkv
 * (Conv1D), tanh GELU, lm_head tied to wte. */
static void gpt2(FILE *o, Cfg *c, int64_t seq)
{
    static const char *const drop[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop", NULL};
    const int64_t V = count(c, "vocab_size", 50257), P = count(c, "n_positions", 1024);
    const int64_t C = count(c, "n_embd", 768), L = count(c, "n_layer", 12);
    const int64_t H = count(c, "n_head", 12), I = count(c, "n_inner", 4 * C);
    const double eps = positive(c, "layer_norm_epsilon", 1e-5);
    const char *act = text(c, "activation_function", "gelu_new");
    const char *fsd_act = strcmp(act, "gelu_new") == 0 || strcmp(act, "gelu_pytorch_tanh") == 0
                              ? "gelu"
                          : strcmp(act, "relu") == 0 ? "relu"
                                                     : NULL;
    if (!fsd_act)
        refuse(c, "`activation_function` is `%s`; fsdpc's MLP has gelu (the tanh approximation: "
                  "gelu_new, gelu_pytorch_tanh) and relu",
               act);
    if (C % H)
        refuse(c, "`n_embd` %lld is not a multiple of `n_head` %lld", (long long)C, (long long)H);
    if (!flag(c, "tie_word_embeddings", true))
        refuse(c, "`tie_word_embeddings` is false; GPT-2's lm_head is tied to wte (--hf-names "
                  "gpt2 writes no lm_head)");
    if (!flag(c, "scale_attn_weights", true))
        refuse(c, "`scale_attn_weights` is false; fsdpc's attention scales by 1/sqrt(head dim)");
    if (flag(c, "scale_attn_by_inverse_layer_idx", false))
        refuse(c, "`scale_attn_by_inverse_layer_idx` is true; fsdpc's attention scales every "
                  "layer by 1/sqrt(head dim) alone");
    if (flag(c, "add_cross_attention", false))
        refuse(c, "`add_cross_attention` is true; fsdpc's blocks have self-attention only");
    seq = sequence(c, seq, "n_positions", P);
    if (c->errors)
        return;
    const char *e = num(eps);
    header(o, c, "GPT-2", "GPT2LMHeadModel", "gpt2", dropouts(c, drop));
    fprintf(o, "model gpt2 {\n");
    fprintf(o, "  const vocab = %lld, dim = %lld, layers = %lld, heads = %lld, hidden = %lld\n",
            (long long)V, (long long)C, (long long)L, (long long)H, (long long)I);
    fprintf(o, "  # n_positions: the rows of the position embedding (wpe); seq: the training\n");
    fprintf(o, "  # sequence length, at most n_positions (fsdpc --from-hf --seq N)\n");
    fprintf(o, "  const n_positions = %lld, seq = %lld\n", (long long)P, (long long)seq);
    fprintf(o, "\n  block Block {\n");
    fprintf(o, "    ln1  = LayerNorm(dim, eps = %s)\n", e);
    fprintf(o, "    attn = Attention(dim, heads = heads, causal = true)\n");
    fprintf(o, "    ln2  = LayerNorm(dim, eps = %s)\n", e);
    fprintf(o, "    mlp  = MLP(dim, hidden = hidden, act = %s)\n", fsd_act);
    fprintf(o, "\n    forward(x) {\n      x = x + attn(ln1(x))\n      x = x + mlp(ln2(x))\n"
               "      return x\n    }\n  }\n\n");
    fprintf(o, "  tok    = Embedding(vocab, dim)        # wte\n");
    fprintf(o, "  pos    = Embedding(n_positions, dim)  # wpe: rows 0 ... seq-1 are used\n");
    fprintf(o, "  blocks = Block[layers]                # h\n");
    fprintf(o, "  ln_f   = LayerNorm(dim, eps = %s)\n", e);
    fprintf(o, "  head   = Linear(dim, vocab, bias = false, tie = tok)   # lm_head, tied to wte\n");
    fprintf(o, "\n  forward(idx, targets) {\n    x = tok(idx) + pos(positions)\n"
               "    x = blocks(x)\n    return cross_entropy(head(ln_f(x)), targets)\n  }\n}\n");
    sections(o, "blocks");
}

/* LlamaForCausalLM: RMSNorm, rotary positions (rotate-half), grouped-query
 * attention, SwiGLU. */
/* Llama and the two families that share its layout and names (Qwen2:
 * biases on q, k and v alone; Qwen3: RMSNorm on each head's q and k). */
typedef enum { LLAMA, QWEN2, QWEN3 } LlamaKind;

static void llama(FILE *o, Cfg *c, int64_t seq, LlamaKind kind)
{
    static const char *const drop[] = {"attention_dropout", NULL};
    static const char *const cls[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    static const char *const title[] = {"Llama", "Qwen2", "Qwen3"};
    static const char *const model[] = {"llama", "qwen2", "qwen3"};
    const bool qwen = kind != LLAMA;
    /* transformers' defaults: LlamaConfig's, or Qwen2Config's and
     * Qwen3Config's (which agree on these) */
    const int64_t V = count(c, "vocab_size", qwen ? 151936 : 32000);
    const int64_t C = count(c, "hidden_size", 4096);
    const int64_t I = count(c, "intermediate_size", qwen ? 22016 : 11008);
    const int64_t L = count(c, "num_hidden_layers", 32);
    const int64_t H = count(c, "num_attention_heads", 32);
    const int64_t K = count(c, "num_key_value_heads", H);
    const int64_t P = count(c, "max_position_embeddings", qwen ? 32768 : 2048);
    const double eps = positive(c, "rms_norm_eps", 1e-6), theta = positive(c, "rope_theta", 10000);
    const char *act = text(c, "hidden_act", "silu");
    const bool tied = flag(c, "tie_word_embeddings", false);
    /* Qwen2's q, k and v always have biases, o never (no key says so);
     * Qwen3 and Llama follow attention_bias, Llama mlp_bias too */
    const bool abias = kind != QWEN2 && flag(c, "attention_bias", false);
    const bool mbias = kind == LLAMA && flag(c, "mlp_bias", false);
    if (strcmp(act, "silu") != 0)
        refuse(c, "`hidden_act` is `%s`; fsdpc's swiglu MLP gates with silu", act);
    if (key(c, "rope_scaling"))
        refuse(c, "`rope_scaling` is set; fsdpc's rope(theta) has no scaling (linear, dynamic, "
                  "yarn, llama3): only configs with rope_scaling null can be expressed");
    /* a window applies only where use_sliding_window allows it (Qwen's
     * default is false; Llama has no such key, so a window there is on) */
    if (key(c, "sliding_window") && flag(c, "use_sliding_window", !qwen))
        refuse(c, "`sliding_window` is set%s; fsdpc's attention is full causal attention",
               key(c, "use_sliding_window") ? " and `use_sliding_window` is true" : "");
    if (C % H)
        refuse(c, "`hidden_size` %lld is not a multiple of `num_attention_heads` %lld",
               (long long)C, (long long)H);
    else if (key(c, "head_dim") && count(c, "head_dim", C / H) != C / H)
        refuse(c, "`head_dim` is not hidden_size / num_attention_heads (%lld); fsdpc's heads are "
                  "dim / heads wide",
               (long long)(C / H));
    if (H % K)
        refuse(c, "`num_attention_heads` %lld is not a multiple of `num_key_value_heads` %lld",
               (long long)H, (long long)K);
    seq = sequence(c, seq, "max_position_embeddings", P);
    if (c->errors)
        return;
    const char *e = num(eps);
    header(o, c, title[kind], cls[kind], "llama", dropouts(c, drop));
    fprintf(o, "model %s {\n", model[kind]);
    fprintf(o, "  const vocab = %lld, dim = %lld, n_layers = %lld, heads = %lld, kv_heads = %lld\n",
            (long long)V, (long long)C, (long long)L, (long long)H, (long long)K);
    fprintf(o, "  # seq: the training sequence length, at most max_position_embeddings = %lld\n",
            (long long)P);
    fprintf(o, "  # (fsdpc --from-hf --seq N)\n");
    fprintf(o, "  const hidden = %lld, seq = %lld\n", (long long)I, (long long)seq);
    fprintf(o, "\n  block Layer {\n");
    fprintf(o, "    attn_norm = RMSNorm(dim, eps = %s)      # input_layernorm\n", e);
    fprintf(o, "    attn      = Attention(dim, heads = heads, kv_heads = kv_heads,\n");
    if (kind == QWEN3)
        fprintf(o, "                          rope = rope(theta = %s), bias = %s,\n"
                   "                          qk_norm = rms(eps = %s))   # q_norm, k_norm\n",
                num(theta), abias ? "true" : "false", e);
    else
        fprintf(o, "                          rope = rope(theta = %s), bias = %s)%s\n", num(theta),
                kind == QWEN2 ? "qkv" : abias ? "true" : "false",
                kind == QWEN2 ? "   # q, k, v: biases; o: none" : "");
    fprintf(o, "    mlp_norm  = RMSNorm(dim, eps = %s)      # post_attention_layernorm\n", e);
    fprintf(o, "    mlp       = MLP(dim, hidden = hidden, act = swiglu, bias = %s)\n",
            mbias ? "true" : "false");
    fprintf(o, "\n    forward(x) {\n      x = x + attn(attn_norm(x))\n      x = x + mlp(mlp_norm(x))\n"
               "      return x\n    }\n  }\n\n");
    fprintf(o, "  tok    = Embedding(vocab, dim)        # embed_tokens\n");
    fprintf(o, "  layers = Layer[n_layers]\n");
    fprintf(o, "  norm   = RMSNorm(dim, eps = %s)\n", e);
    if (tied)
        fprintf(o, "  head   = Linear(dim, vocab, bias = false, tie = tok)   # lm_head, tied "
                   "(tie_word_embeddings)\n");
    else
        fprintf(o, "  head   = Linear(dim, vocab, bias = false)   # lm_head\n");
    fprintf(o, "\n  forward(idx, targets) {\n    x = layers(tok(idx))\n"
               "    return cross_entropy(head(norm(x)), targets)\n  }\n}\n");
    sections(o, "layers");
}

char *hfconfig_fsd(const char *path, int64_t seq, FILE *err)
{
    Cfg c = {path, {0}, err, 0};
    Source *src = source_read(path);
    if (!src) {
        fprintf(err, "fsdpc: cannot read %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t at;
    const char *why;
    if (!json_parse(src->text, src->len, &c.root, &at, &why)) {
        int line, col;
        loc_line_col(src, (uint32_t)at, &line, &col);
        fprintf(err, "fsdpc: %s:%d:%d: not valid JSON: %s\n", path, line, col, why);
        return NULL;
    }
    char *out = NULL;
    size_t n = 0;
    FILE *o = open_memstream(&out, &n);
    const char *type = c.root.type == J_OBJ ? text(&c, "model_type", NULL) : NULL;
    if (c.root.type != J_OBJ)
        refuse(&c, "not a JSON object: a config.json holds one");
    else if (!o)
        refuse(&c, "out of memory");
    else if (!type) {
        if (!c.errors)   /* a model_type that is not a string is said already */
            refuse(&c, "no `model_type`: fsdpc --from-hf reads gpt2, llama, qwen2 and qwen3 "
                       "configs");
    }
    else if (strcmp(type, "gpt2") == 0)
        gpt2(o, &c, seq);
    else if (strcmp(type, "llama") == 0)
        llama(o, &c, seq, LLAMA);
    else if (strcmp(type, "qwen2") == 0)
        llama(o, &c, seq, QWEN2);
    else if (strcmp(type, "qwen3") == 0)
        llama(o, &c, seq, QWEN3);
    else
        refuse(&c, "`model_type` is `%s`; fsdpc --from-hf reads gpt2, llama, qwen2 and qwen3",
               type);
    char *result = NULL;
    if (o && fclose(o) == 0 && !c.errors)
        result = arena_strndup(out, n);
    free(out);
    json_free(&c.root);
    return result;
}
