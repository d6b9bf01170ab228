/*
 * cogexport's compiled K-type quantizer: float32 super-blocks of 256 values in, Q4_K / Q5_K / Q6_K block bytes out,
 * byte for byte what llama.cpp's reference quantizers (quantize_row_q*_K_ref, no importance matrix) store; and Q8_0,
 * the one 32-value type whose torch code is bound by memory (several passes over every value where this makes one).
 *
 * Written from cogexport/quantize/kquants.py (the torch version, which stays as the fallback) and the algorithm
 * described there. The reference chooses between candidate scales by comparing float32 sums accumulated one value
 * at a time, so every sum here is accumulated in the same order and every expression keeps the same order of
 * operations. Build with -ffp-contract=off (a fused multiply-add rounds once where the reference rounds twice) and
 * without -ffast-math; the library is called through ctypes, which releases Python's lock during the call, so
 * threads quantizing different rows run at once.
 *
 * Speed comes from doing what the reference does one group at a time for all the groups of a super-block at once:
 * the values are transposed so that value i of every group sits side by side, and each step of a sum is then one
 * loop over the groups, which the compiler turns into vector instructions while each group's own sum still adds
 * its values one at a time, in order. Choices between candidates are made per group without branches.
 */

#include <stdint.h>
#include <string.h>
#include <math.h>

#define SUPER_BLOCK 256
#define HALF_LIMIT 65504.0f          /* float16's largest finite value: the scales are stored as float16 */
#define ZERO_GROUP_LIMIT 1e-15f      /* a group whose largest magnitude is below this counts as all zero */

/* Q4_K / Q5_K: 8 groups of 32 values; Q6_K: 16 groups of 16 values. */
#define K_GROUPS 8
#define K_VALUES 32
#define X_GROUPS 16
#define X_VALUES 16

/* Round to nearest, ties to even, through the float32 mantissa: adding 1.5 * 2^23 leaves the integer in the low
 * mantissa bits. Past |v| = 2^22 the result is whatever those bits say; the reference uses the same trick with its
 * check compiled out, so using it everywhere (never rint) is what keeps such inputs identical too. */
static inline int32_t mantissa_round(float value)
{
    float shifted = value + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    return (bits & 0x007fffff) - 0x00400000;
}

static inline int32_t clamped(int32_t value, int32_t low, int32_t high)
{
    return value < low ? low : (value > high ? high : value);
}

/* float32 -> float16 bits, round to nearest even, as the reference's conversion (the inputs here are finite). */
static uint16_t half_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x477ff000u)           /* 65520 and up round past the largest finite half */
        return sign | 0x7c00u;
    if (magnitude >= 0x38800000u) {         /* a normal half: rebias the exponent, round off 13 mantissa bits */
        uint32_t half = (magnitude - 0x38000000u) >> 13, rest = magnitude & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
            half++;                         /* a carry into the exponent is the right next value */
        return sign | (uint16_t)half;
    }
    if (magnitude < 0x33000000u)            /* at most half the smallest subnormal: rounds (ties to even) to 0 */
        return sign;
    uint32_t exponent = magnitude >> 23, mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent;       /* in units of 2^-24, the smallest subnormal half */
    uint32_t half = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), tie = 1u << (shift - 1u);
    if (rest > tie || (rest == tie && (half & 1u)))
        half++;
    return sign | (uint16_t)half;
}

static float half_value(uint16_t half)
{
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16, exponent = (half >> 10) & 0x1fu, mantissa = half & 0x3ffu;
    float value;
    if (exponent == 0) {                    /* subnormal: an exact product in float32 */
        value = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -value : value;
    }
    uint32_t bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Whether every value is finite and within float16's range: what the Python caller checks before quantizing (on a
 * failure it runs its own checks, which name the tensor and count the values). NaN fails both comparisons. */
static int plainly_fits(const float *values, int64_t count)
{
    int fits = 1;
    for (int64_t i = 0; i < count; i++)
        fits &= (values[i] >= -HALF_LIMIT) & (values[i] <= HALF_LIMIT);
    return fits;
}

static void store_half(uint8_t *out, uint16_t half)
{
    out[0] = (uint8_t)(half & 0xff);        /* GGUF is little-endian whatever the machine */
    out[1] = (uint8_t)(half >> 8);
}

/* ------------------------------------------------------------------------------------------------------------
 * Q4_K and Q5_K: per 32-value group a weighted search for a scale and a min (make_qkx2_quants), then 6-bit scales
 * and mins per super-block, then every value quantized again with the stored ones. */

/* What a group's search keeps: its scale and min (the min subtracted, >= 0), and the inverse scale and offset its
 * chosen levels were made with (needed only where the stored scale turns out to be 0). */
typedef struct {
    float scale[K_GROUPS], min[K_GROUPS], iscale[K_GROUPS], offset[K_GROUPS];
} GroupFit;

typedef struct {
    int nmax;
    float rmin, rdelta;
    int nstep;
} SearchSettings;

/* The weighted squared error of levels made with (iscale, offset), fitted back as scale * level + low. */
static void weighted_errors(const float x[K_VALUES][K_GROUPS], const float w[K_VALUES][K_GROUPS],
                            const float level[K_VALUES][K_GROUPS], const float scale[K_GROUPS],
                            const float low[K_GROUPS], float error[K_GROUPS])
{
    for (int g = 0; g < K_GROUPS; g++)
        error[g] = 0.0f;
    for (int i = 0; i < K_VALUES; i++)
        for (int g = 0; g < K_GROUPS; g++) {
            float diff = scale[g] * level[i][g] + low[g] - x[i][g];
            error[g] += w[i][g] * (diff * diff);
        }
}

static void levels_for(const float x[K_VALUES][K_GROUPS], const float iscale[K_GROUPS], const float low[K_GROUPS],
                       int nmax, float level[K_VALUES][K_GROUPS])
{
    for (int i = 0; i < K_VALUES; i++)
        for (int g = 0; g < K_GROUPS; g++)
            level[i][g] = (float)clamped(mantissa_round(iscale[g] * (x[i][g] - low[g])), 0, nmax);
}

/* One candidate inverse scale per group (numerator / span), its least-squares fit, and the running choice updated
 * where the fit exists and its error is lower. ``low`` is the choice's min, which later candidates start from. */
static void try_candidate(const float x[K_VALUES][K_GROUPS], const float w[K_VALUES][K_GROUPS], float numerator,
                          const float high[K_GROUPS], const float sum_w[K_GROUPS], const float sum_x[K_GROUPS],
                          const int flat[K_GROUPS], int nmax, float best_error[K_GROUPS], GroupFit *fit)
{
    float iscale[K_GROUPS], level[K_VALUES][K_GROUPS];
    float sum_l[K_GROUPS] = {0}, sum_l2[K_GROUPS] = {0}, sum_xl[K_GROUPS] = {0};
    for (int g = 0; g < K_GROUPS; g++)
        iscale[g] = numerator / (high[g] - fit->min[g]);
    levels_for(x, iscale, fit->min, nmax, level);
    for (int i = 0; i < K_VALUES; i++)
        for (int g = 0; g < K_GROUPS; g++) {
            float wl = w[i][g] * level[i][g];
            sum_l[g] += wl;
            sum_l2[g] += wl * level[i][g];
            sum_xl[g] += wl * x[i][g];
        }
    float scale[K_GROUPS], low[K_GROUPS], det[K_GROUPS], error[K_GROUPS];
    for (int g = 0; g < K_GROUPS; g++) {
        det[g] = sum_w[g] * sum_l2[g] - sum_l[g] * sum_l[g];
        float fitted_scale = (sum_w[g] * sum_xl[g] - sum_x[g] * sum_l[g]) / det[g];
        float fitted_low = (sum_l2[g] * sum_x[g] - sum_l[g] * sum_xl[g]) / det[g];
        int positive = fitted_low > 0.0f;   /* a positive min is not allowed: the scale is refitted through 0 */
        scale[g] = positive ? sum_xl[g] / sum_l2[g] : fitted_scale;
        low[g] = positive ? 0.0f : fitted_low;
    }
    weighted_errors(x, w, level, scale, low, error);
    for (int g = 0; g < K_GROUPS; g++) {
        int better = !flat[g] & (det[g] > 0.0f) & (error[g] < best_error[g]);
        best_error[g] = better ? error[g] : best_error[g];
        fit->iscale[g] = better ? iscale[g] : fit->iscale[g];
        fit->offset[g] = better ? fit->min[g] : fit->offset[g];
        fit->scale[g] = better ? scale[g] : fit->scale[g];
        fit->min[g] = better ? low[g] : fit->min[g];
    }
}

/* The search for all 8 groups of a super-block; ``fit->min`` comes back as the min to subtract (>= 0). A group
 * whose max equals its (clipped) min has scale 0 and levels 0; it searches a harmless span of 1 meanwhile. */
static void search_scales_mins(const float x[K_VALUES][K_GROUPS], const float w[K_VALUES][K_GROUPS],
                               const SearchSettings *settings, GroupFit *fit)
{
    float high[K_GROUPS], sum_w[K_GROUPS], sum_x[K_GROUPS], best_error[K_GROUPS], level[K_VALUES][K_GROUPS];
    int flat[K_GROUPS];
    for (int g = 0; g < K_GROUPS; g++) {
        float low = x[0][g], top = x[0][g];
        sum_w[g] = w[0][g];
        sum_x[g] = sum_w[g] * x[0][g];
        for (int i = 1; i < K_VALUES; i++) {
            low = x[i][g] < low ? x[i][g] : low;
            top = x[i][g] > top ? x[i][g] : top;
            sum_w[g] += w[i][g];
            sum_x[g] += w[i][g] * x[i][g];
        }
        fit->min[g] = low > 0.0f ? 0.0f : low;
        flat[g] = top == fit->min[g];
        high[g] = flat[g] ? fit->min[g] + 1.0f : top;
        fit->iscale[g] = (float)settings->nmax / (high[g] - fit->min[g]);
        fit->scale[g] = 1.0f / fit->iscale[g];
        fit->offset[g] = fit->min[g];
    }
    levels_for(x, fit->iscale, fit->min, settings->nmax, level);
    weighted_errors(x, w, level, fit->scale, fit->min, best_error);
    for (int step = 0; step <= settings->nstep; step++) {
        float numerator = settings->rmin + settings->rdelta * (float)step + (float)settings->nmax;
        try_candidate(x, w, numerator, high, sum_w, sum_x, flat, settings->nmax, best_error, fit);
    }
    for (int g = 0; g < K_GROUPS; g++) {
        fit->scale[g] = flat[g] ? 0.0f : fit->scale[g];
        fit->min[g] = -fit->min[g];
    }
}

/* The largest of the values if any is > 0, else 0 (the reference's running max starting from 0). */
static float positive_peak(const float *values, int count)
{
    float peak = 0.0f;
    for (int i = 0; i < count; i++)
        peak = values[i] > peak ? values[i] : peak;
    return peak;
}

/* Eight 6-bit scales and mins in 12 bytes: groups 0-3 whole in bytes 0-7 (scales, then mins), groups 4-7 as a low
 * nibble each in bytes 8-11 and their top two bits in the spare bits 6-7 of bytes 0-7. */
static void pack_scales_mins(const uint8_t ls[K_GROUPS], const uint8_t lm[K_GROUPS], uint8_t packed[12])
{
    for (int g = 0; g < 4; g++) {
        packed[g] = (uint8_t)(ls[g] | ((ls[g + 4] >> 4) << 6));
        packed[g + 4] = (uint8_t)(lm[g] | ((lm[g + 4] >> 4) << 6));
        packed[g + 8] = (uint8_t)((ls[g + 4] & 0xf) | ((lm[g + 4] & 0xf) << 4));
    }
}

/* The super-block's float16 d and dmin, its 12 bytes of packed 6-bit scales and mins, and the levels (0..nmax) of
 * its 256 values in their own order. */
static void qkx_levels(const float *block, const SearchSettings *settings, uint8_t header[16],
                       uint8_t levels[SUPER_BLOCK])
{
    float x[K_VALUES][K_GROUPS], w[K_VALUES][K_GROUPS];
    for (int g = 0; g < K_GROUPS; g++) {
        float sum_squares = 0.0f;
        for (int i = 0; i < K_VALUES; i++) {
            x[i][g] = block[K_VALUES * g + i];
            sum_squares += x[i][g] * x[i][g];
        }
        float average = sqrtf(sum_squares / 32.0f);
        for (int i = 0; i < K_VALUES; i++)
            w[i][g] = average + fabsf(x[i][g]);
    }
    GroupFit fit;
    search_scales_mins(x, w, settings, &fit);
    float max_scale = positive_peak(fit.scale, K_GROUPS), max_min = positive_peak(fit.min, K_GROUPS);
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    uint8_t ls[K_GROUPS], lm[K_GROUPS];
    for (int g = 0; g < K_GROUPS; g++) {
        uint8_t scale_byte = (uint8_t)mantissa_round(inv_scale * fit.scale[g]);  /* wraps as C's conversion does */
        uint8_t min_byte = (uint8_t)mantissa_round(inv_min * fit.min[g]);
        ls[g] = scale_byte < 63 ? scale_byte : 63;
        lm[g] = min_byte < 63 ? min_byte : 63;
    }
    uint16_t d16 = half_bits(max_scale / 63.0f), dmin16 = half_bits(max_min / 63.0f);
    store_half(header, d16);
    store_half(header + 2, dmin16);
    pack_scales_mins(ls, lm, header + 4);
    float d_unit = half_value(d16), dmin_unit = half_value(dmin16);
    for (int g = 0; g < K_GROUPS; g++) {
        float d = d_unit * (float)ls[g], dm = dmin_unit * (float)lm[g];
        for (int i = 0; i < K_VALUES; i++) {
            /* a stored scale of 0 keeps the search's own levels */
            int32_t level = d != 0.0f ? mantissa_round((x[i][g] + dm) / d)
                                      : mantissa_round(fit.iscale[g] * (x[i][g] - fit.offset[g]));
            levels[K_VALUES * g + i] = (uint8_t)clamped(level, 0, settings->nmax);
        }
    }
}

static void q4_k_block(const float *block, uint8_t *out)
{
    static const SearchSettings settings = {15, -1.0f, 0.1f, 20};
    uint8_t levels[SUPER_BLOCK];
    qkx_levels(block, &settings, out, levels);
    uint8_t *qs = out + 16;                 /* each 64 values: the first 32 in low nibbles, the next 32 in high */
    for (int chunk = 0; chunk < SUPER_BLOCK; chunk += 64)
        for (int l = 0; l < 32; l++)
            *qs++ = (uint8_t)(levels[chunk + l] | (levels[chunk + l + 32] << 4));
}

static void q5_k_block(const float *block, uint8_t *out)
{
    static const SearchSettings settings = {31, -0.5f, 0.1f, 15};
    uint8_t levels[SUPER_BLOCK];
    qkx_levels(block, &settings, out, levels);
    uint8_t *qh = out + 16, *qs = out + 48;
    memset(qh, 0, 32);
    for (int chunk = 0, bit = 0; chunk < SUPER_BLOCK; chunk += 64, bit += 2)
        for (int l = 0; l < 32; l++) {
            uint8_t first = levels[chunk + l], second = levels[chunk + l + 32];
            qh[l] |= (uint8_t)(((first >> 4) << bit) | ((second >> 4) << (bit + 1)));
            *qs++ = (uint8_t)((first & 0xf) | ((second & 0xf) << 4));
        }
}

/* ------------------------------------------------------------------------------------------------------------
 * Q6_K: per 16-value group the search over 19 inverse scales with weights x^2 (make_qx_quants, rmse_type 1), then
 * 8-bit scales per super-block and every value quantized again with the stored ones. */

/* The candidate numerators in the order tried: -nmax, then -(nmax + 0.1 * step) for step -9..-1 and 1..9. */
static float qx_numerator(int candidate, int nmax)
{
    if (candidate == 0)
        return (float)-nmax;
    int step = candidate <= 9 ? candidate - 10 : candidate - 9;
    return -((float)nmax + 0.1f * (float)step);
}

/* The first value of largest magnitude of each group (its sign kept), over x[value][group]. */
static void signed_peaks(const float x[X_VALUES][X_GROUPS], float peak[X_GROUPS])
{
    float largest[X_GROUPS] = {0};
    for (int g = 0; g < X_GROUPS; g++)
        peak[g] = 0.0f;
    for (int i = 0; i < X_VALUES; i++)
        for (int g = 0; g < X_GROUPS; g++) {
            float magnitude = fabsf(x[i][g]);
            int larger = magnitude > largest[g];
            largest[g] = larger ? magnitude : largest[g];
            peak[g] = larger ? x[i][g] : peak[g];
        }
}

/* Each group's scale, the inverse scale its kept candidate's levels come from, and whether it is all zero (scale 0,
 * and its levels, should they be kept, 0: signed -nmax). */
static void qx_search(const float x[X_VALUES][X_GROUPS], int nmax, float scale[X_GROUPS], float kept[X_GROUPS],
                      int zero[X_GROUPS])
{
    float peak[X_GROUPS], wx[X_VALUES][X_GROUPS], w[X_VALUES][X_GROUPS], best[X_GROUPS];
    signed_peaks(x, peak);
    for (int i = 0; i < X_VALUES; i++)
        for (int g = 0; g < X_GROUPS; g++) {
            w[i][g] = x[i][g] * x[i][g];
            wx[i][g] = w[i][g] * x[i][g];
        }
    for (int candidate = 0; candidate < 19; candidate++) {
        float numerator = qx_numerator(candidate, nmax), iscale[X_GROUPS];
        float sum_lx[X_GROUPS] = {0}, sum_l2[X_GROUPS] = {0};
        for (int g = 0; g < X_GROUPS; g++)
            iscale[g] = numerator / peak[g];
        for (int i = 0; i < X_VALUES; i++)
            for (int g = 0; g < X_GROUPS; g++) {
                float level = (float)clamped(mantissa_round(iscale[g] * x[i][g]), -nmax, nmax - 1);
                sum_lx[g] += wx[i][g] * level;
                sum_l2[g] += (w[i][g] * level) * level;
            }
        for (int g = 0; g < X_GROUPS; g++) {
            float offered = sum_lx[g] / sum_l2[g];
            if (candidate == 0) {           /* the first is kept whatever it is (scale 0 if sum_l2 is 0) */
                scale[g] = sum_l2[g] != 0.0f ? offered : 0.0f;
                best[g] = scale[g] * sum_lx[g];
                kept[g] = iscale[g];
                continue;
            }
            int better = (sum_l2[g] > 0.0f) & (sum_lx[g] * sum_lx[g] > best[g] * sum_l2[g]);
            scale[g] = better ? offered : scale[g];
            best[g] = better ? offered * sum_lx[g] : best[g];
            kept[g] = better ? iscale[g] : kept[g];
        }
    }
    for (int g = 0; g < X_GROUPS; g++) {
        zero[g] = fabsf(peak[g]) < ZERO_GROUP_LIMIT;
        scale[g] = zero[g] ? 0.0f : scale[g];
    }
}

/* Value 128 h + 32 q + l: its low nibble to ql[64 h + 32 (q % 2) + l] (the high nibble for q >= 2), its top two
 * bits to bits 2q, 2q + 1 of qh[32 h + l]; ql is the block's first 128 bytes, qh the next 64. */
static void pack_q6_levels(const uint8_t levels[SUPER_BLOCK], uint8_t *out)
{
    uint8_t *ql = out, *qh = out + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = levels + 128 * h + l;
            ql[64 * h + l] = (uint8_t)((v[0] & 0xf) | ((v[64] & 0xf) << 4));
            ql[64 * h + 32 + l] = (uint8_t)((v[32] & 0xf) | ((v[96] & 0xf) << 4));
            qh[32 * h + l] = (uint8_t)((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
        }
}

static void q6_k_block(const float *block, uint8_t *out)
{
    float x[X_VALUES][X_GROUPS], scale[X_GROUPS], kept[X_GROUPS];
    int zero[X_GROUPS];
    for (int g = 0; g < X_GROUPS; g++)
        for (int i = 0; i < X_VALUES; i++)
            x[i][g] = block[X_VALUES * g + i];
    qx_search(x, 32, scale, kept, zero);
    float max_scale = 0.0f, max_magnitude = 0.0f;
    for (int g = 0; g < X_GROUPS; g++)
        if (fabsf(scale[g]) > max_magnitude) {
            max_magnitude = fabsf(scale[g]);
            max_scale = scale[g];
        }
    memset(out, 0, 210);
    if (max_magnitude < ZERO_GROUP_LIMIT)   /* an all-zero super-block stores zeros */
        return;
    float iscale = -128.0f / max_scale;
    uint16_t d16 = half_bits(1.0f / iscale);
    int8_t small[X_GROUPS];
    uint8_t levels[SUPER_BLOCK];
    float unit = half_value(d16);
    for (int g = 0; g < X_GROUPS; g++) {
        int32_t rounded = mantissa_round(iscale * scale[g]);
        small[g] = (int8_t)(rounded < 127 ? rounded : 127);
        float d = unit * (float)small[g];
        for (int i = 0; i < X_VALUES; i++) {
            /* a stored scale of 0 keeps the search's own levels */
            int32_t level = d != 0.0f ? mantissa_round(x[i][g] / d)
                          : zero[g] ? -32 : mantissa_round(kept[g] * x[i][g]);
            levels[X_VALUES * g + i] = (uint8_t)(clamped(level, -32, 31) + 32);
        }
    }
    pack_q6_levels(levels, out);
    memcpy(out + 192, small, X_GROUPS);
    store_half(out + 208, d16);
}

/* ------------------------------------------------------------------------------------------------------------
 * Q8_0: 32 values a block, stored as the float16 of d = (largest magnitude) / 127 and each value times 1/d rounded
 * to the nearest integer, halves away from zero (C's roundf), as an int8. */

#define Q8_VALUES 32
/* The float32 just below one half: for |v| < 256, v + copysign(it, v) truncated toward zero is roundf(v) (adding 0.5
 * itself would carry 0.49999997 up to 1); the scaled values lie within 127. Checked for every such float32 in
 * cogexport/quantize/legacy.py's torch version, which uses the same constant. */
#define BELOW_HALF 0.49999997f

static void q8_0_block(const float *block, uint8_t *out)
{
    float amax = 0.0f;
    for (int i = 0; i < Q8_VALUES; i++) {
        const float magnitude = fabsf(block[i]);
        amax = magnitude > amax ? magnitude : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;   /* a true division, as the reference's 1.0f/d */
    store_half(out, half_bits(d));
    for (int i = 0; i < Q8_VALUES; i++) {
        const float scaled = block[i] * id;
        out[2 + i] = (uint8_t)(int8_t)(int32_t)(scaled + copysignf(BELOW_HALF, scaled));
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * The entry points: ``blocks`` super-blocks of ``values`` (256 float32 each) into ``out`` (144 / 176 / 210 bytes a
 * block). Each returns 0, or 1 without quantizing when a value is not finite or beyond float16's range (the caller's
 * own checks then say which and where). */

typedef void (*BlockQuantizer)(const float *, uint8_t *);

static int quantize_blocks(BlockQuantizer quantize_block, int64_t block_values, int64_t block_bytes,
                           const float *values, uint8_t *out, int64_t blocks)
{
    if (!plainly_fits(values, blocks * block_values))
        return 1;
    for (int64_t b = 0; b < blocks; b++)
        quantize_block(values + b * block_values, out + b * block_bytes);
    return 0;
}

/* The float16 conversion alone, for the tests to hold it to another (every tie and range edge is hard to reach
 * through the searches). */
void cogexport_half_bits(const float *values, uint16_t *out, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        out[i] = half_bits(values[i]);
}

int cogexport_quantize_q4_k(const float *values, uint8_t *out, int64_t blocks)
{
    return quantize_blocks(q4_k_block, SUPER_BLOCK, 144, values, out, blocks);
}

int cogexport_quantize_q5_k(const float *values, uint8_t *out, int64_t blocks)
{
    return quantize_blocks(q5_k_block, SUPER_BLOCK, 176, values, out, blocks);
}

int cogexport_quantize_q6_k(const float *values, uint8_t *out, int64_t blocks)
{
    return quantize_blocks(q6_k_block, SUPER_BLOCK, 210, values, out, blocks);
}

int cogexport_quantize_q8_0(const float *values, uint8_t *out, int64_t blocks)
{
    return quantize_blocks(q8_0_block, Q8_VALUES, 34, values, out, blocks);
}
