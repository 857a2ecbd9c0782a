/*
 * test_half.c — runtime/half.h's conversions at every place rounding can
 * go wrong: each 16-bit value, the midpoints between neighbours (ties go
 * to even) and one float either side of them, subnormals, overflow to
 * infinity, NaN. fp16 is checked against GCC's _Float16 (IEEE, nearest
 * even); bf16 against exact rounding by scaling to its 8-bit significand.
 * Prints run.sh-style lines and "N passed, N failed".
 */
#include "half.h"

#include <stdbool.h>
#include <stdio.h>

static int pass, fail;

static void check(bool ok, const char *what)
{
    if (ok)
        pass++, printf("ok   half: %s\n", what);
    else
        fail++, printf("FAIL half: %s\n", what);
}

static float bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static bool same(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* x rounded to bf16 exactly: 8 significant bits, ties to even (the default
 * rounding mode of nearbyint), float's exponent range. */
static float bf16_reference(float x)
{
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    int e = ilogbf(x) < -126 ? -126 : ilogbf(x);
    double q = nearbyint(ldexp((double)x, 7 - e));
    double r = ldexp(q, e - 7);
    return fabs(r) >= 0x1p128 ? copysignf(INFINITY, x) : (float)r;
}

/* every float near one 16-bit value: it, the midpoint to the next, and a
 * float either side of each */
static void near(float v, float next, float *out)
{
    float mid = (v + next) / 2;   /* exact: floats have more bits than either */
    out[0] = v, out[1] = nextafterf(v, INFINITY), out[2] = nextafterf(v, -INFINITY);
    out[3] = mid, out[4] = nextafterf(mid, INFINITY), out[5] = nextafterf(mid, -INFINITY);
}

int main(void)
{
    bool fp16_ok = true, bf16_ok = true, back_ok = true;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float v = float_from_fp16((uint16_t)h), w = (float)(_Float16)v;
        back_ok = back_ok && same(v, w);
        if (isnan(v) || isinf(v))
            continue;
        float next = float_from_fp16((uint16_t)(h + 1)), xs[6];
        if (isnan(next))
            continue;
        if (isinf(next))
            next = (h & 0x8000 ? -1 : 1) * 65536.0f;   /* where overflow starts */
        near(v, next, xs);
        for (int k = 0; k < 6; k++)
            fp16_ok = fp16_ok && same(float_from_fp16(fp16_from_float(xs[k])), (float)(_Float16)xs[k]);
    }
    for (uint32_t h = 0; h < 0x10000; h++) {
        float v = float_from_bf16((uint16_t)h);
        back_ok = back_ok && same(v, bits(h << 16));
        if (isnan(v) || isinf(v))
            continue;
        /* bf16 is float's top half, so the midpoint to the next value up
         * in magnitude is a float even next to infinity */
        float mid = bits(h << 16 | 0x8000), xs[6] = {v, nextafterf(v, INFINITY),
                                                      nextafterf(v, -INFINITY), mid,
                                                      nextafterf(mid, INFINITY),
                                                      nextafterf(mid, -INFINITY)};
        for (int k = 0; k < 6; k++)
            bf16_ok = bf16_ok && same(float_from_bf16(bf16_from_float(xs[k])), bf16_reference(xs[k]));
    }
    /* a sweep over all floats, 1 in 9973 */
    for (uint64_t u = 0; u < (1ull << 32); u += 9973) {
        float x = bits((uint32_t)u);
        fp16_ok = fp16_ok && same(float_from_fp16(fp16_from_float(x)), (float)(_Float16)x);
        bf16_ok = bf16_ok && same(float_from_bf16(bf16_from_float(x)), bf16_reference(x));
    }
    check(back_ok, "every fp16 and bf16 value widens exactly");
    check(fp16_ok, "float to fp16: nearest even at every midpoint, subnormals, overflow (vs _Float16)");
    check(bf16_ok, "float to bf16: nearest even at every midpoint, overflow, NaN kept");
    check(isnan(float_from_bf16(bf16_from_float(NAN))) && isnan(float_from_fp16(fp16_from_float(NAN))),
          "NaN stays NaN");
    printf("%d passed, %d failed\n", pass, fail);
    return fail != 0;
}
