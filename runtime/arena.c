/*
 * arena.c — where each activation lives in the one arena buffer.
 *
 * The runtime places the arena at start-up, once the micro-batch size is
 * known; the compiler's memory planner places the same tensors to predict
 * the arena's size. Both must get the same answer, so both link this file:
 * it is pure (arrays in, offsets out) and depends on nothing but libc.
 *
 * Greedy by size, first fit (TensorFlow Lite's arena planner; Pisarchyk and
 * Lee, "Efficient Memory Management for Deep Neural Net Inference", 2020):
 * the largest tensors are placed first, each at the lowest offset where it
 * overlaps no already placed tensor whose live range overlaps its own.
 * Ties go to the tensor live first, then to the lower index, so the result
 * is the same on every platform (qsort is not stable).
 */
#include "fsdrt.h"

#include <stdlib.h>

typedef struct Item {
    int64_t size;
    int first, last, index;
} Item;

static int by_size_desc(const void *a, const void *b)
{
    const Item *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return x->index - y->index;
}

int64_t fsdrt_place_arena(int n, const int64_t *bytes, const int *first, const int *last,
                          int64_t align, int64_t *offset)
{
    if (n <= 0)
        return 0;
    if (align < 1)
        align = 1;
    Item *items = malloc(sizeof *items * (size_t)n);
    Item **placed = malloc(sizeof *placed * (size_t)n);   /* by offset, ascending */
    if (!items || !placed) {
        free(items);
        free(placed);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        /* every size a multiple of align keeps every offset one too */
        int64_t b = bytes[i] > 0 ? bytes[i] : 0;
        items[i] = (Item){(b + align - 1) / align * align, first[i], last[i], i};
    }
    qsort(items, (size_t)n, sizeof *items, by_size_desc);

    int nplaced = 0;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        Item *t = &items[i];
        int64_t off = 0;
        for (int k = 0; k < nplaced; k++) {
            const Item *p = placed[k];
            if (p->first > t->last || t->first > p->last)
                continue;                /* never live at the same time */
            int64_t p_off = offset[p->index];
            if (p_off >= off + t->size)
                break;                   /* t fits in the gap below p; the rest lie higher */
            if (p_off + p->size > off)
                off = p_off + p->size;
        }
        offset[t->index] = off;
        int j = nplaced++;
        while (j > 0 && offset[placed[j - 1]->index] > off) {
            placed[j] = placed[j - 1];
            j--;
        }
        placed[j] = t;
        if (off + t->size > total)
            total = off + t->size;
    }
    free(items);
    free(placed);
    return total;
}
