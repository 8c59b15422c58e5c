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
 * torch.amax does. The mask is never a branch (one on a random mask mispredicts once in a
 * few elements): with AVX-512 it is a mask register that the vector instructions obey;
 * in the portable code, bit logic: `keep = -m` is all ones or all zeros, and
 * `(bits & keep) | (identity & ~keep)` is the value or the identity.
 * Runs of elements are reduced in vector lanes (RANGE says how), never in one scalar
 * accumulator that would wait on its own latency at every element.
 *
 * Every index read from memory is checked before it is used; a kernel returns -1 at the
 * first one out of range (and the caller raises), never reads or writes out of bounds.
 * Nothing is allocated on the heap here; the caller owns every array it passes (small
 * scatters of float32 sums keep their double sums on the stack: SCATTER_STACK).
 *
 * Built at install (setup.py), never at run time: this one file is compiled once per
 * instruction set -- baseline (SSE2 on x86-64, the only build elsewhere: aarch64 and others),
 * "avx2" (-mavx2 -mfma ...: the compiler's loops in 256-bit vectors) and "avx512" (the
 * explicit AVX-512 code below) -- into one shared library each, with the same symbols.
 * _native.py loads the baseline build first, asks it (ms_cpu_isa) what this CPU runs, then
 * loads the widest build the CPU runs, so one install (or wheel) serves every x86-64 CPU.
 * Whole builds rather than function-level target attributes: every kernel, helper and
 * macro stays written once, compiled by the same rules for each target (the explicit code
 * keyed on the compiler's own __AVX512F__ & co.), and the dispatch costs nothing per call
 * (ctypes binds each symbol of the chosen build once).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The version of the kernels' signatures: _native.py's _ABI must equal it, else the build
 * is refused (a stale build of another version). Bump both when a signature changes. */
#define MS_ABI 2
int ms_abi_version(void) { return MS_ABI; }

/* The instruction set this build was compiled for: 2 explicit AVX-512 code, 1 AVX2 (the
 * portable loops, 256-bit), 0 baseline. Defined below, once VECTOR is known. */
int ms_built_isa(void);

/* What this CPU (and its operating system, which must save the wide registers) runs, by
 * the same scale: the build _native.py loads is the widest with ms_built_isa() <= this. */
int ms_cpu_isa(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
               __builtin_cpu_supports("popcnt");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return 2;
    return avx2 ? 1 : 0;
#else
    return 0;
#endif
}

#define LONG_RUN 256 /* portable code: runs at least this long are one simd loop */
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
 * cheaper there than the bit logic); the others by bits. */
#define PICK_sum(T, x, k, other, start) keep_##T(x, k, other)
#define PICK_sumsq(T, x, k, other, start) keep_##T(x, k, other)
#define PICK_prod(T, x, k, other, start) keep_##T(x, k, other)
#define PICK_max(T, x, k, other, start) ((k) ? (x) : (T)(start))
#define PICK_min(T, x, k, other, start) ((k) ? (x) : (T)(start))
#define PRAGMA(x) _Pragma(#x)
#define SIMD(OP) PRAGMA(omp simd reduction(LANES_##OP : s) reduction(| : nan))

/* -- explicit AVX-512 ------------------------------------------------------------------
 * Where the compiler targets AVX-512 (F, BW, VL: the "avx512" build of setup.py), every
 * run is reduced by hand-written vector code rather than by what the compiler makes of
 * the portable loops below (faster on long runs and most of all on short rows, where the
 * compiler's loops pay their setup and scalar tail: benchmarks/bench_native.py and
 * bench_scipy.py; Note [Native reductions]); the other builds (MASKED_SPARSE_NATIVE=avx2
 * or =portable, or another CPU) keep the portable loops only.
 * A run goes 64 elements at a time, in steps of one vector each:
 * - a step's mask: vptestmb turns its 8 or 16 mask bytes into mask bits (a mask register;
 *   cheaper than one test of 64 bytes and shifts of the mask register);
 * - the step's values are loaded whole and joined to the accumulator under that mask
 *   (masked add / fma / mul / max): an unspecified lane leaves the accumulator as it is,
 *   whatever it holds (NaN, inf);
 * - sums widen 8 elements to 8 doubles (vcvtps2pd for float32: the bound of a float32
 *   sum); prod, max, min step 64 bytes of values at a time;
 * - 4 independent accumulators hide the latency of each fma / mul / max; fewer to join
 *   at the end of every row (8 measured slower on rows of tens to hundreds);
 * - max / min: a masked compare "unordered" collects the NaNs apart (a NaN result at the
 *   end) and max(x, acc) takes acc where x is NaN; +-0 and +-inf compare as the scalar
 *   step does (x > acc ? x : acc);
 * - the last, partial block tests its mask bytes and loads its values with masked loads,
 *   which read nothing past the run: no scalar tail, and a short run (a sparse row) is
 *   one such block, its steps into one accumulator (no join of the others).
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VECTOR 1
#include <immintrin.h>
#define VECTOR_RUN 1 /* every run but an empty one: a short run is its partial block */

/* The mask bits of the 8 or 16 elements from m on (the low bits of the result). */
static inline __mmask16 mask_bits_at(const uint8_t *m, int width) {
    __m128i bytes = width == 8 ? _mm_loadl_epi64((const __m128i *)m)
                               : _mm_loadu_si128((const __m128i *)m);
    return _mm_test_epi8_mask(bytes, bytes);
}

/* The mask bits of the last `left` (< 64) elements from m on; reads only those bytes. */
static inline __mmask64 mask_bits_tail(const uint8_t *m, int64_t left) {
    __m512i bytes = _mm512_maskz_loadu_epi8(((__mmask64)1 << left) - 1, m);
    return _mm512_test_epi8_mask(bytes, bytes);
}

/* Intrinsic names per value type: VOP(f64, add) is _mm512_add_pd. */
#define VOP_f64(name) _mm512_##name##_pd
#define VOP_f32(name) _mm512_##name##_ps
#define VOP(T, name) VOP_##T(name)
#define VEC_f64 __m512d
#define VEC_f32 __m512
/* 8 elements (the sums' step), whole or where k, and as doubles (a float32 widens
 * exactly). */
#define EIGHT_f64 __m512d
#define EIGHT_f32 __m256
#define LOAD8_f64(p) _mm512_loadu_pd(p)
#define LOAD8_f32(p) _mm256_loadu_ps(p)
#define LOAD8Z_f64(k, p) _mm512_maskz_loadu_pd(k, p)
#define LOAD8Z_f32(k, p) _mm256_maskz_loadu_ps(k, p)
#define WIDEN_f64(x) (x)
#define WIDEN_f32(x) _mm512_cvtps_pd(x)
/* The lanes of x where k that are NaN. */
#define ISNAN_f64(k, x) _mm512_mask_cmp_pd_mask(k, x, x, _CMP_UNORD_Q)
#define ISNAN_f32(k, x) _mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q)

/* Per op: W, the elements of one step, and their vector (RAW); the accumulator vector
 * and its start; a step's loads (whole; where k); the step that joins x's lanes where k
 * into acc; how two accumulators join; the reduction of an accumulator's lanes. */
#define W_sum(T) 8
#define W_sumsq(T) 8
#define W_prod(T) (64 / sizeof(T))
#define W_max(T) (64 / sizeof(T))
#define W_min(T) (64 / sizeof(T))
#define RAW_sum(T) EIGHT_##T
#define RAW_sumsq(T) EIGHT_##T
#define RAW_prod(T) VEC_##T
#define RAW_max(T) VEC_##T
#define RAW_min(T) VEC_##T
#define VACC_sum(T) __m512d
#define VACC_sumsq(T) __m512d
#define VACC_prod(T) VEC_##T
#define VACC_max(T) VEC_##T
#define VACC_min(T) VEC_##T
#define VSTART_sum(T, s) _mm512_setzero_pd()
#define VSTART_sumsq(T, s) _mm512_setzero_pd()
#define VSTART_prod(T, s) VOP(T, set1)(1)
#define VSTART_max(T, s) VOP(T, set1)(s)
#define VSTART_min(T, s) VOP(T, set1)(s)
#define LOAD_sum(T, p) LOAD8_##T(p)
#define LOAD_sumsq(T, p) LOAD8_##T(p)
#define LOAD_prod(T, p) VOP(T, loadu)(p)
#define LOAD_max(T, p) VOP(T, loadu)(p)
#define LOAD_min(T, p) VOP(T, loadu)(p)
#define LOADZ_sum(T, k, p) LOAD8Z_##T(k, p)
#define LOADZ_sumsq(T, k, p) LOAD8Z_##T(k, p)
#define LOADZ_prod(T, k, p) VOP(T, maskz_loadu)(k, p)
#define LOADZ_max(T, k, p) VOP(T, maskz_loadu)(k, p)
#define LOADZ_min(T, k, p) VOP(T, maskz_loadu)(k, p)
/* sum: fma(x, 1, acc) is x + acc, on the FMA pipes (vcvtps2pd keeps the adders busy) */
#define VSTEP_sum(T, acc, k, x, nans)                                                    \
    ((acc) = _mm512_mask3_fmadd_pd(WIDEN_##T(x), _mm512_set1_pd(1), acc, k))
#define VSTEP_sumsq(T, acc, k, x, nans)                                                  \
    do {                                                                                 \
        __m512d w_ = WIDEN_##T(x);                                                       \
        (acc) = _mm512_mask3_fmadd_pd(w_, w_, acc, k);                                   \
    } while (0)
#define VSTEP_prod(T, acc, k, x, nans) ((acc) = VOP(T, mask_mul)(acc, k, acc, x))
#define VSTEP_max(T, acc, k, x, nans)                                                    \
    ((nans) |= ISNAN_##T(k, x),                                                          \
     (acc) = VOP(T, mask_max)(acc, k, x, acc)) /* acc where x is NaN */
#define VSTEP_min(T, acc, k, x, nans)                                                    \
    ((nans) |= ISNAN_##T(k, x),                                                          \
     (acc) = VOP(T, mask_min)(acc, k, x, acc))
#define VJOIN_sum(T, a, b) ((a) = _mm512_add_pd(a, b))
#define VJOIN_sumsq(T, a, b) ((a) = _mm512_add_pd(a, b))
#define VJOIN_prod(T, a, b) ((a) = VOP(T, mul)(a, b))
#define VJOIN_max(T, a, b) ((a) = VOP(T, max)(a, b))
#define VJOIN_min(T, a, b) ((a) = VOP(T, min)(a, b))
#define VREDUCE_sum(T, acc) _mm512_reduce_add_pd(acc)
#define VREDUCE_sumsq(T, acc) _mm512_reduce_add_pd(acc)
#define VREDUCE_prod(T, acc) VOP(T, reduce_mul)(acc)
#define VREDUCE_max(T, acc) VOP(T, reduce_max)(acc)
#define VREDUCE_min(T, acc) VOP(T, reduce_min)(acc)

/* OP over where(m, v, identity)[a:b] joined into s (the identity for max / min), 64
 * elements a block; *nan set where a specified element is NaN (max, min). */
#define VRANGE(T, OP)                                                                    \
    static inline __attribute__((always_inline)) ACC_##OP(T) OP##_vrange_##T(           \
        const T *v, const uint8_t *m, int64_t a, int64_t b, ACC_##OP(T) s, int *nan) {   \
        enum { W = W_##OP(T), STEPS = 64 / W_##OP(T), ACCS = STEPS < 4 ? STEPS : 4 };    \
        VACC_##OP(T) acc[ACCS];                                                          \
        uint32_t nans = 0;                                                               \
        int64_t i = a;                                                                   \
        for (int q = 0; q < ACCS; q++) acc[q] = VSTART_##OP(T, s);                       \
        for (; i + 64 <= b; i += 64)                                                     \
            for (int q = 0; q < STEPS; q++) {                                            \
                RAW_##OP(T) x = LOAD_##OP(T, v + i + q * W);                             \
                VSTEP_##OP(T, acc[q % ACCS], mask_bits_at(m + i + q * W, W), x, nans);   \
            }                                                                            \
        if (i < b) { /* the partial block: masked loads, its steps into acc[0] */        \
            __mmask64 k = mask_bits_tail(m + i, b - i);                                  \
            for (int q = 0; q * W < b - i; q++) {                                        \
                RAW_##OP(T) x = LOADZ_##OP(T, k >> (q * W), v + i + q * W);              \
                VSTEP_##OP(T, acc[0], k >> (q * W), x, nans);                            \
            }                                                                            \
        }                                                                                \
        if (b - a >= 64) /* a short run (a sparse row) used acc[0] only */               \
            for (int q = 1; q < ACCS; q++) VJOIN_##OP(T, acc[0], acc[q]);                \
        *nan |= nans != 0;                                                               \
        ACC_##OP(T) r = VREDUCE_##OP(T, acc[0]);                                         \
        JOIN_##OP(s, r);                                                                 \
        return s;                                                                        \
    }
/* A run of at least VECTOR_RUN elements: the vector code. */
#define VECTOR_LOOP(T, OP) s = OP##_vrange_##T(v, m, a, b, s, &nan)

/* The scatter kernels of the sums (SCATTER below), 64 elements a block: an unspecified
 * element of a sum adds +0.0, which changes no group (a group's sum is never -0.0: it
 * starts at +0.0), so only the specified ones need the read-modify-write of out[g], the
 * loop's cost. Per step of 8: the 8 indices as 64-bit lanes (sign-extended), all checked
 * at once (specified or not); the specified lanes' indices and values (as doubles)
 * compressed to the front of two registers (vpcompressq / vcompresspd: the register
 * forms; compressing to memory is slow on some CPUs) and stored at the end of a block's
 * list; then the list's entries, in storage order, one scalar step each. The same sums in
 * the same order as the portable loop. The index and values are prefetched 1024 elements
 * ahead: without, the loads of a block wait behind the previous block's list (with an
 * int64 index and float64 values, slower than the scalar loop; with, faster:
 * benchmarks/bench_scipy.py's column sums and means). */
#define IDX8_i64(p) _mm512_loadu_si512(p)
#define IDX8_i32(p) _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i *)(p)))
#define IDX8_u16(p) _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(p)))
#define VSCATTER_sum(T, I) VSCATTER_BLOCKS(T, I, NO_LIST, SCATTER_ENTRY_sum)
#define VSCATTER_sumsq(T, I) VSCATTER_BLOCKS(T, I, NO_LIST, SCATTER_ENTRY_sumsq)
#define VSCATTER_prod(T, I)
#define VSCATTER_max(T, I)
#define VSCATTER_min(T, I)
#define SCATTER_ENTRY_sum(g, x) STEP_sum(out[g], x)
#define SCATTER_ENTRY_sumsq(g, x) STEP_sumsq(out[g], x)
#define NO_LIST(T, c)
/* The blocks of 64 of a scatter over the specified elements: a block's list of groups gs
 * and values xs (as doubles, c entries) first goes through LIST(T, c), then ENTRY(g, x) is
 * one entry's step (group g, value x), taken in storage order. The caller declares gs and
 * xs, 64 entries each. */
#define VSCATTER_BLOCKS(T, I, LIST, ENTRY)                                               \
    do {                                                                                 \
        const __m512i bound = _mm512_set1_epi64(nout);                                   \
        for (; j + 64 <= n; j += 64) {                                                   \
            int c = 0;                                                                   \
            for (int q = 0; q < 8; q++) {                                                \
                __m512i g = IDX8_##I(index + j + q * 8);                                 \
                _mm_prefetch((const char *)(index + j + q * 8 + 1024), _MM_HINT_T0);     \
                _mm_prefetch((const char *)(v + j + q * 8 + 1024), _MM_HINT_T0);         \
                if (_mm512_cmpge_epu64_mask(g, bound)) return -1;                        \
                __mmask8 k = (__mmask8)mask_bits_at(m + j + q * 8, 8);                   \
                __m512d x = WIDEN_##T(LOAD8_##T(v + j + q * 8));                         \
                _mm512_storeu_si512(gs + c, _mm512_maskz_compress_epi64(k, g));          \
                _mm512_storeu_pd(xs + c, _mm512_maskz_compress_pd(k, x));                \
                c += __builtin_popcount(k);                                              \
            }                                                                            \
            LIST(T, c);                                                                  \
            for (int q = 0; q < c; q++) ENTRY(gs[q], xs[q]);                             \
        }                                                                                \
    } while (0)
#else
#define VECTOR 0
#define VECTOR_RUN LONG_RUN
#define VRANGE(T, OP)
#define VSCATTER_sum(T, I)
#define VSCATTER_sumsq(T, I)
#define VSCATTER_prod(T, I)
#define VSCATTER_max(T, I)
#define VSCATTER_min(T, I)
/* A run of at least VECTOR_RUN elements: one OpenMP simd loop. */
#define VECTOR_LOOP(T, OP)                                                               \
    do {                                                                                 \
        const ACC_##OP(T) start = s; /* what PICK_max / PICK_min read */                 \
        (void)start;                                                                     \
        SIMD(OP)                                                                         \
        for (int64_t i = a; i < b; i++) {                                                \
            T x = PICK_##OP(T, v[i], m[i], other, start);                                \
            STEP_##OP(s, x);                                                             \
        }                                                                                \
    } while (0)
#endif

int ms_built_isa(void) {
#if VECTOR
    return 2;
#elif defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

/* OP over where(m, v, identity)[a:b]; `other` is the bits an unspecified element reads.
 * A run of VECTOR_RUN elements or more is one vector loop (VECTOR_LOOP: with AVX-512, the
 * explicit code above, for every non-empty run; else an OpenMP simd loop from LONG_RUN
 * on). Without AVX-512, a run of a few dozen elements (a sparse row) would spend more on
 * the simd loop's setup than on its work, so it goes LANES at a time into LANES
 * accumulators, a loop of fixed length that the compiler turns into vector instructions
 * with no setup. Inlined always, so that a constant `other` (0 for sums) folds into the
 * bit logic. */
#define RANGE(T, OP)                                                                     \
    VRANGE(T, OP)                                                                        \
    static inline __attribute__((always_inline)) ACC_##OP(T) OP##_range_##T(            \
        const T *v, const uint8_t *m, int64_t a, int64_t b, ACC_##OP(T) s,               \
        bits_##T other) {                                                                \
        int nan = 0;                                                                     \
        int64_t j = a;                                                                   \
        if (b - a >= VECTOR_RUN) {                                                       \
            VECTOR_LOOP(T, OP);                                                          \
            j = b;                                                                       \
        } else if (b - a >= CHUNKS_##OP) {                                               \
            ACC_##OP(T) acc[LANES];                                                      \
            acc[0] = s; /* the other lanes start at the op's own start: s joins once */   \
            for (int k = 1; k < LANES; k++) acc[k] = START_##OP(s);                      \
            for (; j + LANES <= b; j += LANES)                                           \
                for (int k = 0; k < LANES; k++) {                                        \
                    T x = keep_##T(v[j + k], m[j + k], other);                           \
                    STEP_##OP(acc[k], x);                                                \
                }                                                                        \
            s = acc[0];                                                                  \
            for (int k = 1; k < LANES; k++) JOIN_##OP(s, acc[k]);                        \
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
 * instructions; a narrower index is what pays (fewer bytes read per element). A sorted
 * index (runs of one group: a row-sorted COO's rows, the gradient of a column vector read
 * at its stored positions) waits on the previous element's store instead, slower than a
 * random one: there each run is reduced in a register and stored once (SCATTER_RUNS). A
 * scan finds the index sorted and stops at the first descent, so a random index pays a few
 * comparisons (reducing runs in a register there cost time). The same steps in the same
 * order: the same bits. With AVX-512 a sum over an unsorted
 * index skips the unspecified elements' read-modify-write (VSCATTER_BLOCKS). */
#define SCATTER_RUNS(T, OP)                                                              \
    for (; j < n;) {                                                                     \
        const uint64_t g = (uint64_t)(int64_t)index[j];                                  \
        if (g >= (uint64_t)nout) return -1;                                              \
        ACC_##OP(T) s = out[g];                                                          \
        do {                                                                             \
            T x = keep_##T(v[j], m[j], other);                                           \
            STEP_##OP(s, x);                                                             \
            if (nan) s = (ACC_##OP(T))NAN, nan = 0; /* a NaN, once in, stays */          \
        } while (++j < n && index[j] == index[j - 1]);                                   \
        out[g] = s;                                                                      \
    }
#define SCATTER(T, OP, I)                                                                \
    int ms_scatter_##OP##_##T##_##I(const T *v, const uint8_t *m, int64_t n,             \
                                    const I *index, T identity, ACC_##OP(T) *out,        \
                                    int64_t nout) {                                      \
        const ACC_##OP(T) start = START_##OP(identity);                                  \
        const bits_##T other = bits_of_##T((T)start);                                    \
        int nan = 0;                                                                     \
        int64_t j = 0, gs[64];                                                           \
        double xs[64];                                                                   \
        (void)gs, (void)xs; /* the sums' lists (VSCATTER_BLOCKS) */                      \
        for (int64_t g = 0; g < nout; g++) out[g] = start;                               \
        int64_t ascending = 1;                                                           \
        while (ascending < n && index[ascending] >= index[ascending - 1]) ascending++;   \
        if (ascending >= n) {                                                            \
            SCATTER_RUNS(T, OP)                                                          \
            return 0;                                                                    \
        }                                                                                \
        VSCATTER_##OP(T, I); /* AVX-512, sums: blocks of 64, specified elements only */  \
        for (; j < n; j++) {                                                             \
            uint64_t g = (uint64_t)(int64_t)index[j];                                    \
            if (g >= (uint64_t)nout) return -1;                                          \
            T x = keep_##T(v[j], m[j], other);                                           \
            STEP_##OP(out[g], x);                                                        \
            if (nan) out[g] = (ACC_##OP(T))NAN, nan = 0; /* a NaN, once in, stays */     \
        }                                                                                \
        return 0;                                                                        \
    }

/* In a lines kernel (its parameters offsets, nlines_all, lines, nlines, n in scope): the
 * elements a .. b - 1 of listed line i (line i itself when `lines` is NULL), every bound
 * checked first -- the kernel returns -1 at a line or offset out of range. */
#define LINE_BOUNDS(i, a, b)                                                             \
    uint64_t r_##i = lines ? (uint64_t)lines[i] : (uint64_t)(i);                         \
    if (r_##i >= (uint64_t)nlines_all) return -1;                                        \
    int64_t a = offsets[r_##i], b = offsets[r_##i + 1];                                  \
    if (a < 0 || a > b || b > n) return -1

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
            LINE_BOUNDS(i, a, b);                                                        \
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

/* A float32 sum's scatter written as float32: the double sums of at most SCATTER_STACK
 * groups in an array on the stack, each rounded once into out as the cast of the double
 * result would round it, so that the caller allocates no double output and casts nothing
 * (a column sum of a small matrix: benchmarks/profile_overhead.py --fixed). More groups:
 * -2, nothing written (the caller takes the double output). ms_scatter_stack() is the
 * bound; the moments' scatter takes the same stack array for its sums when given none. */
#define SCATTER_STACK 2048
int ms_scatter_stack(void) { return SCATTER_STACK; }
#define SCATTER_TO(OP, I)                                                                \
    int ms_scatter_to_##OP##_f32_##I(const f32 *v, const uint8_t *m, int64_t n,          \
                                     const I *index, f32 identity, f32 *out,             \
                                     int64_t nout) {                                     \
        double acc[SCATTER_STACK];                                                       \
        if (nout > SCATTER_STACK) return -2;                                             \
        if (ms_scatter_##OP##_f32_##I(v, m, n, index, identity, acc, nout)) return -1;   \
        for (int64_t g = 0; g < nout; g++) out[g] = (f32)acc[g];                         \
        return 0;                                                                        \
    }
SCATTER_TO(sum, i64) SCATTER_TO(sum, i32) SCATTER_TO(sum, u16)
SCATTER_TO(sumsq, i64) SCATTER_TO(sumsq, i32) SCATTER_TO(sumsq, u16)

/* -- counts of the mask ---------------------------------------------------------------- */
static inline int64_t count_range(const uint8_t *m, int64_t a, int64_t b) {
    int64_t c = 0, j = a;
#if VECTOR /* 64 mask bytes to 64 bits (vptestmb), then popcnt */
    for (; j + 64 <= b; j += 64) {
        __m512i bytes = _mm512_loadu_si512(m + j);
        c += __builtin_popcountll(_mm512_test_epi8_mask(bytes, bytes));
    }
    if (j < b) c += __builtin_popcountll(mask_bits_tail(m + j, b - j));
    return c;
#endif
    for (; j < b; j++) c += m[j] != 0;
    return c;
}

int ms_all_count(const uint8_t *m, int64_t n, int64_t *out) {
    *out = count_range(m, 0, n);
    return 0;
}

int ms_lines_count(const uint8_t *m, int64_t n, const int64_t *offsets, int64_t nlines_all,
                   const int64_t *lines, int64_t nlines, int64_t *out) {
    for (int64_t i = 0; i < nlines; i++) {
        LINE_BOUNDS(i, a, b);
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
 * one pass. With `remap` (nout entries, each below nout) the copy holds remap[index[j]]
 * instead: a key slot's group (Note [Narrow group indices]). */
#define NARROW(I)                                                                        \
    int ms_narrow_##I(const int64_t *index, int64_t n, int64_t nout,                     \
                      const int64_t *remap, I *out) {                                    \
        uint64_t bad = 0;                                                                \
        for (int64_t j = 0; j < n; j++) {                                                \
            uint64_t g = (uint64_t)index[j];                                             \
            bad |= g >= (uint64_t)nout;                                                  \
            out[j] = (I)g;                                                               \
        }                                                                                \
        if (!bad && remap)                                                               \
            for (int64_t j = 0; j < n; j++) {                                            \
                uint64_t r = (uint64_t)remap[out[j]];                                    \
                bad |= r >= (uint64_t)nout;                                              \
                out[j] = (I)r;                                                           \
            }                                                                            \
        return bad ? -1 : 0;                                                             \
    }
NARROW(i32)
NARROW(u16)

/* -- the exact fill --------------------------------------------------------------------- */
/* out[j] = m[j] ? v[j] : f over the values' bits (B-bit unsigned integers: every float
 * bit pattern, NaN payloads and -0.0 included, is copied as it is): where(mask, values,
 * fill) in one pass, vectorized by the compiler into blends (fill_unspecified in
 * layouts/_fill.py: torch's CPU where branches on its condition, which mispredicts on a
 * random mask). Every v[j] is read whatever m[j] says: with the read inside the condition
 * the compiler may not read an element the condition skips, and vectorizes with masked
 * loads instead (vpmaskmovd), much slower than a plain load and a blend on Zen. */
#define FILL(B)                                                                          \
    void ms_fill_u##B(const uint##B##_t *v, const uint8_t *m, int64_t n, uint##B##_t f,    \
                      uint##B##_t *out) {                                                \
        for (int64_t j = 0; j < n; j++) {                                                \
            const uint##B##_t x = v[j];                                                  \
            out[j] = m[j] ? x : f;                                                       \
        }                                                                                \
    }
FILL(8)
FILL(16)
FILL(32)
FILL(64)

/* -- a plain operand read at the stored positions and added ---------------------------
 * out[k] = v[k] + d[at[k]] (op 1: v[k] - d[at[k]], op 2: d[at[k]] - v[k]) for k < n: a
 * masked operand's values plus a plain operand read at the flat positions of its stored
 * elements (layouts.convert.add_stored: the sum of a graph attention's scores), one pass in
 * place of torch's take and add, with the same roundings (one addition or subtraction).
 * Every position is checked first, in a pass of its own: nothing is written before a bad
 * one is found. */
#define GATHER_ADD(T)                                                                    \
    int ms_gather_add_##T(const T *v, const T *d, const int64_t *at, int64_t n,          \
                          int64_t nd, int op, T *restrict out) {                         \
        uint64_t bad = 0;                                                                \
        for (int64_t k = 0; k < n; k++) bad |= (uint64_t)at[k] >= (uint64_t)nd;          \
        if (bad) return -1;                                                              \
        if (op == 0)                                                                     \
            for (int64_t k = 0; k < n; k++) out[k] = v[k] + d[at[k]];                    \
        else if (op == 1)                                                                \
            for (int64_t k = 0; k < n; k++) out[k] = v[k] - d[at[k]];                    \
        else                                                                             \
            for (int64_t k = 0; k < n; k++) out[k] = d[at[k]] - v[k];                    \
        return 0;                                                                        \
    }
GATHER_ADD(f64)
GATHER_ADD(f32)

/* -- the first specified element equal to x ------------------------------------------- */
/* The index of the first j with m[j] and v[j] == x (with x NaN: v[j] NaN), or -1: where an
 * arg-extreme is, once its value is known (a full argmax: the max kernel, then this scan,
 * instead of torch's argmax of the filled values, a fill and a slower scan). Blocks of 64
 * elements are tested with no exit (a loop the compiler vectorizes); the block holding a
 * hit is then scanned element by element. */
#define FIRST(T)                                                                         \
    int ms_first_##T(const T *v, const uint8_t *m, int64_t n, T x, int64_t *out) {       \
        const int nan = x != x;                                                          \
        int64_t j = 0;                                                                   \
        *out = -1;                                                                       \
        for (; j + 64 <= n; j += 64) {                                                   \
            int hit = 0;                                                                 \
            for (int k = 0; k < 64; k++)                                                 \
                hit |= (m[j + k] != 0) & (nan ? v[j + k] != v[j + k] : v[j + k] == x);   \
            if (hit) break;                                                              \
        }                                                                                \
        for (; j < n; j++)                                                               \
            if (m[j] && (nan ? v[j] != v[j] : v[j] == x)) {                              \
                *out = j;                                                                \
                break;                                                                   \
            }                                                                            \
        return 0;                                                                        \
    }
FIRST(f64)
FIRST(f32)

/* -- arg-extremes along dims: per group, the extreme and where it first is ------------- */
/* Per group, the max (min) of the specified elements, `top`, and the position pos[j] of
 * the first specified element reaching it, `at` (both 0 where the group has no
 * specified element, as the outputs hold there): what argmax / max(dim) return. NaN
 * counts as the extreme, as in torch: the group's top is NaN and `at` the first NaN's
 * position. "First" is the smallest position among the ties, compared explicitly: no
 * kernel assumes that storage order and position order agree.
 *
 *   lines    per line, two passes over its elements: the masked extreme (the range code
 *            of the reductions above), then the smallest position of a specified element
 *            equal to it, LANES at a time in a loop of fixed length (vector code with no
 *            setup; a line is often short) while the line is in cache; the winners'
 *            positions are read in a last pass over the lines (ARG_LINES);
 *   scatter  one pass in storage order, each element updating its group's (top, at).
 *
 * Neither branches on the mask or on a comparison (on random data one would mispredict
 * every few elements; written as conditionals, the compiler made branches of them and
 * the scatter ran slower): the mask and the hits are bit logic, as in keep_T. */
#define BEATS_max(x, t) ((x) > (t))
#define BEATS_min(x, t) ((x) < (t))
#define BELOW_max(x, t) ((x) < (t)) /* false where either is NaN */
#define BELOW_min(x, t) ((x) > (t))

/* p where k, else INT64_MAX (a position that never wins). */
static inline int64_t pos_where(int64_t p, int k) {
    const int64_t keep = -(int64_t)(k != 0);
    return (p & keep) | (INT64_MAX & ~keep);
}

/* The element j, a <= j < b, of the smallest pos[j] among the specified elements hitting
 * t -- equal to it, or NaN with t NaN (`nan`, a constant where inlined) -- or -1 where none
 * does. Hits are few (one a line, mostly): pos is read only where a line has ties, so a
 * line's one hit costs no read of pos here (see ARG_LINES). With AVX-512: one vector of
 * values a step, its mask bytes tested into mask bits (masked loads past the end of the
 * line: no scalar tail) and compared under them; the hits are counted and the first one
 * kept with no branch (the step holding a line's one hit is not predictable), and a line
 * with ties is scanned again for the smallest position (far fewer steps than the scalar
 * loop: the argmax rows of benchmarks/bench_reductions.py).
 * Else a scalar loop that tests each value first (a branch that predicts well), then its
 * mask (the compiler made slower scalar code of a blocked, branch-free test). */
#define ARG_TIE(jj)                                                                      \
    do {                                                                                 \
        const int64_t j_ = (jj);                                                         \
        if (best < 0)                                                                    \
            best = j_;                                                                   \
        else if (pos[j_] < pos[best])                                                    \
            best = j_;                                                                   \
    } while (0)
#if VECTOR
#define SCAN_W_f64 8
#define SCAN_W_f32 16
#define SCAN_CMP_f64(k, x, y, how) _mm512_mask_cmp_pd_mask((__mmask8)(k), x, y, how)
#define SCAN_CMP_f32(k, x, y, how) _mm512_mask_cmp_ps_mask(k, x, y, how)
#define ARG_SCAN(T)                                                                      \
    static inline __attribute__((always_inline)) int64_t arg_scan_##T(                  \
        const T *v, const uint8_t *m, const int64_t *pos, int64_t a, int64_t b, T t,      \
        int nan) {                                                                       \
        enum { W = SCAN_W_##T };                                                         \
        const VEC_##T tv = VOP(T, set1)(t);                                              \
        int64_t first = INT64_MAX, count = 0, best = -1;                                 \
        for (int64_t j = a; j < b; j += W) {                                             \
            __mmask16 k = b - j >= W ? (__mmask16)((1u << W) - 1)                        \
                                     : (__mmask16)((1u << (b - j)) - 1);                 \
            __m128i bytes = _mm_maskz_loadu_epi8(k, m + j);                              \
            __mmask16 specified = _mm_test_epi8_mask(bytes, bytes);                      \
            VEC_##T x = VOP(T, maskz_loadu)(specified, v + j);                           \
            unsigned hits = nan ? SCAN_CMP_##T(specified, x, x, _CMP_UNORD_Q)             \
                                : SCAN_CMP_##T(specified, x, tv, _CMP_EQ_OQ);             \
            const int64_t at = hits ? j + (int64_t)_tzcnt_u32(hits) : INT64_MAX;         \
            first = at < first ? at : first;                                             \
            count += __builtin_popcount(hits);                                           \
        }                                                                                \
        if (count < 2) return count ? first : -1;                                        \
        for (int64_t j = first; j < b; j++) /* ties: the smallest position */            \
            if (m[j] && (nan ? v[j] != v[j] : v[j] == t)) ARG_TIE(j);                    \
        return best;                                                                     \
    }
#else
#define HIT(x) (nan ? (x) != (x) : (x) == t)
#define ARG_SCAN(T)                                                                      \
    static inline __attribute__((always_inline)) int64_t arg_scan_##T(                  \
        const T *v, const uint8_t *m, const int64_t *pos, int64_t a, int64_t b, T t,      \
        int nan) {                                                                       \
        int64_t best = -1;                                                               \
        for (int64_t j = a; j < b; j++)                                                  \
            if (HIT(v[j]) && m[j]) ARG_TIE(j);                                           \
        return best;                                                                     \
    }
#endif
ARG_SCAN(f64)
ARG_SCAN(f32)

/* Lines are scanned first, each line's winning element kept in at[i] (-1: none) and its
 * position prefetched; a last pass over the lines reads the positions. Reading pos[j] in
 * the line's own step waited on memory once a line (pos is 8 bytes an element, out of
 * cache on a large input, and one element a line is read: no prefetcher follows that);
 * apart, the reads overlap. */
#define ARG_LINES(T, OP)                                                                 \
    int ms_lines_arg##OP##_##T(const T *v, const uint8_t *m, int64_t n,                  \
                               const int64_t *offsets, int64_t nlines_all,               \
                               const int64_t *lines, int64_t nlines, const int64_t *pos, \
                               T identity, T *top, int64_t *at) {                        \
        const bits_##T other = bits_of_##T(identity);                                    \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            LINE_BOUNDS(i, a, b);                                                        \
            const T t = (T)OP##_range_##T(v, m, a, b, identity, other);                  \
            const int64_t best = t != t ? arg_scan_##T(v, m, pos, a, b, t, 1)           \
                                        : arg_scan_##T(v, m, pos, a, b, t, 0);          \
            if (best >= 0) __builtin_prefetch(pos + best);                               \
            top[i] = best < 0 ? 0 : t;                                                   \
            at[i] = best;                                                                \
        }                                                                                \
        for (int64_t i = 0; i < nlines; i++) at[i] = at[i] < 0 ? 0 : pos[at[i]];         \
        return 0;                                                                        \
    }

/* Most elements neither beat nor tie their group's top: one comparison, a branch that is
 * rarely taken (so rarely mispredicted), sets them apart; an unspecified element reads
 * the identity there (no branch on the mask: a random one would mispredict every other
 * element). A candidate (not below the top, or NaN on either side) is then checked in
 * full: specified, and a NaN beats a number; a tie, or a NaN after a NaN: the earlier
 * position. */
#define ARG_SCATTER(T, OP, I)                                                            \
    int ms_scatter_arg##OP##_##T##_##I(const T *v, const uint8_t *m, int64_t n,          \
                                       const I *index, const int64_t *pos, T identity,   \
                                       T *top, int64_t *at, int64_t nout) {              \
        const bits_##T other = bits_of_##T(identity);                                    \
        for (int64_t g = 0; g < nout; g++) top[g] = identity, at[g] = INT64_MAX;         \
        for (int64_t j = 0; j < n; j++) {                                                \
            uint64_t g = (uint64_t)(int64_t)index[j];                                    \
            if (g >= (uint64_t)nout) return -1;                                          \
            const T x = keep_##T(v[j], m[j], other), t = top[g];                         \
            if (BELOW_##OP(x, t) || !m[j]) continue;                                     \
            const int64_t p = pos[j];                                                    \
            const int earlier = p < at[g];                                               \
            if (x != x ? t != t ? earlier : 1                                            \
                       : t == t && (BEATS_##OP(x, t) || (x == t && earlier)))            \
                top[g] = x, at[g] = p;                                                   \
        }                                                                                \
        for (int64_t g = 0; g < nout; g++)                                               \
            if (at[g] == INT64_MAX) top[g] = 0, at[g] = 0;                               \
        return 0;                                                                        \
    }

#define ARG_KERNELS(T, OP)                                                               \
    ARG_LINES(T, OP)                                                                     \
    ARG_SCATTER(T, OP, i64) ARG_SCATTER(T, OP, i32) ARG_SCATTER(T, OP, u16)
ARG_KERNELS(f64, max)
ARG_KERNELS(f64, min)
ARG_KERNELS(f32, max)
ARG_KERNELS(f32, min)

/* -- exp without libm ------------------------------------------------------------------
 * Note [Native exp]
 * exp(x) in double from arithmetic and bit operations only, inlined into the loops of the
 * sumexp kernels below so that the compiler vectorizes it (a call to libm's exp would keep
 * every loop scalar): 8 doubles a zmm register with AVX-512 (exp_dev8), 4 a ymm register in
 * the AVX2 build's softmax (exp_dev4), the compiler's loops elsewhere; the same bits in all.
 * - x is clamped to [-800, 800] (a NaN passes through the comparisons unchanged): e^800
 *   overflows to +inf and e^-800 underflows to 0 below, so +-inf give +inf and 0;
 * - Cody-Waite range reduction: n = round(x log2(e)) by the shifter 1.5 * 2^52 (x log2 e +
 *   shifter rounds to an integer in the low mantissa bits, no conversion instruction), r =
 *   x - n ln2_hi - n ln2_lo with ln2_hi's low 21 bits zero (n ln2_hi is exact for |n| <
 *   2^21), |r| <= ln2 / 2;
 * - e^r = 1 + r + r^2 q(r), q of degree 9 near-minimax on [-ln2/2, ln2/2] (Chebyshev fit,
 *   relative error ~1e-17; exp(0) is 1 exactly);
 * - times 2^n as two factors 2^(n/2) and 2^(n - n/2) built in the exponent bits: each is a
 *   normal double for |n| <= 1155, so results near overflow (n = 1024) are exact and
 *   subnormal results (x < -708.4) are rounded once, by the last multiplication.
 * Measured against torch.exp in float64 on 2.5e7 points ([-760, 720], [-1, 1], [-745.2,
 * -708], [700, 709.8]; test_native.py sweeps 4e5 and the edges), both builds: at most
 * 1 ULP (91% equal), exact at 0, +-inf, NaN, 0 below the underflow threshold, inf above the
 * overflow one. One implementation for float32 and float64 values (widened, as the sums
 * are); benchmarks/bench_reductions.py times logsumexp (on a CPU with one 512-bit FMA
 * port the kernel costs more relative to torch's float32 exp). A float32 exp
 * (16 lanes, degree-6 polynomial) measured faster but 20 float32 ULP from exp(v - c) (the
 * deviation rounded to float32); with the reduction in double and the polynomial in
 * float32 it was 1 ULP but the compiler's code slower: not kept. */
static inline double exp_dev(double x) {
    const double shifter = 0x1.8p52;
    x = x < -800.0 ? -800.0 : x;
    x = x > 800.0 ? 800.0 : x;
    double kd = x * 0x1.71547652b82fep0 + shifter; /* log2(e) */
    double n = kd - shifter;
    double r = x - n * 0x1.62e42fee00000p-1 - n * 0x1.a39ef35793c76p-33; /* ln2 hi, lo */
    double q = 0x1.af389ecfc4b9cp-26;
    q = q * r + 0x1.28917c89a43a7p-22;
    q = q * r + 0x1.71de0db2f6b19p-19;
    q = q * r + 0x1.a019b9149a41cp-16;
    q = q * r + 0x1.a01a01a7c2efep-13;
    q = q * r + 0x1.6c16c17889ef1p-10;
    q = q * r + 0x1.11111111109b5p-7;
    q = q * r + 0x1.5555555553d68p-5;
    q = q * r + 0x1.5555555555556p-3;
    q = q * r + 0x1.0000000000001p-1;
    double p = 1.0 + (r + r * r * q);
    int64_t k = (int64_t)(bits_of_f64(kd) - bits_of_f64(shifter)), half = k >> 1;
    double lo, hi;
    bits_f64 b_lo = (bits_f64)(half + 1023) << 52, b_hi = (bits_f64)(k - half + 1023) << 52;
    memcpy(&lo, &b_lo, sizeof lo);
    memcpy(&hi, &b_hi, sizeof hi);
    return p * lo * hi;
}

#if !VECTOR && defined(__AVX2__) && defined(__FMA__)
#define EXP4 1
#include <immintrin.h>
/* exp_dev of 4 lanes in AVX2 instructions for the builds without AVX-512 (their compiled
 * loops around exp_dev kept it scalar, or spilled registers: several times this one's
 * time, benchmarks/bench_graph.py), step for step the scalar function as exp_dev8 is: bit
 * for bit its results (test_native.py). AVX2 has no 64-bit arithmetic shift: half = floor(k / 2) is the logical
 * shift of k + 2048 (|k| <= 1155 once x is clamped; a NaN's k is any value and its result
 * NaN whatever the two factors). */
static inline __m256d exp_dev4(__m256d x) {
    const __m256d shifter = _mm256_set1_pd(0x1.8p52);
    x = _mm256_min_pd(_mm256_set1_pd(800.0), _mm256_max_pd(_mm256_set1_pd(-800.0), x));
    __m256d kd = _mm256_fmadd_pd(x, _mm256_set1_pd(0x1.71547652b82fep0), shifter);
    __m256d n = _mm256_sub_pd(kd, shifter);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0x1.62e42fee00000p-1), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0x1.a39ef35793c76p-33), r);
    __m256d q = _mm256_set1_pd(0x1.af389ecfc4b9cp-26);
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.28917c89a43a7p-22));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.71de0db2f6b19p-19));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.a019b9149a41cp-16));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.a01a01a7c2efep-13));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.6c16c17889ef1p-10));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.11111111109b5p-7));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.5555555553d68p-5));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.5555555555556p-3));
    q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0x1.0000000000001p-1));
    __m256d p = _mm256_add_pd(_mm256_set1_pd(1.0),
                              _mm256_fmadd_pd(_mm256_mul_pd(r, r), q, r));
    __m256i k = _mm256_sub_epi64(_mm256_castpd_si256(kd), _mm256_castpd_si256(shifter));
    __m256i half = _mm256_sub_epi64(
        _mm256_srli_epi64(_mm256_add_epi64(k, _mm256_set1_epi64x(2048)), 1),
        _mm256_set1_epi64x(1024));
    __m256i bias = _mm256_set1_epi64x(1023);
    __m256i lo = _mm256_slli_epi64(_mm256_add_epi64(half, bias), 52);
    __m256i hi = _mm256_slli_epi64(_mm256_add_epi64(_mm256_sub_epi64(k, half), bias), 52);
    return _mm256_mul_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(lo)), _mm256_castsi256_pd(hi));
}
/* The lanes of 4 elements from m on, the first `left` of them (at most 4 mask bytes read):
 * all ones where specified, 0 elsewhere and past `left`; as 64-bit lanes (lanes4_f64) and as
 * 32-bit lanes (lanes4_f32). */
static inline __m128i mask_bytes4(const uint8_t *m, int64_t left) {
    uint32_t bytes = 0;
    if (left >= 4)
        memcpy(&bytes, m, 4);
    else
        for (int64_t i = 0; i < left; i++) bytes |= (uint32_t)m[i] << (8 * i);
    return _mm_cvtsi32_si128((int)bytes);
}
static inline __m256i lanes4_f64(const uint8_t *m, int64_t left) {
    return _mm256_cmpgt_epi64(_mm256_cvtepu8_epi64(mask_bytes4(m, left)),
                              _mm256_setzero_si256());
}
static inline __m128i lanes4_f32(const uint8_t *m, int64_t left) {
    return _mm_cmpgt_epi32(_mm_cvtepu8_epi32(mask_bytes4(m, left)), _mm_setzero_si128());
}
/* The first `left` of 4 lanes (all ones), 64- and 32-bit. */
static inline __m256i first4_f64(int64_t left) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(left), _mm256_setr_epi64x(0, 1, 2, 3));
}
static inline __m128i first4_f32(int64_t left) {
    return _mm_cmpgt_epi32(_mm_set1_epi32((int)(left < 4 ? left : 4)), _mm_setr_epi32(0, 1, 2, 3));
}
/* 4 elements of T as a vector (FOUR_T), loaded where `in`, stored where `in`, widened to
 * doubles (a float32 exactly) and narrowed back, and the vector ops the softmax takes. */
#define FOUR_f64 __m256d
#define FOUR_f32 __m128
#define IN4_f64(left) first4_f64(left)
#define IN4_f32(left) first4_f32(left)
#define KEEP4_f64(m, left) lanes4_f64(m, left)
#define KEEP4_f32(m, left) lanes4_f32(m, left)
#define LOAD4_f64(in, p) _mm256_maskload_pd(p, in)
#define LOAD4_f32(in, p) _mm_maskload_ps(p, in)
#define LOADU4_f64(p) _mm256_loadu_pd(p)
#define LOADU4_f32(p) _mm_loadu_ps(p)
#define STOREU4_f64(p, x) _mm256_storeu_pd(p, x)
#define STOREU4_f32(p, x) _mm_storeu_ps(p, x)
#define DIV4_f64(x, y) _mm256_div_pd(x, y)
#define DIV4_f32(x, y) _mm_div_ps(x, y)
#define STORE4_f64(p, in, x) _mm256_maskstore_pd(p, in, x)
#define STORE4_f32(p, in, x) _mm_maskstore_ps(p, in, x)
#define WIDEN4_f64(x) (x)
#define WIDEN4_f32(x) _mm256_cvtps_pd(x)
#define NARROW4_f64(x) (x)
#define NARROW4_f32(x) _mm256_cvtpd_ps(x)
#define AND4_f64(x, k) _mm256_and_pd(x, _mm256_castsi256_pd(k))
#define AND4_f32(x, k) _mm_and_ps(x, _mm_castsi128_ps(k))
#define SUB4_f64(x, y) _mm256_sub_pd(x, y)
#define SUB4_f32(x, y) _mm_sub_ps(x, y)
#define SET4_f64(c) _mm256_set1_pd(c)
#define SET4_f32(c) _mm_set1_ps(c)
#define SETR4_f64(a, b, c, d) _mm256_setr_pd(a, b, c, d)
#define SETR4_f32(a, b, c, d) _mm_setr_ps(a, b, c, d)
#else
#define EXP4 0
#endif

/* -- sums of a function of the deviations --------------------------------------------- */
/* Per group, the sum over its specified elements of f(v - center), in double, for
 *   sqdev   f(d) = d^2     the second pass of a masked variance (the center is the group's
 *                          mean, from the sum kernels);
 *   sumexp  f(d) = e^d     the second pass of a masked logsumexp (the center is the
 *                          group's max; Note [Native exp]);
 * in one pass, instead of expanding the centers onto the elements, filling, applying f and
 * summing. The center is one value (all), one per output line (lines: center[i] for
 * out[i]) or one per group (scatter: center[index[j]] for element j). An unspecified
 * element adds +0.0 (f of its deviation, whatever v and the center hold, is dropped by a
 * mask register or replaced by 0 with bit logic); a specified NaN or inf makes the group's
 * sum NaN (or inf), as in the composed path. */
#define DEV_sqdev(d) ((d) * (d))
#define DEV_sumexp(d) exp_dev(d)
/* The bits of the deviation an unspecified element reads in bit logic: f of it is +0.0. */
#define DROP_sqdev 0                     /* 0.0 */
#define DROP_sumexp 0xFFF0000000000000u  /* -inf */
#if VECTOR
/* exp_dev of 8 lanes in AVX-512 instructions, step for step the scalar function with
 * each `a * b + c` as one fma (as the compiler contracts the scalar code): bit for bit
 * the same results (4e5 points, test_native.py). The scalar function in a simd
 * loop over an array of 8 was slower on an Intel build (the compiler vectorized it in
 * 256-bit halves; the 512-bit store and the halves' loads defeat store forwarding). max_pd(lo, x) and min_pd(hi, x) return x where x is NaN, as the scalar
 * comparisons do. */
static inline __m512d exp_dev8(__m512d x) {
    const __m512d shifter = _mm512_set1_pd(0x1.8p52);
    x = _mm512_min_pd(_mm512_set1_pd(800.0), _mm512_max_pd(_mm512_set1_pd(-800.0), x));
    __m512d kd = _mm512_fmadd_pd(x, _mm512_set1_pd(0x1.71547652b82fep0), shifter);
    __m512d n = _mm512_sub_pd(kd, shifter);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0x1.62e42fee00000p-1), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0x1.a39ef35793c76p-33), r);
    __m512d q = _mm512_set1_pd(0x1.af389ecfc4b9cp-26);
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.28917c89a43a7p-22));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.71de0db2f6b19p-19));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.a019b9149a41cp-16));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.a01a01a7c2efep-13));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.6c16c17889ef1p-10));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.11111111109b5p-7));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.5555555553d68p-5));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.5555555555556p-3));
    q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(0x1.0000000000001p-1));
    __m512d p = _mm512_add_pd(_mm512_set1_pd(1.0),
                              _mm512_fmadd_pd(_mm512_mul_pd(r, r), q, r));
    __m512i k = _mm512_sub_epi64(_mm512_castpd_si512(kd), _mm512_castpd_si512(shifter));
    __m512i half = _mm512_srai_epi64(k, 1), bias = _mm512_set1_epi64(1023);
    __m512i lo = _mm512_slli_epi64(_mm512_add_epi64(half, bias), 52);
    __m512i hi = _mm512_slli_epi64(_mm512_add_epi64(_mm512_sub_epi64(k, half), bias), 52);
    __m512d scaled = _mm512_mul_pd(p, _mm512_castsi512_pd(lo));
    return _mm512_mul_pd(scaled, _mm512_castsi512_pd(hi));
}
/* One step: f of the 8 deviations d, added to acc where k. */
#define VDEV_sqdev(acc, k, d) ((acc) = _mm512_mask3_fmadd_pd(d, d, acc, k))
#define VDEV_sumexp(acc, k, d) ((acc) = _mm512_mask_add_pd(acc, k, acc, exp_dev8(d)))
/* As VRANGE's sums: 8 elements a step widened to doubles, minus the center, f of it joined
 * under the step's mask into one of 4 accumulators; the partial block by masked loads. */
#define DEV_RANGE(T, OP)                                                                 \
    static inline __attribute__((always_inline)) double OP##_range_##T(                  \
        const T *v, const uint8_t *m, int64_t a, int64_t b, double c) {                  \
        const __m512d center = _mm512_set1_pd(c);                                        \
        __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), \
                          _mm512_setzero_pd()};                                          \
        int64_t i = a;                                                                   \
        for (; i + 64 <= b; i += 64)                                                     \
            for (int q = 0; q < 8; q++) {                                                \
                __m512d d = _mm512_sub_pd(WIDEN_##T(LOAD8_##T(v + i + q * 8)), center);  \
                VDEV_##OP(acc[q % 4], (__mmask8)mask_bits_at(m + i + q * 8, 8), d);      \
            }                                                                            \
        if (i < b) {                                                                     \
            __mmask64 k = mask_bits_tail(m + i, b - i);                                  \
            for (int q = 0; q * 8 < b - i; q++) {                                        \
                __mmask8 kq = (__mmask8)(k >> (q * 8));                                  \
                __m512d d = _mm512_sub_pd(WIDEN_##T(LOAD8Z_##T(kq, v + i + q * 8)), center); \
                VDEV_##OP(acc[0], kq, d);                                                \
            }                                                                            \
        }                                                                                \
        acc[0] = _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])); \
        return _mm512_reduce_add_pd(acc[0]);                                             \
    }
#else
/* As RANGE: one simd loop from LONG_RUN elements, LANES accumulators from LANES. */
#define DEV_STEP(OP, s, j) ((s) += DEV_##OP(keep_f64((double)v[j] - c, m[j], DROP_##OP)))
#define DEV_RANGE(T, OP)                                                                 \
    static inline __attribute__((always_inline)) double OP##_range_##T(                  \
        const T *v, const uint8_t *m, int64_t a, int64_t b, double c) {                  \
        double s = 0;                                                                    \
        int64_t j = a;                                                                   \
        if (b - a >= LONG_RUN) {                                                         \
            PRAGMA(omp simd reduction(+ : s))                                            \
            for (int64_t i = a; i < b; i++) DEV_STEP(OP, s, i);                          \
            return s;                                                                    \
        }                                                                                \
        if (b - a >= LANES) {                                                            \
            double acc[LANES] = {0};                                                     \
            for (; j + LANES <= b; j += LANES)                                           \
                for (int k = 0; k < LANES; k++) DEV_STEP(OP, acc[k], j + k);             \
            for (int k = 0; k < LANES; k++) s += acc[k];                                 \
        }                                                                                \
        for (; j < b; j++) DEV_STEP(OP, s, j);                                           \
        return s;                                                                        \
    }
#endif

/* The scatter kernels' blocks of 64 (DEV_VSCATTER_op). sqdev squares each entry as it
 * adds it to its group (in the entries' loop: a vector pass over a block's list, with a
 * gather of the centers, measured slower); sumexp takes exp_dev of a whole
 * block's list first, 8 entries a step, to a multiple of 8 entries: those past c, from
 * earlier blocks or zeroed, hold checked groups. The portable build leaves the steps to
 * the compiler (an omp simd loop, faster than a scalar exp_dev per entry); the AVX-512
 * one gathers the 8 centers and takes exp_dev8 (the compiler's simd loop may run in
 * 256-bit halves, as on an Intel build). */
#if VECTOR
/* 8 elements of a T array p at the int64 lanes g */
#define GATHERT8_f64(g, p) _mm512_i64gather_pd(g, p, 8)
#define GATHERT8_f32(g, p) _mm512_i64gather_ps(g, p, 4)
#define EXP_LIST(T, c)                                                                   \
    do {                                                                                 \
        for (int q = 0; q < (((c) + 7) & ~7); q += 8) {                                  \
            __m512i g8 = _mm512_loadu_si512(gs + q);                                     \
            __m512d c8 = WIDEN_##T(GATHERT8_##T(g8, center));                            \
            __m512d d8 = _mm512_sub_pd(_mm512_loadu_pd(xs + q), c8);                     \
            _mm512_storeu_pd(xs + q, exp_dev8(d8));                                      \
        }                                                                                \
    } while (0)
#else
#define EXP_LIST(T, c)                                                                   \
    do {                                                                                 \
        PRAGMA(omp simd)                                                                 \
        for (int q = 0; q < (((c) + 7) & ~7); q++)                                       \
            xs[q] = exp_dev(xs[q] - (double)center[gs[q]]);                              \
    } while (0)
#endif
#if VECTOR
/* As the sums' scatter (VSCATTER_BLOCKS): the specified entries of each block of 64. */
#define SQDEV_ENTRY(g, x)                                                                \
    do {                                                                                 \
        double d_ = (x) - (double)center[g];                                             \
        out[g] += d_ * d_;                                                               \
    } while (0)
#define DEV_VSCATTER_sqdev(T, I) VSCATTER_BLOCKS(T, I, NO_LIST, SQDEV_ENTRY)
#define DEV_VSCATTER_sumexp(T, I) VSCATTER_BLOCKS(T, I, EXP_LIST, SCATTER_ENTRY_sum)
#else
/* Portable: sqdev in the scalar loop; sumexp in blocks of 64 elements, every index
 * checked first, the exps in one simd loop (EXP_LIST), then each masked to +0.0 where
 * unspecified and added to its group in storage order. */
#define DEV_VSCATTER_sqdev(T, I)
#define DEV_VSCATTER_sumexp(T, I)                                                        \
    for (; j + 64 <= n; j += 64) {                                                       \
        uint64_t bad = 0;                                                                \
        for (int q = 0; q < 64; q++)                                                     \
            bad |= (uint64_t)(int64_t)index[j + q] >= (uint64_t)nout;                    \
        if (bad) return -1;                                                              \
        for (int q = 0; q < 64; q++) gs[q] = (int64_t)index[j + q];                      \
        for (int q = 0; q < 64; q++) xs[q] = (double)v[j + q];                           \
        EXP_LIST(T, 64);                                                                 \
        for (int q = 0; q < 64; q++) out[gs[q]] += keep_f64(xs[q], m[j + q], 0);         \
    }
#endif

/* out[index[j]] += f(v[j] - center[index[j]]) where m[j], into nout groups (doubles), in
 * storage order, every index checked before it is read: blocks of 64 (DEV_VSCATTER_op),
 * the rest (or all) in one scalar loop. */
#define DEV_SCATTER(T, OP, I)                                                            \
    int ms_scatter_##OP##_##T##_##I(const T *v, const uint8_t *m, int64_t n,             \
                                    const I *index, const T *center, double *out,        \
                                    int64_t nout) {                                      \
        int64_t j = 0, gs[64] = {0};                                                     \
        double xs[64] = {0};                                                             \
        (void)gs, (void)xs; /* sumexp's block lists */                                   \
        for (int64_t g = 0; g < nout; g++) out[g] = 0;                                   \
        DEV_VSCATTER_##OP(T, I);                                                         \
        for (; j < n; j++) {                                                             \
            uint64_t g = (uint64_t)(int64_t)index[j];                                    \
            if (g >= (uint64_t)nout) return -1;                                          \
            double d = keep_f64((double)v[j] - (double)center[g], m[j], DROP_##OP);     \
            out[g] += DEV_##OP(d);                                                       \
        }                                                                                \
        return 0;                                                                        \
    }

#define DEV_KERNELS(T, OP)                                                               \
    DEV_RANGE(T, OP)                                                                     \
    int ms_all_##OP##_##T(const T *v, const uint8_t *m, int64_t n, const T *center,      \
                          T *out) {                                                      \
        *out = (T)OP##_range_##T(v, m, 0, n, (double)*center);                           \
        return 0;                                                                        \
    }                                                                                    \
    int ms_lines_##OP##_##T(const T *v, const uint8_t *m, int64_t n,                     \
                            const int64_t *offsets, int64_t nlines_all,                  \
                            const int64_t *lines, int64_t nlines, const T *center,       \
                            T *out) {                                                    \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            LINE_BOUNDS(i, a, b);                                                        \
            out[i] = (T)OP##_range_##T(v, m, a, b, (double)center[i]);                   \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    DEV_SCATTER(T, OP, i64) DEV_SCATTER(T, OP, i32) DEV_SCATTER(T, OP, u16)
DEV_KERNELS(f64, sqdev)
DEV_KERNELS(f32, sqdev)
DEV_KERNELS(f64, sumexp)
DEV_KERNELS(f32, sumexp)

/* -- logsumexp in one call -------------------------------------------------------------
 * Per line (all: one line of every element), the masked logsumexp step for step as the
 * composed path computes it (layouts/kernels/logsumexp.py, its torch ops): top, the
 * max of the specified elements (NaN where one is NaN), replaced by 0 where it is not
 * finite; the sum of exp(v - top) over the specified elements (the sumexp pass, in
 * double, rounded to T); log of that sum plus top, in T. A line without a specified
 * element is 0 (the caller's result mask leaves it unspecified). One call instead of two
 * kernels and the torch ops between them: the line's elements are read again from L1.
 * scatter: the same passes over the whole input, group by group in scratch arrays. */
#define LOG_f64(x) log(x)
#define LOG_f32(x) logf(x)
#define LSE_KERNELS(T)                                                                   \
    static inline T lse_range_##T(const T *v, const uint8_t *m, int64_t a, int64_t b) {  \
        if (count_range(m, a, b) == 0) return 0;                                         \
        T top = max_range_##T(v, m, a, b, (T)-INFINITY, bits_of_##T((T)-INFINITY));     \
        if (!isfinite(top)) top = 0;                                                     \
        T total = (T)sumexp_range_##T(v, m, a, b, (double)top);                          \
        return LOG_##T(total) + top;                                                     \
    }                                                                                    \
    int ms_all_logsumexp_##T(const T *v, const uint8_t *m, int64_t n, T *out) {          \
        *out = lse_range_##T(v, m, 0, n);                                                \
        return 0;                                                                        \
    }                                                                                    \
    int ms_lines_logsumexp_##T(const T *v, const uint8_t *m, int64_t n,                  \
                               const int64_t *offsets, int64_t nlines_all,               \
                               const int64_t *lines, int64_t nlines, T *out) {           \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            LINE_BOUNDS(i, a, b);                                                        \
            out[i] = lse_range_##T(v, m, a, b);                                          \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    LSE_SCATTER(T, i64) LSE_SCATTER(T, i32) LSE_SCATTER(T, u16)
/* Into nout groups: the max pass (out holds each group's top), the sumexp pass around it
 * into the caller's double scratch `sums`, then log(sum) + top; 0 where `specified[g]` is
 * 0 (the caller knows which groups have a specified element; an all -inf group's sum is 0
 * as well). The passes check every index. */
#define LSE_SCATTER(T, I)                                                                \
    int ms_scatter_logsumexp_##T##_##I(const T *v, const uint8_t *m, int64_t n,          \
                                       const I *index, const uint8_t *specified,         \
                                       double *sums, T *out, int64_t nout) {             \
        if (ms_scatter_max_##T##_##I(v, m, n, index, (T)-INFINITY, out, nout)) return -1; \
        for (int64_t g = 0; g < nout; g++)                                               \
            if (!isfinite(out[g])) out[g] = 0;                                           \
        if (ms_scatter_sumexp_##T##_##I(v, m, n, index, out, sums, nout)) return -1;     \
        for (int64_t g = 0; g < nout; g++)                                               \
            out[g] = specified[g] ? LOG_##T((T)sums[g]) + out[g] : 0;                    \
        return 0;                                                                        \
    }
LSE_KERNELS(f64)
LSE_KERNELS(f32)

/* -- softmax in one call ---------------------------------------------------------------
 * Per line (all: one line of every element), the masked softmax or log_softmax of the
 * specified elements, step for step as the composed path (layouts/kernels/softmax.py,
 * its torch ops): top, the max of the specified elements (a +inf or NaN max, or
 * every element -inf, makes the group NaN, as torch.softmax; the composed path's shift
 * of a -inf max to 0 changes no specified result, so it is not taken here); d = v - top
 * in T; e = exp(d) rounded to T (the kernels' exp, Note [Native exp]); the group's
 * total, the sum of e over its specified elements in double rounded to T; then e / total
 * (softmax) or d - log(total) (log_softmax) where specified, 0 elsewhere. out receives e
 * (softmax) or d (log_softmax), then the result in place. The mask is never a branch
 * (bit logic, keep_T: a branch on a random mask mispredicts). Over a group index
 * (columns: ms_scatter_softmax below) the same steps in three passes; a first version
 * with the compiler's exp loops was slower than the composed route on large inputs, the
 * explicit AVX-512 passes are faster (benchmarks/bench_reductions.py's softmax over
 * columns). */
#if VECTOR
/* The sum of e = exp(v - top) (d = v - top in T, e rounded to T) over the specified
 * elements of [a, b), 8 a step: out receives d (take_log) or e (softmax; 0 where
 * unspecified). */
#define SUB8_f64(x, c) _mm512_sub_pd(x, _mm512_set1_pd(c))
#define SUB8_f32(x, c) _mm256_sub_ps(x, _mm256_set1_ps(c))
#define NARROW8_f64(x) (x)
#define NARROW8_f32(x) _mm512_cvtpd_ps(x)
#define STORE8_f64(p, k, x) _mm512_mask_storeu_pd(p, k, x)
#define STORE8_f32(p, k, x) _mm256_mask_storeu_ps(p, k, x)
#define MASKZ8_f64(k, x) _mm512_maskz_mov_pd(k, x)
#define MASKZ8_f32(k, x) _mm256_maskz_mov_ps(k, x)
#define SOFTMAX_EXPS(T)                                                                  \
    static inline double softmax_exps_##T(const T *v, const uint8_t *m, int64_t a,       \
                                          int64_t b, T top, int take_log, T *out) {      \
        __m512d acc = _mm512_setzero_pd();                                               \
        for (int64_t j = a; j < b; j += 8) {                                             \
            __mmask8 in = b - j >= 8 ? 0xFF : (__mmask8)((1u << (b - j)) - 1);           \
            __mmask8 k = (__mmask8)mask_bits_tail(m + j, b - j < 8 ? b - j : 8);         \
            EIGHT_##T d = SUB8_##T(LOAD8Z_##T(in, v + j), top);                          \
            EIGHT_##T e = MASKZ8_##T(k, NARROW8_##T(exp_dev8(WIDEN_##T(d))));            \
            STORE8_##T(out + j, in, take_log ? d : e);                                   \
            acc = _mm512_add_pd(acc, WIDEN_##T(e));                                      \
        }                                                                                \
        return _mm512_reduce_add_pd(acc);                                                \
    }
#elif EXP4
/* As above, 4 a step (exp_dev4); the last, partial step by masked loads and stores. */
#define SOFTMAX_EXPS(T)                                                                  \
    static inline double softmax_exps_##T(const T *v, const uint8_t *m, int64_t a,       \
                                          int64_t b, T top, int take_log, T *out) {      \
        __m256d acc = _mm256_setzero_pd();                                               \
        for (int64_t j = a; j < b; j += 4) {                                             \
            const int64_t left = b - j;                                                  \
            FOUR_##T d = SUB4_##T(LOAD4_##T(IN4_##T(left), v + j), SET4_##T(top));       \
            FOUR_##T e = AND4_##T(NARROW4_##T(exp_dev4(WIDEN4_##T(d))),                  \
                                  KEEP4_##T(m + j, left));                               \
            STORE4_##T(out + j, IN4_##T(left), take_log ? d : e);                        \
            acc = _mm256_add_pd(acc, WIDEN4_##T(e));                                     \
        }                                                                                \
        double lanes[4];                                                                 \
        _mm256_storeu_pd(lanes, acc);                                                    \
        return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);                            \
    }
#else
#define SOFTMAX_EXPS(T)                                                                  \
    static inline double softmax_exps_##T(const T *v, const uint8_t *m, int64_t a,       \
                                          int64_t b, T top, int take_log, T *out) {      \
        double s = 0;                                                                    \
        PRAGMA(omp simd reduction(+ : s))                                                \
        for (int64_t j = a; j < b; j++) {                                                \
            T d = (T)(v[j] - top);                                                       \
            T e = keep_##T((T)exp_dev((double)d), m[j], 0);                              \
            out[j] = take_log ? d : e;                                                   \
            s += (double)e;                                                              \
        }                                                                                \
        return s;                                                                        \
    }
#endif
#define SOFTMAX_KERNELS(T)                                                               \
    SOFTMAX_EXPS(T)                                                                      \
    static inline void softmax_range_##T(const T *v, const uint8_t *m, int64_t a,        \
                                         int64_t b, int take_log, T *out) {              \
        T top = max_range_##T(v, m, a, b, (T)-INFINITY, bits_of_##T((T)-INFINITY));      \
        T total = (T)softmax_exps_##T(v, m, a, b, top, take_log, out);                   \
        if (take_log) {                                                                  \
            T lt = LOG_##T(total);                                                       \
            for (int64_t j = a; j < b; j++) out[j] = keep_##T(out[j] - lt, m[j], 0);     \
        } else {                                                                         \
            for (int64_t j = a; j < b; j++) out[j] = keep_##T(out[j] / total, m[j], 0);  \
        }                                                                                \
    }                                                                                    \
    int ms_all_softmax_##T(const T *v, const uint8_t *m, int64_t n, int take_log,        \
                           T *out) {                                                     \
        softmax_range_##T(v, m, 0, n, take_log, out);                                    \
        return 0;                                                                        \
    }                                                                                    \
    /* every line's elements: offsets from 0 to n, each line listed once at most (the    \
     * caller's `lines` are the non-empty ones) */                                       \
    int ms_lines_softmax_##T(const T *v, const uint8_t *m, int64_t n,                    \
                             const int64_t *offsets, int64_t nlines_all,                 \
                             const int64_t *lines, int64_t nlines, int take_log,         \
                             T *out) {                                                   \
        if (offsets[0] != 0 || offsets[nlines_all] != n) return -1;                      \
        SOFTMAX_LINES(T)                                                                 \
        return 0;                                                                        \
    }
#if VECTOR
/* Line by line: a short line is one masked step or two. */
#define SOFTMAX_LINES(T)                                                                 \
    for (int64_t i = 0; i < nlines; i++) {                                               \
        LINE_BOUNDS(i, a, b);                                                            \
        softmax_range_##T(v, m, a, b, take_log, out);                                    \
    }
#define SOFTMAX_SHIFTED(T)
#else
/* Short lines (a graph's neighbours: a few dozen) paid a vector loop's setup and tail per
 * line, half again the time of a long line's elements. So the same steps in three
 * passes: each line's top written over its elements; one flat pass over every element of
 * e = exp(v - top) (d in T, e rounded to T, 0 where unspecified: softmax_shifted); then
 * each line's total (in double, in storage order) and its results, for log_softmax from
 * d recomputed (the line's top again). */
#define SOFTMAX_LINES(T)                                                                 \
    for (int64_t i = 0; i < nlines; i++) {                                               \
        LINE_BOUNDS(i, a, b);                                                            \
        T top = max_range_##T(v, m, a, b, (T)-INFINITY, bits_of_##T((T)-INFINITY));      \
        for (int64_t j = a; j < b; j++) out[j] = top;                                    \
    }                                                                                    \
    softmax_shifted_##T(v, m, n, out);                                                   \
    for (int64_t i = 0; i < nlines; i++) {                                               \
        LINE_BOUNDS(i, a, b);                                                            \
        double s = 0;                                                                    \
        for (int64_t j = a; j < b; j++) s += (double)out[j];                             \
        T total = (T)s;                                                                  \
        if (take_log) {                                                                  \
            T top = max_range_##T(v, m, a, b, (T)-INFINITY, bits_of_##T((T)-INFINITY));  \
            T lt = LOG_##T(total);                                                       \
            for (int64_t j = a; j < b; j++)                                              \
                out[j] = keep_##T((T)(v[j] - top) - lt, m[j], 0);                        \
        } else {                                                                         \
            for (int64_t j = a; j < b; j++) out[j] = keep_##T(out[j] / total, m[j], 0);  \
        }                                                                                \
    }
#if EXP4
#define SOFTMAX_SHIFTED(T)                                                               \
    static inline void softmax_shifted_##T(const T *v, const uint8_t *m, int64_t n,      \
                                           T *out) {                                     \
        int64_t j = 0;                                                                   \
        for (; j + 4 <= n; j += 4) {                                                     \
            FOUR_##T d = SUB4_##T(LOADU4_##T(v + j), LOADU4_##T(out + j));               \
            STOREU4_##T(out + j, AND4_##T(NARROW4_##T(exp_dev4(WIDEN4_##T(d))),          \
                                          KEEP4_##T(m + j, 4)));                         \
        }                                                                                \
        if (j < n) {                                                                     \
            const int64_t left = n - j;                                                  \
            FOUR_##T d = SUB4_##T(LOAD4_##T(IN4_##T(left), v + j),                       \
                                  LOAD4_##T(IN4_##T(left), out + j));                    \
            STORE4_##T(out + j, IN4_##T(left),                                           \
                       AND4_##T(NARROW4_##T(exp_dev4(WIDEN4_##T(d))),                    \
                                KEEP4_##T(m + j, left)));                                \
        }                                                                                \
    }
#else
#define SOFTMAX_SHIFTED(T)                                                               \
    static inline void softmax_shifted_##T(const T *v, const uint8_t *m, int64_t n,      \
                                           T *out) {                                     \
        PRAGMA(omp simd)                                                                 \
        for (int64_t j = 0; j < n; j++)                                                  \
            out[j] = keep_##T((T)exp_dev((double)(T)(v[j] - out[j])), m[j], 0);          \
    }
#endif
#endif
SOFTMAX_SHIFTED(f64)
SOFTMAX_SHIFTED(f32)
SOFTMAX_KERNELS(f64)
SOFTMAX_KERNELS(f32)

/* Into nout groups of an index (columns of a row-major matrix): the steps of
 * softmax_range over each group's elements in storage order (the totals summed in that
 * order, where softmax_range adds 8 lanes: they may differ in the last bit). The max pass
 * (tops: each group's top, the scatter max kernel, which checks every index); then d, e
 * and out per element, e added to its group's double sum (the caller's scratch `sums`) in
 * storage order; then each group's total rounded to T (its log for log_softmax) into
 * tops, and out divided (shifted) by it, 0 where unspecified. With AVX-512 the element
 * passes take 8 a step, the tops and totals gathered, exp_dev8, the sums added one lane at
 * a time. */
#if VECTOR
#define VSUB8_f64(x, y) _mm512_sub_pd(x, y)
#define VSUB8_f32(x, y) _mm256_sub_ps(x, y)
#define VDIV8_f64(x, y) _mm512_div_pd(x, y)
#define VDIV8_f32(x, y) _mm256_div_ps(x, y)
#define SOFTMAX_EXPS8(T, I)                                                              \
    for (; j + 8 <= n; j += 8) {                                                         \
        __m512i g8 = IDX8_##I(index + j);                                                \
        __mmask8 k = (__mmask8)mask_bits_at(m + j, 8);                                   \
        EIGHT_##T d = VSUB8_##T(LOAD8_##T(v + j), GATHERT8_##T(g8, tops));               \
        EIGHT_##T e = MASKZ8_##T(k, NARROW8_##T(exp_dev8(WIDEN_##T(d))));                \
        STORE8_##T(out + j, 0xFF, take_log ? d : e);                                     \
        int64_t gs[8];                                                                   \
        double es[8];                                                                    \
        _mm512_storeu_si512(gs, g8);                                                     \
        _mm512_storeu_pd(es, WIDEN_##T(e));                                              \
        for (int q = 0; q < 8; q++) sums[gs[q]] += es[q];                                \
    }
#define SOFTMAX_SCALE8(T, I)                                                             \
    for (; j + 8 <= n; j += 8) {                                                         \
        __m512i g8 = IDX8_##I(index + j);                                                \
        __mmask8 k = (__mmask8)mask_bits_at(m + j, 8);                                   \
        EIGHT_##T x = LOAD8_##T(out + j), t = GATHERT8_##T(g8, tops);                    \
        STORE8_##T(out + j, 0xFF,                                                        \
                   MASKZ8_##T(k, take_log ? VSUB8_##T(x, t) : VDIV8_##T(x, t)));         \
    }
#elif EXP4
/* 4 a step: the tops and totals read one by one, exp_dev4, the sums added one lane at a
 * time (in storage order, as the scalar step). */
#define GATHER4(T, p, g) SETR4_##T(p[g[0]], p[g[1]], p[g[2]], p[g[3]])
#define SOFTMAX_EXPS8(T, I)                                                              \
    for (; j + 4 <= n; j += 4) {                                                         \
        const int64_t g[4] = {(int64_t)index[j], (int64_t)index[j + 1],                  \
                              (int64_t)index[j + 2], (int64_t)index[j + 3]};             \
        FOUR_##T d = SUB4_##T(LOADU4_##T(v + j), GATHER4(T, tops, g));                   \
        FOUR_##T e = AND4_##T(NARROW4_##T(exp_dev4(WIDEN4_##T(d))), KEEP4_##T(m + j, 4)); \
        STOREU4_##T(out + j, take_log ? d : e);                                          \
        double es[4];                                                                    \
        _mm256_storeu_pd(es, WIDEN4_##T(e));                                             \
        for (int q = 0; q < 4; q++) sums[g[q]] += es[q];                                 \
    }
#define SOFTMAX_SCALE8(T, I)                                                             \
    for (; j + 4 <= n; j += 4) {                                                         \
        const int64_t g[4] = {(int64_t)index[j], (int64_t)index[j + 1],                  \
                              (int64_t)index[j + 2], (int64_t)index[j + 3]};             \
        FOUR_##T x = LOADU4_##T(out + j), t = GATHER4(T, tops, g);                       \
        STOREU4_##T(out + j, AND4_##T(take_log ? SUB4_##T(x, t) : DIV4_##T(x, t),        \
                                      KEEP4_##T(m + j, 4)));                             \
    }
#else
#define SOFTMAX_EXPS8(T, I)
#define SOFTMAX_SCALE8(T, I)
#endif
#define SOFTMAX_SCATTER(T, I)                                                            \
    int ms_scatter_softmax_##T##_##I(const T *v, const uint8_t *m, int64_t n,            \
                                     const I *index, int take_log, T *tops,              \
                                     double *sums, T *out, int64_t nout) {               \
        if (ms_scatter_max_##T##_##I(v, m, n, index, (T)-INFINITY, tops, nout)) return -1; \
        for (int64_t g = 0; g < nout; g++) sums[g] = 0;                                  \
        int64_t j = 0;                                                                   \
        SOFTMAX_EXPS8(T, I)                                                              \
        for (; j < n; j++) {                                                             \
            int64_t g = (int64_t)index[j];                                               \
            T d = (T)(v[j] - tops[g]);                                                   \
            T e = keep_##T((T)exp_dev((double)d), m[j], 0);                              \
            out[j] = take_log ? d : e;                                                   \
            sums[g] += (double)e;                                                        \
        }                                                                                \
        for (int64_t g = 0; g < nout; g++)                                               \
            tops[g] = take_log ? LOG_##T((T)sums[g]) : (T)sums[g];                       \
        j = 0;                                                                           \
        SOFTMAX_SCALE8(T, I)                                                             \
        for (; j < n; j++) {                                                             \
            T t = tops[(int64_t)index[j]];                                               \
            out[j] = keep_##T(take_log ? out[j] - t : out[j] / t, m[j], 0);              \
        }                                                                                \
        return 0;                                                                        \
    }
SOFTMAX_SCATTER(f64, i64) SOFTMAX_SCATTER(f64, i32) SOFTMAX_SCATTER(f64, u16)
SOFTMAX_SCATTER(f32, i64) SOFTMAX_SCATTER(f32, i32) SOFTMAX_SCATTER(f32, u16)

/* -- running sums along lines ----------------------------------------------------------
 * Per line (offsets from 0 to n, every element in one line, in order), the running sum of
 * v restarting at the line, in double, rounded to T at every element: torch.cumsum's steps
 * on each line (its CPU kernel accumulates float32 in double too), so bit for bit its
 * result. The caller has filled unspecified elements with 0. */
#define CUMSUM_KERNEL(T)                                                                 \
    int ms_lines_cumsum_##T(const T *v, int64_t n, const int64_t *offsets,               \
                            int64_t nlines, T *out) {                                    \
        if (offsets[0] != 0 || offsets[nlines] != n) return -1;                          \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            int64_t a = offsets[i], b = offsets[i + 1];                                  \
            if (a > b) return -1; /* from 0 to n, non-decreasing: within [0, n] */       \
            double s = 0;                                                                \
            for (int64_t j = a; j < b; j++) out[j] = (T)(s += (double)v[j]);             \
        }                                                                                \
        return 0;                                                                        \
    }
CUMSUM_KERNEL(f64)
CUMSUM_KERNEL(f32)

/* -- mean and variance in one call -----------------------------------------------------
 * Per line (all: one line of every element; scatter: per group of an index), the masked
 * mean and variance step for step as the composed paths (the torch ops of
 * layouts/kernels/moments.py): c, the count of specified elements; their sum in
 * double rounded to T; the mean in T, sum / max(c, 1). With `var` (NULL: the mean alone,
 * specified where c > 0): the squared deviations from that mean (the sqdev pass, in
 * double, rounded to T); dof = c - correction in float32 (as torch computes an int64
 * count minus a Python float); the variance sqdev / dof where dof > 0, else 0, specified
 * there. scatter: the caller's cached counts and a double scratch `sums` (nout each; NULL: an
 * array on the stack, for at most SCATTER_STACK groups, else -2); the sum pass checks
 * every index. */
#define MOMENTS_OUT(T, c, sq, correction, i)                                             \
    do {                                                                                 \
        if (!var) {                                                                      \
            specified[i] = (c) > 0;                                                      \
            break;                                                                       \
        }                                                                                \
        float dof_ = (float)(c) - (float)(correction);                                   \
        var[i] = dof_ > 0 ? (T)(sq) / (T)dof_ : 0;                                       \
        specified[i] = dof_ > 0;                                                         \
    } while (0)
#define MOMENTS_KERNELS(T)                                                               \
    static inline void moments_range_##T(const T *v, const uint8_t *m, int64_t a,       \
                                         int64_t b, double correction, T *var, T *mean,  \
                                         uint8_t *specified, int64_t i) {                \
        int64_t c = count_range(m, a, b);                                                \
        T mu = (T)sum_range_##T(v, m, a, b, 0.0, 0) / (T)(c > 0 ? c : 1);                \
        mean[i] = mu;                                                                    \
        MOMENTS_OUT(T, c, var ? (T)sqdev_range_##T(v, m, a, b, (double)mu) : 0,          \
                    correction, i);                                                      \
    }                                                                                    \
    int ms_all_moments_##T(const T *v, const uint8_t *m, int64_t n, double correction,   \
                           T *var, T *mean, uint8_t *specified) {                        \
        moments_range_##T(v, m, 0, n, correction, var, mean, specified, 0);              \
        return 0;                                                                        \
    }                                                                                    \
    int ms_lines_moments_##T(const T *v, const uint8_t *m, int64_t n,                    \
                             const int64_t *offsets, int64_t nlines_all,                 \
                             const int64_t *lines, int64_t nlines, double correction,    \
                             T *var, T *mean, uint8_t *specified) {                      \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            LINE_BOUNDS(i, a, b);                                                        \
            moments_range_##T(v, m, a, b, correction, var, mean, specified, i);          \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    MOMENTS_SCATTER(T, i64) MOMENTS_SCATTER(T, i32) MOMENTS_SCATTER(T, u16)
#define MOMENTS_SCATTER(T, I)                                                            \
    int ms_scatter_moments_##T##_##I(const T *v, const uint8_t *m, int64_t n,            \
                                     const I *index, const int64_t *counts,              \
                                     double correction, double *sums, T *var, T *mean,   \
                                     uint8_t *specified, int64_t nout) {                 \
        double stack_[SCATTER_STACK]; /* the sums when the caller passes none */          \
        if (!sums) {                                                                     \
            if (nout > SCATTER_STACK) return -2;                                         \
            sums = stack_;                                                               \
        }                                                                                \
        if (ms_scatter_sum_##T##_##I(v, m, n, index, 0, sums, nout)) return -1;          \
        for (int64_t g = 0; g < nout; g++)                                               \
            mean[g] = (T)sums[g] / (T)(counts[g] > 0 ? counts[g] : 1);                   \
        if (var && ms_scatter_sqdev_##T##_##I(v, m, n, index, mean, sums, nout))         \
            return -1;                                                                   \
        for (int64_t g = 0; g < nout; g++)                                               \
            MOMENTS_OUT(T, counts[g], (T)sums[g], correction, g);                        \
        return 0;                                                                        \
    }
MOMENTS_KERNELS(f64)
MOMENTS_KERNELS(f32)

/* -- backward of the reductions ---------------------------------------------------------
 * The gradient of a grouped reduction with respect to its stored values, in one pass that
 * writes every element: out[j] = m[j] ? f(...) : +0.0, where f reads the element's x[j]
 * and y[j] (value arrays of n) and its group's a[g], b[g] (arrays of one per group: per
 * listed line i for the lines kernel, per group index[j] for the scatter kernel):
 *
 *   expand       a                       sum (a = grad), mean (a = grad / count)
 *   dev          (x - b) * a  [+ c]      var (a = 2 grad / dof, b = the mean; c, when not
 *                                        NULL, one more per-group term: the mean's gradient)
 *   exp          a * exp(x - b)          logsumexp (a = grad, b = the logsumexp)
 *   softmax      x * (y - a)             softmax (x = its output, y = grad, a = the
 *                                        group's sum of x * y)
 *   log_softmax  y - exp(x) * a          log_softmax (x = its output, y = grad, a = the
 *                                        group's sum of y)
 *   ties         (x == b) ? a / t : 0    amax / amin (b = the extreme, t = the group's
 *                                        count of specified elements equal to it: the
 *                                        gradient split evenly among the ties, as torch's)
 *
 * each step in the value type T, in the order the composed torch-op backward of
 * layouts/kernels/ computes it, so that the results are that backward's bits (the exps: the
 * kernels' exp of Note [Native exp], rounded to T, within an ULP of torch's). Where a
 * product feeds a sum or difference (dev with c, log_softmax) the two run as separate
 * loops, so that the compiler never contracts them into one fma (a different rounding).
 * What an unspecified element holds (NaN, inf) is dropped by the bit logic of keep_T: it
 * never reaches the result. One pass instead of the composed backward's gather of the group's
 * values onto every element, its arithmetic and its fill
 * (benchmarks/bench_training_reductions.py). Ties: the lines kernel writes a at a line's
 * ties while it counts them, and again a / t only where a line has more than one (a / 1 is
 * a); the scatter kernel takes a first pass that counts them per group into the caller's
 * scratch `shares` (nout doubles). `out` (restrict) is the caller's fresh array: no
 * input shares its memory, so that the compiler vectorizes the loops that count as they
 * write. */
enum { BW_EXPAND, BW_DEV, BW_EXP, BW_SOFTMAX, BW_LOG_SOFTMAX, BW_TIES };

/* exp_dev of xs[0] .. xs[c - 1] in place, c a multiple of 8 (the exps of the backward's
 * blocks): exp_dev8 with AVX-512 (as the forward's sumexp), else a simd loop the compiler
 * vectorizes (a scalar exp_dev per element would not be). */
static inline void exps_in_place(double *xs, int c) {
#if VECTOR
    for (int q = 0; q < c; q += 8) _mm512_storeu_pd(xs + q, exp_dev8(_mm512_loadu_pd(xs + q)));
#else
    PRAGMA(omp simd)
    for (int q = 0; q < c; q++) xs[q] = exp_dev(xs[q]);
#endif
}

/* The elements lo .. hi - 1 of one op, A(j), B(j), C(j) the group values of element j and
 * SHARE(j) its share of a tie (a, b, c of its line, or gathered per group); c_on: C is
 * added (dev). Exps go by blocks of 64: their arguments in double into xs, exps_in_place,
 * then the results. */
#define BACKWARD_LOOP(T, A, B, C, SHARE, c_on)                                           \
    do {                                                                                 \
        double xs[64];                                                                   \
        switch (op) {                                                                    \
        case BW_EXPAND:                                                                  \
            for (int64_t j = lo; j < hi; j++) out[j] = keep_##T(A(j), m[j], 0);          \
            break;                                                                       \
        case BW_DEV:                                                                     \
            for (int64_t j = lo; j < hi; j++) out[j] = keep_##T((x[j] - B(j)) * A(j), m[j], 0); \
            if (c_on)                                                                    \
                for (int64_t j = lo; j < hi; j++) out[j] = keep_##T(C(j) + out[j], m[j], 0); \
            break;                                                                       \
        case BW_EXP:                                                                     \
        case BW_LOG_SOFTMAX:                                                             \
            for (int64_t j0 = lo; j0 < hi; j0 += 64) {                                   \
                int cnt = hi - j0 < 64 ? (int)(hi - j0) : 64;                            \
                for (int q = cnt; q < 64; q++) xs[q] = 0;                                \
                if (op == BW_EXP)                                                        \
                    for (int q = 0; q < cnt; q++) {                                        \
                        T d = x[j0 + q] - B(j0 + q);                                     \
                        xs[q] = (double)d;                                               \
                    }                                                                    \
                else                                                                     \
                    for (int q = 0; q < cnt; q++) xs[q] = (double)x[j0 + q];               \
                exps_in_place(xs, (cnt + 7) & ~7);                                         \
                if (op == BW_EXP)                                                        \
                    for (int q = 0; q < cnt; q++)                                          \
                        out[j0 + q] = keep_##T(A(j0 + q) * (T)xs[q], m[j0 + q], 0);      \
                else { /* the product stored first: never contracted with the difference */ \
                    for (int q = 0; q < cnt; q++) out[j0 + q] = (T)xs[q] * A(j0 + q);      \
                    for (int q = 0; q < cnt; q++)                                          \
                        out[j0 + q] = keep_##T(y[j0 + q] - out[j0 + q], m[j0 + q], 0);   \
                }                                                                        \
            }                                                                            \
            break;                                                                       \
        case BW_SOFTMAX:                                                                 \
            for (int64_t j = lo; j < hi; j++) out[j] = keep_##T(x[j] * (y[j] - A(j)), m[j], 0); \
            break;                                                                       \
        default: /* BW_TIES */                                                           \
            for (int64_t j = lo; j < hi; j++)                                            \
                out[j] = keep_##T((T)SHARE(j), (m[j] != 0) & (x[j] == B(j)), 0);            \
        }                                                                                \
    } while (0)

/* The lines backward kernel of the AVX-512 build with 256-bit vectors (GCC): its loops run
 * once per line, a few dozen elements of varying length, and with 512-bit vectors their
 * alignment peeling and tails (trip counts that change from line to line) cost more than
 * the work; explicit 512-bit steps with a masked last step measured slower still (their
 * unaligned stores split cache lines). benchmarks/bench_training_reductions.py, along
 * dim 1. The arithmetic is the same element by element: the bits do not change. */
#if VECTOR && defined(__GNUC__) && !defined(__clang__)
#define LINES_BACKWARD_WIDTH __attribute__((target("prefer-vector-width=256")))
#else
#define LINES_BACKWARD_WIDTH
#endif
/* BW_EXPAND (out[j] = m[j] ? a[its line] : +0.0) along lines with AVX-512 as one pass over
 * the elements, W at a time, instead of a loop per line: a sparse matrix's lines are a few
 * dozen elements of ragged length, and per line the loop's setup and scalar tail (its
 * length changing from line to line, so its branches mispredict) cost more than the
 * stores. A step takes its line's value, and where a line ends inside the step, the next
 * line's from that lane on (a blend): without a branch while the lines are at least a step
 * long; a step that holds more than one line end is redone by a loop. Applies where the
 * listed lines tile 0 .. n in order (checked first, a pass over the lines); returns 1
 * where they do not (the per-line loop then runs, and reports bad bounds). The same
 * values as the per-line loop. */
#if VECTOR
#define LINE_END(i) offsets[(lines ? lines[i] : (i)) + 1]
/* Note [Streaming stores]: the one-pass kernels below write a fresh gradient the size of
 * the values. Past the private caches, a plain store first reads each cache line it fills
 * (a read for ownership): memory traffic that is not needed, as every line of `out` is
 * written whole, and that evicts the values the kernel reads. There the steps' stores are
 * non-temporal (`stream`, 64-byte aligned: torch's allocations are), fenced at the end;
 * the scalar stores (short lines, the tail, a line rewritten for its ties) stay plain,
 * which the core orders with its own streamed stores. `benchmarks.bench_training_reductions`
 * measures the effect (forward + backward along lines). */
#define STREAM_MIN_BYTES ((int64_t)4 << 20)
static inline int streamed(const void *out, int64_t bytes) {
    return bytes >= STREAM_MIN_BYTES && ((uintptr_t)out & 63) == 0;
}
#define STORE_OUT(T, nt, p, v)                                                           \
    do {                                                                                 \
        if (nt)                                                                          \
            VOP(T, stream)(p, v);                                                        \
        else                                                                             \
            VOP(T, storeu)(p, v);                                                        \
    } while (0)
/* True where the listed lines (every line where `lines` is NULL) are non-empty and tile
 * the elements 0 .. n in order: what the one-pass kernels below read them as. */
static int lines_tile(int64_t n, const int64_t *offsets, int64_t nlines_all,
                      const int64_t *lines, int64_t nlines) {
    int64_t end = 0;
    for (int64_t i = 0; i < nlines; i++) {
        const uint64_t r = lines ? (uint64_t)lines[i] : (uint64_t)i;
        if (r >= (uint64_t)nlines_all || offsets[r] != end || offsets[r + 1] <= end) return 0;
        end = offsets[r + 1];
    }
    return nlines > 0 && end == n;
}
/* (in expand_stream) the line after line i: where it ends and its value, or n and line
 * i's own past the last line; then moving on to it */
#define EXPAND_AFTER(T)                                                                  \
    do {                                                                                 \
        const int64_t k_ = i + 1 < nlines ? i + 1 : i;                                   \
        after = i + 1 < nlines ? LINE_END(k_) : n, nv = VOP(T, set1)(a[k_]);             \
    } while (0)
#define EXPAND_NEXT_LINE(T)                                                              \
    do {                                                                                 \
        if (i + 1 < nlines) {                                                            \
            i++, next = after, av = nv;                                                  \
            EXPAND_AFTER(T);                                                             \
        }                                                                                \
    } while (0)
#define EXPAND_STREAM(T)                                                                 \
    static int expand_stream_##T(const uint8_t *m, int64_t n, const int64_t *offsets,    \
                                 int64_t nlines_all, const int64_t *lines,               \
                                 int64_t nlines, const T *a, T *restrict out) {          \
        enum { W = SCAN_W_##T };                                                         \
        const unsigned full = (1u << W) - 1;                                             \
        if (!lines_tile(n, offsets, nlines_all, lines, nlines)) return 1;                \
        const int nt = streamed(out, n * (int64_t)sizeof(T));                           \
        /* line i holds element j and ends at next; the line after it ends at after (read a \
         * step ahead: the loads stay off the chain from one step to the next) */          \
        int64_t i = 0, next = LINE_END(0), after = nlines > 1 ? LINE_END(1) : n, j = 0;  \
        VEC_##T av = VOP(T, set1)(a[0]), nv = VOP(T, set1)(a[nlines > 1 ? 1 : 0]);       \
        for (; j + W <= n; j += W) {                                                     \
            const int64_t sh = next - j; /* >= 1: the lane where line i ends */           \
            const __mmask16 spec = mask_bits_at(m + j, W);                               \
            if (sh >= W) { /* no line end inside this step: line i's value */             \
                STORE_OUT(T, nt, out + j, VOP(T, maskz_mov)(spec, av));                    \
                if (sh == W) EXPAND_NEXT_LINE(T); /* line i ends with this step */       \
                continue;                                                                \
            }                                                                            \
            if (after > j + W) { /* one line end inside: blend, then the next line */     \
                const __mmask16 from = (__mmask16)((full << sh) & full);                 \
                STORE_OUT(T, nt, out + j, VOP(T, maskz_mov)(spec, VOP(T, mask_mov)(av, from, nv))); \
                EXPAND_NEXT_LINE(T);                                                     \
                continue;                                                                \
            }                                                                            \
            /* several line ends in this step (lines shorter than a step) */             \
            VEC_##T vals = av;                                                           \
            int64_t ii = i, nx = next;                                                   \
            while (nx < j + W && ii + 1 < nlines) {                                      \
                ii++;                                                                    \
                vals = VOP(T, mask_mov)(vals, (__mmask16)((full << (nx - j)) & full),     \
                                        VOP(T, set1)(a[ii]));                            \
                nx = LINE_END(ii);                                                       \
            }                                                                            \
            STORE_OUT(T, nt, out + j, VOP(T, maskz_mov)(spec, vals));                      \
            while (nx <= j + W && ii + 1 < nlines) nx = LINE_END(++ii);                  \
            i = ii, next = nx, av = VOP(T, set1)(a[ii]);                                 \
            EXPAND_AFTER(T);                                                             \
        }                                                                                \
        for (; j < n; j++) { /* the last, partial step */                                \
            while (next <= j && i + 1 < nlines) next = LINE_END(++i);                    \
            out[j] = keep_##T(a[i], m[j], 0);                                            \
        }                                                                                \
        if (nt) _mm_sfence(); /* the streamed stores, visible before the caller goes on */ \
        return 0;                                                                        \
    }
EXPAND_STREAM(f64)
EXPAND_STREAM(f32)

/* BW_TIES along lines the same way (amax / amin: a at the specified elements equal to the
 * line's extreme b, +0.0 elsewhere; a / t at each where a line has t > 1 ties): one pass of
 * steps, each comparing with its line's b (blended where a line ends inside it), counting
 * each line's ties; a line found with several is rewritten at its end with the share, as
 * the per-line loop does. */
#define TIES_AFTER(T)                                                                    \
    do {                                                                                 \
        const int64_t k_ = i + 1 < nlines ? i + 1 : i;                                   \
        after = i + 1 < nlines ? LINE_END(k_) : n;                                       \
        nv = VOP(T, set1)(a[k_]), nb = VOP(T, set1)(b[k_]);                              \
    } while (0)
#define TIES_SPLIT(T) /* line i (start .. next) is written: split it among its t ties */ \
    do {                                                                                 \
        if (t > 1) {                                                                     \
            const T share = a[i] / (T)t, b_ = b[i];                                      \
            for (int64_t q = start; q < next; q++)                                       \
                out[q] = keep_##T(share, (m[q] != 0) & (x[q] == b_), 0);                 \
        }                                                                                \
    } while (0)
#define TIES_END_OF_LINE(T) /* line i is written: split it among its ties, move on */    \
    do {                                                                                 \
        TIES_SPLIT(T);                                                                   \
        if (i + 1 < nlines) {                                                            \
            start = next, i++, next = after, av = nv, bv = nb, t = 0;                    \
            TIES_AFTER(T);                                                               \
        }                                                                                \
    } while (0)
#define TIES_STREAM(T)                                                                   \
    static int ties_stream_##T(const T *x, const uint8_t *m, int64_t n,                  \
                               const int64_t *offsets, int64_t nlines_all,               \
                               const int64_t *lines, int64_t nlines, const T *a,         \
                               const T *b, T *restrict out) {                            \
        enum { W = SCAN_W_##T };                                                         \
        const unsigned full = (1u << W) - 1;                                             \
        if (!lines_tile(n, offsets, nlines_all, lines, nlines)) return 1;                \
        const int nt = streamed(out, n * (int64_t)sizeof(T));                           \
        int64_t i = 0, start = 0, next = LINE_END(0), after = 0, t = 0, j = 0;           \
        VEC_##T av = VOP(T, set1)(a[0]), bv = VOP(T, set1)(b[0]), nv, nb;                \
        TIES_AFTER(T);                                                                   \
        for (; j + W <= n; j += W) {                                                     \
            const int64_t sh = next - j; /* >= 1: the lane where line i ends */           \
            const __mmask16 spec = mask_bits_at(m + j, W);                               \
            const VEC_##T v = VOP(T, loadu)(x + j);                                      \
            if (sh >= W) { /* no line end inside this step */                            \
                const __mmask16 hits = SCAN_CMP_##T(spec, v, bv, _CMP_EQ_OQ);            \
                t += __builtin_popcount(hits);                                           \
                STORE_OUT(T, nt, out + j, VOP(T, maskz_mov)(hits, av));                    \
                if (sh == W) TIES_END_OF_LINE(T);                                        \
                continue;                                                                \
            }                                                                            \
            if (after > j + W) { /* one line end inside: blend, count on both sides */   \
                const __mmask16 from = (__mmask16)((full << sh) & full);                 \
                const __mmask16 hits = SCAN_CMP_##T(spec, v, VOP(T, mask_mov)(bv, from, nb), \
                                                    _CMP_EQ_OQ);                         \
                STORE_OUT(T, nt, out + j, VOP(T, maskz_mov)(hits, VOP(T, mask_mov)(av, from, nv))); \
                t += __builtin_popcount(hits & ~from & full);                            \
                TIES_END_OF_LINE(T);                                                     \
                t = __builtin_popcount(hits & from);                                     \
                continue;                                                                \
            }                                                                            \
            for (int64_t q = j; q < j + W; q++) { /* several line ends: element by element */ \
                while (next <= q) TIES_END_OF_LINE(T);                                   \
                const uint8_t hit = (uint8_t)((m[q] != 0) & (x[q] == b[i]));             \
                t += hit;                                                                \
                out[q] = keep_##T(a[i], hit, 0);                                         \
            }                                                                            \
            if (next == j + W) TIES_END_OF_LINE(T);                                      \
        }                                                                                \
        for (; j < n; j++) { /* the last, partial step */                                \
            while (next <= j) TIES_END_OF_LINE(T);                                       \
            const uint8_t hit = (uint8_t)((m[j] != 0) & (x[j] == b[i]));                 \
            t += hit;                                                                    \
            out[j] = keep_##T(a[i], hit, 0);                                             \
        }                                                                                \
        TIES_SPLIT(T); /* the last line */                                               \
        if (nt) _mm_sfence(); /* the streamed stores, visible before the caller goes on */ \
        return 0;                                                                        \
    }
TIES_STREAM(f64)
TIES_STREAM(f32)
#define EXPAND_STREAM_OR_LOOP(T)                                                         \
    if (op == BW_EXPAND && expand_stream_##T(m, n, offsets, nlines_all, lines, nlines, a, out) == 0) \
        return 0;                                                                        \
    if (op == BW_TIES && ties_stream_##T(x, m, n, offsets, nlines_all, lines, nlines, a, b, out) == 0) \
        return 0;
#else
#define EXPAND_STREAM_OR_LOOP(T)
#endif
#define BW_LINE(j) a_
#define BW_LINE_B(j) b_
#define BW_LINE_C(j) c_
#define BW_LINE_SHARE(j) a_ /* (the lines' ties are written before) */
#define BW_GROUP(j) a[index[j]]
#define BW_GROUP_B(j) b[index[j]]
#define BW_GROUP_C(j) c[index[j]]
#define BW_GROUP_SHARE(j) shares[index[j]]
#define BACKWARD_KERNELS(T)                                                              \
    /* every line's elements: offsets from 0 to n, each line listed once at most (the    \
     * caller's `lines` are the non-empty ones); a, b, c: one per listed line */          \
    LINES_BACKWARD_WIDTH                                                                 \
    int ms_lines_backward_##T(const T *x, const T *y, const uint8_t *m, int64_t n,       \
                              const int64_t *offsets, int64_t nlines_all,                \
                              const int64_t *lines, int64_t nlines, int op, const T *a,  \
                              const T *b, const T *c, T *restrict out) {                 \
        if (op < BW_EXPAND || op > BW_TIES) return -1;                                   \
        if (offsets[0] != 0 || offsets[nlines_all] != n) return -1;                      \
        EXPAND_STREAM_OR_LOOP(T)                                                         \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            LINE_BOUNDS(i, lo, hi);                                                      \
            const T a_ = a[i], b_ = b ? b[i] : 0, c_ = c ? c[i] : 0;                     \
            if (op == BW_TIES) { /* a_ at the ties, then a_ / t where t > 1 (a_ / 1 is a_) */ \
                int32_t t = 0;                                                           \
                for (int64_t j = lo; j < hi; j++) {                                      \
                    uint8_t hit = (uint8_t)((m[j] != 0) & (x[j] == b_));                \
                    t += hit;                                                            \
                    out[j] = keep_##T(a_, hit, 0);                                       \
                }                                                                        \
                const T share = a_ / (T)t;                                               \
                if (t > 1)                                                               \
                    for (int64_t j = lo; j < hi; j++)                                    \
                        out[j] = keep_##T(share, (m[j] != 0) & (x[j] == b_), 0);           \
                continue;                                                                \
            }                                                                            \
            BACKWARD_LOOP(T, BW_LINE, BW_LINE_B, BW_LINE_C, BW_LINE_SHARE, c != NULL);   \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    BACKWARD_SCATTER(T, i64) BACKWARD_SCATTER(T, i32) BACKWARD_SCATTER(T, u16)
/* Every index checked first (a pass of its own, so that nothing is written before a bad
 * index is found; for ties the pass that counts them per group into the caller's scratch
 * `shares`, then each group's share a / count, in T, kept there as a double), then one
 * pass over the elements, the group's a, b, c gathered per element. */
#define BACKWARD_SCATTER(T, I)                                                           \
    int ms_scatter_backward_##T##_##I(const T *x, const T *y, const uint8_t *m,          \
                                      int64_t n, const I *index, int op, const T *a,     \
                                      const T *b, const T *c, double *shares,            \
                                      T *restrict out, int64_t nout) {                   \
        if (op < BW_EXPAND || op > BW_TIES) return -1;                                   \
        uint64_t bad = 0;                                                                \
        if (op == BW_TIES) {                                                             \
            for (int64_t g = 0; g < nout; g++) shares[g] = 0;                            \
            for (int64_t j = 0; j < n; j++) {                                            \
                uint64_t g = (uint64_t)(int64_t)index[j];                                \
                if (g >= (uint64_t)nout) return -1;                                      \
                shares[g] += (double)((m[j] != 0) & (x[j] == b[g]));                     \
            }                                                                            \
            for (int64_t g = 0; g < nout; g++) shares[g] = (double)(a[g] / (T)shares[g]); \
        } else {                                                                         \
            for (int64_t j = 0; j < n; j++)                                              \
                bad |= (uint64_t)(int64_t)index[j] >= (uint64_t)nout;                    \
            if (bad) return -1;                                                          \
        }                                                                                \
        const int64_t lo = 0, hi = n;                                                    \
        BACKWARD_LOOP(T, BW_GROUP, BW_GROUP_B, BW_GROUP_C, BW_GROUP_SHARE, c != NULL);   \
        return 0;                                                                        \
    }
BACKWARD_KERNELS(f64)
BACKWARD_KERNELS(f32)

/* The softmax's gradient along lines in one call: per listed line, total = the masked sum
 * of y * x (the products rounded to T, summed by sum_range as ms_lines_sum does, rounded
 * to T), then out[j] = m[j] ? x[j] * (y[j] - total) : +0.0 (BW_SOFTMAX). x is the softmax's
 * output, y the gradient; the composed route's multiply, lines sum and backward pass step
 * for step, so the same bits, with out as the products' scratch. Offsets from 0 to n, each
 * line listed once at most (every element in a listed line); -1 on a bad bound. */
#define SOFTMAX_BACKWARD_KERNELS(T)                                                      \
    int ms_lines_softmax_backward_##T(const T *x, const T *y, const uint8_t *m,          \
                                      int64_t n, const int64_t *offsets,                 \
                                      int64_t nlines_all, const int64_t *lines,          \
                                      int64_t nlines, T *restrict out) {                 \
        if (offsets[0] != 0 || offsets[nlines_all] != n) return -1;                      \
        const bits_##T zero = bits_of_##T((T)START_sum(0));                              \
        for (int64_t i = 0; i < nlines; i++) {                                           \
            LINE_BOUNDS(i, lo, hi);                                                      \
            for (int64_t j = lo; j < hi; j++) out[j] = y[j] * x[j];                      \
            const T total = (T)sum_range_##T(out, m, lo, hi, START_sum(0), zero);        \
            for (int64_t j = lo; j < hi; j++)                                            \
                out[j] = keep_##T(x[j] * (y[j] - total), m[j], 0);                       \
        }                                                                                \
        return 0;                                                                        \
    }
SOFTMAX_BACKWARD_KERNELS(f64)
SOFTMAX_BACKWARD_KERNELS(f32)

/* -- the per-head product (layouts/_per_head.py) ---------------------------------------
 * One sparse index for H heads: entry e joins output line keep[e] to input line summed[e],
 * with H values v[e, :]; a line holds H heads of W features (the caller's dense operand,
 * row-major).
 * - mm: out[keep[e], h, :] += v[e, h] * d[summed[e], h, :], in storage order (the caller
 *   zeroed out): the product S @ d per head (keep the rows, sum the columns), its
 *   transpose S.T @ d (the roles swapped) and the product's gradient of d;
 * - dot: out[e, h] = sum_w a[keep[e], h, w] * b[summed[e], h, w], in T in feature order (as
 *   the torch ops' sum of the terms; rows are a few dozen features wide, so that a double
 *   sum bought no accuracy worth its conversions): the gradient of the product's values (a
 *   sampled dot).
 * Every index is checked first, in a pass of its own: nothing is written before a bad one
 * is found. The output is a buffer of its own (restrict). */
#define PER_HEAD_CHECK                                                                   \
    uint64_t bad = 0;                                                                    \
    for (int64_t e = 0; e < nnz; e++)                                                    \
        bad |= ((uint64_t)keep[e] >= (uint64_t)nkeep) |                                  \
               ((uint64_t)summed[e] >= (uint64_t)nsummed);                               \
    if (bad) return -1;
/* The loops over the entries for a line of `heads` heads of WIDTH features: WIDTH a
 * constant (PER_HEAD_WIDTHS) the loops unroll into whole vectors, which halved the time of
 * a GAT product's narrow lines (8 features: the runtime-width loop's prologue and
 * epilogue cost as much as its work); any other width reads `width`. */
#define PER_HEAD_MM_LOOP(T, WIDTH)                                                       \
    for (int64_t e = 0; e < nnz; e++) {                                                  \
        T *restrict o = out + keep[e] * line;                                            \
        const T *x = d + summed[e] * line, *w = v + e * heads;                           \
        for (int64_t h = 0; h < heads; h++) {                                            \
            const T c = w[h];                                                            \
            PRAGMA(omp simd)                                                             \
            for (int64_t f = 0; f < (WIDTH); f++)                                        \
                o[h * (WIDTH) + f] += c * x[h * (WIDTH) + f];                            \
        }                                                                                \
    }
/* One head (one-head attention, the last layer, S @ d) and keep sorted (the rows of a
 * coalesced index: the product itself, not its transpose): a row's entries accumulate in
 * registers and the line is stored once, where the loop above reads, adds and writes it for
 * every entry, a chain of dependent stores along the row (benchmarks/bench_graph.py's
 * sizes). The sums are the same, in the same order. Over an unsorted keep (runs of one
 * entry) the run test cost more than it saved: the loop above runs there. */
#define PER_HEAD_MM_RUNS(T, WIDTH)                                                       \
    for (int64_t e = 0; e < nnz;) {                                                      \
        const int64_t row = keep[e];                                                     \
        T *restrict o = out + row * (WIDTH);                                             \
        T acc[(WIDTH)];                                                                  \
        for (int64_t f = 0; f < (WIDTH); f++) acc[f] = o[f];                             \
        do {                                                                             \
            const T c = v[e];                                                            \
            const T *x = d + summed[e] * (WIDTH);                                        \
            PRAGMA(omp simd)                                                             \
            for (int64_t f = 0; f < (WIDTH); f++) acc[f] += c * x[f];                    \
        } while (++e < nnz && keep[e] == row);                                           \
        for (int64_t f = 0; f < (WIDTH); f++) o[f] = acc[f];                             \
    }
#define PER_HEAD_DOT_LOOP(T, WIDTH, SIMD)                                                \
    for (int64_t e = 0; e < nnz; e++) {                                                  \
        const T *x = a + keep[e] * line, *y = b + summed[e] * line;                      \
        for (int64_t h = 0; h < heads; h++) {                                            \
            T s = 0;                                                                     \
            SIMD                                                                         \
            for (int64_t f = 0; f < (WIDTH); f++)                                        \
                s += x[h * (WIDTH) + f] * y[h * (WIDTH) + f];                            \
            out[e * heads + h] = s;                                                      \
        }                                                                                \
    }
/* A constant width sums its lanes as a vector (one reduction a head: summed across the
 * heads the compiler's code shuffled strided loads, three times slower); the runtime
 * width sums in feature order (a vector reduction there measured slower). */
#define PER_HEAD_DOT_FIXED(T, WIDTH)                                                     \
    PER_HEAD_DOT_LOOP(T, WIDTH, PRAGMA(omp simd reduction(+ : s)))
#define PER_HEAD_DOT_ANY(T, WIDTH) PER_HEAD_DOT_LOOP(T, WIDTH, )
/* One case per constant width (every one up to 8: a class count), then the runtime width. */
#define PER_HEAD_WIDTHS(FIXED, ANY, T)                                                   \
    switch (width) {                                                                     \
    case 1: FIXED(T, 1) break;                                                           \
    case 2: FIXED(T, 2) break;                                                           \
    case 3: FIXED(T, 3) break;                                                           \
    case 4: FIXED(T, 4) break;                                                           \
    case 5: FIXED(T, 5) break;                                                           \
    case 6: FIXED(T, 6) break;                                                           \
    case 7: FIXED(T, 7) break;                                                           \
    case 8: FIXED(T, 8) break;                                                           \
    case 16: FIXED(T, 16) break;                                                         \
    case 32: FIXED(T, 32) break;                                                         \
    case 64: FIXED(T, 64) break;                                                         \
    default: ANY(T, width)                                                               \
    }
#define PER_HEAD_KERNELS(T)                                                              \
    int ms_per_head_mm_##T(const int64_t *keep, const int64_t *summed, int64_t nnz,      \
                           int64_t nkeep, int64_t nsummed, const T *v, const T *d,       \
                           int64_t heads, int64_t width, T *restrict out) {              \
        PER_HEAD_CHECK                                                                   \
        const int64_t line = heads * width;                                              \
        uint64_t descents = 0; /* (keep is in cache: the check just read it) */          \
        for (int64_t e = 1; e < nnz; e++) descents |= (uint64_t)(keep[e] < keep[e - 1]); \
        if (heads == 1 && !descents) {                                                   \
            PER_HEAD_WIDTHS(PER_HEAD_MM_RUNS, PER_HEAD_MM_LOOP, T)                       \
        } else {                                                                         \
            PER_HEAD_WIDTHS(PER_HEAD_MM_LOOP, PER_HEAD_MM_LOOP, T)                       \
        }                                                                                \
        return 0;                                                                        \
    }                                                                                    \
    int ms_per_head_dot_##T(const int64_t *keep, const int64_t *summed, int64_t nnz,     \
                            int64_t nkeep, int64_t nsummed, const T *a, const T *b,      \
                            int64_t heads, int64_t width, T *restrict out) {             \
        PER_HEAD_CHECK                                                                   \
        const int64_t line = heads * width;                                              \
        PER_HEAD_WIDTHS(PER_HEAD_DOT_FIXED, PER_HEAD_DOT_ANY, T)                                            \
        return 0;                                                                        \
    }
PER_HEAD_KERNELS(f64)
PER_HEAD_KERNELS(f32)

/* -- compacting (B, L) rows by their mask (layouts/_compact.py) --------------------------
 * One pass over row-major ids and their mask: the ids the mask keeps, in order, written
 * contiguously into out (room for B * L), and offsets[b] the number kept before row b;
 * returns how many were kept. Branch-free: every id is stored at the next free slot and
 * the slot moves on by its mask byte, so a kept id stays and a dropped one is overwritten
 * (the slot written is never past the ids read: out needs no more room than the input). */
#define COMPACT_ROWS_KERNEL(T)                                                           \
    int64_t ms_compact_rows_##T(const T *restrict ids, const uint8_t *restrict m,         \
                                int64_t rows, int64_t length, T *restrict out,           \
                                int64_t *restrict offsets) {                             \
        int64_t k = 0;                                                                   \
        for (int64_t r = 0; r < rows; r++) {                                             \
            const T *x = ids + r * length;                                               \
            const uint8_t *keep = m + r * length;                                        \
            offsets[r] = k;                                                              \
            for (int64_t j = 0; j < length; j++) {                                       \
                out[k] = x[j];                                                           \
                k += keep[j] != 0;                                                       \
            }                                                                            \
        }                                                                                \
        return k;                                                                        \
    }
typedef int32_t i32;
typedef int64_t i64;
COMPACT_ROWS_KERNEL(i32)
COMPACT_ROWS_KERNEL(i64)

/* -- SGD with momentum on the specified entries (layouts/_sgd.py) -----------------------
 * torch.optim.sgd's foreach step, operation for operation, on the n elements where m is
 * 1, in one pass (the gradient's unspecified values are never read into a result: a
 * select, not arithmetic, so NaN or inf there cannot leak); the elements where m is 0
 * keep their parameter and buffer bits. In torch's order, each in the value type:
 *   d = maximize ? -g : g;  d = d + weight_decay * p   (when weight_decay != 0)
 *   b = first ? d : momentum * b + (1 - dampening) * d
 *   u = nesterov ? d + momentum * b : b;  p = p + (-lr) * u
 * where torch's vector kernels compute `x + alpha * y` as one fused multiply-add (fma
 * here too; a scalar tail of torch's may round the two apart: within an ulp). */
#define SGD_MOMENTUM_KERNEL(T, FMA)                                                      \
    int ms_sgd_momentum_##T(T *restrict p, const T *restrict g, T *restrict buf,          \
                            const uint8_t *restrict m, int64_t n, double lr,              \
                            double momentum, double dampening, double weight_decay,       \
                            int nesterov, int maximize, int first) {                     \
        const T neg_lr = (T)(-lr), mom = (T)momentum, damp = (T)(1 - dampening);         \
        const T wd = (T)weight_decay, sign = maximize ? (T)-1 : (T)1;                    \
        const int decay = weight_decay != 0;                                             \
        PRAGMA(omp simd)                                                                 \
        for (int64_t i = 0; i < n; i++) {                                                \
            const T pi = p[i], bi = buf[i];                                              \
            T d = sign * g[i];                                                           \
            d = decay ? FMA(pi, wd, d) : d;                                              \
            const T b = first ? d : FMA(d, damp, mom * bi);                              \
            const T u = nesterov ? FMA(b, mom, d) : b;                                   \
            const T np = FMA(u, neg_lr, pi);                                             \
            buf[i] = m[i] ? b : bi;                                                      \
            p[i] = m[i] ? np : pi;                                                       \
        }                                                                                \
        return 0;                                                                        \
    }
SGD_MOMENTUM_KERNEL(f64, fma)
SGD_MOMENTUM_KERNEL(f32, fmaf)
