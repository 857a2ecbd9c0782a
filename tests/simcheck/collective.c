/*
 * collective.c — one collective as fsdpc's simulator predicts it, for the
 * calibration table's nccl-tests rows (tests/simcheck/run.sh):
 *
 *   build/simcheck_collective SPEC KIND BYTES
 *
 * SPEC is a --sim cluster ("a100:nodes=4"); KIND all_gather, reduce_scatter
 * or all_reduce over the whole world; BYTES the size nccl-tests reports
 * (all-reduce and reduce-scatter: each rank's buffer; all-gather: the
 * gathered buffer). Prints "ALGO BUSBW_GBPS SECONDS".
 */
#include "fsdpc.h"

#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    SimCluster c;
    char msg[512];
    if (argc != 4) {
        fprintf(stderr, "usage: %s SPEC all_gather|reduce_scatter|all_reduce BYTES\n", argv[0]);
        return 2;
    }
    if (!sim_parse_cluster(argv[1], &c, msg, sizeof msg)) {
        fprintf(stderr, "%s\n", msg);
        return 2;
    }
    CollKind k;
    if (strcmp(argv[2], "all_gather") == 0)
        k = COLL_ALL_GATHER;
    else if (strcmp(argv[2], "reduce_scatter") == 0)
        k = COLL_REDUCE_SCATTER;
    else if (strcmp(argv[2], "all_reduce") == 0)
        k = COLL_ALL_REDUCE;
    else {
        fprintf(stderr, "unknown collective %s\n", argv[2]);
        return 2;
    }
    int64_t bytes = strtoll(argv[3], NULL, 10);
    if (k == COLL_ALL_GATHER)   /* nccl-tests sizes an all-gather by its output */
        bytes /= c.world;
    SimAlgo a;
    double bw, t = sim_collective_detail(&c, k, bytes, c.world, 1, &a, &bw);
    printf("%s %.1f %.6f\n", sim_algo_name(a), bw / 1e9, t);
    return 0;
}
