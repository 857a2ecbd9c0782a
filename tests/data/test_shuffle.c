/*
 * test_shuffle.c — --shuffle's order (runtime/data.c, data_shuffled)
 * without a trainer: for every n from 1 to 600 and a few large ones, each
 * epoch's n positions read each of the n sequences exactly once (the
 * Feistel permutation with cycle walking is a bijection of 0 … n − 1);
 * the order is a function of (seed, position) alone (asked twice, in
 * another order, it answers the same); two epochs and two seeds give
 * different orders; and it is shuffled, not a shift or the identity: of
 * 100,000 sequences, few stay in place and few neighbours stay neighbours
 * (a uniform permutation has on average 1 fixed point and 2 kept
 * successions; the bounds are far above what one should show and far
 * below what a weak permutation gives). Prints run.sh-style lines and
 * "N passed, N failed".
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pass, fail;

static void check(const char *what, bool ok)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (ok)
        pass++;
    else
        fail++;
}

/* Epoch e of n sequences under seed: every sequence once. */
static bool bijective(int64_t n, int64_t e, uint64_t seed, unsigned char *seen)
{
    memset(seen, 0, (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t j = data_shuffled(e * n + i, n, seed);
        if (j < 0 || j >= n || seen[j])
            return false;
        seen[j] = 1;
    }
    return true;
}

int main(void)
{
    enum { BIG = 100000 };
    unsigned char *seen = malloc(BIG + 1);
    int64_t *order = malloc(sizeof(int64_t) * (BIG + 1));
    if (!seen || !order)
        return 1;

    bool all = true;
    for (int64_t n = 1; n <= 600 && all; n++)
        all = bijective(n, 0, 1337, seen) && bijective(n, 3, 1337, seen);
    check("every n in 1..600, epochs 0 and 3: each sequence read once", all);
    const int64_t sizes[] = {1023, 1024, 1025, 4097, 65536, 99991, BIG};
    all = true;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        all = all && bijective(sizes[k], 1, 42, seen);
    check("n = 1023, 1024, 1025, 4097, 65536, 99991, 100000: each sequence read once", all);

    /* a function of the position: backwards gives the same answers */
    for (int64_t i = 0; i < BIG; i++)
        order[i] = data_shuffled(5 * (int64_t)BIG + i, BIG, 7);
    all = true;
    for (int64_t i = BIG - 1; i >= 0; i--)
        all = all && data_shuffled(5 * (int64_t)BIG + i, BIG, 7) == order[i];
    check("the same (seed, position) reads the same sequence, asked in any order", all);

    int64_t fixed = 0, succ = 0, same_epoch = 0, same_seed = 0;
    for (int64_t i = 0; i < BIG; i++) {
        fixed += order[i] == i;
        succ += i + 1 < BIG && order[i + 1] == order[i] + 1;
        same_epoch += data_shuffled(6 * (int64_t)BIG + i, BIG, 7) == order[i];
        same_seed += data_shuffled(5 * (int64_t)BIG + i, BIG, 8) == order[i];
    }
    printf("     100000 sequences: %lld in place, %lld successions kept, %lld the same in the "
           "next epoch, %lld the same under another seed\n",
           (long long)fixed, (long long)succ, (long long)same_epoch, (long long)same_seed);
    check("shuffled: at most 20 of 100000 sequences in place", fixed <= 20);
    check("shuffled: at most 20 of 100000 neighbours still neighbours", succ <= 20);
    check("the next epoch reads another order (at most 20 positions agree)", same_epoch <= 20);
    check("another seed reads another order (at most 20 positions agree)", same_seed <= 20);
    free(seen);
    free(order);
    printf("%d passed, %d failed\n", pass, fail);
    return fail != 0;
}
