/*
 * kg_flash.cuh: the fused ("flash") causal attention of the cuda
 * accelerator's `attention = "flash"` path, written once for two machines.
 * Its three block programs (the forward; the backward's dK/dV pass and its
 * dQ pass) are templates over an execution policy X. kg_flash.cu
 * instantiates them with kg_fl_dev, a real CUDA block: KG_FL_THREADS
 * threads, __syncthreads, warp shuffles, and the tensor cores through
 * PTX's ldmatrix and mma.sync (m16n8k16, sm_80 and newer).
 * kg_flash_host.cuh's kg_fl_host runs the same programs on the host: each
 * "for each thread / warp / lane" loop visits every one in turn, the
 * barriers are no-ops, and the warp-wide operations are loops over the
 * warp's 32 lanes. Every phase between two barriers is free of races (a
 * thread writes only its own elements and reads only what an earlier phase
 * wrote), so the host's serial order computes what the GPU's parallel one
 * does. That host emulation is what CI tests against the cpu kernels
 * (test_cuda_flash, no GPU), and what the fake cuda accelerator runs;
 * tests/gpu/run.sh tests the device one.
 *
 * Registers, not shared memory, hold everything a warp computes (the
 * design of FlashAttention-2): the scores, the softmax, P and dS, and the
 * accumulators. That is possible because mma.sync's fragment layouts are
 * specified by the PTX ISA, unlike wmma's: a lane knows which rows and
 * columns of an accumulator it holds, so the row max and sums are taken in
 * registers (and across a row's four lanes by shuffles), and an
 * accumulator of scores, rounded, is the next product's A operand without
 * leaving the registers. Shared memory holds only the tiles all four warps
 * read (q, k, v, dO), loaded once per tile and read by ldmatrix. The
 * emulation implements the ISA's layouts (test_cuda_flash checks them
 * element by element against the ISA's tables), poisons shared memory
 * before each block, and fails on races between phases (see
 * kg_flash_host.cuh).
 *
 * Numbers: q, k, v and dO (fp32 in memory, 16-bit values in a
 * mixed-precision step; or OP's own 16 bits, kg_flash_args.s16) are
 * rounded to OP (bf16 or f16) in shared memory.
 * S = q k^T, O += P v, dP = dO v^T and the gradients are tensor-core
 * products with fp32 accumulation. The softmax (max, exponentials, row
 * sums) is fp32 in base 2: scores times scale * log2(e), then exp2f, the
 * hardware's fast exponential; lse goes back to natural units for the ABI.
 * P and dS are rounded to OP for their products, as in the gemm path. The
 * backward is deterministic without atomics: dK and dV are summed by the
 * block owning a key tile, over the query tiles in order; dQ by a second
 * program owning a query tile, over the key tiles in order. The scores are
 * recomputed there: about 40 % more backward work than an atomic dQ, for
 * the same bits on every run.
 *
 * Tiles: KG_FL_BR = KG_FL_BC = 64 rows (queries, keys), 4 warps of 16 rows
 * each; the head size D = 16 * DN for DN in 1, 2, 4, 8. Shared-memory rows
 * are padded (+8 16-bit elements) so that ldmatrix's reads of 8
 * consecutive rows fall in different banks.
 */
#ifndef KILN_KERNELS_CUDA_KG_FLASH_CUH
#define KILN_KERNELS_CUDA_KG_FLASH_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kg_math.cuh"

#define KG_FL_LOG2E 1.44269504088896341f
#define KG_FL_LN2 0.693147180559945309f

#define KG_FL_BR 64
#define KG_FL_BC 64
#define KG_FL_WARPS 4
#define KG_FL_THREADS (32 * KG_FL_WARPS)

/* The three block programs. */
enum { KG_FL_FWD = 0, KG_FL_DKDV = 1, KG_FL_DQ = 2 };

/* One call's operands (kiln/training.h's layouts: qkv(B, T, 3C), out and
 * dout (B, T, C), lse (B, NH, T), delta (B, NH, T) = rowsum(dout * out) in
 * double, dqkv (B, T, 3C)); rd: the rounding of the outputs (KG_BF16 or
 * KG_F16; KG_F32 none); scale = 1/sqrt(D) in float. s16 (ABI 1.7's 16-bit
 * activations): qkv, dout, out, o and dqkv are stored in rd's 16 bits
 * instead of float32 (lse stays float32): the tiles load their bits as
 * they are (OP is rd) and the outputs store the rounding, half the bytes
 * of the float32 call for the same values. A runtime flag, not a template
 * parameter: the branch is uniform over the block and sits only in the
 * global loads and stores, so the programs are not instantiated twice. */
struct kg_flash_args {
    const void *qkv, *dout, *out;
    const float *lse_in;
    const double *delta;
    void *o;
    float *lse;
    void *dqkv;
    int B, T, C, NH, rd;
    float scale;
    int s16;
};

/* Shared-memory layout of one program: byte offsets of each array (0 when
 * absent) and the total. Every array starts 128-byte aligned. Only the
 * tiles the warps share live here (q, k, v, dO: 16-bit, leading dimension
 * kg_fl_lde) and, for the dK/dV program, a query tile's lse and delta;
 * scores, probabilities and accumulators stay in registers. */
struct kg_fl_layout {
    size_t q, k, v, dout, rowa, rowb, bytes;
};

KG_HD size_t kg_fl_up128(size_t n) { return (n + 127) & ~(size_t)127; }

/* The leading dimension of a 16-bit tile of width D, in elements: 8 more
 * than D, so that the eight 16-byte rows an ldmatrix phase reads (rows
 * r..r+7, one column block) start 4 banks apart, in 8 different groups of
 * 4 banks, for every D here (16 bytes of padding a row: D = 64's rows are
 * 36 words apart, 4 past a multiple of 32). */
#define KG_FL_LDE(D) ((D) + 8)
KG_HD int kg_fl_lde(int D) { return KG_FL_LDE(D); }

KG_HD kg_fl_layout kg_fl_layout_of(int prog, int D) {
    kg_fl_layout L = {0, 0, 0, 0, 0, 0, 0};
    const size_t e_tile = kg_fl_up128((size_t)KG_FL_BR * (size_t)kg_fl_lde(D) * 2u);
    const size_t row = kg_fl_up128((size_t)KG_FL_BR * 4u);
    size_t at = 0;
    L.q = at, at += e_tile;
    L.k = at, at += e_tile;
    L.v = at, at += e_tile;
    if (prog != KG_FL_FWD) L.dout = at, at += e_tile;
    if (prog == KG_FL_DKDV) {
        L.rowa = at, at += row;
        L.rowb = at, at += row;
    }
    L.bytes = at;
    return L;
}

/* The shared memory a block needs for head size D: the most of the three
 * programs (kg_flash_smem_bytes). */
KG_HD size_t kg_fl_smem_most(int D) {
    size_t most = 0;
    for (int prog = KG_FL_FWD; prog <= KG_FL_DQ; prog++) {
        const size_t b = kg_fl_layout_of(prog, D).bytes;
        most = b > most ? b : most;
    }
    return most;
}

/* A float rounded to OP's 16 bits, and back. */
template <int OP> KG_HD uint16_t kg_fl_enc(float x) {
    if constexpr (OP == KG_BF16) return kg_bf16_bits(x);
    else return kg_f16_bits(x);
}
template <int OP> KG_HD float kg_fl_dec(uint16_t b) {
    if constexpr (OP == KG_BF16) return kg_bf16_value(b);
    else return kg_f16_value(b);
}

/*
 * The execution policy X. The loops of a phase:
 *   for (int t = X::tid0(); X::tin(t); t += X::tstep())       threads
 *   for (int w = X::warp0(); X::win(w); w += X::wstep())      warps
 *   for (int l = X::lane0(); X::lin(w, l); l += X::lstep())   lanes of w
 * (on the device one pass each: this thread, its warp, its lane; on the
 * host every one in turn, the test telling the policy who runs), with
 * X::sync() (the block's barrier). Shared memory is written and read by
 * the thread loops through X::st / X::ld (the host's race check; plain
 * accesses on the device).
 *
 * Registers. A warp's registers are arrays whose last index is the lane
 * slot, [X::NL]: on the device NL is 1 (a thread holds its own lane's
 * value), on the host 32 (the host runs a lane loop over them). Lane l's
 * slot is X::li(l). What a warp keeps across the block's barriers (its
 * accumulators, its resident fragments) has a first index [X::kSlots],
 * one per warp on the host (which runs the warps in turn), 1 on the
 * device; warp w's is X::slot(w).
 *
 * The warp-wide operations, called by a warp loop's body (every lane of
 * the warp at once, with every lane's slot filled):
 *  - X::template ldsm<TRANS>(r, p): ldmatrix.x4, four 8 x 8 matrices of
 *    16-bit elements from shared memory, lane l giving the address of row
 *    l % 8 of matrix l / 8 (p[X::li(l)], 16 bytes, 16-byte aligned); r[i]
 *    gets matrix i's fragment: lane l holds row l / 4, columns 2 (l % 4)
 *    and 2 (l % 4) + 1 (TRANS = 0), or column l / 4, rows 2 (l % 4) and
 *    2 (l % 4) + 1 (TRANS = 1), the lower index in the lower 16 bits.
 *  - X::template mma<OP>(d, a, b, h): mma.sync m16n8k16, D(16 x 8, float)
 *    += A(16 x 16) B(16 x 8) on OP's 16-bit values, B's two registers
 *    being b[2h] and b[2h + 1] (an ldsm result holds two). Lane l, g = l /
 *    4, c = 2 (l % 4): a[0] = A(g, c..c+1), a[1] = A(g+8, c..c+1), a[2] =
 *    A(g, c+8..c+9), a[3] = A(g+8, c+8..c+9); b[2h] = B(c..c+1, g),
 *    b[2h+1] = B(c+8..c+9, g); d[0], d[1] = D(g, c), D(g, c+1); d[2],
 *    d[3] = D(g+8, c), D(g+8, c+1).
 *  - X::shfl_xor(v, m): every lane's v becomes lane l ^ m's.
 * and per lane, X::template pack2<OP>(lo, hi): two floats rounded to OP
 * into one register, lo in the lower half (mma's operand order).
 *
 * Those layouts are the PTX ISA's (mma's fragments for .m16n8k16 with
 * .bf16/.f16 operands and .f32 accumulators; ldmatrix's), so a program may
 * read an accumulator element by element: lane l holds rows l / 4 and
 * l / 4 + 8 of a warp's 16, which is what the register-resident softmax
 * below is built on. The host policy implements the same layouts from the
 * ISA's definitions, and the products as float sums in increasing k.
 */

#ifdef __CUDACC__
#define KG_FL_HD __host__ __device__ __forceinline__
#define KG_FL_NOCHECK _Pragma("nv_exec_check_disable")
#else
#define KG_FL_HD inline
#define KG_FL_NOCHECK
#endif
#ifdef __CUDA_ARCH__
#define KG_FL_UNROLL _Pragma("unroll")
#else
#define KG_FL_UNROLL
#endif

/* Loads the rows [r0, r0 + 64) of one of q, k, v (which = 0, 1, 2) or of
 * dout (which = 3) for head h of batch element b into a 16-bit tile
 * (leading dimension lde), rows at or past T as zeros.
 *
 * For head sizes of 64 and more, eight elements a thread at a time, stored
 * with one 16-byte store (a quarter warp's eight stores fill 128 bytes of
 * one row: no bank conflict), and read with one 16-byte load (16-bit
 * storage) or two (float32) where the source is 16-byte aligned, which the
 * accelerator's allocations and D, C being multiples of 16 make the usual
 * case; else one element at a time, for the same values. Smaller heads go
 * one element a thread: there a quarter warp's 16-byte stores would span
 * rows that share banks, and 32 two-byte stores fill a row without. */
KG_FL_NOCHECK
template <class X, int OP>
KG_FL_HD void kg_fl_load_rows(const kg_flash_args &a, uint16_t *tile, int which, int b, int h, int D, int r0) {
    const int lde = kg_fl_lde(D);
    const size_t ld = which == 3 ? (size_t)a.C : 3u * (size_t)a.C;
    const size_t off = (size_t)b * (size_t)a.T * ld + (size_t)h * (size_t)D +
                       (which == 3 ? 0u : (size_t)which * (size_t)a.C);
    const void *base = which == 3 ? a.dout : a.qkv;
    const uint16_t *b16 = (const uint16_t *)base;
    const float *b32 = (const float *)base;
    if (D < 64) {
        for (int t = X::tid0(); X::tin(t); t += X::tstep())
            for (int i = t; i < KG_FL_BR * D; i += KG_FL_THREADS) {
                const int r = i / D, d = i % D, row = r0 + r;
                const size_t e = off + (size_t)row * ld + (size_t)d;
                uint16_t v = 0; /* +0 in either format */
                if (row < a.T) v = a.s16 ? b16[e] : kg_fl_enc<OP>(b32[e]);
                X::st(&tile[r * lde + d], v);
            }
        return;
    }
    const size_t esize = a.s16 ? 2u : 4u;
    const bool vec = ((uintptr_t)base + off * esize) % 16u == 0 && (ld * esize) % 16u == 0;
    for (int t = X::tid0(); X::tin(t); t += X::tstep())
        for (int i = 8 * t; i < KG_FL_BR * D; i += 8 * KG_FL_THREADS) {
            const int r = i / D, d = i % D, row = r0 + r;
            const size_t e = off + (size_t)row * ld + (size_t)d;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (row < a.T && vec && a.s16) {
                v = *(const uint4 *)(b16 + e);
            } else if (row < a.T) {
                uint16_t x[8];
                if (vec) {
                    const float4 f0 = *(const float4 *)(b32 + e), f1 = *(const float4 *)(b32 + e + 4);
                    x[0] = kg_fl_enc<OP>(f0.x), x[1] = kg_fl_enc<OP>(f0.y), x[2] = kg_fl_enc<OP>(f0.z);
                    x[3] = kg_fl_enc<OP>(f0.w), x[4] = kg_fl_enc<OP>(f1.x), x[5] = kg_fl_enc<OP>(f1.y);
                    x[6] = kg_fl_enc<OP>(f1.z), x[7] = kg_fl_enc<OP>(f1.w);
                } else {
                    for (int k = 0; k < 8; k++) x[k] = a.s16 ? b16[e + k] : kg_fl_enc<OP>(b32[e + k]);
                }
                /* little-endian, as host and GPU are: element 2k in the low half */
                v.x = (uint32_t)x[0] | (uint32_t)x[1] << 16, v.y = (uint32_t)x[2] | (uint32_t)x[3] << 16;
                v.z = (uint32_t)x[4] | (uint32_t)x[5] << 16, v.w = (uint32_t)x[6] | (uint32_t)x[7] << 16;
            }
            X::st((uint4 *)&tile[r * lde + d], v);
        }
}

/* The key tile from k0: its k rows into Ks, its v rows into Vs. */
KG_FL_NOCHECK
template <class X, int OP>
KG_FL_HD void kg_fl_load_kv(const kg_flash_args &a, uint16_t *Ks, uint16_t *Vs, int b, int h, int D, int k0) {
    kg_fl_load_rows<X, OP>(a, Ks, 1, b, h, D, k0);
    kg_fl_load_rows<X, OP>(a, Vs, 2, b, h, D, k0);
}

/* The key tiles a query tile from q0 sees under the causal mask: up to the
 * one holding its last row (the last position, T - 1, at most). */
KG_HD int kg_fl_key_tiles(int q0, int T) {
    const int qlast = (q0 + KG_FL_BR < T ? q0 + KG_FL_BR : T) - 1;
    return qlast / KG_FL_BC + 1;
}

/*
 * The fragment loads. A 16-bit tile is row-major with leading dimension
 * LDE; "rows" below are its rows.
 *
 * kg_fl_frag_a: the A operand A(i, k) = tile(r0 + i, c0 + k), 16 x 16 (the
 * matrices: rows 0-7 and 8-15 of columns 0-7, then of columns 8-15; lane
 * l gives row l % 16 of column block l / 16). With TRANS = 1 the same
 * addresses give the B operands B(k, n) = tile(r0 + k, c0 + n) of two
 * 8-wide n-tiles: n-tile 0 in r[0], r[1] (h = 0), n-tile 1 in r[2], r[3]
 * (h = 1).
 *
 * kg_fl_frag_bt: the B operands B(k, n) = tile(r0 + n, c0 + k) of two
 * n-tiles (rows r0..r0+7 and r0+8..r0+15), k over 16 columns (the
 * matrices: rows 0-7 of columns 0-7 and 8-15, then rows 8-15 of both; lane
 * l gives row l % 8 + 8 (l / 16) of column block (l / 8) % 2).
 */
KG_FL_NOCHECK
template <class X, int TRANS, int LDE>
KG_FL_HD void kg_fl_frag_a(uint32_t (&r)[4][X::NL], const uint16_t *tile, int r0, int c0, int w) {
    const uint16_t *p[X::NL];
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep())
        p[X::li(l)] = tile + (r0 + (l & 15)) * LDE + c0 + 8 * (l >> 4);
    X::template ldsm<TRANS>(r, p);
}

KG_FL_NOCHECK
template <class X, int LDE>
KG_FL_HD void kg_fl_frag_bt(uint32_t (&r)[4][X::NL], const uint16_t *tile, int r0, int c0, int w) {
    const uint16_t *p[X::NL];
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep())
        p[X::li(l)] = tile + (r0 + (l & 7) + 8 * (l >> 4)) * LDE + c0 + 8 * ((l >> 3) & 1);
    X::template ldsm<0>(r, p);
}

/*
 * S(16 x 64) = A(16 x D) Bt(64 x D)^T, one warp's scores against a tile of
 * 64 keys: s[n] is the accumulator of the n-th block of 8 keys, Bt the 64
 * rows of a 16-bit tile. Two overloads for where A comes from: the warp's
 * resident fragments (a[kk], 16 columns each), or rows r0..r0+15 of the
 * 16-bit tile At, loaded 16 columns at a time (where resident fragments
 * would not fit in registers beside the accumulators).
 */
KG_FL_NOCHECK
template <class X> KG_FL_HD void kg_fl_scores_zero(float (&s)[8][4][X::NL], int w) {
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
        KG_FL_UNROLL for (int n = 0; n < 8; n++) {
            KG_FL_UNROLL for (int i = 0; i < 4; i++) s[n][i][X::li(l)] = 0.0f;
        }
    }
}

/* s += af Bt(:, 16 kk..16 kk + 15)^T: one 16-column step of the product. */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_scores_step(float (&s)[8][4][X::NL], const uint32_t (&af)[4][X::NL], const uint16_t *Bt, int kk,
                                int w) {
    constexpr int LDE = KG_FL_LDE(16 * DN);
    KG_FL_UNROLL for (int np = 0; np < 4; np++) {
        uint32_t bf[4][X::NL];
        kg_fl_frag_bt<X, LDE>(bf, Bt, 16 * np, 16 * kk, w);
        X::template mma<OP>(s[2 * np], af, bf, 0);
        X::template mma<OP>(s[2 * np + 1], af, bf, 1);
    }
}

KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_scores(float (&s)[8][4][X::NL], const uint32_t (&a)[DN][4][X::NL], const uint16_t *Bt, int w) {
    kg_fl_scores_zero<X>(s, w);
    KG_FL_UNROLL for (int kk = 0; kk < DN; kk++) kg_fl_scores_step<X, OP, DN>(s, a[kk], Bt, kk, w);
}

KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_scores(float (&s)[8][4][X::NL], const uint16_t *At, int r0, const uint16_t *Bt, int w) {
    kg_fl_scores_zero<X>(s, w);
    KG_FL_UNROLL for (int kk = 0; kk < DN; kk++) {
        uint32_t af[4][X::NL];
        kg_fl_frag_a<X, 0, KG_FL_LDE(16 * DN)>(af, At, r0, 16 * kk, w);
        kg_fl_scores_step<X, OP, DN>(s, af, Bt, kk, w);
    }
}

/* acc(16 x D) += P(16 x 64) V(64 x D): P as four A operands (p[kk]: keys
 * 16 kk..16 kk + 15, packed by kg_fl_pack_p), V the 64 rows of a 16-bit
 * tile read transposed; acc[n] the n-th 8-wide column block. */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_acc_pv(float (&acc)[2 * DN][4][X::NL], const uint32_t (&p)[4][4][X::NL], const uint16_t *V,
                           int w) {
    constexpr int LDE = KG_FL_LDE(16 * DN);
    KG_FL_UNROLL for (int kk = 0; kk < 4; kk++) {
        KG_FL_UNROLL for (int dp = 0; dp < DN; dp++) {
            uint32_t bf[4][X::NL];
            kg_fl_frag_a<X, 1, LDE>(bf, V, 16 * kk, 16 * dp, w);
            X::template mma<OP>(acc[2 * dp], p[kk], bf, 0);
            X::template mma<OP>(acc[2 * dp + 1], p[kk], bf, 1);
        }
    }
}

/* One lane's 16 x 64 accumulator values (s, rounded to OP) as the A
 * operands of the next product: a 16-key block kk is accumulator blocks 2
 * kk and 2 kk + 1, whose layouts are A's halves. */
KG_FL_NOCHECK
template <class X, int OP>
KG_FL_HD void kg_fl_pack_p(uint32_t (&p)[4][4][X::NL], const float (&s)[8][4][X::NL], int L) {
    KG_FL_UNROLL for (int kk = 0; kk < 4; kk++) {
        p[kk][0][L] = X::template pack2<OP>(s[2 * kk][0][L], s[2 * kk][1][L]);
        p[kk][1][L] = X::template pack2<OP>(s[2 * kk][2][L], s[2 * kk][3][L]);
        p[kk][2][L] = X::template pack2<OP>(s[2 * kk + 1][0][L], s[2 * kk + 1][1][L]);
        p[kk][3][L] = X::template pack2<OP>(s[2 * kk + 1][2][L], s[2 * kk + 1][3][L]);
    }
}

/* Every lane's v becomes the largest (or the sum, sum = true) of its quad
 * of lanes (l / 4 equal: one row's four holders). */
KG_FL_NOCHECK
template <class X> KG_FL_HD void kg_fl_quad(float (&v)[X::NL], int w, bool sum) {
    for (int m = 1; m <= 2; m *= 2) {
        float o[X::NL];
        for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) o[X::li(l)] = v[X::li(l)];
        X::shfl_xor(o, m);
        for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
            const int L = X::li(l);
            v[L] = sum ? v[L] + o[L] : (o[L] > v[L] ? o[L] : v[L]);
        }
    }
}

/* One float of an output at element e: 16-bit storage (s16) or float32,
 * rounded through rd either way (OP is rd). */
template <int OP> KG_FL_HD void kg_fl_put(void *base, size_t e, float v, int s16, int rd) {
    if (s16) ((uint16_t *)base)[e] = kg_fl_enc<OP>(v);
    else ((float *)base)[e] = kg_round_to_dtype(v, rd);
}

/* mma's accumulator layout, in one place: lane l's element i (0..3) of
 * the n-th 8-wide block of a warp's 16-row accumulator sits at row
 * kg_fl_acc_row(l, i) and column kg_fl_acc_col(l, n, i) (the ISA's D
 * fragment: rows l / 4 and l / 4 + 8, columns 2 (l % 4) and 2 (l % 4) + 1
 * of each block). */
KG_HD int kg_fl_acc_row(int l, int i) { return (l >> 2) + 8 * (i >> 1); }
KG_HD int kg_fl_acc_col(int l, int n, int i) { return 8 * n + 2 * (l & 3) + (i & 1); }

/* A warp's 16 x D accumulator, times mul, into rows r0.. (16 of them, rows
 * at or past T skipped) and columns col.. of an output with row stride ld
 * (elements) from element base of batch element b. */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_store_acc(const kg_flash_args &a, void *out, size_t base, size_t ld,
                              const float (&acc)[2 * DN][4][X::NL], int r0, size_t col, float mul, int w) {
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
        const int L = X::li(l);
        KG_FL_UNROLL for (int n = 0; n < 2 * DN; n++) {
            KG_FL_UNROLL for (int i = 0; i < 4; i++) {
                const int row = r0 + kg_fl_acc_row(l, i);
                if (row >= a.T) continue;
                const size_t e = base + (size_t)row * ld + col + (size_t)kg_fl_acc_col(l, n, i);
                kg_fl_put<OP>(out, e, acc[n][i][L] * mul, a.s16, a.rd);
            }
        }
    }
}

/*
 * The causal mask's three uses, each a template over MASK: a warp's block
 * of scores that lies wholly below the diagonal (every key at or before
 * every query; most blocks of a long sequence) takes MASK = false, with
 * no compare and select per element; the blocks that cross the diagonal
 * take MASK = true, where the mask is a select, not a branch, so the
 * lanes stay in step. The unmasked elements get the same expressions
 * either way, hence the same bits. Keys past T are masked by the same
 * test: they lie only in the diagonal tile, since a query tile's key
 * tiles end at its last valid query. (Queries past T are never stored,
 * and in the dK/dV program add nothing: q = dO = 0 there.)
 */

/* Whether query q sees key k. */
KG_HD bool kg_fl_causal_in(int k, int q) { return k <= q; }
/* Whether a block of scores whose last key is k_last and first query q_first
 * crosses the diagonal (some key there is after some query): the blocks
 * that take MASK = true. */
KG_HD bool kg_fl_crosses_diag(int k_last, int q_first) { return k_last > q_first; }

/* The forward's scores of warp w (rows q_lo.., keys k0..) scaled to base 2
 * and masked, and each lane's two row maxima. */
KG_FL_NOCHECK
template <class X, bool MASK>
KG_FL_HD void kg_fl_fwd_mask_max(float (&S)[8][4][X::NL], float (&mx)[2][X::NL], float sc2, int q_lo, int k0, int w) {
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
        const int L = X::li(l);
        mx[0][L] = mx[1][L] = -INFINITY;
        KG_FL_UNROLL for (int n = 0; n < 8; n++) {
            KG_FL_UNROLL for (int i = 0; i < 4; i++) {
                const bool in = !MASK || kg_fl_causal_in(k0 + kg_fl_acc_col(l, n, i), q_lo + kg_fl_acc_row(l, i));
                const float x = in ? S[n][i][L] * sc2 : -INFINITY;
                S[n][i][L] = x;
                mx[i >> 1][L] = x > mx[i >> 1][L] ? x : mx[i >> 1][L];
            }
        }
    }
}

/* The dK/dV program's P^T and dS^T of warp w (keys key_lo.., queries
 * q0..: lse and delta by query, from shared memory), rounded to OP. */
KG_FL_NOCHECK
template <class X, int OP, bool MASK>
KG_FL_HD void kg_fl_dkdv_p_ds(uint32_t (&P)[4][4][X::NL], uint32_t (&dS)[4][4][X::NL], float (&St)[8][4][X::NL],
                              float (&dPt)[8][4][X::NL], const float *Lq, const float *Dq, float sc2, int key_lo,
                              int q0, int w) {
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
        const int L = X::li(l);
        KG_FL_UNROLL for (int n = 0; n < 8; n++) {
            /* the two queries of this lane's columns in block n (elements 0 and 1 are adjacent) */
            const int c = kg_fl_acc_col(l, n, 0);
            const float2 ls = X::ld((const float2 *)&Lq[c]), de = X::ld((const float2 *)&Dq[c]);
            KG_FL_UNROLL for (int i = 0; i < 4; i++) {
                /* transposed scores: rows are keys, columns queries */
                const bool in = !MASK || kg_fl_causal_in(key_lo + kg_fl_acc_row(l, i), q0 + kg_fl_acc_col(l, n, i));
                const float lse = i & 1 ? ls.y : ls.x, delta = i & 1 ? de.y : de.x;
                const float p = in ? exp2f(St[n][i][L] * sc2 - lse) : 0.0f;
                St[n][i][L] = p;
                dPt[n][i][L] = in ? p * (dPt[n][i][L] - delta) : 0.0f;
            }
        }
        kg_fl_pack_p<X, OP>(P, St, L);
        kg_fl_pack_p<X, OP>(dS, dPt, L);
    }
}

/* The dQ program's dS of warp w (rows q_lo.., keys k0..; lse in base 2
 * and delta per row from registers), rounded to OP. */
KG_FL_NOCHECK
template <class X, int OP, bool MASK>
KG_FL_HD void kg_fl_dq_ds(uint32_t (&dS)[4][4][X::NL], const float (&S)[8][4][X::NL], float (&dP)[8][4][X::NL],
                          const float (&Ls)[2][X::NL], const float (&De)[2][X::NL], float sc2, int q_lo, int k0,
                          int w) {
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
        const int L = X::li(l);
        KG_FL_UNROLL for (int n = 0; n < 8; n++) {
            KG_FL_UNROLL for (int i = 0; i < 4; i++) {
                const bool in = !MASK || kg_fl_causal_in(k0 + kg_fl_acc_col(l, n, i), q_lo + kg_fl_acc_row(l, i));
                const float p = in ? exp2f(S[n][i][L] * sc2 - Ls[i >> 1][L]) : 0.0f;
                dP[n][i][L] = in ? p * (dP[n][i][L] - De[i >> 1][L]) : 0.0f;
            }
        }
        kg_fl_pack_p<X, OP>(dS, dP, L);
    }
}

/*
 * The forward of query tile qt of head bh = b * NH + h. Each warp owns 16
 * query rows and keeps in registers their q fragments, the output
 * accumulator O (16 x D), and per row the running max m and sum l (each
 * lane its partial sum over its own columns: every lane of a row scales by
 * the same factor, so the four partials are added once, at the end). For
 * each key tile up to the diagonal: S = q k^T, the causal mask, the row
 * max (the four lanes of a row by shuffles), p = exp(s*scale - m), O and
 * l rescaled by exp(m_old - m), then O += P v with P rounded to OP and
 * passed from the scores' registers as the next product's operand.
 * Finally out = O / l (rounded through rd) and lse = m + log(l).
 */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_forward_block(const kg_flash_args &a, unsigned char *sm, int qt, int bh) {
    constexpr int D = 16 * DN, LDE = KG_FL_LDE(D), NL = X::NL;
    const kg_fl_layout Ly = kg_fl_layout_of(KG_FL_FWD, D);
    uint16_t *Qs = (uint16_t *)(sm + Ly.q), *Ks = (uint16_t *)(sm + Ly.k), *Vs = (uint16_t *)(sm + Ly.v);
    const int b = bh / a.NH, h = bh % a.NH, T = a.T, q0 = qt * KG_FL_BR;
    const float sc2 = a.scale * KG_FL_LOG2E;
    uint32_t qa[X::kSlots][DN][4][NL];
    float O[X::kSlots][2 * DN][4][NL], M[X::kSlots][2][NL], Lp[X::kSlots][2][NL];

    kg_fl_load_rows<X, OP>(a, Qs, 0, b, h, D, q0);
    X::sync();
    for (int w = X::warp0(); X::win(w); w += X::wstep()) {
        const int s = X::slot(w);
        KG_FL_UNROLL for (int kk = 0; kk < DN; kk++) kg_fl_frag_a<X, 0, LDE>(qa[s][kk], Qs, 16 * w, 16 * kk, w);
        for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
            const int L = X::li(l);
            KG_FL_UNROLL for (int n = 0; n < 2 * DN; n++) {
                KG_FL_UNROLL for (int i = 0; i < 4; i++) O[s][n][i][L] = 0.0f;
            }
            M[s][0][L] = M[s][1][L] = -INFINITY, Lp[s][0][L] = Lp[s][1][L] = 0.0f;
        }
    }

    const int nkt = kg_fl_key_tiles(q0, T);
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * KG_FL_BC;
        kg_fl_load_kv<X, OP>(a, Ks, Vs, b, h, D, k0);
        X::sync();
        for (int w = X::warp0(); X::win(w); w += X::wstep()) {
            const int s = X::slot(w);
            float S[8][4][NL], mx[2][NL];
            kg_fl_scores<X, OP, DN>(S, qa[s], Ks, w);
            /* the mask only where the last key passes the first row */
            const int q_lo = q0 + 16 * w;
            if (kg_fl_crosses_diag(k0 + KG_FL_BC - 1, q_lo)) kg_fl_fwd_mask_max<X, true>(S, mx, sc2, q_lo, k0, w);
            else kg_fl_fwd_mask_max<X, false>(S, mx, sc2, q_lo, k0, w);
            kg_fl_quad<X>(mx[0], w, false);
            kg_fl_quad<X>(mx[1], w, false);
            /* p = exp(s - m_new) (0 where masked: exp2(-inf)); the first key
             * tile holds key 0, which every row sees, so m_new is finite and
             * alpha = exp(m_old - m_new) is 0 on the first tile, not NaN */
            uint32_t P[4][4][NL];
            for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
                const int L = X::li(l);
                float alpha[2];
                KG_FL_UNROLL for (int r = 0; r < 2; r++) {
                    const float mn = M[s][r][L] > mx[r][L] ? M[s][r][L] : mx[r][L];
                    alpha[r] = exp2f(M[s][r][L] - mn);
                    M[s][r][L] = mn;
                }
                float sum[2] = {0.0f, 0.0f};
                KG_FL_UNROLL for (int n = 0; n < 8; n++) {
                    KG_FL_UNROLL for (int i = 0; i < 4; i++) {
                        const float p = exp2f(S[n][i][L] - M[s][i >> 1][L]);
                        S[n][i][L] = p;
                        sum[i >> 1] += p;
                    }
                }
                KG_FL_UNROLL for (int r = 0; r < 2; r++) Lp[s][r][L] = Lp[s][r][L] * alpha[r] + sum[r];
                KG_FL_UNROLL for (int n = 0; n < 2 * DN; n++) {
                    KG_FL_UNROLL for (int i = 0; i < 4; i++)
                        O[s][n][i][L] *= alpha[i >> 1];
                }
                kg_fl_pack_p<X, OP>(P, S, L);
            }
            kg_fl_acc_pv<X, OP, DN>(O[s], P, Vs, w);
        }
        X::sync();
    }

    for (int w = X::warp0(); X::win(w); w += X::wstep()) {
        const int s = X::slot(w);
        kg_fl_quad<X>(Lp[s][0], w, true);
        kg_fl_quad<X>(Lp[s][1], w, true);
        for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
            const int L = X::li(l);
            KG_FL_UNROLL for (int n = 0; n < 2 * DN; n++) {
                KG_FL_UNROLL for (int i = 0; i < 4; i++)
                    O[s][n][i][L] /= Lp[s][i >> 1][L];
            }
            if ((l & 3) == 0) {
                KG_FL_UNROLL for (int r = 0; r < 2; r++) {
                    const int q = q0 + 16 * w + (l >> 2) + 8 * r;
                    if (q < T)
                        a.lse[(size_t)bh * (size_t)T + (size_t)q] = (M[s][r][L] + log2f(Lp[s][r][L])) * KG_FL_LN2;
                }
            }
        }
        kg_fl_store_acc<X, OP, DN>(a, a.o, (size_t)b * (size_t)T * (size_t)a.C, (size_t)a.C, O[s], q0 + 16 * w,
                                   (size_t)h * D, 1.0f, w);
    }
}

/* The rows [q0, q0 + 64) of lse (in base 2: times log2(e)) and delta into
 * two float arrays (0 past T, which with q = dO = 0 there makes those rows
 * contribute nothing). */
KG_FL_NOCHECK
template <class X> KG_FL_HD void kg_fl_load_stats(const kg_flash_args &a, float *Lq, float *Dq, int bh, int q0) {
    for (int t = X::tid0(); X::tin(t); t += X::tstep())
        if (t < KG_FL_BR) {
            const int q = q0 + t;
            const size_t i = (size_t)bh * (size_t)a.T + (size_t)q;
            X::st(&Lq[t], q < a.T ? a.lse_in[i] * KG_FL_LOG2E : 0.0f);
            X::st(&Dq[t], q < a.T ? (float)a.delta[i] : 0.0f);
        }
}

/* Head sizes whose q and dO fragments stay in registers through the dQ
 * program; D = 128's are loaded again from shared memory at each key tile,
 * so that the accumulator and the two score tiles fit. The dK/dV program
 * loads its k and v fragments at each query tile at every head size: with
 * two accumulators beside the scores, resident ones made ptxas spill at
 * D = 32 and 64 (sm_90), and the reloads are 8 of a warp's 72 ldmatrix
 * a query tile at D = 64. */
#define KG_FL_RESIDENT(DN) ((DN) <= 4)

/*
 * The backward's dK/dV program for key tile kt of head bh. Each warp owns
 * 16 keys, and keeps their dK and dV accumulators in registers. Over the
 * query tiles from the diagonal on, in order: the transposed scores S^T =
 * k q^T and dP^T = v dO^T (16 keys x 64 queries), P^T = exp(s*scale -
 * lse) (0 where the key is after the query) and dS^T = P^T (dP^T - delta),
 * lse and delta by query, then dV += P^T dO
 * and dK += dS^T q with P^T and dS^T rounded to OP and passed from
 * registers. dK is scaled by 1/sqrt(D) at the end.
 */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_dkdv_block(const kg_flash_args &a, unsigned char *sm, int kt, int bh) {
    constexpr int D = 16 * DN, NL = X::NL;
    const kg_fl_layout Ly = kg_fl_layout_of(KG_FL_DKDV, D);
    uint16_t *Qs = (uint16_t *)(sm + Ly.q), *Ks = (uint16_t *)(sm + Ly.k), *Vs = (uint16_t *)(sm + Ly.v);
    uint16_t *dOs = (uint16_t *)(sm + Ly.dout);
    float *Lq = (float *)(sm + Ly.rowa), *Dq = (float *)(sm + Ly.rowb);
    const int b = bh / a.NH, h = bh % a.NH, T = a.T, k0 = kt * KG_FL_BC;
    const float sc2 = a.scale * KG_FL_LOG2E;
    float dK[X::kSlots][2 * DN][4][NL], dV[X::kSlots][2 * DN][4][NL];

    kg_fl_load_kv<X, OP>(a, Ks, Vs, b, h, D, k0);
    X::sync();
    for (int w = X::warp0(); X::win(w); w += X::wstep()) {
        const int s = X::slot(w);
        for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
            KG_FL_UNROLL for (int n = 0; n < 2 * DN; n++) {
                KG_FL_UNROLL for (int i = 0; i < 4; i++)
                    dK[s][n][i][X::li(l)] = dV[s][n][i][X::li(l)] = 0.0f;
            }
        }
    }
    const int nqt = (T + KG_FL_BR - 1) / KG_FL_BR;
    for (int qt = k0 / KG_FL_BR; qt < nqt; qt++) {
        const int q0 = qt * KG_FL_BR;
        kg_fl_load_rows<X, OP>(a, Qs, 0, b, h, D, q0);
        kg_fl_load_rows<X, OP>(a, dOs, 3, b, h, D, q0);
        kg_fl_load_stats<X>(a, Lq, Dq, bh, q0);
        X::sync();
        for (int w = X::warp0(); X::win(w); w += X::wstep()) {
            const int s = X::slot(w);
            float St[8][4][NL], dPt[8][4][NL];
            kg_fl_scores<X, OP, DN>(St, Ks, 16 * w, Qs, w);
            kg_fl_scores<X, OP, DN>(dPt, Vs, 16 * w, dOs, w);
            uint32_t P[4][4][NL], dS[4][4][NL];
            /* the mask only where the warp's last key passes the first query */
            const int key_lo = k0 + 16 * w;
            if (kg_fl_crosses_diag(key_lo + 15, q0))
                kg_fl_dkdv_p_ds<X, OP, true>(P, dS, St, dPt, Lq, Dq, sc2, key_lo, q0, w);
            else
                kg_fl_dkdv_p_ds<X, OP, false>(P, dS, St, dPt, Lq, Dq, sc2, key_lo, q0, w);
            kg_fl_acc_pv<X, OP, DN>(dV[s], P, dOs, w);
            kg_fl_acc_pv<X, OP, DN>(dK[s], dS, Qs, w);
        }
        X::sync();
    }
    const size_t base = (size_t)b * (size_t)T * 3u * (size_t)a.C, ld = 3u * (size_t)a.C;
    for (int w = X::warp0(); X::win(w); w += X::wstep()) {
        const int s = X::slot(w);
        kg_fl_store_acc<X, OP, DN>(a, a.dqkv, base, ld, dK[s], k0 + 16 * w, (size_t)a.C + (size_t)h * D, a.scale, w);
        kg_fl_store_acc<X, OP, DN>(a, a.dqkv, base, ld, dV[s], k0 + 16 * w, 2u * (size_t)a.C + (size_t)h * D, 1.0f,
                                   w);
    }
}

/*
 * The backward's dQ program for query tile qt of head bh. Each warp owns
 * 16 queries and keeps their dQ accumulator (and their q and dO
 * fragments, and per row lse and delta) in registers. Over the key tiles
 * up to the diagonal, in order: S = q k^T and dP = dO v^T, P and dS = P
 * (dP - delta) as in the dK/dV program, then dQ += dS k; scaled by
 * 1/sqrt(D) at the end.
 */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_dq_block(const kg_flash_args &a, unsigned char *sm, int qt, int bh) {
    constexpr int D = 16 * DN, LDE = KG_FL_LDE(D), NL = X::NL;
    constexpr bool RES = KG_FL_RESIDENT(DN);
    const kg_fl_layout Ly = kg_fl_layout_of(KG_FL_DQ, D);
    uint16_t *Qs = (uint16_t *)(sm + Ly.q), *Ks = (uint16_t *)(sm + Ly.k), *Vs = (uint16_t *)(sm + Ly.v);
    uint16_t *dOs = (uint16_t *)(sm + Ly.dout);
    const int b = bh / a.NH, h = bh % a.NH, T = a.T, q0 = qt * KG_FL_BR;
    const float sc2 = a.scale * KG_FL_LOG2E;
    uint32_t qa[X::kSlots][RES ? DN : 1][4][NL], da[X::kSlots][RES ? DN : 1][4][NL];
    float dQ[X::kSlots][2 * DN][4][NL], Ls[X::kSlots][2][NL], De[X::kSlots][2][NL];

    kg_fl_load_rows<X, OP>(a, Qs, 0, b, h, D, q0);
    kg_fl_load_rows<X, OP>(a, dOs, 3, b, h, D, q0);
    X::sync();
    for (int w = X::warp0(); X::win(w); w += X::wstep()) {
        const int s = X::slot(w);
        if constexpr (RES) {
            KG_FL_UNROLL for (int kk = 0; kk < DN; kk++) {
                kg_fl_frag_a<X, 0, LDE>(qa[s][kk], Qs, 16 * w, 16 * kk, w);
                kg_fl_frag_a<X, 0, LDE>(da[s][kk], dOs, 16 * w, 16 * kk, w);
            }
        }
        for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
            const int L = X::li(l);
            KG_FL_UNROLL for (int n = 0; n < 2 * DN; n++) {
                KG_FL_UNROLL for (int i = 0; i < 4; i++) dQ[s][n][i][L] = 0.0f;
            }
            KG_FL_UNROLL for (int r = 0; r < 2; r++) {
                const int q = q0 + 16 * w + (l >> 2) + 8 * r;
                const size_t e = (size_t)bh * (size_t)T + (size_t)q;
                Ls[s][r][L] = q < T ? a.lse_in[e] * KG_FL_LOG2E : 0.0f;
                De[s][r][L] = q < T ? (float)a.delta[e] : 0.0f;
            }
        }
    }
    const int nkt = kg_fl_key_tiles(q0, T);
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * KG_FL_BC;
        kg_fl_load_kv<X, OP>(a, Ks, Vs, b, h, D, k0);
        X::sync();
        for (int w = X::warp0(); X::win(w); w += X::wstep()) {
            const int s = X::slot(w);
            float S[8][4][NL], dP[8][4][NL];
            if constexpr (RES) {
                kg_fl_scores<X, OP, DN>(S, qa[s], Ks, w);
                kg_fl_scores<X, OP, DN>(dP, da[s], Vs, w);
            } else {
                kg_fl_scores<X, OP, DN>(S, Qs, 16 * w, Ks, w);
                kg_fl_scores<X, OP, DN>(dP, dOs, 16 * w, Vs, w);
            }
            uint32_t dS[4][4][NL];
            /* the mask only where the last key passes the first row */
            const int q_lo = q0 + 16 * w;
            if (kg_fl_crosses_diag(k0 + KG_FL_BC - 1, q_lo))
                kg_fl_dq_ds<X, OP, true>(dS, S, dP, Ls[s], De[s], sc2, q_lo, k0, w);
            else
                kg_fl_dq_ds<X, OP, false>(dS, S, dP, Ls[s], De[s], sc2, q_lo, k0, w);
            kg_fl_acc_pv<X, OP, DN>(dQ[s], dS, Ks, w);
        }
        X::sync();
    }
    for (int w = X::warp0(); X::win(w); w += X::wstep())
        kg_fl_store_acc<X, OP, DN>(a, a.dqkv, (size_t)b * (size_t)T * 3u * (size_t)a.C, 3u * (size_t)a.C,
                                   dQ[X::slot(w)], q0 + 16 * w, (size_t)h * D, a.scale, w);
}

/* Blocks of a program over B * NH heads and T positions: one per (tile,
 * head), with the tile index major so that, in launch order, the costliest
 * tiles (the last query tiles, the first key tiles) start first. */
KG_HD size_t kg_fl_blocks(int B, int NH, int T) {
    return (size_t)((T + KG_FL_BR - 1) / KG_FL_BR) * (size_t)B * (size_t)NH;
}
/* Block i's tile and head for a program. */
KG_HD void kg_fl_block_of(int prog, size_t i, int B, int NH, int T, int *tile, int *bh) {
    const size_t BH = (size_t)B * (size_t)NH;
    const int nt = (T + KG_FL_BR - 1) / KG_FL_BR, j = (int)(i / BH);
    *bh = (int)(i % BH);
    *tile = prog == KG_FL_DKDV ? j : nt - 1 - j;
}

#endif
