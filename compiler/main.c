/*
 * main.c — the fsdpc command line, and the pipeline as one list of passes:
 *
 *   parse_program → sema_check → model_build → lower_model → autodiff
 *   → recompute_units, plan_recompute, recompute_apply → fuse (unless
 *   --no-fuse) → plan_choose → the dumps, --sim and --trace → emit_program
 *
 * with a verifier after every pass that builds or transforms the IR: a
 * failure there is a compiler bug and stops with an internal error. Every
 * choice the compiler makes (fully_shard auto's groups, the policy under
 * memory_budget) is made inside plan_choose (planner.c); the passes after
 * it only read the plan. The one choice made before it, each recomputation
 * unit's mode, is the planner's too (plan_recompute): the graph it plans
 * must already hold the recompute ops. The run stops after the last stage an output
 * needs: --dump-ast after parsing, --check and --dump-model after
 * model_build. --verify stops after fusion: it compiles the graph's kernel
 * templates with NVRTC and prints its report instead of writing train.cu.
 *
 * `fsdpc --from-hf config.json` runs beside the pipeline: hfconfig.c writes
 * the .fsd of a Hugging Face model, which goes through the front end
 * (parse_program, sema_check, model_build) before it is written out.
 *
 * Output (train.cu, or the dumps asked for) goes to -o FILE or stdout. A file
 * named by -o is written under a temporary name and renamed only when the
 * whole compile succeeded, so an error never leaves a partial or stale
 * output behind; a device or pipe (-o /dev/null) is written directly, never
 * renamed over. A write that fails (a full disk) is an error, exit 1.
 */
#include "fsdpc.h"

#include <inttypes.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Larger sources are refused before scanning: locations are 32-bit
 * offsets, and no model description comes near this. */
#define MAX_SOURCE_BYTES (256u << 20)

typedef struct Options {
    const char *input, *output;
    bool check, dump_ast, dump_model, dump_ir, dump_plan, dump_schedule, schedule_json;
    bool dump_memory;
    int64_t world;
    bool world_set;            /* --world given: --sim must agree with it */
    const char *sim_spec;      /* --sim PRESET[:nodes=N,gpus=N] */
    const char *trace;         /* --trace FILE.json */
    bool verify;               /* --verify: the kernels through NVRTC */
    bool no_fuse;              /* --no-fuse: keep every forward op apart */
    const char *arch;          /* --arch sm_80,sm_90: what --verify compiles for */
    SimCluster cluster;        /* what --sim and --trace simulate */
    bool emit;                 /* no --check and no dump: write train.cu */
    const char *from_hf;       /* --from-hf CONFIG.json: write its .fsd instead */
    int64_t seq;               /* --seq N for --from-hf (0: the model's positions) */
} Options;

static void usage(FILE *out)
{
    fputs("usage: fsdpc FILE.fsd [options]\n"
          "       fsdpc --from-hf config.json [--seq N] [-o FILE.fsd]\n"
          "\n"
          "Compiles a model, sharding policy and training setup (.fsd) into a\n"
          "sharded training program: with no --check or --dump option it writes\n"
          "train.cu (to -o FILE or standard output).\n"
          "\n"
          "options:\n"
          "  --check          check the file (front end only) and exit\n"
          "  --dump-ast       print the syntax tree\n"
          "  --dump-model     print the typed model: layers, parameters, shapes,\n"
          "                   parameter count, shard groups and settings\n"
          "  --dump-ir        print the training graph: forward and backward ops\n"
          "  --dump-plan      print the shard groups, their flat layout and policies\n"
          "  --dump-schedule  print one training step's events, one a line\n"
          "  --dump-schedule=json   the same as JSON\n"
          "  --dump-memory    print each rank's memory plan: resident state, unsharded\n"
          "                   buffers, activation arena, workspace and the peak\n"
          "  --world N        size the dumps for N ranks (default 8)\n"
          "  --sim PRESET[:nodes=N,gpus=N,...]\n"
          "                   predict one step's time, exposed communication, MFU and\n"
          "                   tokens/s on a cluster: presets a100, h100, h200, b200;\n"
          "                   one node of 8 GPUs unless nodes= or gpus= (per node) says\n"
          "                   otherwise; the world is nodes x gpus; also nics=, nic_gbps=,\n"
          "                   hbm_gbs=, hbm_gib=, nvlink_gbs= (a variant of the GPU),\n"
          "                   eff=ideal|measured, calib=FILE (docs/simulator.md)\n"
          "  --trace FILE.json  write the simulated step as a Chrome trace (Perfetto,\n"
          "                   chrome://tracing); without --sim it simulates h100 nodes\n"
          "                   of 8 GPUs, ceil(N/8) of them, at the --world size\n"
          "  --verify         compile every kernel the program uses with NVRTC (loaded at\n"
          "                   run time from the CUDA toolkit) and report each kernel's\n"
          "                   registers and spills, and failures against the template\n"
          "                   and the .fsd lines using it; no GPU needed\n"
          "  --arch LIST      --verify's architectures (default sm_80,sm_90)\n"
          "  --no-fuse        keep add + norm and matmul_bias + gelu as separate ops\n"
          "                   (by default each pair is one fused op; docs/compiler.md)\n"
          "  --from-hf CONFIG.json\n"
          "                   write the .fsd of a Hugging Face GPT-2 or Llama model from its\n"
          "                   config.json, named so that `train --init-from DIR --hf-names`\n"
          "                   imports its weights (docs/checkpoint.md)\n"
          "  --seq N          --from-hf's training sequence length (default and most: the\n"
          "                   model's n_positions or max_position_embeddings)\n"
          "  -o FILE          write the output to FILE instead of standard output\n"
          "  --help           print this help\n"
          "  --version        print the version\n",
          out);
}

static int parse_options(int argc, char **argv, Options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("fsdpc %s\n", FSDPC_VERSION);
            exit(0);
        } else if (strcmp(a, "--check") == 0) {
            o->check = true;
        } else if (strcmp(a, "--dump-ast") == 0) {
            o->dump_ast = true;
        } else if (strcmp(a, "--dump-model") == 0) {
            o->dump_model = true;
        } else if (strcmp(a, "--dump-ir") == 0) {
            o->dump_ir = true;
        } else if (strcmp(a, "--dump-plan") == 0) {
            o->dump_plan = true;
        } else if (strcmp(a, "--dump-schedule") == 0) {
            o->dump_schedule = true;
        } else if (strcmp(a, "--dump-schedule=json") == 0) {
            o->dump_schedule = o->schedule_json = true;
        } else if (strcmp(a, "--dump-memory") == 0) {
            o->dump_memory = true;
        } else if (strcmp(a, "--world") == 0) {
            char *end;
            if (++i == argc) {
                fprintf(stderr, "fsdpc: --world needs a number of ranks\n");
                return 1;
            }
            errno = 0;
            long long w = strtoll(argv[i], &end, 10);
            if (*end || end == argv[i] || errno || w < 1 || w > (1 << 24)) {
                fprintf(stderr, "fsdpc: --world %s: expected a number of ranks from 1 to %d\n",
                        argv[i], 1 << 24);
                return 1;
            }
            o->world = w;
            o->world_set = true;
        } else if (strcmp(a, "--sim") == 0) {
            if (++i == argc) {
                fprintf(stderr, "fsdpc: --sim needs a cluster preset (%s), e.g. --sim h100:nodes=16\n",
                        sim_preset_list());
                return 1;
            }
            o->sim_spec = argv[i];
        } else if (strcmp(a, "--trace") == 0) {
            if (++i == argc) {
                fprintf(stderr, "fsdpc: --trace needs a file name (FILE.json)\n");
                return 1;
            }
            o->trace = argv[i];
        } else if (strcmp(a, "--verify") == 0) {
            o->verify = true;
        } else if (strcmp(a, "--no-fuse") == 0) {
            o->no_fuse = true;
        } else if (strcmp(a, "--arch") == 0) {
            if (++i == argc) {
                fprintf(stderr, "fsdpc: --arch needs a list of architectures, e.g. sm_80,sm_90\n");
                return 1;
            }
            o->arch = argv[i];
        } else if (strcmp(a, "--from-hf") == 0) {
            if (++i == argc) {
                fprintf(stderr, "fsdpc: --from-hf needs a config.json\n");
                return 1;
            }
            o->from_hf = argv[i];
        } else if (strcmp(a, "--seq") == 0) {
            char *end;
            if (++i == argc) {
                fprintf(stderr, "fsdpc: --seq needs a sequence length\n");
                return 1;
            }
            errno = 0;
            long long n = strtoll(argv[i], &end, 10);
            if (*end || end == argv[i] || errno || n < 1 || n > (1 << 24)) {
                fprintf(stderr, "fsdpc: --seq %s: expected a sequence length from 1 to %d\n",
                        argv[i], 1 << 24);
                return 1;
            }
            o->seq = n;
        } else if (strcmp(a, "-o") == 0) {
            if (++i == argc) {
                fprintf(stderr, "fsdpc: -o needs a file name\n");
                return 1;
            }
            o->output = argv[i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "fsdpc: unknown option %s (see fsdpc --help)\n", a);
            return 1;
        } else if (o->input) {
            fprintf(stderr, "fsdpc: more than one input file (%s and %s)\n", o->input, a);
            return 1;
        } else {
            o->input = a;
        }
    }
    if (o->seq && !o->from_hf) {
        fprintf(stderr, "fsdpc: --seq is --from-hf's sequence length (a .fsd says `const seq`)\n");
        return 1;
    }
    if (o->from_hf) {
        bool other = o->input || o->check || o->dump_ast || o->dump_model || o->dump_ir ||
                     o->dump_plan || o->dump_schedule || o->dump_memory || o->sim_spec ||
                     o->trace || o->verify || o->world_set;
        if (other) {
            fprintf(stderr, "fsdpc: --from-hf writes a .fsd from a config.json and takes only "
                            "--seq and -o; compile the .fsd it writes with a second fsdpc run\n");
            return 1;
        }
        return 0;
    }
    if (!o->input) {
        fprintf(stderr, "fsdpc: no input file (see fsdpc --help)\n");
        return 1;
    }
    o->emit = !(o->check || o->dump_ast || o->dump_model || o->dump_ir || o->dump_plan ||
                o->dump_schedule || o->dump_memory || o->sim_spec || o->verify);
    if (o->arch && !o->verify) {
        fprintf(stderr, "fsdpc: --arch names --verify's architectures; add --verify\n");
        return 1;
    }
    if (!o->arch)
        o->arch = "sm_80,sm_90";
    if (o->sim_spec) {
        char msg[512];
        if (!sim_parse_cluster(o->sim_spec, &o->cluster, msg, sizeof msg)) {
            fprintf(stderr, "fsdpc: %s\n", msg);
            return 1;
        }
        if (o->world_set && o->world != o->cluster.world) {
            fprintf(stderr, "fsdpc: --world %lld disagrees with --sim %s, which has %lld ranks "
                            "(%lld node%s x %lld GPUs); drop --world or make them agree\n",
                    (long long)o->world, o->sim_spec, (long long)o->cluster.world,
                    (long long)o->cluster.nodes, o->cluster.nodes == 1 ? "" : "s",
                    (long long)o->cluster.gpus_per_node);
            return 1;
        }
        o->world = o->cluster.world;
    } else {
        o->cluster = sim_default_cluster(o->world);
    }
    return 0;
}

/* Whether `path` may be written under a temporary name and renamed into
 * place: it is a regular file or does not exist yet. A device or pipe
 * (/dev/null, /dev/full, /dev/stdout, a FIFO) is written directly instead:
 * renaming over it would replace it with a file (as root, /dev/null). */
static bool renamable(const char *path)
{
    struct stat st;
    return stat(path, &st) != 0 || S_ISREG(st.st_mode);
}

/* Closes f, written as `name`, and says why when anything written to it
 * was lost (a full disk, /dev/full): a write that failed earlier (ferror),
 * or the last buffer's (fflush, fclose). Standard output is flushed, not
 * closed. Returns whether all of it was written. */
static bool close_written(FILE *f, const char *name)
{
    errno = 0;
    bool ok = fflush(f) == 0 && !ferror(f);
    int err = errno;
    if (f != stdout && fclose(f) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok)
        fprintf(stderr, "fsdpc: cannot write %s: %s\n", name,
                err ? strerror(err) : "a write failed");
    return ok;
}

/* The trace goes to its own file, written under a temporary name and
 * renamed when complete, like -o (a device or pipe directly). */
static int write_trace(const char *path, Sim *sim, MemPlan *mp)
{
    char *tmp = renamable(path) ? arena_printf("%s.tmp.%ld", path, (long)getpid()) : NULL;
    const char *name = tmp ? tmp : path;
    FILE *f = fopen(name, "wb");
    if (!f) {
        fprintf(stderr, "fsdpc: cannot write %s: %s\n", name, strerror(errno));
        return 1;
    }
    sim_trace(f, sim, mp);
    if (!close_written(f, name)) {
        if (tmp)
            remove(tmp);
        return 1;
    }
    if (tmp && rename(tmp, path) != 0) {
        fprintf(stderr, "fsdpc: cannot rename %s to %s: %s\n", tmp, path, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

/* The output (-o FILE or standard output), opened when something is first
 * written: a file named by -o goes to a temporary name beside it, renamed
 * only when the whole compile succeeded. */
typedef struct Output {
    const char *path;          /* -o FILE, or NULL for standard output */
    FILE *f;
    char *tmp;
    bool failed;               /* it could not be opened */
} Output;

static FILE *output(Output *o)
{
    if (o->f || o->failed)
        return o->f;
    if (!o->path)
        return o->f = stdout;
    /* a device or pipe (-o /dev/null, -o /dev/stdout) directly */
    const char *name = o->path;
    if (renamable(o->path))
        name = o->tmp = arena_printf("%s.tmp.%ld", o->path, (long)getpid());
    if (!(o->f = fopen(name, "wb"))) {
        fprintf(stderr, "fsdpc: cannot write %s: %s\n", name, strerror(errno));
        o->failed = true;
    }
    return o->f;
}

/* Ends the run: on success the output (if any was written) is flushed and
 * renamed into place; on failure the temporary file is removed. Returns
 * main's exit status. */
static int finish(Output *o, bool ok)
{
    if (o->failed)
        return 1;
    if (!o->f)
        return ok ? 0 : 1;
    if (!o->tmp)
        return close_written(o->f, o->path ? o->path : "standard output") && ok ? 0 : 1;
    if (!close_written(o->f, o->tmp) || !ok) {
        remove(o->tmp);
        return 1;
    }
    if (rename(o->tmp, o->path) != 0) {
        fprintf(stderr, "fsdpc: cannot rename %s to %s: %s\n", o->tmp, o->path, strerror(errno));
        remove(o->tmp);
        return 1;
    }
    return 0;
}

/* A verifier's complaint after a pass is a compiler bug, not a user error:
 * the run stops with status 2, leaving no output behind. */
static void verified(Output *o, int violations, const char *pass)
{
    if (violations) {
        if (o->tmp) {
            fclose(o->f);
            remove(o->tmp);
        }
        fprintf(stderr, "fsdpc: internal compiler error: %d violation%s after %s "
                        "(please report this with the .fsd file)\n",
                violations, violations == 1 ? "" : "s", pass);
        exit(2);
    }
}

static Source *read_input(const char *path)
{
    Source *src = source_read(path);
    if (!src) {
        fprintf(stderr, "fsdpc: cannot read %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (src->len > MAX_SOURCE_BYTES) {
        fprintf(stderr, "fsdpc: %s is %zu bytes; .fsd files are limited to %u MiB\n", path,
                src->len, MAX_SOURCE_BYTES >> 20);
        return NULL;
    }
    return src;
}

/* How far the pipeline runs: the last stage any requested output needs. */
typedef enum { UPTO_PARSE, UPTO_SEMA, UPTO_PLAN } Upto;

static Upto upto(const Options *o)
{
    if (o->dump_ir || o->dump_plan || o->dump_schedule || o->dump_memory || o->sim_spec ||
        o->trace || o->verify || o->emit)
        return UPTO_PLAN;
    return o->check || o->dump_model ? UPTO_SEMA : UPTO_PARSE;
}

/* The dumps that read the plan, in a fixed order; --trace to its own file. */
static bool write_plan_outputs(const Options *o, Output *out, Plan *plan)
{
    Sim *sim = o->sim_spec || o->trace ? sim_run(plan->sched, &o->cluster) : NULL;
    if (o->dump_ir && output(out))
        ir_dump(out->f, plan->g);
    if (o->dump_plan && output(out)) {
        plan_dump(out->f, plan, o->world);
        recompute_dump_plan(out->f, plan->g, plan->micro_batch);
    }
    if (o->dump_schedule && output(out)) {
        if (o->schedule_json)
            schedule_dump_json(out->f, plan->sched, o->world, plan->mem);
        else
            schedule_dump(out->f, plan->sched, o->world, plan->mem);
    }
    if (o->dump_memory && output(out)) {
        memplan_dump(out->f, plan->mem);
        recompute_dump_memory(out->f, plan->g, plan->micro_batch);
    }
    if (o->sim_spec && output(out))
        sim_dump(out->f, sim, plan->mem);
    return !out->failed && !(o->trace && write_trace(o->trace, sim, plan->mem));
}

/* --from-hf: the .fsd hfconfig.c writes, through the front end first (a
 * text that does not compile is fsdpc's bug, like a verifier's complaint),
 * then to the output. */
static int from_hf(const Options *o, Output *out)
{
    char *text = hfconfig_fsd(o->from_hf, o->seq, stderr);
    if (!text)
        return 1;
    Source *src = source_from_memory(o->output ? o->output : "(--from-hf)", text, strlen(text));
    Diag diag;
    diag_init(&diag, src, stderr);
    Program *prog = parse_program(src, &diag);
    Model *model = diag.errors ? NULL : sema_check(prog, &diag);
    if (model)
        model = model_build(model, &diag);
    if (!model || diag.errors) {
        fprintf(stderr, "fsdpc: internal compiler error: the .fsd written for %s does not "
                        "compile (please report this with the config.json)\n",
                o->from_hf);
        return 2;
    }
    if (output(out))
        fputs(text, out->f);
    return finish(out, true);
}

/* replicate = R needs a world R divides (docs/design.md#hsdp), and
 * reshard_after_forward = N a shard group of S = W / R ranks that N
 * divides (docs/design.md#partial-resharding): refused here when --world
 * (or --sim) names the world, at the setting; else the plan's default
 * world of 8 becomes the next multiple of R (and of R * N), and the
 * trainer checks the world it runs at. With the world known, N = S is
 * plain resharding, planned as `true`. replicate = auto chooses R among
 * the meshes of the world it plans for (planner.c), each one's shard group
 * a multiple of every N; here it counts as R = 1. */
/* R as written; 1 under replicate = auto, which chooses it later */
static int64_t mesh_replicas(const Model *m)
{
    return !m->shard.replicate_auto && m->shard.replicate > 1 ? m->shard.replicate : 1;
}

static bool check_reshard_ranks(Options *o, Model *m, Diag *d, ReshardSpec *rs, int64_t *ranks)
{
    int64_t N = *ranks, R = mesh_replicas(m), S = o->world / R;
    if (N < 2)
        return true;
    if (S % N != 0) {
        diag_error(d, rs ? rs->loc : m->shard.reshard_ranks_loc,
                   "`reshard_after_forward = %" PRId64 "` does not divide the shard group of %"
                   PRId64 " ranks (world %" PRId64 "%s, %s): the copy kept after forward is "
                   "sharded over N consecutive ranks of it; use a divisor of %" PRId64,
                   N, S, o->world, R > 1 ? arena_printf(" / replicate %" PRId64, R) : "",
                   o->sim_spec ? "--sim" : "--world", S);
        return false;
    }
    if (N == S) {
        *ranks = 0;
        if (rs)
            rs->ranks = 0;
    }
    return true;
}

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

static bool check_mesh(Options *o, Model *m, Diag *d)
{
    int64_t R = mesh_replicas(m);
    if (R > 1 && o->world % R != 0) {
        if (o->world_set || o->sim_spec) {
            diag_error(d, m->shard.replicate_loc,
                       "`replicate = %" PRId64 "` does not divide the world of %" PRId64
                       " ranks (%s): HSDP needs R replicas of W/R ranks each; use a world that "
                       "is a multiple of %" PRId64,
                       R, o->world, o->sim_spec ? "--sim" : "--world", R);
            return false;
        }
    }
    if (!o->world_set && !o->sim_spec) {
        /* the smallest world from 8 that every N and R fit */
        int64_t step = R;
        for (int i = 0; i <= m->ngroups; i++) {
            const ReshardSpec *rs = i < m->ngroups ? m->groups[i]->reshard_own : NULL;
            int64_t N = i < m->ngroups ? (rs ? rs->ranks : 0) : m->shard.reshard_ranks;
            if (N >= 2)
                step = step / gcd64(step, R * N) * (R * N);
        }
        int64_t w = (o->world + step - 1) / step * step;
        if (w != o->world) {
            o->world = w;
            o->cluster = sim_default_cluster(o->world);
        }
        return true;
    }
    bool ok = check_reshard_ranks(o, m, d, NULL, &m->shard.reshard_ranks);
    for (int i = 0; i < m->ngroups; i++) {
        ReshardSpec *rs = (ReshardSpec *)m->groups[i]->reshard_own;
        if (rs)
            ok &= check_reshard_ranks(o, m, d, rs, &rs->ranks);
    }
    return ok;
}

int main(int argc, char **argv)
{
    Options o = {.world = 8};
    if (parse_options(argc, argv, &o))
        return 1;
    Output out = {.path = o.output};
    if (o.from_hf)
        return from_hf(&o, &out);
    Source *src = read_input(o.input);
    if (!src)
        return 1;
    Diag diag;
    diag_init(&diag, src, stderr);

    Program *prog = parse_program(src, &diag);
    if (diag.errors)
        return 1;
    if (o.dump_ast && output(&out))
        ast_dump(out.f, prog);
    if (upto(&o) == UPTO_PARSE)
        return finish(&out, true);

    Model *model = sema_check(prog, &diag);
    if (model)
        model = model_build(model, &diag);
    if (!model)
        return finish(&out, false);
    if (!check_mesh(&o, model, &diag))
        return finish(&out, false);
    if (o.dump_model && output(&out))
        model_dump(out.f, model);
    if (upto(&o) == UPTO_SEMA)
        return finish(&out, true);

    Graph *graph = lower_model(model);
    verified(&out, ir_verify(graph, stderr), "lowering");
    autodiff(graph);
    verified(&out, ir_verify(graph, stderr), "autodiff");
    Recompute *rc = recompute_units(model, graph);
    plan_recompute_search(model, graph, rc, !o.no_fuse, &o.cluster);
    plan_recompute(rc);
    graph = recompute_apply(graph, rc);
    verified(&out, ir_verify(graph, stderr), "recomputation");
    if (!o.no_fuse) {
        fuse(graph);
        verified(&out, ir_verify(graph, stderr), "fusion");
    }
    if (o.verify) {   /* the kernels through NVRTC: the report, and no train.cu */
        int failed = output(&out) ? verify_kernels(out.f, model, graph, o.arch) : 0;
        return finish(&out, true) || failed != 0;
    }

    Plan *plan = plan_choose(model, graph, &o.cluster, &diag);
    if (!plan)
        return finish(&out, false);
    if (plan->mesh)   /* replicate = auto planned for a world nobody named */
        plan->mesh->world_assumed = !o.world_set && !o.sim_spec;
    verified(&out, schedule_verify(plan->sched, stderr), "scheduling");
    verified(&out, memplan_verify(plan->mem, stderr), "memory planning");
    if (!write_plan_outputs(&o, &out, plan))
        return finish(&out, false);

    if (o.emit && output(&out))
        verified(&out, emit_program(out.f, plan, stderr), "scheduling the emitted micro-batches");
    return finish(&out, true);
}
