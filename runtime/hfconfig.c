/*
 * hfconfig.c — the config.json of the Hugging Face model directory that
 * `--export DIR --export-shard-size S --hf-names gpt2|llama` writes, so that
 * transformers' from_pretrained(DIR) builds the model the weights belong to
 * (docs/checkpoint.md#the-config). compiler/hfconfig.c goes the other way,
 * config.json to .fsd, and the two agree on every field that defines the
 * model (tests/hf/run.sh holds them to it).
 *
 * What the parameter shapes show (vocabulary, width, blocks, the MLP's
 * width, GPT-2's positions, biases, an untied head) comes from the layout
 * hfnames.c built, which also says which layer plays which part; what they
 * do not show (heads, kv heads, eps, RoPE's theta, causality, the
 * activation) comes from the layer table the compiler writes into train.cu
 * (FsdLayerInfo). A config holds one value of each for every block, so a
 * model whose blocks differ, or with a layer a config cannot say (a
 * LayerNorm where Llama has RMSNorms, attention that is not causal, RoPE in
 * a GPT-2), gets no config.json: a one-line warning at start-up names the
 * layer and the field, and the weights are still exported, as they are
 * correct under their names. That is a warning rather than hfnames.c's
 * refusal because the weights are what the user asked for, and hfnames.c
 * refuses only what the weights file itself cannot hold.
 *
 * Llama's names hold three models, told apart by the attention as
 * hfnames.c's header describes: qk_norm is Qwen3's (Qwen3ForCausalLM,
 * whose attention_bias puts biases on q, k, v and o alike); biases on q, k
 * and v without o (bias = qkv) are Qwen2's (Qwen2ForCausalLM); anything
 * else is LlamaForCausalLM (attention_bias, mlp_bias). Qwen2 and Qwen3
 * have no MLP biases.
 *
 * The keys are written sorted, indented by two spaces, as save_pretrained
 * writes them; keys the model does not decide (token ids, initializer
 * range) are left to transformers' defaults: fsdpc does not know the
 * tokenizer.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ── the keys, composed then written sorted ── */

typedef struct Key {
    const char *name;
    char value[128];         /* JSON text */
} Key;

typedef struct Config {
    Key keys[32];
    int n;
} Config;

static void put(Config *c, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void put(Config *c, const char *name, const char *fmt, ...)
{
    if (c->n == (int)(sizeof c->keys / sizeof c->keys[0])) {   /* a bug here, not input */
        fprintf(stderr, "train: %s:%d: more config keys than Config holds\n", __FILE__, __LINE__);
        abort();
    }
    Key *k = &c->keys[c->n++];
    k->name = name;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->value, sizeof k->value, fmt, ap);
    va_end(ap);
}

static void put_int(Config *c, const char *name, int64_t v) { put(c, name, "%lld", (long long)v); }
static void put_bool(Config *c, const char *name, bool v) { put(c, name, "%s", v ? "true" : "false"); }
static void put_str(Config *c, const char *name, const char *v) { put(c, name, "\"%s\"", v); }

/* A float as Python's json writes it (repr): the fewest digits that read
 * back as the same double, positional from 1e-4 to 1e16 and with an
 * exponent outside (0.02, 1e-05, 500000.0), so transformers reads exactly
 * what fsdpc computed with. */
static void put_real(Config *c, const char *name, double v)
{
    char s[48];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(s, sizeof s, "%.*e", prec - 1, v);
        if (strtod(s, NULL) == v)
            break;
    }
    const double a = fabs(v);
    if (a != 0 && (a < 1e-4 || a >= 1e16)) {
        snprintf(s, sizeof s, "%.*g", prec, v);
    } else {
        const int exp10 = a == 0 ? 0 : (int)floor(log10(a));
        const int decimals = prec - 1 - exp10;
        snprintf(s, sizeof s, "%.*f", decimals > 0 ? decimals : 0, v);
    }
    if (!strpbrk(s, ".eni"))   /* integral: a float all the same */
        strcat(s, ".0");
    put(c, name, "%s", s);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const Key *)a)->name, ((const Key *)b)->name);
}

static bool write_config(FILE *f, Config *c)
{
    qsort(c->keys, (size_t)c->n, sizeof c->keys[0], by_name);
    fputs("{\n", f);
    for (int i = 0; i < c->n; i++)
        fprintf(f, "  \"%s\": %s%s\n", c->keys[i].name, c->keys[i].value, i + 1 < c->n ? "," : "");
    fputs("}\n", f);
    return !ferror(f);
}

/* ── what the model is ── */

typedef struct Desc {
    const FsdModel *m;
    const WLayout *L;
    const char *model;       /* "GPT-2", "Llama": for messages */
    char why[ERR_MAX - 256]; /* the first reason there is no config */
} Desc;

static bool no(Desc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool no(Desc *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->why, sizeof d->why, fmt, ap);
    va_end(ap);
    return false;
}

/* The layer at `path` in the program's layer table, of kind `kind` (what
 * the format's `role` is); NULL with the reason. */
static const FsdLayerInfo *layer(Desc *d, const char *path, FsdLayerKind kind, const char *role)
{
    static const char *const kinds[] = {"a LayerNorm", "an RMSNorm", "an Attention", "an MLP"};
    for (int i = 0; i < d->m->nlayers; i++) {
        const FsdLayerInfo *l = &d->m->layers[i];
        if (strcmp(l->path, path) != 0)
            continue;
        if (l->kind == kind)
            return l;
        no(d, "`%s` is %s; %s's %s is %s (and from_pretrained would run it as one)", path,
           kinds[l->kind], d->model, role, kinds[kind]);
        return NULL;
    }
    no(d, "layer `%s` is not in the program's layer table (a train.cu from an fsdpc without "
          "one? compile the .fsd again)",
       path);
    return NULL;
}

/* Block n's layer `local` (ARR.n.local). */
static const FsdLayerInfo *block_layer(Desc *d, int n, const char *local, FsdLayerKind kind,
                                       const char *role)
{
    char path[600];
    snprintf(path, sizeof path, "%s.%d.%s", d->L->roles.arr, n, local);
    return layer(d, path, kind, role);
}

/* The layout's tensor named by fmt, or NULL. */
static const WTensor *tensor(const WLayout *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const WTensor *tensor(const WLayout *L, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    for (int t = 0; t < L->ntensors; t++)
        if (strcmp(L->tensors[t].name, name) == 0)
            return &L->tensors[t];
    return NULL;
}

/* One config value for every block: block n's `field` against block 0's. */
static bool same(Desc *d, int n, const char *local, const char *field, double v, double v0,
                 const char *key)
{
    if (v == v0)
        return true;
    const WRoles *R = &d->L->roles;
    return no(d, "`%s.%d.%s` has %s %g and `%s.0.%s` %g: a %s config has one %s for every layer",
              R->arr, n, local, field, v, R->arr, local, v0, d->model, key);
}

/* A norm's eps against the final norm's: one eps for every norm. */
static bool same_eps(Desc *d, const char *path, double eps, const FsdLayerInfo *final,
                     const char *key)
{
    if (eps == final->eps)
        return true;
    return no(d, "`%s` has eps %g and `%s` %g: a %s config has one %s for every norm", path, eps,
              final->path, final->eps, d->model, key);
}

static bool attention_common(Desc *d, const FsdLayerInfo *a)
{
    if (!a->causal)
        return no(d, "`%s` is not causal (causal = false); %s's attention is", a->path, d->model);
    return true;
}

static bool gpt2_config(Desc *d, Config *c)
{
    const WRoles *R = &d->L->roles;
    const FsdLayerInfo *fn = layer(d, R->final_norm, FSD_LAYER_LAYERNORM, "ln_f");
    const FsdLayerInfo *a0 = NULL, *m0 = NULL;
    if (!fn)
        return false;
    for (int n = 0; n < R->nblocks; n++) {
        const FsdLayerInfo *a = block_layer(d, n, R->attn, FSD_LAYER_ATTENTION, "attn");
        const FsdLayerInfo *mlp = a ? block_layer(d, n, R->mlp, FSD_LAYER_MLP, "mlp") : NULL;
        if (!mlp || !attention_common(d, a))
            return false;
        if (a->rope_theta > 0)
            return no(d, "`%s` has rope; GPT-2's positions are wpe alone", a->path);
        if (mlp->mlp_act == FSD_MLP_SWIGLU)   /* hfnames.c refuses it first */
            return no(d, "`%s` is a swiglu MLP; GPT-2's is gelu or relu", mlp->path);
        const WTensor *fc = tensor(d->L, "transformer.h.%d.mlp.c_fc.weight", n);
        if (!fc)   /* hfnames.c wrote it for every block */
            return no(d, "the layout has no transformer.h.%d.mlp.c_fc.weight", n);
        if (n == 0)
            a0 = a, m0 = mlp;
        if (!same(d, n, R->attn, "heads", (double)a->heads, (double)a0->heads, "n_head") ||
            !same(d, n, R->mlp, "hidden", (double)fc->shape[1], (double)R->hidden, "n_inner") ||
            (mlp->mlp_act != m0->mlp_act &&
             !no(d, "`%s` is a %s MLP and `%s` a %s one: a GPT-2 config has one "
                    "activation_function for every layer",
                 mlp->path, mlp->mlp_act == FSD_MLP_RELU ? "relu" : "gelu", m0->path,
                 m0->mlp_act == FSD_MLP_RELU ? "relu" : "gelu")))
            return false;
        for (int i = 0; i < 2; i++) {
            const FsdLayerInfo *ln =
                block_layer(d, n, R->norm[i], FSD_LAYER_LAYERNORM, i ? "ln_2" : "ln_1");
            if (!ln || !same_eps(d, ln->path, ln->eps, fn, "layer_norm_epsilon"))
                return false;
        }
    }
    put(c, "architectures", "[\n    \"GPT2LMHeadModel\"\n  ]");
    put_str(c, "model_type", "gpt2");
    put_int(c, "vocab_size", d->m->vocab);
    put_int(c, "n_positions", R->positions);
    put_int(c, "n_embd", R->dim);
    put_int(c, "n_layer", R->nblocks);
    put_int(c, "n_head", a0->heads);
    put_int(c, "n_inner", R->hidden);
    /* fsdpc's gelu is the tanh approximation: transformers' gelu_new */
    put_str(c, "activation_function", m0->mlp_act == FSD_MLP_RELU ? "relu" : "gelu_new");
    put_real(c, "layer_norm_epsilon", fn->eps);
    put_bool(c, "tie_word_embeddings", true);
    put_bool(c, "scale_attn_weights", true);
    put_bool(c, "scale_attn_by_inverse_layer_idx", false);
    put_bool(c, "reorder_and_upcast_attn", false);
    /* fsdpc has no dropout: GPT2Config's defaults are 0.1 */
    put_real(c, "resid_pdrop", 0);
    put_real(c, "embd_pdrop", 0);
    put_real(c, "attn_pdrop", 0);
    put_real(c, "summary_first_dropout", 0);
    return true;
}

static bool llama_config(Desc *d, Config *c)
{
    const WRoles *R = &d->L->roles;
    const FsdLayerInfo *fn = layer(d, R->final_norm, FSD_LAYER_RMSNORM, "norm");
    const FsdLayerInfo *a0 = NULL;
    bool qb0 = false, ob0 = false, mb0 = false;
    if (!fn)
        return false;
    for (int n = 0; n < R->nblocks; n++) {
        const FsdLayerInfo *a = block_layer(d, n, R->attn, FSD_LAYER_ATTENTION, "self_attn");
        if (!a || !block_layer(d, n, R->mlp, FSD_LAYER_MLP, "mlp") || !attention_common(d, a))
            return false;
        if (!(a->rope_theta > 0))
            return no(d, "`%s` has no rope; Llama's positions are rotary (rope(theta = ...))",
                      a->path);
        if (a->eps > 0 && !same_eps(d, a->path, a->eps, fn, "rms_norm_eps (q_norm and k_norm's too)"))
            return false;
        const bool qb = tensor(d->L, "model.layers.%d.self_attn.q_proj.bias", n);
        const bool ob = tensor(d->L, "model.layers.%d.self_attn.o_proj.bias", n);
        const bool mb = tensor(d->L, "model.layers.%d.mlp.gate_proj.bias", n);
        const WTensor *gate = tensor(d->L, "model.layers.%d.mlp.gate_proj.weight", n);
        if (!gate)   /* hfnames.c wrote it for every block */
            return no(d, "the layout has no model.layers.%d.mlp.gate_proj.weight", n);
        if (n == 0)
            a0 = a, qb0 = qb, ob0 = ob, mb0 = mb;
        if (!same(d, n, R->attn, "heads", (double)a->heads, (double)a0->heads,
                  "num_attention_heads") ||
            !same(d, n, R->attn, "kv_heads", (double)a->kv_heads, (double)a0->kv_heads,
                  "num_key_value_heads") ||
            !same(d, n, R->attn, "rope theta", a->rope_theta, a0->rope_theta, "rope_theta") ||
            ((a->eps > 0) != (a0->eps > 0) &&
             !no(d, "`%s` has %s and `%s` %s: one config says for every layer whether the "
                    "model is a Qwen3 (q_norm, k_norm)",
                 a->path, a->eps > 0 ? "qk_norm" : "no qk_norm", a0->path,
                 a0->eps > 0 ? "qk_norm" : "none")) ||
            !same(d, n, R->attn, "q bias", qb, qb0, "attention_bias") ||
            !same(d, n, R->attn, "o bias", ob, ob0, "attention_bias") ||
            !same(d, n, R->mlp, "bias", mb, mb0, "mlp_bias") ||
            !same(d, n, R->mlp, "hidden", (double)gate->shape[0], (double)R->hidden,
                  "intermediate_size"))
            return false;
        for (int i = 0; i < 2; i++) {
            const FsdLayerInfo *ln =
                block_layer(d, n, R->norm[i], FSD_LAYER_RMSNORM,
                            i ? "post_attention_layernorm" : "input_layernorm");
            if (!ln || !same_eps(d, ln->path, ln->eps, fn, "rms_norm_eps"))
                return false;
        }
    }
    const bool qk_norm = a0->eps > 0;
    char a0path[600];
    snprintf(a0path, sizeof a0path, "%s.0.%s", R->arr, R->attn);
    const char *arch = "LlamaForCausalLM", *type = "llama";
    if (qk_norm && qb0 != ob0)
        return no(d, "`%s` has biases on q, k and v alone (bias = qkv) and qk_norm: Qwen2 has "
                     "no qk_norm, and Qwen3's attention_bias is on q, k, v and o alike",
                  a0path);
    if (qk_norm)
        arch = "Qwen3ForCausalLM", type = "qwen3";
    else if (qb0 && !ob0)
        arch = "Qwen2ForCausalLM", type = "qwen2";
    if (mb0 && strcmp(type, "llama") != 0)
        return no(d, "`%s.0.%s` has biases; the MLP of %s (which its attention makes it) has "
                     "none",
                  R->arr, R->mlp, arch);
    put(c, "architectures", "[\n    \"%s\"\n  ]", arch);
    put_str(c, "model_type", type);
    put_int(c, "vocab_size", d->m->vocab);
    put_int(c, "hidden_size", R->dim);
    put_int(c, "intermediate_size", R->hidden);
    put_int(c, "num_hidden_layers", R->nblocks);
    put_int(c, "num_attention_heads", a0->heads);
    put_int(c, "num_key_value_heads", a0->kv_heads);
    /* Qwen3Config's head_dim defaults to 128, not hidden_size / heads */
    if (qk_norm)
        put_int(c, "head_dim", R->dim / a0->heads);
    put_str(c, "hidden_act", "silu");
    put_int(c, "max_position_embeddings", d->m->seq);
    put_real(c, "rms_norm_eps", fn->eps);
    put_real(c, "rope_theta", a0->rope_theta);
    put(c, "rope_scaling", "null");
    put_bool(c, "tie_word_embeddings", !R->untied_head);
    put_real(c, "attention_dropout", 0);
    if (strcmp(type, "qwen2") != 0)   /* Qwen2's q, k, v biases are not a key */
        put_bool(c, "attention_bias", qb0);
    if (strcmp(type, "llama") == 0)
        put_bool(c, "mlp_bias", mb0);
    else
        put_bool(c, "use_sliding_window", false);
    return true;
}

/* The config of r's model under layout L, or false with d->why. */
static bool describe(FsdRun *r, const WLayout *L, Desc *d, Config *c)
{
    static const char *const dtypes[ST_NDTYPES] = {[ST_F32] = "float32", [ST_BF16] = "bfloat16",
                                                    [ST_F16] = "float16"};
    const bool gpt2 = strcmp(L->names, "gpt2") == 0;
    memset(c, 0, sizeof *c);
    d->m = r->m;
    d->L = L;
    d->model = gpt2 ? "GPT-2" : "Llama";
    d->why[0] = 0;
    if (!(gpt2 ? gpt2_config(d, c) : llama_config(d, c)))
        return false;
    put_str(c, "torch_dtype", dtypes[r->export_dtype]);
    return true;
}

void hf_config_check(FsdRun *r)
{
    WLayout L;
    Desc d;
    Config c;
    r->export_config = false;
    if (!hf_layout(r, r->hf_names, &L))
        return;
    r->export_config = describe(r, &L, &d, &c);
    if (!r->export_config)
        fprintf(stderr, "train: warning: --export %s gets the weights without config.json: %s\n",
                r->export_path, d.why);
    hf_layout_free(&L);
}

bool hf_config_put(FILE *f, FsdRun *r, const WLayout *L)
{
    Desc d;
    Config c;
    return describe(r, L, &d, &c) && write_config(f, &c);
}
