/*
 * test_arena.c — fsdrt_place_arena against what it promises: tensors whose
 * live ranges overlap never share bytes, offsets are aligned, the result is
 * deterministic, and known small cases come out as greedy-by-size first fit
 * places them. Prints run.sh-style lines and "N passed, N failed".
 */
#include "fsdrt.h"

#include <stdio.h>
#include <string.h>

static int pass, fail;

static void check(bool ok, const char *what)
{
    if (ok)
        pass++, printf("ok   arena: %s\n", what);
    else
        fail++, printf("FAIL arena: %s\n", what);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(void)
{
    /* logits and dlogits overlap at op 2; x overlaps both; dx only dlogits */
    {
        int64_t bytes[4] = {1024, 8192, 8192, 1024}, off[4];
        int first[4] = {0, 1, 2, 4}, last[4] = {3, 2, 4, 5};
        int64_t size = fsdrt_place_arena(4, bytes, first, last, 256, off);
        check(size == 17408 && off[1] == 0 && off[2] == 8192 && off[0] == 16384 && off[3] == 0,
              "known case: largest first, ties by first use, reuse by dx");
    }
    {
        int64_t bytes[3] = {100, 100, 100}, off[3];
        int first[3] = {0, 1, 2}, last[3] = {0, 1, 2};
        int64_t size = fsdrt_place_arena(3, bytes, first, last, 256, off);
        check(size == 256 && off[0] == 0 && off[1] == 0 && off[2] == 0,
              "disjoint lives share offset 0; sizes rounded up to the alignment");
    }
    {
        int64_t bytes[2] = {0, 64}, off[2];
        int first[2] = {0, 0}, last[2] = {9, 9};
        int64_t size = fsdrt_place_arena(2, bytes, first, last, 64, off);
        check(size == 64 && off[1] == 0, "an empty tensor takes no room");
    }
    check(fsdrt_place_arena(0, NULL, NULL, NULL, 256, NULL) == 0, "no tensors, no arena");

    /* random cases: the invariants, and a second run gives the same offsets */
    bool ok = true, same = true, tight = true;
    for (int trial = 0; trial < 300; trial++) {
        enum { MAXN = 40 };
        int n = 1 + (int)(next() % MAXN);
        int64_t bytes[MAXN], off[MAXN], off2[MAXN], lower = 0;
        int first[MAXN], last[MAXN];
        for (int i = 0; i < n; i++) {
            bytes[i] = (int64_t)(next() % 5000);
            first[i] = (int)(next() % 30);
            last[i] = first[i] + (int)(next() % 10);
        }
        int64_t size = fsdrt_place_arena(n, bytes, first, last, 256, off);
        int64_t size2 = fsdrt_place_arena(n, bytes, first, last, 256, off2);
        same = same && size == size2 && memcmp(off, off2, sizeof(int64_t) * (size_t)n) == 0;
        for (int i = 0; i < n; i++) {
            int64_t bi = (bytes[i] + 255) / 256 * 256;
            ok = ok && off[i] % 256 == 0 && off[i] >= 0 && off[i] + bi <= size;
            for (int j = i + 1; j < n; j++) {
                int64_t bj = (bytes[j] + 255) / 256 * 256;
                bool live = !(last[i] < first[j] || last[j] < first[i]);
                bool mem = off[i] < off[j] + bj && off[j] < off[i] + bi;
                ok = ok && !(live && mem && bi && bj);
            }
        }
        /* never below the most bytes live at one op */
        for (int op = 0; op < 40; op++) {
            int64_t at = 0;
            for (int i = 0; i < n; i++)
                if (first[i] <= op && op <= last[i])
                    at += (bytes[i] + 255) / 256 * 256;
            lower = at > lower ? at : lower;
        }
        tight = tight && size >= lower;
    }
    check(ok, "300 random cases: live-overlapping tensors never overlap in memory, aligned");
    check(same, "placement is deterministic");
    check(tight, "arena is at least the peak of live bytes");
    printf("%d passed, %d failed\n", pass, fail);
    return fail != 0;
}
