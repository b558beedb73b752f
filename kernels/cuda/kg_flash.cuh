/*
 * kg_flash.cuh: the fused ("flash") causal attention of the cuda
 * accelerator's `attention = "flash"` path, written once for two machines.
 * Its three block programs (the forward; the backward's dK/dV pass and its
 * dQ pass) are templates over an execution policy X. kg_flash.cu
 * instantiates them with kg_fl_dev, a real CUDA block: KG_FL_THREADS
 * threads, __syncthreads, and the tensor cores through nvcuda::wmma.
 * kg_flash_host.cuh's kg_fl_host runs the same programs on the host: each
 * "for each thread" loop visits every thread in turn, the barriers are
 * no-ops, and the warp-wide products are plain loops. Every phase between
 * two barriers is free of races (a thread writes only its own elements and
 * reads only what an earlier phase wrote), so the host's serial order
 * computes what the GPU's parallel one does. That host emulation is what CI
 * tests against the cpu kernels (test_cuda_flash, no GPU), and what the
 * fake cuda accelerator runs; tests/gpu/run.sh tests the device one.
 *
 * The programs never look inside a tensor-core fragment (wmma's element
 * layout is unspecified): the products are defined by their operands in
 * shared memory alone, so the emulation's fragments need not match the
 * hardware's. The emulation also checks what wmma requires, poisons shared
 * memory before each block, and fails on races between phases (see
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
 * are padded (+8 16-bit elements, +4 floats) so that the wmma tile loads of
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
 * absent) and the total. Every array starts 128-byte aligned. */
struct kg_fl_layout {
    size_t q, k, v, dout, s, dp, p, ds, acc, rowa, rowb, rowc, rowd, bytes;
};

KG_HD size_t kg_fl_up128(size_t n) { return (n + 127) & ~(size_t)127; }

/* Leading dimensions, in elements: 16-bit tiles of width D (q, k, v, dO),
 * 16-bit tiles of width BC (P, dS), float tiles of width BC (S, dP), float
 * tiles of width D (the accumulators). */
KG_HD int kg_fl_lde(int D) { return D + 8; }
#define KG_FL_LDT (KG_FL_BC + 8)
#define KG_FL_LDS (KG_FL_BC + 4)
KG_HD int kg_fl_ldo(int D) { return D + 4; }

KG_HD kg_fl_layout kg_fl_layout_of(int prog, int D) {
    kg_fl_layout L = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const size_t e_tile = kg_fl_up128((size_t)KG_FL_BR * (size_t)kg_fl_lde(D) * 2u);
    const size_t t_tile = kg_fl_up128((size_t)KG_FL_BR * KG_FL_LDT * 2u);
    const size_t s_tile = kg_fl_up128((size_t)KG_FL_BR * KG_FL_LDS * 4u);
    const size_t o_tile = kg_fl_up128((size_t)KG_FL_BR * (size_t)kg_fl_ldo(D) * 4u);
    const size_t row = kg_fl_up128((size_t)KG_FL_BR * 2u * 4u);
    size_t at = 0;
    L.q = at, at += e_tile;
    L.k = at, at += e_tile;
    L.v = at, at += e_tile;
    if (prog != KG_FL_FWD) L.dout = at, at += e_tile;
    L.s = at, at += s_tile;
    if (prog != KG_FL_FWD) L.dp = at, at += s_tile;
    if (prog != KG_FL_DQ) L.p = at, at += t_tile;
    if (prog != KG_FL_FWD) L.ds = at, at += t_tile;
    /* the forward's accumulator is rescaled row by row, so it lives here;
     * the backward's stay in registers (X::acc) */
    if (prog == KG_FL_FWD) L.acc = at, at += o_tile;
    L.rowa = at, at += row;
    L.rowb = at, at += row;
    if (prog == KG_FL_FWD) {
        L.rowc = at, at += row;
        L.rowd = at, at += row;
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

/*
 * The order in which lane l of a warp's softmax loops visits its columns:
 * the j-th visit is column j ^ kg_fl_swz(l) of its half row. Lane l holds
 * row l / 2 of the warp's 16 and half l & 1. Visited in plain order, the
 * four lanes whose rows are 8 apart, in either half, would meet in one
 * bank at every step, since the rows' strides (KG_FL_LDS, KG_FL_LDT,
 * kg_fl_ldo) are 4 words more than a multiple of 32: every float access 4
 * wavefronts, every 16-bit store 4. XOR-ing the column with 0, 3, 5 or 6
 * for those four lanes parts them: the two low bits differ (float rows)
 * and so do bits 1 and 2 (16-bit rows, two columns to a word). Any span of
 * 8 or more columns (a power of two) is still visited whole. The bank model
 * of kg_flash_host.cuh counts one wavefront a request for these loops.
 */
KG_HD int kg_fl_swz(int l) { return (0x6530 >> (4 * (2 * (l >> 4) + (l & 1)))) & 0xf; }

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
 * The policy's warp-wide product (every lane of the warp calls it with the
 * same arguments; on the host it is called once per warp):
 *   C[16 x 16*NN] (=, or += when acc) A[16 x 16*KN] * B[16*KN x 16*NN]
 * C: float, row-major, leading dimension ldc. A(i, k) = a[i*lda + k]
 * (AT = 0) or a[k*lda + i] (AT = 1); B(k, n) = b[k*ldb + n] (BT = 0) or
 * b[n*ldb + k] (BT = 1); a and b hold OP bit patterns.
 *   X::template mma<OP, AT, BT, KN, NN>(c, ldc, a, lda, b, ldb, acc)
 * and the loops of a phase:
 *   for (int t = X::tid0(); X::tin(t); t += X::tstep())       threads
 *   for (int w = X::warp0(); X::win(w); w += X::wstep())      warps
 *   for (int l = X::lane0(); X::lin(w, l); l += X::lstep())   lanes of w
 * (on the device one pass each: this thread, its warp, its lane; on the
 * host every one in turn, the test telling the policy who runs),
 * with X::sync() (the block's barrier) and X::syncwarp() between phases.
 * Shared memory is read and written through X::ld / X::st (the host's race
 * check; plain accesses on the device).
 *
 * Accumulators that stay in registers across phases (the backward's dK, dV
 * and dQ: never read element by element, so wmma's opaque fragments do):
 *   typename X::template acc<NN> a[X::kSlots]   one per warp: X::slot(w)
 *   X::acc_zero(a), X::template mma_acc<OP, AT, BT, KN, NN>(a, ...) (the
 *   product above, added into a), X::acc_store(a, c, ldc) (into shared
 *   memory, row-major). On the device kSlots is 1 (each warp holds its own
 *   in registers); on the host one per warp, since the host runs the warps
 *   in turn.
 */

#ifdef __CUDACC__
#define KG_FL_HD __host__ __device__ __forceinline__
#define KG_FL_NOCHECK _Pragma("nv_exec_check_disable")
#else
#define KG_FL_HD inline
#define KG_FL_NOCHECK
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

/* Zeroes a float tile of width D (leading dimension ldo). */
KG_FL_NOCHECK
template <class X> KG_FL_HD void kg_fl_zero_acc(float *acc, int D) {
    const int ldo = kg_fl_ldo(D);
    for (int t = X::tid0(); X::tin(t); t += X::tstep())
        for (int i = t; i < KG_FL_BR * D; i += KG_FL_THREADS) X::st(&acc[(i / D) * ldo + i % D], 0.0f);
}

/*
 * The forward of query tile qt of head bh = b * NH + h: for each key tile
 * up to the diagonal, S = q k^T (each warp its 16 rows), the online
 * softmax (two lanes per row, 32 columns each: the row max, p = exp(s*scale
 * - m), the running sum l and the rescaling of the accumulator by exp(m_old
 * - m)), then O += P v. Finally out = O / l (rounded through rd) and lse =
 * m + log(l).
 */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_forward_block(const kg_flash_args &a, unsigned char *sm, int qt, int bh) {
    constexpr int D = 16 * DN, LDE = D + 8, LDO = D + 4;
    const kg_fl_layout L = kg_fl_layout_of(KG_FL_FWD, D);
    uint16_t *Qs = (uint16_t *)(sm + L.q), *Ks = (uint16_t *)(sm + L.k), *Vs = (uint16_t *)(sm + L.v);
    uint16_t *Ps = (uint16_t *)(sm + L.p);
    float *Ss = (float *)(sm + L.s), *Os = (float *)(sm + L.acc);
    float *M = (float *)(sm + L.rowa), *Lsum = (float *)(sm + L.rowb);
    float *PM = (float *)(sm + L.rowc), *PS = (float *)(sm + L.rowd); /* (64, 2) per-lane partials */
    const int b = bh / a.NH, h = bh % a.NH, T = a.T, q0 = qt * KG_FL_BR;

    kg_fl_load_rows<X, OP>(a, Qs, 0, b, h, D, q0);
    kg_fl_zero_acc<X>(Os, D);
    for (int t = X::tid0(); X::tin(t); t += X::tstep())
        if (t < KG_FL_BR) X::st(&M[t], -INFINITY), X::st(&Lsum[t], 0.0f);
    X::sync();

    const int nkt = kg_fl_key_tiles(q0, T);
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * KG_FL_BC;
        kg_fl_load_kv<X, OP>(a, Ks, Vs, b, h, D, k0);
        X::sync();
        for (int w = X::warp0(); X::win(w); w += X::wstep()) {
            X::template mma<OP, 0, 1, DN, KG_FL_BC / 16>(Ss + 16 * w * KG_FL_LDS, KG_FL_LDS, Qs + 16 * w * LDE, LDE,
                                                         Ks, LDE, false);
            X::syncwarp();
            /* the row max of the scaled, masked scores, per half row. The
             * causal mask here and below is a select, not a branch: every
             * lane loads all its columns (the product wrote them all), so
             * a diagonal tile's lanes stay in step, each load one warp-wide
             * request in its own bank (kg_fl_swz) */
            for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
                const int r = 16 * w + l / 2, hf = l & 1, q = q0 + r, sw = kg_fl_swz(l);
                float mx = -INFINITY;
                for (int j = 0; j < 32; j++) {
                    const int c = 32 * hf + (j ^ sw);
                    const float s = X::ld(&Ss[r * KG_FL_LDS + c]) * (a.scale * KG_FL_LOG2E);
                    mx = k0 + c <= q && s > mx ? s : mx;
                }
                X::st(&PM[2 * r + hf], mx);
            }
            X::syncwarp();
            /* p = exp(s - m_new) (0 above the diagonal), its partial sum,
             * the accumulator's half row scaled by exp(m_old - m_new). The
             * scaled score is computed again rather than stored by the
             * loop above and read back: the same product (no contraction),
             * so the same bits, for one shared-memory store fewer each */
            for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
                const int r = 16 * w + l / 2, hf = l & 1, q = q0 + r, sw = kg_fl_swz(l);
                const float pm0 = X::ld(&PM[2 * r]), pm1 = X::ld(&PM[2 * r + 1]), mo = X::ld(&M[r]);
                float mn = pm0 > pm1 ? pm0 : pm1;
                mn = mo > mn ? mo : mn;
                float sum = 0.0f;
                for (int j = 0; j < 32; j++) {
                    const int c = 32 * hf + (j ^ sw);
                    const float s = X::ld(&Ss[r * KG_FL_LDS + c]) * (a.scale * KG_FL_LOG2E);
                    const float p = k0 + c <= q ? exp2f(s - mn) : 0.0f;
                    X::st(&Ps[r * KG_FL_LDT + c], kg_fl_enc<OP>(p));
                    sum += p;
                }
                X::st(&PS[2 * r + hf], sum);
                /* a row whose max did not grow keeps its accumulator: the
                 * factor would be exactly 1, so skipping the pass through
                 * shared memory changes no bit (after the first key tiles
                 * of a causal row, most tiles are such) */
                if (mn != mo) {
                    const float alpha = exp2f(mo - mn);
                    for (int j = 0; j < D / 2; j++) {
                        const int d = hf * (D / 2) + (j ^ sw);
                        X::st(&Os[r * LDO + d], X::ld(&Os[r * LDO + d]) * alpha);
                    }
                }
            }
            X::syncwarp();
            for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
                if (l & 1) continue;
                const int r = 16 * w + l / 2;
                const float pm0 = X::ld(&PM[2 * r]), pm1 = X::ld(&PM[2 * r + 1]), mo = X::ld(&M[r]);
                float mn = pm0 > pm1 ? pm0 : pm1;
                mn = mo > mn ? mo : mn;
                const float alpha = exp2f(mo - mn);
                X::st(&Lsum[r], X::ld(&Lsum[r]) * alpha + (X::ld(&PS[2 * r]) + X::ld(&PS[2 * r + 1])));
                X::st(&M[r], mn);
            }
            X::syncwarp();
            X::template mma<OP, 0, 0, KG_FL_BC / 16, DN>(Os + 16 * w * LDO, LDO, Ps + 16 * w * KG_FL_LDT, KG_FL_LDT,
                                                         Vs, LDE, true);
        }
        X::sync();
    }

    const size_t obase = (size_t)b * (size_t)T * (size_t)a.C + (size_t)h * D;
    for (int t = X::tid0(); X::tin(t); t += X::tstep()) {
        for (int i = t; i < KG_FL_BR * D; i += KG_FL_THREADS) {
            const int r = i / D, d = i % D, q = q0 + r;
            if (q >= T) continue;
            const float v = X::ld(&Os[r * LDO + d]) / X::ld(&Lsum[r]);
            const size_t e = obase + (size_t)q * (size_t)a.C + d;
            if (a.s16) ((uint16_t *)a.o)[e] = kg_fl_enc<OP>(v);
            else ((float *)a.o)[e] = kg_round_to_dtype(v, a.rd);
        }
        if (t < KG_FL_BR && q0 + t < T)
            a.lse[(size_t)bh * (size_t)T + (size_t)(q0 + t)] = (X::ld(&M[t]) + log2f(X::ld(&Lsum[t]))) * KG_FL_LN2;
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

/* One warp's rows of the backward's scores: S = q k^T, dP = dO v^T, then
 * per element P = exp(s*scale - lse) (0 above the diagonal) and dS = P *
 * (dP - delta), rounded to OP into Ps (when not NULL) and dSs. */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_bwd_scores(const kg_flash_args &a, int w, int q0, int k0, const uint16_t *Qs, const uint16_t *dOs,
                               const uint16_t *Ks, const uint16_t *Vs, float *Ss, float *dPs, const float *Lq,
                               const float *Dq, uint16_t *Ps, uint16_t *dSs) {
    constexpr int LDE = 16 * DN + 8;
    X::template mma<OP, 0, 1, DN, KG_FL_BC / 16>(Ss + 16 * w * KG_FL_LDS, KG_FL_LDS, Qs + 16 * w * LDE, LDE, Ks, LDE,
                                                 false);
    X::template mma<OP, 0, 1, DN, KG_FL_BC / 16>(dPs + 16 * w * KG_FL_LDS, KG_FL_LDS, dOs + 16 * w * LDE, LDE, Vs, LDE,
                                                 false);
    X::syncwarp();
    for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) {
        const int r = 16 * w + l / 2, hf = l & 1, q = q0 + r, sw = kg_fl_swz(l);
        const float lse = X::ld(&Lq[r]), delta = X::ld(&Dq[r]);
        for (int j = 0; j < 32; j++) {
            const int c = 32 * hf + (j ^ sw);
            const float s = X::ld(&Ss[r * KG_FL_LDS + c]), dp = X::ld(&dPs[r * KG_FL_LDS + c]);
            const bool in = k0 + c <= q;
            const float p = in ? exp2f(s * (a.scale * KG_FL_LOG2E) - lse) : 0.0f;
            const float ds = in ? p * (dp - delta) : 0.0f;
            if (Ps) X::st(&Ps[r * KG_FL_LDT + c], kg_fl_enc<OP>(p));
            X::st(&dSs[r * KG_FL_LDT + c], kg_fl_enc<OP>(ds));
        }
    }
}

/* Writes a float tile of width D times `mul`, rounded through rd, into
 * dqkv's columns [col, col + D) of rows [r0, r0 + 64) of batch element b
 * (rows past T skipped). */
KG_FL_NOCHECK
template <class X>
KG_FL_HD void kg_fl_store_grad(const kg_flash_args &a, const float *acc, int D, int b, size_t col, int r0, float mul) {
    const int ldo = kg_fl_ldo(D);
    const size_t base = (size_t)b * (size_t)a.T * 3u * (size_t)a.C + col;
    for (int t = X::tid0(); X::tin(t); t += X::tstep())
        for (int i = t; i < KG_FL_BR * D; i += KG_FL_THREADS) {
            const int r = i / D, d = i % D, row = r0 + r;
            if (row >= a.T) continue;
            const float v = X::ld(&acc[r * ldo + d]) * mul;
            const size_t e = base + (size_t)row * 3u * (size_t)a.C + d;
            if (a.s16) ((uint16_t *)a.dqkv)[e] = a.rd == KG_BF16 ? kg_fl_enc<KG_BF16>(v) : kg_fl_enc<KG_F16>(v);
            else ((float *)a.dqkv)[e] = kg_round_to_dtype(v, a.rd);
        }
}

/*
 * The backward's dK/dV program for key tile kt of head bh: over the query
 * tiles from the diagonal on, in order, the scores and P, dS of each (each
 * warp its 16 query rows), then dV += P^T dO and dK += dS^T q (each warp
 * its 16 key rows). dK is scaled by 1/sqrt(D) at the end.
 */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_dkdv_block(const kg_flash_args &a, unsigned char *sm, int kt, int bh) {
    constexpr int D = 16 * DN, LDE = D + 8, LDO = D + 4;
    const kg_fl_layout L = kg_fl_layout_of(KG_FL_DKDV, D);
    uint16_t *Qs = (uint16_t *)(sm + L.q), *Ks = (uint16_t *)(sm + L.k), *Vs = (uint16_t *)(sm + L.v);
    uint16_t *dOs = (uint16_t *)(sm + L.dout), *Ps = (uint16_t *)(sm + L.p), *dSs = (uint16_t *)(sm + L.ds);
    float *Ss = (float *)(sm + L.s), *dPs = (float *)(sm + L.dp);
    float *Lq = (float *)(sm + L.rowa), *Dq = (float *)(sm + L.rowb);
    const int b = bh / a.NH, h = bh % a.NH, T = a.T, k0 = kt * KG_FL_BC;
    typename X::template acc<DN> dK[X::kSlots], dV[X::kSlots];

    kg_fl_load_kv<X, OP>(a, Ks, Vs, b, h, D, k0);
    for (int w = X::warp0(); X::win(w); w += X::wstep()) X::acc_zero(dK[X::slot(w)]), X::acc_zero(dV[X::slot(w)]);
    const int nqt = (T + KG_FL_BR - 1) / KG_FL_BR;
    for (int qt = k0 / KG_FL_BR; qt < nqt; qt++) {
        const int q0 = qt * KG_FL_BR;
        kg_fl_load_rows<X, OP>(a, Qs, 0, b, h, D, q0);
        kg_fl_load_rows<X, OP>(a, dOs, 3, b, h, D, q0);
        kg_fl_load_stats<X>(a, Lq, Dq, bh, q0);
        X::sync();
        for (int w = X::warp0(); X::win(w); w += X::wstep())
            kg_fl_bwd_scores<X, OP, DN>(a, w, q0, k0, Qs, dOs, Ks, Vs, Ss, dPs, Lq, Dq, Ps, dSs);
        X::sync();
        for (int w = X::warp0(); X::win(w); w += X::wstep()) {
            X::template mma_acc<OP, 1, 0, KG_FL_BR / 16, DN>(dV[X::slot(w)], Ps + 16 * w, KG_FL_LDT, dOs, LDE);
            X::template mma_acc<OP, 1, 0, KG_FL_BR / 16, DN>(dK[X::slot(w)], dSs + 16 * w, KG_FL_LDT, Qs, LDE);
        }
        X::sync();
    }
    /* dK and dV through shared memory (the tiles' space, no longer read:
     * 2 x 64 x (D + 4) floats fit in the four 64 x (D + 8) 16-bit tiles),
     * so rows past T are not written */
    float *stK = (float *)(sm + L.q), *stV = stK + KG_FL_BC * LDO;
    for (int w = X::warp0(); X::win(w); w += X::wstep()) {
        X::acc_store(dK[X::slot(w)], stK + 16 * w * LDO, LDO);
        X::acc_store(dV[X::slot(w)], stV + 16 * w * LDO, LDO);
    }
    X::sync();
    kg_fl_store_grad<X>(a, stK, D, b, (size_t)a.C + (size_t)h * D, k0, a.scale);
    kg_fl_store_grad<X>(a, stV, D, b, 2u * (size_t)a.C + (size_t)h * D, k0, 1.0f);
}

/*
 * The backward's dQ program for query tile qt of head bh: over the key
 * tiles up to the diagonal, in order, the scores and dS of each warp's
 * rows, then dQ += dS k; scaled by 1/sqrt(D) at the end.
 */
KG_FL_NOCHECK
template <class X, int OP, int DN>
KG_FL_HD void kg_fl_dq_block(const kg_flash_args &a, unsigned char *sm, int qt, int bh) {
    constexpr int D = 16 * DN, LDE = D + 8, LDO = D + 4;
    const kg_fl_layout L = kg_fl_layout_of(KG_FL_DQ, D);
    uint16_t *Qs = (uint16_t *)(sm + L.q), *Ks = (uint16_t *)(sm + L.k), *Vs = (uint16_t *)(sm + L.v);
    uint16_t *dOs = (uint16_t *)(sm + L.dout), *dSs = (uint16_t *)(sm + L.ds);
    float *Ss = (float *)(sm + L.s), *dPs = (float *)(sm + L.dp);
    float *Lq = (float *)(sm + L.rowa), *Dq = (float *)(sm + L.rowb);
    const int b = bh / a.NH, h = bh % a.NH, T = a.T, q0 = qt * KG_FL_BR;
    typename X::template acc<DN> dQ[X::kSlots];

    kg_fl_load_rows<X, OP>(a, Qs, 0, b, h, D, q0);
    kg_fl_load_rows<X, OP>(a, dOs, 3, b, h, D, q0);
    kg_fl_load_stats<X>(a, Lq, Dq, bh, q0);
    for (int w = X::warp0(); X::win(w); w += X::wstep()) X::acc_zero(dQ[X::slot(w)]);
    const int nkt = kg_fl_key_tiles(q0, T);
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * KG_FL_BC;
        kg_fl_load_kv<X, OP>(a, Ks, Vs, b, h, D, k0);
        X::sync();
        for (int w = X::warp0(); X::win(w); w += X::wstep()) {
            kg_fl_bwd_scores<X, OP, DN>(a, w, q0, k0, Qs, dOs, Ks, Vs, Ss, dPs, Lq, Dq, (uint16_t *)0, dSs);
            X::syncwarp();
            X::template mma_acc<OP, 0, 0, KG_FL_BC / 16, DN>(dQ[X::slot(w)], dSs + 16 * w * KG_FL_LDT, KG_FL_LDT, Ks,
                                                             LDE);
        }
        X::sync();
    }
    /* dQ through shared memory (the tiles' space), so rows past T are not
     * written */
    float *st = (float *)(sm + L.q);
    for (int w = X::warp0(); X::win(w); w += X::wstep()) X::acc_store(dQ[X::slot(w)], st + 16 * w * LDO, LDO);
    X::sync();
    kg_fl_store_grad<X>(a, st, D, b, (size_t)h * D, q0, a.scale);
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
