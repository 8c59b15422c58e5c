/* Masked reductions of stored values in one pass: the native kernels of layouts/_native.py.
 *
 * Every kernel reads a values array `v` (float or double), its mask `m` (bytes, 0 or 1)
 * and, for grouped reductions, an index, and reduces `where(m, v, identity)` per group:
 *
 *   all      one group of every element                   (a full reduction)
 *   lines    group i is elements offsets[lines[i]] .. offsets[lines[i] + 1] - 1
 *            (lines NULL: every line, lines[i] = i)
 *            (CSR rows; COO rows of a row-major coalesced index)
 *   scatter  element j belongs to group index[j]            (columns of a matrix)
 *
 * with op sum, sumsq (the sum of squares), prod, max or min. Sums accumulate in double
 * (never less exact than torch's float sums); products in the value type, as torch's (an
 * intermediate overflow is inf in both); max and min propagate a specified NaN, as
 * torch.amax does. The mask is applied by bit logic, not a branch: `keep = -m` is all
 * ones or all zeros, and `(bits & keep) | (identity & ~keep)` is the value or the identity
 * (a branch on a random mask mispredicts once in a few elements).
 * Runs of elements are reduced in vector lanes (RANGE says how), never in one scalar
 * accumulator that would wait on its own latency at every element.
 *
 * Every index read from memory is checked before it is used; a kernel returns -1 at the
 * first one out of range (and the caller raises), never reads or writes out of bounds.
 * Nothing is allocated here; the caller owns every array. Compiled for the machine it runs
 * on (-march=native: the vector width of the CPU; _native.py keys the build by CPU).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LONG_RUN 256 /* runs at least this long are one simd loop */
#define LANES 16     /* shorter runs of at least CHUNKS_op elements: LANES accumulators */
#define CHUNKS_sum LANES
#define CHUNKS_sumsq LANES
#define CHUNKS_prod LANES
#define CHUNKS_max 64 /* a max's scalar step is cheap: lanes pay from longer runs */
#define CHUNKS_min 64

typedef double f64;
typedef float f32;
typedef uint64_t bits_f64;
typedef uint32_t bits_f32;

/* x where k, else the value whose bits are `other`. */
#define KEEP(T)                                                                          \
    static inline T keep_##T(T x, uint8_t k, bits_##T other) {                           \
        bits_##T b, keep = -(bits_##T)(k != 0);                                           \
        memcpy(&b, &x, sizeof b);                                                        \
        b = (b & keep) | (other & ~keep);                                                \
        memcpy(&x, &b, sizeof x);                                                        \
        return x;                                                                        \
    }                                                                                    \
    static inline bits_##T bits_of_##T(T x) {                                            \
        bits_##T b;                                                                      \
        memcpy(&b, &x, sizeof b);                                                        \
        return b;                                                                        \
    }
KEEP(f64)
KEEP(f32)

/* The ops: accumulator type, start (the identity: for max / min the caller's, the
 * dtype's lowest / highest value), one step, the OpenMP reduction that combines vector
 * lanes, and how two accumulators join. */
#define ACC_sum(T) double
#define ACC_sumsq(T) double
#define ACC_prod(T) T
#define ACC_max(T) T
#define ACC_min(T) T
#define START_sum(identity) 0.0
#define START_sumsq(identity) 0.0
#define START_prod(identity) 1.0
#define START_max(identity) (identity)
#define START_min(identity) (identity)
#define STEP_sum(a, x) ((a) += (double)(x))
#define STEP_sumsq(a, x) ((a) += (double)(x) * (double)(x))
#define STEP_prod(a, x) ((a) *= (x))
#define STEP_max(a, x) ((a) = (x) > (a) ? (x) : (a), nan |= (x) != (x))
#define STEP_min(a, x) ((a) = (x) < (a) ? (x) : (a), nan |= (x) != (x))
#define LANES_sum +
#define LANES_sumsq +
#define LANES_prod *
#define LANES_max max
#define LANES_min min
#define JOIN_sum(a, b) ((a) += (b))
#define JOIN_sumsq(a, b) ((a) += (b))
#define JOIN_prod(a, b) ((a) *= (b))
#define JOIN_max(a, b) ((a) = (b) > (a) ? (b) : (a))
#define JOIN_min(a, b) ((a) = (b) < (a) ? (b) : (a))
/* An element as the simd loop reads it: max / min select (a masked move in vector code,
 * 1.3-1.4x faster there than the bit logic); the others by bits. */
#define PICK_sum(T, x, k, other, start) keep_##T(x, k, other)
#define PICK_sumsq(T, x, k, other, start) keep_##T(x, k, other)
#define PICK_prod(T, x, k, other, start) keep_##T(x, k, other)
#define PICK_max(T, x, k, other, start) ((k) ? (x) : (T)(start))
#define PICK_min(T, x, k, other, start) ((k) ? (x) : (T)(start))
#define PRAGMA(x) _Pragma(#x)
#define SIMD(OP) PRAGMA(omp simd reduction(LANES_##OP : s) reduction(| : nan))

/* OP over where(m, v, identity)[a:b]; `other` is the bits an unspecified element reads.
 * A long run is one OpenMP simd loop; a run of a few dozen elements (a sparse row) would
 * spend more on that loop's setup than on its work, so it goes LANES at a time into
 * LANES accumulators, a loop of fixed length that the compiler turns into vector
 * instructions with no setup. Inlined always, so that a constant `other` (0 for sums)
 * folds into the bit logic. */
#define RANGE(T, OP)                                                                     \
    static inline __attribute__((always_inline)) ACC_##OP(T) OP##_range_##T(            \
        const T *v, const uint8_t *m, int64_t a, int64_t b, ACC_##OP(T) s,               \
        bits_##T other) {                                                                \
        int nan = 0;                                                                     \
        int64_t j = a;                                                                   \
        if (b - a >= LONG_RUN) {                                                         \
            const ACC_##OP(T) start = s;                                                 \
            SIMD(OP)                                                                     \
            for (int64_t i = a; i < b; i++) {                                            \
                T x = PICK_##OP(T, v[i], m[i], other, start);                            \
                STEP_##OP(s, x);                                                         \
            }                                                                            \
            j = b;                                                                       \
        } else if (b - a >= CHUNKS_##OP) {                                               \
            ACC_##OP(T) acc[LANES];                                                      \
            for (int k = 0; k < LANES; k++) acc[k] = s;                                  \
            for (; j + LANES <= b; j += LANES)                                           \
                for (int k = 0; k < LANES; k++) {                                        \
                    T x = keep_##T(v[j + k], m[j + k], other);                           \
                    STEP_##OP(acc[k], x);                                                \
                }                                                                        \
            for (int k = 0; k < LANES; k++) JOIN_##OP(s, acc[k]);                        \
        }                                                                                \
        for (; j < b; j++) {                                                             \
            T x = keep_##T(v[j], m[j], other);                                           \
            STEP_##OP(s, x);                                                             \
        }                                                                                \
        return nan ? (ACC_##OP(T))NAN : s;                                               \
    }

/* Index types of a scatter kernel's group index: int64 (torch's), int32 (a CSR's
 * col_indices may be) and uint16, a narrowed copy for at most 65536 groups that the caller
 * keeps (Note [Narrow group indices] in _native.py): the pass over the stored elements reads
 * 2 bytes of index per element instead of 8. */
typedef int64_t i64;
typedef int32_t i32;
typedef uint16_t u16;

/* out[index[j]] op= where(m, v, identity)[j] into nout groups: one pass in storage order,
 * every index checked before it is used (sign-extended first: a negative int32 is out of
 * range). Unrolled and prefetched variants measured no faster: the loop waits on the
 * read-modify-write of out[g] (out of L1 for thousands of groups), not on its own
 * instructions; a narrower index is what pays (2M elements into 20000 groups: 3.6 ->
 * 2.6 ms from int64 to uint16). A sorted index (runs of one group) waits on the previous
 * element's store instead, 2-3x slower: runs are the lines kernel's work (a variant that
 * reduced runs in a register here cost 5-30% on a random index). */
#define SCATTER(T, OP, I)                                                                \
    int ms_scatter_##OP##_##T##_##I(const T *v, const uint8_t *m, int64_t n,             \
                                    const I *index, T identity, ACC_##OP(T) *out,        \
                                    int64_t nout) {                                      \
        const ACC_##OP(T) start = START_##OP(identity);                                  \
        const bits_##T other = bits_of_##T((T)start);                                    \
        int nan = 0;                                                                     \
        for (int64_t g = 0; g < nout; g++) out[g] = start;                               \
        for (int64_t j = 0; j < n; j++) {                                                \
            uint64_t g = (uint64_t)(int64_t)index[j];                                    \
            if (g >= (uint64_t)nout) return -1;                                          \
            T x = keep_##T(v[j], m[j], other);                                           \
            STEP_##OP(out[g], x);                                                        \
            if (nan) out[g] = (ACC_##OP(T))NAN, nan = 0; /* a NaN, once in, stays */     \
        }                                                                                \
        return 0;                                                                        \
    }

/* The three kernels of one op and value type (scatter: one per index type). */
#define KERNELS(T, OP)                                                                   \
    RANGE(T, OP)                                                                         \
    int ms_all_##OP##_##T(const T *v, const uint8_t *m, int64_t n, T identity, T *out) {  \
        const ACC_##OP(T) start = START_##OP(identity);                                  \
        (void)identity; /* the sums' identity is their own */                            \
        *out = (T)OP##_range_##T(v, m, 0, n, start, bits_of_##T((T)start));              \
        return 0;                                                                        \
    }                                                                                    \
    int ms_lines_##OP##_##T(const T *v, const uint8_t *m, int64_t n,                     \
                            const int64_t *offsets, int64_t nlines_all,                  \
                            const int64_t *lines, int64_t nlines, T identity, T *out) {  \
        const ACC_##OP(T) start = START_##OP(identity);                                  \
        const bits_##T other = bits_of_##T((T)start);                                    \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            uint64_t r = lines ? (uint64_t)lines[i] : (uint64_t)i;                       \
            if (r >= (uint64_t)nlines_all) return -1;                                    \
            int64_t a = offsets[r], b = offsets[r + 1];                                  \
            if (a < 0 || a > b || b > n) return -1;                                      \
            out[i] = (T)OP##_range_##T(v, m, a, b, start, other);                        \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    SCATTER(T, OP, i64) SCATTER(T, OP, i32) SCATTER(T, OP, u16)

#define ALL_OPS(T)                                                                       \
    KERNELS(T, sum)                                                                      \
    KERNELS(T, sumsq)                                                                    \
    KERNELS(T, prod)                                                                     \
    KERNELS(T, max)                                                                      \
    KERNELS(T, min)
ALL_OPS(f64)
ALL_OPS(f32)

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

int ms_lines_count(const uint8_t *m, int64_t n, const int64_t *offsets, int64_t nlines_all,
                   const int64_t *lines, int64_t nlines, int64_t *out) {
    for (int64_t i = 0; i < nlines; i++) {
        uint64_t r = lines ? (uint64_t)lines[i] : (uint64_t)i;
        if (r >= (uint64_t)nlines_all) return -1;
        int64_t a = offsets[r], b = offsets[r + 1];
        if (a < 0 || a > b || b > n) return -1;
        out[i] = count_range(m, a, b);
    }
    return 0;
}

#define SCATTER_COUNT(I)                                                                 \
    int ms_scatter_count_##I(const uint8_t *m, int64_t n, const I *index, int64_t *out,    \
                             int64_t nout) {                                               \
        memset(out, 0, (size_t)nout * sizeof *out);                                        \
        for (int64_t j = 0; j < n; j++) {                                                  \
            uint64_t g = (uint64_t)(int64_t)index[j];                                      \
            if (g >= (uint64_t)nout) return -1;                                            \
            out[g] += m[j] != 0;                                                           \
        }                                                                                  \
        return 0;                                                                          \
    }
SCATTER_COUNT(i64)
SCATTER_COUNT(i32)
SCATTER_COUNT(u16)

/* -- narrowed group indices ------------------------------------------------------------ */
/* A copy of an int64 group index in a narrower type I, when every element is in
 * [0, nout) (nout fits I): returns -1, and leaves `out` partly written, at the first
 * element out of range (the caller keeps the int64 index, whose scatter then raises);
 * one pass. */
#define NARROW(I)                                                                        \
    int ms_narrow_##I(const int64_t *index, int64_t n, int64_t nout, I *out) {            \
        uint64_t bad = 0;                                                                \
        for (int64_t j = 0; j < n; j++) {                                                \
            uint64_t g = (uint64_t)index[j];                                             \
            bad |= g >= (uint64_t)nout;                                                  \
            out[j] = (I)g;                                                               \
        }                                                                                \
        return bad ? -1 : 0;                                                             \
    }
NARROW(i32)
NARROW(u16)
