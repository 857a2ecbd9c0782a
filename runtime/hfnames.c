/*
 * hfnames.c — how a weights file lays out the model's parameters: under
 * fsdpc's own names (one tensor a parameter, its shape), or under the names
 * and layouts Hugging Face's `transformers` uses for GPT-2 and Llama models
 * (--hf-names gpt2|llama), so `transformers` loads what fsdpc trained and
 * fsdpc starts from what `transformers` saved. weights.c reads and writes
 * safetensors through the WLayout built here; this file only decides where
 * each parameter lies.
 *
 * The parameter tables carry names and shapes only, in declaration order
 * (docs/design.md#parameter-names-and-layouts: `<path>.<tensor>`, array elements by index), so the
 * mapping goes by layer kind and position, recognised from the names:
 *
 *   - a parameter `A.N.rest` (N a number) belongs to block N of the model's
 *     one block array A (blocks, layers, ...); anything else is top level;
 *   - in a block, layer X is an attention when X.q, X.k, X.v and X.o exist
 *     (with X.q_norm and X.k_norm under qk_norm),
 *     an MLP when X.fc and X.proj do (gelu/relu) or X.gate, X.up and X.down
 *     do (swiglu), and a norm when it is one name holding a 1-D weight; a
 *     block must hold one attention, one MLP and two norms, and the first
 *     norm declared is the one before the attention (ln_1,
 *     input_layernorm), the second the one before the MLP (ln_2,
 *     post_attention_layernorm) — pre-norm blocks declared in forward
 *     order, as the examples are;
 *   - at top level the first 2-D parameter is the token embedding (its rows
 *     are the vocabulary); GPT-2's second is the learned positions (wpe),
 *     Llama's an untied head (lm_head); the one norm is the final norm.
 *
 * Any parameter left over, or a shape the format cannot hold (GPT-2's
 * c_attn needs q, k and v of one shape; GPT-2's layers all have biases;
 * Llama's norms have none), is refused with its name. Layouts:
 *
 *   GPT-2 (GPT2LMHeadModel; Conv1D stores weights [in, out], the transpose
 *   of a Linear's): transformer.wte.weight ← tok; transformer.wpe.weight ←
 *   pos; transformer.h.N.ln_1.{weight,bias}; transformer.h.N.attn.c_attn.weight
 *   [C, 3C] = concat(q, k, v)ᵀ and .bias = concat of the biases;
 *   attn.c_proj = oᵀ; ln_2; mlp.c_fc = fcᵀ; mlp.c_proj = projᵀ;
 *   transformer.ln_f. The head is tied to wte and not written; an untied
 *   head has no place in GPT-2 and is refused.
 *
 *   Llama (LlamaForCausalLM; nn.Linear, no transposes):
 *   model.embed_tokens.weight; model.layers.N.input_layernorm.weight;
 *   self_attn.{q,k,v,o}_proj.weight (and .bias when the model has them:
 *   attention_bias); post_attention_layernorm.weight;
 *   mlp.{gate,up,down}_proj.weight (mlp_bias); model.norm.weight;
 *   lm_head.weight when the head is untied (else tie_word_embeddings).
 *   The same names hold Qwen2's and Qwen3's checkpoints (Qwen2ForCausalLM,
 *   Qwen3ForCausalLM): Attention(bias = qkv) writes q_proj, k_proj and
 *   v_proj with biases and o_proj without, Qwen2's layout, and qk_norm
 *   writes self_attn.q_norm.weight and self_attn.k_norm.weight [head_dim],
 *   Qwen3's.
 *   q_proj and k_proj are NOT permuted: Meta's original checkpoints
 *   interleave rotary pairs and HF's conversion script permutes them into
 *   rotate-half order, but fsdpc's rope already is HF's rotate-half
 *   (docs/design.md#layer-semantics), so its q and k are HF's as they stand.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* A parameter's name, taken apart: `A.N.local.tensor` or `local.tensor`. */
typedef struct Name {
    int block;               /* N, or -1 at top level */
    char local[256];         /* the layer's path within its block (or the model) */
    const char *tensor;      /* "weight" or "bias", or NULL when neither */
} Name;

typedef struct Builder {
    FsdRun *r;
    const char *fmt;         /* "gpt2" or "llama", for messages */
    WLayout *L;
    Name *names;
    bool *used;
    int cap;
    char arr[128];           /* the block array's name */
    int nblocks;
    bool failed;
} Builder;

static bool all_digits(const char *s, size_t n)
{
    if (n == 0 || n > 9)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* Splits P's name; false when it has no place in any layout (nested
 * arrays, a path too long). */
static bool split(const char *name, Name *out, char arr[128])
{
    const char *dot = strrchr(name, '.');
    out->block = -1;
    out->tensor = NULL;
    out->local[0] = 0;
    arr[0] = 0;
    if (!dot)
        return false;
    if (strcmp(dot + 1, "weight") == 0 || strcmp(dot + 1, "bias") == 0)
        out->tensor = dot + 1;
    size_t path = (size_t)(dot - name);
    const char *d1 = memchr(name, '.', path);
    const char *d2 = d1 ? memchr(d1 + 1, '.', path - (size_t)(d1 + 1 - name)) : NULL;
    const char *local = name;
    if (d1 && d2 && all_digits(d1 + 1, (size_t)(d2 - d1 - 1))) {
        if ((size_t)(d1 - name) >= 128)
            return false;
        memcpy(arr, name, (size_t)(d1 - name));
        arr[d1 - name] = 0;
        out->block = atoi(d1 + 1);
        local = d2 + 1;
    }
    size_t n = (size_t)(dot - local);
    if (n == 0 || n >= sizeof out->local)
        return false;
    memcpy(out->local, local, n);
    out->local[n] = 0;
    /* a number left in the path would be a second array level */
    for (const char *s = out->local; *s;) {
        size_t k = strcspn(s, ".");
        if (all_digits(s, k))
            return false;
        s += k + (s[k] == '.');
    }
    return true;
}

static void refuse(Builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(Builder *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    char msg[ERR_MAX - 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rt_fail(b->r, "--hf-names %s: %s", b->fmt, msg);
    b->failed = true;
}

/* The parameter `local.tensor` of block `block` (-1: top level), or -1. */
static int find(const Builder *b, int block, const char *local, const char *tensor)
{
    for (int p = 0; p < b->r->m->nparams; p++) {
        const Name *n = &b->names[p];
        if (n->block == block && n->tensor && strcmp(n->tensor, tensor) == 0 &&
            strcmp(n->local, local) == 0)
            return p;
    }
    return -1;
}

static const char *shape_text(char *buf, size_t n, int rank, int64_t s0, int64_t s1)
{
    if (rank == 1)
        snprintf(buf, n, "[%lld]", (long long)s0);
    else
        snprintf(buf, n, "[%lld, %lld]", (long long)s0, (long long)s1);
    return buf;
}

/* Checks parameter p's shape against what the format's tensor needs. */
static bool expect(Builder *b, int p, int rank, int64_t s0, int64_t s1, const char *why)
{
    const FsdParamInfo *P = &b->r->m->params[p];
    if (P->rank == rank && P->shape[0] == s0 && (rank == 1 || P->shape[1] == s1))
        return true;
    char got[64], want[64];
    refuse(b, "`%s` is %s; %s needs %s", P->name,
           shape_text(got, sizeof got, P->rank, P->shape[0], P->shape[1]), why,
           shape_text(want, sizeof want, rank, s0, s1));
    return false;
}

static int add_tensor(Builder *b, int rank, int64_t s0, int64_t s1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int add_tensor(Builder *b, int rank, int64_t s0, int64_t s1, const char *fmt, ...)
{
    WLayout *L = b->L;
    if (L->ntensors == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        WTensor *t = realloc(L->tensors, sizeof *t * (size_t)cap);
        if (!t) {
            refuse(b, "out of memory");
            return -1;
        }
        L->tensors = t;
        b->cap = cap;
    }
    WTensor *t = &L->tensors[L->ntensors];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->rank = rank;
    t->shape[0] = s0;
    t->shape[1] = rank == 2 ? s1 : 1;
    t->numel = s0 * t->shape[1];
    return L->ntensors++;
}

/* Parameter p goes into tensor t: at element `at` (a concatenation along
 * the first dimension), or transposed with its rows as the tensor's columns
 * from `at` on. */
static void place(Builder *b, int p, int t, bool transposed, int64_t at)
{
    if (p < 0 || t < 0)
        return;
    b->L->place[p] = (WPlace){t, transposed, at};
    b->used[p] = true;
}

/* ── the block's layers ── */

typedef struct BlockKinds {
    char attn[256], mlp[256], norm[2][256];
    bool swiglu;
    int nnorm;
} BlockKinds;

/* `X.last` → X when last is one of `names` (NULL-terminated). */
static bool child_of(const char *local, const char *const *names, char out[256])
{
    const char *dot = strrchr(local, '.');
    if (!dot)
        return false;
    for (int i = 0; names[i]; i++)
        if (strcmp(dot + 1, names[i]) == 0) {
            memcpy(out, local, (size_t)(dot - local));
            out[dot - local] = 0;
            return true;
        }
    return false;
}

/* What block 0's layers are, by the rule in the header comment. */
static bool classify(Builder *b, BlockKinds *k)
{
    static const char *const attn[] = {"q", "k", "v", "o", "q_norm", "k_norm", NULL};
    static const char *const gelu[] = {"fc", "proj", NULL};
    static const char *const swiglu[] = {"gate", "up", "down", NULL};
    const FsdModel *m = b->r->m;
    memset(k, 0, sizeof *k);
    bool have_attn = false, have_mlp = false;
    for (int p = 0; p < m->nparams; p++) {
        const Name *n = &b->names[p];
        if (n->block != 0)
            continue;
        char parent[256];
        if (child_of(n->local, attn, parent)) {
            if (have_attn && strcmp(parent, k->attn) != 0) {
                refuse(b, "block %s.0 has two attention layers (%s, %s); a %s block has one",
                       b->arr, k->attn, parent, b->fmt);
                return false;
            }
            strcpy(k->attn, parent);
            have_attn = true;
        } else if (child_of(n->local, gelu, parent) || child_of(n->local, swiglu, parent)) {
            bool sw = child_of(n->local, swiglu, parent);
            if (have_mlp && (strcmp(parent, k->mlp) != 0 || sw != k->swiglu)) {
                refuse(b, "block %s.0 has two MLPs (%s, %s); a %s block has one", b->arr, k->mlp,
                       parent, b->fmt);
                return false;
            }
            strcpy(k->mlp, parent);
            k->swiglu = sw;
            have_mlp = true;
        } else if (!strchr(n->local, '.') && n->tensor) {
            bool seen = false;
            for (int i = 0; i < k->nnorm; i++)
                seen |= strcmp(k->norm[i], n->local) == 0;
            if (seen)
                continue;
            if (k->nnorm == 2 || m->params[p].rank != 1) {
                refuse(b, "`%s` has no %s counterpart: a %s block holds two norms, one "
                          "attention (q, k, v, o) and one MLP",
                       m->params[p].name, b->fmt, b->fmt);
                return false;
            }
            strcpy(k->norm[k->nnorm++], n->local);
        } else {
            refuse(b, "`%s` has no %s counterpart: a %s block holds two norms, one attention "
                      "(q, k, v, o) and one MLP",
                   m->params[p].name, b->fmt, b->fmt);
            return false;
        }
    }
    if (!have_attn || !have_mlp || k->nnorm != 2) {
        refuse(b, "block %s.0 holds %s attention, %s MLP and %d norms; a %s block holds one "
                  "attention, one MLP and two norms",
               b->arr, have_attn ? "an" : "no", have_mlp ? "an" : "no", k->nnorm, b->fmt);
        return false;
    }
    return true;
}

/* The parameter `layer.tensor` of block n, refused when required and
 * missing. */
static int member(Builder *b, int n, const char *layer, const char *child, const char *tensor,
                  bool required)
{
    char local[300];
    if (child)
        snprintf(local, sizeof local, "%s.%s", layer, child);
    else
        snprintf(local, sizeof local, "%s", layer);
    int p = find(b, n, local, tensor);
    if (p < 0 && required)
        refuse(b, "`%s.%d.%s.%s` is missing; %s's layer needs it", b->arr, n, local, tensor,
               b->fmt);
    return p;
}

/* ── the two formats ── */

/* c_attn [C, 3C]: q, k and v side by side, each transposed; c_proj = oᵀ */
static void gpt2_attention(Builder *b, const BlockKinds *k, int64_t C, int n)
{
    static const char *const qkv[] = {"q", "k", "v"};
    int tw = add_tensor(b, 2, C, 3 * C, "transformer.h.%d.attn.c_attn.weight", n);
    int tb = add_tensor(b, 1, 3 * C, 0, "transformer.h.%d.attn.c_attn.bias", n);
    for (int i = 0; i < 3 && !b->failed; i++) {
        int w = member(b, n, k->attn, qkv[i], "weight", true);
        int bias = member(b, n, k->attn, qkv[i], "bias", true);
        if (b->failed || !expect(b, w, 2, C, C, "GPT-2's c_attn (q, k, v of one shape)") ||
            !expect(b, bias, 1, C, 0, "GPT-2's c_attn"))
            return;
        place(b, w, tw, true, i * C);
        place(b, bias, tb, false, i * C);
    }
    int w = member(b, n, k->attn, "o", "weight", true);
    int bias = member(b, n, k->attn, "o", "bias", true);
    if (b->failed || !expect(b, w, 2, C, C, "GPT-2's c_proj") ||
        !expect(b, bias, 1, C, 0, "GPT-2's c_proj"))
        return;
    place(b, w, add_tensor(b, 2, C, C, "transformer.h.%d.attn.c_proj.weight", n), true, 0);
    place(b, bias, add_tensor(b, 1, C, 0, "transformer.h.%d.attn.c_proj.bias", n), false, 0);
}

/* ln_1 (i = 0) or ln_2 (i = 1): a LayerNorm, weight and bias */
static void gpt2_norm(Builder *b, const BlockKinds *k, int64_t C, int n, int i)
{
    int w = member(b, n, k->norm[i], NULL, "weight", true);
    int bias = member(b, n, k->norm[i], NULL, "bias", false);
    if (w >= 0 && bias < 0)
        refuse(b, "`%s.%d.%s` has no bias: GPT-2's LayerNorms have one (an RMSNorm? "
                  "--hf-names llama)",
               b->arr, n, k->norm[i]);
    if (b->failed || !expect(b, w, 1, C, 0, "GPT-2's LayerNorm") ||
        !expect(b, bias, 1, C, 0, "GPT-2's LayerNorm"))
        return;
    const char *ln = i == 0 ? "ln_1" : "ln_2";
    place(b, w, add_tensor(b, 1, C, 0, "transformer.h.%d.%s.weight", n, ln), false, 0);
    place(b, bias, add_tensor(b, 1, C, 0, "transformer.h.%d.%s.bias", n, ln), false, 0);
}

static void gpt2_blocks(Builder *b, const BlockKinds *k, int64_t C)
{
    for (int n = 0; n < b->nblocks && !b->failed; n++) {
        /* GPT2Block's order: ln_1, attn, ln_2, mlp */
        gpt2_norm(b, k, C, n, 0);
        if (!b->failed)
            gpt2_attention(b, k, C, n);
        if (!b->failed)
            gpt2_norm(b, k, C, n, 1);
        if (b->failed)
            return;
        int fw = member(b, n, k->mlp, "fc", "weight", true);
        int fb = member(b, n, k->mlp, "fc", "bias", true);
        int pw = member(b, n, k->mlp, "proj", "weight", true);
        int pb = member(b, n, k->mlp, "proj", "bias", true);
        if (b->failed)
            return;
        int64_t H = b->r->m->params[fw].shape[0];
        if (!expect(b, fw, 2, H, C, "GPT-2's c_fc") || !expect(b, fb, 1, H, 0, "GPT-2's c_fc") ||
            !expect(b, pw, 2, C, H, "GPT-2's mlp.c_proj") ||
            !expect(b, pb, 1, C, 0, "GPT-2's mlp.c_proj"))
            return;
        place(b, fw, add_tensor(b, 2, C, H, "transformer.h.%d.mlp.c_fc.weight", n), true, 0);
        place(b, fb, add_tensor(b, 1, H, 0, "transformer.h.%d.mlp.c_fc.bias", n), false, 0);
        place(b, pw, add_tensor(b, 2, H, C, "transformer.h.%d.mlp.c_proj.weight", n), true, 0);
        place(b, pb, add_tensor(b, 1, C, 0, "transformer.h.%d.mlp.c_proj.bias", n), false, 0);
    }
}

static void llama_blocks(Builder *b, const BlockKinds *k, int64_t C)
{
    static const char *const attn[] = {"q", "k", "v", "o"};
    static const char *const mlp[] = {"gate", "up", "down"};
    for (int n = 0; n < b->nblocks && !b->failed; n++) {
        /* LlamaDecoderLayer's order: self_attn, mlp, then the two norms */
        int q = member(b, n, k->attn, "q", "weight", true);
        int kk = member(b, n, k->attn, "k", "weight", true);
        int gate = member(b, n, k->mlp, "gate", "weight", true);
        if (b->failed)
            return;
        const FsdParamInfo *P = b->r->m->params;
        int64_t Hq = P[q].shape[0], Hkv = P[kk].shape[0], I = P[gate].shape[0];
        const int64_t rows[] = {Hq, Hkv, Hkv, C}, cols[] = {C, C, C, Hq};
        for (int i = 0; i < 4 && !b->failed; i++) {
            int w = member(b, n, k->attn, attn[i], "weight", true);
            int bias = member(b, n, k->attn, attn[i], "bias", false);
            if (b->failed || !expect(b, w, 2, rows[i], cols[i], "Llama's attention") ||
                (bias >= 0 && !expect(b, bias, 1, rows[i], 0, "Llama's attention")))
                return;
            place(b, w,
                  add_tensor(b, 2, rows[i], cols[i], "model.layers.%d.self_attn.%s_proj.weight",
                             n, attn[i]),
                  false, 0);
            if (bias >= 0)
                place(b, bias,
                      add_tensor(b, 1, rows[i], 0, "model.layers.%d.self_attn.%s_proj.bias", n,
                                 attn[i]),
                      false, 0);
        }
        /* qk_norm: Qwen3's q_norm and k_norm, one head's RMSNorm weight each */
        static const char *const qk[] = {"q_norm", "k_norm"};
        int qn = member(b, n, k->attn, qk[0], "weight", false);
        for (int i = 0; i < 2 && !b->failed && qn >= 0; i++) {
            int w = member(b, n, k->attn, qk[i], "weight", true);
            if (b->failed)
                return;
            int64_t hd = P[w].shape[0];
            if (P[w].rank != 1 || hd < 1 || Hq % hd || Hkv % hd ||
                (i == 1 && hd != P[qn].shape[0])) {
                refuse(b, "`%s` is not one head's norm weight: Qwen3's %s is [head_dim], "
                          "head_dim dividing q_proj's %lld rows and k_proj's %lld",
                       P[w].name, qk[i], (long long)Hq, (long long)Hkv);
                return;
            }
            place(b, w, add_tensor(b, 1, hd, 0, "model.layers.%d.self_attn.%s.weight", n, qk[i]),
                  false, 0);
        }
        const int64_t mrows[] = {I, I, C}, mcols[] = {C, C, I};
        for (int i = 0; i < 3 && !b->failed; i++) {
            int w = member(b, n, k->mlp, mlp[i], "weight", true);
            int bias = member(b, n, k->mlp, mlp[i], "bias", false);
            if (b->failed || !expect(b, w, 2, mrows[i], mcols[i], "Llama's MLP") ||
                (bias >= 0 && !expect(b, bias, 1, mrows[i], 0, "Llama's MLP")))
                return;
            place(b, w,
                  add_tensor(b, 2, mrows[i], mcols[i], "model.layers.%d.mlp.%s_proj.weight", n,
                             mlp[i]),
                  false, 0);
            if (bias >= 0)
                place(b, bias,
                      add_tensor(b, 1, mrows[i], 0, "model.layers.%d.mlp.%s_proj.bias", n, mlp[i]),
                      false, 0);
        }
        for (int i = 0; i < 2; i++) {
            int w = member(b, n, k->norm[i], NULL, "weight", true);
            if (member(b, n, k->norm[i], NULL, "bias", false) >= 0)
                refuse(b, "`%s.%d.%s` has a bias: Llama's RMSNorms have none (a LayerNorm? "
                          "--hf-names gpt2)",
                       b->arr, n, k->norm[i]);
            if (b->failed || !expect(b, w, 1, C, 0, "Llama's RMSNorm"))
                return;
            place(b, w,
                  add_tensor(b, 1, C, 0, "model.layers.%d.%s.weight", n,
                             i == 0 ? "input_layernorm" : "post_attention_layernorm"),
                  false, 0);
        }
    }
}

/* Top level: embeddings (2-D, in declaration order) and the final norm. */
static void top_level(Builder *b, bool gpt2, int64_t C, int *emb, int *second, int *normw,
                      int *normb)
{
    const FsdModel *m = b->r->m;
    *emb = *second = *normw = *normb = -1;
    for (int p = 0; p < m->nparams && !b->failed; p++) {
        const Name *n = &b->names[p];
        const FsdParamInfo *P = &m->params[p];
        if (n->block >= 0)
            continue;
        bool plain = n->tensor && !strchr(n->local, '.');
        if (plain && P->rank == 2 && strcmp(n->tensor, "weight") == 0 && *second < 0) {
            if (*emb < 0)
                *emb = p;
            else
                *second = p;
        } else if (plain && P->rank == 1 && strcmp(n->tensor, "weight") == 0 && *normw < 0) {
            *normw = p;
        } else if (plain && P->rank == 1 && strcmp(n->tensor, "bias") == 0 && *normw >= 0 &&
                   *normb < 0 && strcmp(b->names[*normw].local, n->local) == 0) {
            *normb = p;
        } else if (gpt2 && plain && P->rank == 2 && *second >= 0) {
            refuse(b, "`%s` has no GPT-2 counterpart: GPT-2 has a token and a position "
                      "embedding, and its lm_head is tied to wte (tie = %s)",
                   P->name, b->names[*emb].local);
        } else {
            refuse(b, "`%s` has no %s counterpart (top level: %s, a final norm%s)", P->name,
                   b->fmt, gpt2 ? "token and position embeddings" : "a token embedding",
                   gpt2 ? "" : ", an untied head");
        }
    }
    if (b->failed)
        return;
    if (*emb < 0 || *normw < 0) {
        refuse(b, "model %s has no %s at top level (outside %s[*])", m->name,
               *emb < 0 ? "token embedding (a 2-D weight)" : "final norm (a 1-D weight)", b->arr);
        return;
    }
    if (!expect(b, *emb, 2, m->vocab, C, gpt2 ? "GPT-2's wte" : "Llama's embed_tokens"))
        return;
    if (gpt2 && *second < 0)
        refuse(b, "model %s has no position embedding; GPT-2 has wpe (learned positions)", m->name);
    else if (gpt2 && m->params[*second].shape[1] != C)
        expect(b, *second, 2, m->params[*second].shape[0], C, "GPT-2's wpe");
    else if (!gpt2 && *second >= 0 && m->params[*second].shape[0] != m->vocab)
        refuse(b, "`%s` has no Llama counterpart: Llama has no learned positions (rope), and an "
                  "untied head is [%lld, %lld]",
               m->params[*second].name, (long long)m->vocab, (long long)C);
    else if (!gpt2 && *second >= 0)
        expect(b, *second, 2, m->vocab, C, "Llama's lm_head (an untied head)");
    if (gpt2 && *normb < 0 && !b->failed)
        refuse(b, "`%s` has no bias: GPT-2's ln_f is a LayerNorm", m->params[*normw].name);
    if (!gpt2 && *normb >= 0 && !b->failed)
        refuse(b, "`%s`: Llama's final norm is an RMSNorm, without bias", m->params[*normb].name);
    if (!b->failed)
        expect(b, *normw, 1, C, 0, gpt2 ? "GPT-2's ln_f" : "Llama's norm");
}

static void build_hf(Builder *b, bool gpt2)
{
    const FsdModel *m = b->r->m;
    /* names apart; one block array, blocks 0 … L−1 */
    for (int p = 0; p < m->nparams; p++) {
        char arr[128];
        if (!split(m->params[p].name, &b->names[p], arr) || !b->names[p].tensor) {
            refuse(b, "`%s` has no %s counterpart (names are [ARRAY.N.]LAYER.weight|bias)",
                   m->params[p].name, b->fmt);
            return;
        }
        if (b->names[p].block < 0)
            continue;
        if (!b->arr[0])
            strcpy(b->arr, arr);
        else if (strcmp(arr, b->arr) != 0) {
            refuse(b, "`%s` is in a second block array (%s[*] and %s[*]); %s has one stack of "
                      "layers",
                   m->params[p].name, b->arr, arr, b->fmt);
            return;
        }
        if (b->names[p].block + 1 > b->nblocks)
            b->nblocks = b->names[p].block + 1;
    }
    if (!b->arr[0]) {
        refuse(b, "model %s has no block array (ARRAY.N.LAYER names): %s is a stack of blocks",
               m->name, b->fmt);
        return;
    }
    BlockKinds k;
    if (!classify(b, &k))
        return;
    if (gpt2 && k.swiglu) {
        refuse(b, "`%s.0.%s` is a swiglu MLP (gate, up, down); GPT-2's MLP is c_fc, c_proj "
                  "(--hf-names llama?)",
               b->arr, k.mlp);
        return;
    }
    if (!gpt2 && !k.swiglu) {
        refuse(b, "`%s.0.%s` is a gelu/relu MLP (fc, proj); Llama's MLP is gate, up, down "
                  "(--hf-names gpt2?)",
               b->arr, k.mlp);
        return;
    }
    int emb, second, normw, normb;
    int64_t C = 0;
    for (int p = 0; p < m->nparams && !C; p++)
        if (b->names[p].block < 0 && m->params[p].rank == 2)
            C = m->params[p].shape[1];
    top_level(b, gpt2, C, &emb, &second, &normw, &normb);
    if (b->failed)
        return;
    /* HF's order: embeddings, layers, final norm, head */
    if (gpt2) {
        place(b, emb, add_tensor(b, 2, m->vocab, C, "transformer.wte.weight"), false, 0);
        place(b, second,
              add_tensor(b, 2, m->params[second].shape[0], C, "transformer.wpe.weight"), false, 0);
        gpt2_blocks(b, &k, C);
        place(b, normw, add_tensor(b, 1, C, 0, "transformer.ln_f.weight"), false, 0);
        place(b, normb, add_tensor(b, 1, C, 0, "transformer.ln_f.bias"), false, 0);
    } else {
        place(b, emb, add_tensor(b, 2, m->vocab, C, "model.embed_tokens.weight"), false, 0);
        llama_blocks(b, &k, C);
        place(b, normw, add_tensor(b, 1, C, 0, "model.norm.weight"), false, 0);
        if (second >= 0)
            place(b, second, add_tensor(b, 2, m->vocab, C, "lm_head.weight"), false, 0);
    }
    if (b->failed)
        return;
    for (int p = 0; p < m->nparams; p++)
        if (!b->used[p]) {
            refuse(b, "`%s` has no %s counterpart", m->params[p].name, b->fmt);
            return;
        }
    /* what each layer was taken for, for config.json (hfconfig.c) */
    WRoles *R = &b->L->roles;
    snprintf(R->arr, sizeof R->arr, "%s", b->arr);
    R->nblocks = b->nblocks;
    snprintf(R->attn, sizeof R->attn, "%s", k.attn);
    snprintf(R->mlp, sizeof R->mlp, "%s", k.mlp);
    for (int i = 0; i < 2; i++)
        snprintf(R->norm[i], sizeof R->norm[i], "%s", k.norm[i]);
    snprintf(R->final_norm, sizeof R->final_norm, "%s", b->names[normw].local);
    R->dim = C;
    /* block 0's c_fc or gate_proj: rows = the MLP's hidden width (every
     * block's was checked against its own) */
    R->hidden = m->params[member(b, 0, k.mlp, k.swiglu ? "gate" : "fc", "weight", true)].shape[0];
    R->positions = gpt2 ? m->params[second].shape[0] : 0;
    R->untied_head = !gpt2 && second >= 0;
}

bool hf_layout(FsdRun *r, const char *names, WLayout *L)
{
    const FsdModel *m = r->m;
    memset(L, 0, sizeof *L);
    L->names = names;
    L->place = calloc((size_t)m->nparams + 1, sizeof *L->place);
    Builder b = {r, names ? names : "fsdpc", L, calloc((size_t)m->nparams + 1, sizeof(Name)),
                 calloc((size_t)m->nparams + 1, sizeof(bool)), 0, "", 0, false};
    if (!L->place || !b.names || !b.used)
        refuse(&b, "out of memory");
    else if (!names) {
        /* fsdpc's own: one tensor a parameter, group by group (the order
         * export gathers them in, so the file is written front to back) */
        for (int i = 0; i < m->ngroups * m->nparams && !b.failed; i++) {
            int p = i % m->nparams;
            const FsdParamInfo *P = &m->params[p];
            if (P->group != i / m->nparams)
                continue;
            if (strlen(P->name) >= sizeof L->tensors[0].name) {
                refuse(&b, "parameter name `%s` is too long", P->name);
                break;
            }
            place(&b, p, add_tensor(&b, P->rank, P->shape[0], P->shape[1], "%s", P->name), false,
                  0);
        }
    } else if (strcmp(names, "gpt2") == 0 || strcmp(names, "llama") == 0)
        build_hf(&b, strcmp(names, "gpt2") == 0);
    else {
        rt_fail(r, "--hf-names: '%s' is not one of gpt2, llama", names);
        b.failed = true;
    }

    /* every tensor exactly covered: a bug here would write garbage */
    if (!b.failed) {
        int64_t *covered = calloc((size_t)L->ntensors + 1, sizeof *covered);
        if (!covered)
            refuse(&b, "out of memory");
        for (int p = 0; covered && p < m->nparams; p++)
            covered[L->place[p].tensor] += m->params[p].numel;
        for (int t = 0; covered && t < L->ntensors; t++)
            if (covered[t] != L->tensors[t].numel)
                RT_BUG(r, "--hf-names %s: tensor %s holds %lld elements, %lld placed", b.fmt,
                       L->tensors[t].name, (long long)L->tensors[t].numel, (long long)covered[t]);
        free(covered);
    }
    free(b.names);
    free(b.used);
    if (b.failed)
        hf_layout_free(L);
    return !b.failed;
}

void hf_layout_free(WLayout *L)
{
    free(L->tensors);
    free(L->place);
    L->tensors = NULL;
    L->place = NULL;
    L->ntensors = 0;
}
