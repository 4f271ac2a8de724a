/* mgk_avx512_emu.h: the AVX-512 and AVX512_BF16 intrinsics that mgk.c's paths use, written as scalar loops over the
   lanes of GCC's own vector types, for a test build only (mgk.c with -DMGK_EMULATE_AVX512; see
   tests/test_native_emulated.py). With it, a CPU that has AVX2 but no AVX-512 runs the avx512 and avx512bf16
   paths' packs, masked tails, micro-kernels and k-pairs. Each function follows the instruction's definition in
   Intel's SDM (reduce_add, a sequence rather than one instruction, adds the lanes in order: GCC's adds halves, so
   the same value up to summation order); the regions of mgk_avx512*.inc that call them then compile for AVX2+FMA, so
   fmadd below is one vfmadd per lane, as a zmm FMA lane is (the same rounding and the same MXCSR flush-to-zero).
   Included after <immintrin.h>: the macros at the end send those files' calls here, and the types stay GCC's. */
#ifndef MGK_AVX512_EMU_H
#define MGK_AVX512_EMU_H
#include <stdint.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"   /* 64-byte vectors without AVX-512: every function here is inlined */
#define EMU __attribute__((target("avx2,fma"), always_inline)) static inline
typedef float emu_f16x __attribute__((vector_size(64)));       /* 16 float lanes */
typedef int32_t emu_i16x __attribute__((vector_size(64)));     /* 16 int32 lanes */
typedef uint16_t emu_h32x __attribute__((vector_size(64)));    /* 32 bf16 halves, as bits */

EMU __m512 emu_setzero_ps(void) { return (__m512)(emu_f16x){0}; }
EMU __m512 emu_set1_ps(float x)
{
    emu_f16x v;
    for (int i = 0; i < 16; i++) v[i] = x;
    return (__m512)v;
}
EMU __m512i emu_set1_epi32(int x)
{
    emu_i16x v;
    for (int i = 0; i < 16; i++) v[i] = x;
    return (__m512i)v;
}
EMU __m512 emu_loadu_ps(const void *p) { emu_f16x v; memcpy(&v, p, 64); return (__m512)v; }
EMU __m512i emu_loadu_si512(const void *p) { emu_i16x v; memcpy(&v, p, 64); return (__m512i)v; }
EMU void emu_storeu_ps(void *p, __m512 v) { memcpy(p, &v, 64); }

/* masked lanes are neither read nor written (a masked load past the end of an array is legal) */
EMU __m512 emu_maskz_loadu_ps(__mmask16 k, const void *p)
{
    emu_f16x v = {0};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) v[i] = ((const float *)p)[i];
    return (__m512)v;
}
EMU void emu_mask_storeu_ps(void *p, __mmask16 k, __m512 v)
{
    emu_f16x x = (emu_f16x)v;
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) ((float *)p)[i] = x[i];
}

EMU __m512 emu_fmadd_ps(__m512 a, __m512 b, __m512 c)        /* a*b + c, one rounding */
{
    emu_f16x x = (emu_f16x)a, y = (emu_f16x)b, z = (emu_f16x)c;
    for (int i = 0; i < 16; i++) z[i] = __builtin_fmaf(x[i], y[i], z[i]);
    return (__m512)z;
}
EMU __m512 emu_add_ps(__m512 a, __m512 b) { return (__m512)((emu_f16x)a + (emu_f16x)b); }
EMU __m512 emu_mul_ps(__m512 a, __m512 b) { return (__m512)((emu_f16x)a * (emu_f16x)b); }
EMU float emu_reduce_add_ps(__m512 a)
{
    emu_f16x x = (emu_f16x)a;
    float s = 0.0f;
    for (int i = 0; i < 16; i++) s += x[i];
    return s;
}
EMU __m256 emu_castps512_ps256(__m512 a) { __m256 r; memcpy(&r, &a, 32); return r; }

/* vdpbf16ps: lane j += a.bf16[2j+1] * b.bf16[2j+1], then += a.bf16[2j] * b.bf16[2j], each step an FMA that
   treats denormal inputs as zero, flushes a denormal result to zero and rounds to nearest even, whatever MXCSR
   says (the SDM's pseudo-code). The products of bf16 values are exact in float32. */
EMU float emu_daz(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;             /* exponent 0: zero or denormal -> signed zero */
    memcpy(&x, &u, 4);
    return x;
}
EMU float emu_bf16_value(uint16_t h) { uint32_t u = (uint32_t)h << 16; float x; memcpy(&x, &u, 4); return emu_daz(x); }
EMU __m512 emu_dpbf16_ps(__m512 src, __m512bh a, __m512bh b)
{
    emu_f16x d = (emu_f16x)src;
    emu_h32x x, y;
    memcpy(&x, &a, 64);
    memcpy(&y, &b, 64);
    for (int j = 0; j < 16; j++) {
        float s = emu_daz(d[j]);
        s = emu_daz(__builtin_fmaf(emu_bf16_value(x[2 * j + 1]), emu_bf16_value(y[2 * j + 1]), s));
        s = emu_daz(__builtin_fmaf(emu_bf16_value(x[2 * j]), emu_bf16_value(y[2 * j]), s));
        d[j] = s;
    }
    return (__m512)d;
}

/* vcvtneps2bf16 and vcvtne2ps2bf16: each float to the nearest bf16, ties to even, a NaN made quiet, a denormal
   input as a zero of its sign, whatever MXCSR says (the SDM's convert_fp32_to_bfloat16) */
EMU uint16_t emu_bf16_bits(float x)
{
    uint32_t u;
    x = emu_daz(x);
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u | 0x00400000u) >> 16);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}
EMU __m256bh emu_cvtneps_pbh(__m512 a)                        /* lane i: a[i] */
{
    emu_f16x x = (emu_f16x)a;
    uint16_t h[16];
    __m256bh r;
    for (int i = 0; i < 16; i++) h[i] = emu_bf16_bits(x[i]);
    memcpy(&r, h, 32);
    return r;
}
EMU __m256bh emu_cvtne2ps_pbh256(__m256 a, __m256 b)          /* lanes 0-7: b, 8-15: a */
{
    float x[16];
    uint16_t h[16];
    __m256bh r;
    memcpy(x, &b, 32);
    memcpy(x + 8, &a, 32);
    for (int i = 0; i < 16; i++) h[i] = emu_bf16_bits(x[i]);
    memcpy(&r, h, 32);
    return r;
}
EMU __m256i emu_permutexvar_epi16_256(__m256i idx, __m256i a)  /* lane j: a[idx[j] mod 16] (vpermw) */
{
    uint16_t i16[16], x[16], r[16];
    memcpy(i16, &idx, 32);
    memcpy(x, &a, 32);
    for (int j = 0; j < 16; j++) r[j] = x[i16[j] & 15];
    memcpy(&idx, r, 32);
    return idx;
}

#define _mm512_setzero_ps emu_setzero_ps
#define _mm512_set1_ps emu_set1_ps
#define _mm512_set1_epi32 emu_set1_epi32
#define _mm512_loadu_ps emu_loadu_ps
#define _mm512_loadu_si512 emu_loadu_si512
#define _mm512_storeu_ps emu_storeu_ps
#define _mm512_maskz_loadu_ps emu_maskz_loadu_ps
#define _mm512_mask_storeu_ps emu_mask_storeu_ps
#define _mm512_fmadd_ps emu_fmadd_ps
#define _mm512_add_ps emu_add_ps
#define _mm512_mul_ps emu_mul_ps
#define _mm512_reduce_add_ps emu_reduce_add_ps
#define _mm512_castps512_ps256 emu_castps512_ps256
#define _mm512_dpbf16_ps emu_dpbf16_ps
#define _mm512_cvtneps_pbh emu_cvtneps_pbh
#define _mm256_cvtne2ps_pbh emu_cvtne2ps_pbh256
#define _mm256_permutexvar_epi16 emu_permutexvar_epi16_256
#endif
