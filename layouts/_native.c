/* Masked reductions of stored values in one pass: the native kernels of layouts/_native.py.
 *
 * Every kernel reads a values array `v` (float or double), its mask `m` (bytes, 0 or 1)
 * and, for grouped reductions, an index, and reduces `where(m, v, identity)` per group:
 *
 *   all      one group of every element                   (a full reduction)
 *   lines    group i is elements offsets[lines[i]] .. offsets[lines[i] + 1] - 1
 *            (CSR rows; COO rows of a row-major coalesced index)
 *   scatter  element j belongs to group index[j]            (columns of a matrix)
 *
 * with op sum, max or min. Sums accumulate in double for both value types (as exact as
 * torch's pairwise float sums or better) and write doubles; max and min write the value
 * type and propagate a specified NaN, as torch.amax does. The mask is applied by bit
 * logic, not a branch: `keep = -m` is all ones or all zeros, and `(bits & keep) |
 * (identity & ~keep)` is the value or the identity (a branch on a random mask mispredicts
 * once in a few elements).
 *
 * Every index read from memory is checked before it is used; a kernel returns -1 at the
 * first one out of range (and the caller raises), never reads or writes out of bounds.
 * Nothing is allocated here; the caller owns every array. Compiled for the machine it runs
 * on (-march=native: the vector width of the CPU; _native.py keys the build by CPU).
 */
#include <stdint.h>
#include <math.h>
#include <string.h>

#define LONG_LINE 64 /* lines at least this long are summed with vector lanes */

static inline double keep_f64(double x, uint8_t k, uint64_t other) {
    uint64_t b, keep = -(uint64_t)(k != 0);
    memcpy(&b, &x, sizeof b);
    b = (b & keep) | (other & ~keep);
    memcpy(&x, &b, sizeof x);
    return x;
}

static inline float keep_f32(float x, uint8_t k, uint32_t other) {
    uint32_t b, keep = -(uint32_t)(k != 0);
    memcpy(&b, &x, sizeof b);
    b = (b & keep) | (other & ~keep);
    memcpy(&x, &b, sizeof x);
    return x;
}

static inline uint64_t bits_f64(double x) { uint64_t b; memcpy(&b, &x, sizeof b); return b; }
static inline uint32_t bits_f32(float x) { uint32_t b; memcpy(&b, &x, sizeof b); return b; }

/* The sum of where(m, v, 0) over [a, b), in double. */
#define SUM_RANGE(T)                                                                     \
    static inline double sum_range_##T(const T *v, const uint8_t *m, int64_t a,          \
                                       int64_t b) {                                      \
        double s = 0;                                                                    \
        if (b - a < LONG_LINE) {                                                         \
            for (int64_t j = a; j < b; j++) s += (double)keep_##T(v[j], m[j], 0);         \
            return s;                                                                    \
        }                                                                                \
        _Pragma("omp simd reduction(+:s)")                                              \
        for (int64_t j = a; j < b; j++) s += (double)keep_##T(v[j], m[j], 0);            \
        return s;                                                                        \
    }

typedef double f64;
typedef float f32;
SUM_RANGE(f64)
SUM_RANGE(f32)

/* The max (GT is >) or min (GT is <) of where(m, v, identity) over [a, b); NaN if a
 * specified element is NaN. */
#define EXTREME_RANGE(T, NAME, GT)                                                       \
    static inline T NAME##_range_##T(const T *v, const uint8_t *m, int64_t a, int64_t b, \
                                     T identity) {                                       \
        T s = identity;                                                                  \
        int nan = 0;                                                                     \
        const __typeof__(bits_##T(identity)) other = bits_##T(identity);                \
        for (int64_t j = a; j < b; j++) {                                                \
            T x = keep_##T(v[j], m[j], other);                                           \
            nan |= x != x;                                                               \
            s = x GT s ? x : s;                                                          \
        }                                                                                \
        return nan ? (T)NAN : s;                                                         \
    }

EXTREME_RANGE(f64, max, >)
EXTREME_RANGE(f64, min, <)
EXTREME_RANGE(f32, max, >)
EXTREME_RANGE(f32, min, <)

/* -- sums ------------------------------------------------------------------------------ */
#define SUM_KERNELS(T)                                                                   \
    int ms_all_sum_##T(const T *v, const uint8_t *m, int64_t n, double *out) {    \
        double s = 0;                                                                    \
        for (int64_t a = 0; a < n; a += 4096) /* blocks: partial sums stay small */      \
            s += sum_range_##T(v, m, a, a + 4096 < n ? a + 4096 : n);                    \
        *out = s;                                                                        \
        return 0;                                                                        \
    }                                                                                    \
    int ms_lines_sum_##T(const T *v, const uint8_t *m, int64_t n,                 \
                                const int64_t *offsets, int64_t nlines_all,              \
                                const int64_t *lines, int64_t nlines, double *out) {     \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            uint64_t r = (uint64_t)lines[i];                                             \
            if (r >= (uint64_t)nlines_all) return -1;                                    \
            int64_t a = offsets[r], b = offsets[r + 1];                                  \
            if (a < 0 || a > b || b > n) return -1;                                      \
            out[i] = sum_range_##T(v, m, a, b);                                          \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    int ms_scatter_sum_##T(const T *v, const uint8_t *m, int64_t n,               \
                                  const int64_t *index, double *out, int64_t nout) {     \
        memset(out, 0, (size_t)nout * sizeof *out);                                      \
        for (int64_t j = 0; j < n; j++) {                                                \
            uint64_t g = (uint64_t)index[j];                                             \
            if (g >= (uint64_t)nout) return -1;                                          \
            out[g] += (double)keep_##T(v[j], m[j], 0);                                   \
        }                                                                                \
        return 0;                                                                        \
    }

SUM_KERNELS(f64)
SUM_KERNELS(f32)

/* -- max and min ----------------------------------------------------------------------- */
#define EXTREME_KERNELS(T, NAME, GT)                                                     \
    int ms_all_##NAME##_##T(const T *v, const uint8_t *m, int64_t n, T identity,  \
                                   T *out) {                                             \
        *out = NAME##_range_##T(v, m, 0, n, identity);                                   \
        return 0;                                                                        \
    }                                                                                    \
    int ms_lines_##NAME##_##T(const T *v, const uint8_t *m, int64_t n,            \
                                     const int64_t *offsets, int64_t nlines_all,         \
                                     const int64_t *lines, int64_t nlines, T identity,   \
                                     T *out) {                                           \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            uint64_t r = (uint64_t)lines[i];                                             \
            if (r >= (uint64_t)nlines_all) return -1;                                    \
            int64_t a = offsets[r], b = offsets[r + 1];                                  \
            if (a < 0 || a > b || b > n) return -1;                                      \
            out[i] = NAME##_range_##T(v, m, a, b, identity);                             \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    int ms_scatter_##NAME##_##T(const T *v, const uint8_t *m, int64_t n,          \
                                       const int64_t *index, T identity, T *out,         \
                                       int64_t nout) {                                   \
        const __typeof__(bits_##T(identity)) other = bits_##T(identity);                \
        for (int64_t g = 0; g < nout; g++) out[g] = identity;                            \
        for (int64_t j = 0; j < n; j++) {                                                \
            uint64_t g = (uint64_t)index[j];                                             \
            if (g >= (uint64_t)nout) return -1;                                          \
            T x = keep_##T(v[j], m[j], other), o = out[g];                               \
            out[g] = (x GT o || x != x) ? x : o; /* a NaN, once in, stays */             \
        }                                                                                \
        return 0;                                                                        \
    }

EXTREME_KERNELS(f64, max, >)
EXTREME_KERNELS(f64, min, <)
EXTREME_KERNELS(f32, max, >)
EXTREME_KERNELS(f32, min, <)

/* -- counts of the mask ---------------------------------------------------------------- */
static inline int64_t count_range(const uint8_t *m, int64_t a, int64_t b) {
    int64_t c = 0;
    for (int64_t j = a; j < b; j++) c += m[j] != 0;
    return c;
}

int ms_all_count(const uint8_t *m, int64_t n, int64_t *out) {
    *out = count_range(m, 0, n);
    return 0;
}

int ms_lines_count(const uint8_t *m, int64_t n, const int64_t *offsets,
                          int64_t nlines_all, const int64_t *lines, int64_t nlines,
                          int64_t *out) {
    for (int64_t i = 0; i < nlines; i++) {
        uint64_t r = (uint64_t)lines[i];
        if (r >= (uint64_t)nlines_all) return -1;
        int64_t a = offsets[r], b = offsets[r + 1];
        if (a < 0 || a > b || b > n) return -1;
        out[i] = count_range(m, a, b);
    }
    return 0;
}

int ms_scatter_count(const uint8_t *m, int64_t n, const int64_t *index, int64_t *out,
                            int64_t nout) {
    memset(out, 0, (size_t)nout * sizeof *out);
    for (int64_t j = 0; j < n; j++) {
        uint64_t g = (uint64_t)index[j];
        if (g >= (uint64_t)nout) return -1;
        out[g] += m[j] != 0;
    }
    return 0;
}
