/*
 * test_nf4.c — CUnit tests of the nf4/int4 example plugin. The quantizer and
 * the safetensors writer are linked directly and checked against things the
 * test computes on its own: the NF4 table from the normal quantile function
 * (QLoRA's create_normal_map), the nearest code of every element by brute
 * force, the int4 grid, the nibble order, and an export file read back with
 * a small JSON parser (names, dtypes, shapes, contiguous offsets, bytes).
 * The built plugin is then loaded under kiln's test host (kiln/testing.h,
 * the installed Kiln::testing), with an accelerator of the test's own (host
 * or "device" memory and a bf16 cast), to check the protocol: config
 * validation, setup, convert_params, the closure order, and the export at
 * on_fit_end.
 * Exits non-zero on any failure (counts read before CU_cleanup_registry).
 */
#define _POSIX_C_SOURCE 200809L

#include <CUnit/Basic.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kiln/kiln.h>
#include <kiln/testing.h>
#include <kiln/testing_cunit.h>

#include "nf4_export.h"
#include "nf4_quant.h"

#ifndef NF4_PLUGIN_PATH
#error "NF4_PLUGIN_PATH must name the built libkiln-nf4.so"
#endif

/* ---------------------------------------------------------------------------
 * Helpers: a deterministic RNG, the normal quantile, brute-force nearest */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double urand(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static float nrand(void) { /* roughly N(0, 1): weights look like this */
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Phi^-1(p) by bisection on Phi(x) = 0.5 * erfc(-x / sqrt(2)). */
static double phi_inv(double p) {
    double lo = -12.0, hi = 12.0;
    for (int i = 0; i < 200; i++) {
        double m = 0.5 * (lo + hi);
        if (0.5 * erfc(-m / sqrt(2.0)) < p) lo = m;
        else hi = m;
    }
    return 0.5 * (lo + hi);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The grid a kind's codes may take, by brute force over its table. */
static int grid_lo(int kind) { return kind == NF4Q_INT4 ? 1 : 0; } /* int4 never writes nibble 0 */

/* Index of the grid entry nearest to x, and the distance to it. */
static int nearest(int kind, double x, double *dist) {
    const float *t = nf4q_table(kind);
    int best = -1;
    double bd = INFINITY;
    for (int k = grid_lo(kind); k < 16; k++) {
        double d = fabs(x - (double)t[k]);
        if (d < bd) {
            bd = d;
            best = k;
        }
    }
    *dist = bd;
    return best;
}

/* Check one quantized block of w(n) against brute force. */
static void check_block(int kind, const float *w, size_t n, const uint8_t *codes, float absmax, const float *deq) {
    const float *t = nf4q_table(kind);
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(w[i]));
    CU_ASSERT_EQUAL(absmax, m);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = nf4q_get(codes, i);
        CU_ASSERT(c >= grid_lo(kind) && c < 16);
        CU_ASSERT_EQUAL(deq[i], absmax * t[c]); /* exactly the decoded table value */
        if (m == 0.0f) {
            CU_ASSERT_EQUAL(deq[i], 0.0f);
            continue;
        }
        double x = (double)(w[i] / m), d;
        int k = nearest(kind, x, &d);
        /* the chosen code is a nearest one (1e-6: float ties and the
         * rounding of w/absmax) ... */
        CU_ASSERT(fabs(x - (double)t[c]) <= d + 1e-6);
        /* ... and the nearest one whenever it is clearly nearer */
        double d2 = INFINITY;
        for (int j = grid_lo(kind); j < 16; j++)
            if (j != k) d2 = fmin(d2, fabs(x - (double)t[j]));
        if (d2 - d > 1e-6) {
            CU_ASSERT_EQUAL(c, k);
        }
        if (fabsf(w[i]) == m) {
            CU_ASSERT_EQUAL(deq[i], w[i]); /* the absmax element is exact */
        }
    }
}

/* ---------------------------------------------------------------------------
 * Quantizer tests */

static void test_nf4_codebook(void) {
    /* QLoRA create_normal_map(offset=0.9677083, use_extra_value=True):
     * 8 positive = Phi^-1(linspace(offset, 0.5, 9)[:-1]), 7 negative =
     * -Phi^-1(linspace(offset, 0.5, 8)[:-1]), and 0; divided by max |v|. */
    const double offset = 0.9677083;
    double v[16];
    int n = 0;
    for (int i = 0; i < 8; i++) v[n++] = phi_inv(offset + (0.5 - offset) * i / 8.0);
    v[n++] = 0.0;
    for (int i = 0; i < 7; i++) v[n++] = -phi_inv(offset + (0.5 - offset) * i / 7.0);
    qsort(v, 16, sizeof v[0], cmp_double);
    double mx = 0;
    for (int i = 0; i < 16; i++) mx = fmax(mx, fabs(v[i]));
    for (int i = 0; i < 16; i++) {
        double want = v[i] / mx;
        if (fabs((double)nf4q_nf4_table[i] - want) > 1e-6)
            printf("\n  nf4 table[%d] = %.9f, computed %.9f\n", i, nf4q_nf4_table[i], want);
        CU_ASSERT(fabs((double)nf4q_nf4_table[i] - want) <= 1e-6);
    }
    CU_ASSERT_EQUAL(nf4q_nf4_table[0], -1.0f);
    CU_ASSERT_EQUAL(nf4q_nf4_table[7], 0.0f);
    CU_ASSERT_EQUAL(nf4q_nf4_table[15], 1.0f);
    CU_ASSERT_PTR_EQUAL(nf4q_table(NF4Q_NF4), nf4q_nf4_table);
    CU_ASSERT_PTR_NULL(nf4q_table(7));
}

static void test_int4_grid(void) {
    for (int n = 0; n < 16; n++) CU_ASSERT(fabs((double)nf4q_int4_table[n] - (n - 8) / 7.0) <= 1e-7);
    CU_ASSERT_EQUAL(nf4q_int4_table[15], 1.0f);
    CU_ASSERT_EQUAL(nf4q_int4_table[1], -1.0f);
    CU_ASSERT_EQUAL(nf4q_int4_table[8], 0.0f);
    /* q = round(x * 7), clamped to [-7, 7] */
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_INT4, 0.0f), 8);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_INT4, 1.0f), 15);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_INT4, -1.0f), 1);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_INT4, 3.0f / 7.0f), 11);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_INT4, -2.4f / 7.0f), 6);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_INT4, 5.0f), 15);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_INT4, -5.0f), 1);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_NF4, 1.0f), 15);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_NF4, -1.0f), 0);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_NF4, 0.0f), 7);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_NF4, 0.03f), 7);
    CU_ASSERT_EQUAL(nf4q_encode(NF4Q_NF4, 0.05f), 8);
}

static void roundtrip_kind(int kind) {
    float w[64], deq[64];
    uint8_t codes[32];
    for (int rep = 0; rep < 300; rep++) {
        float scale = (float)pow(10.0, -4.0 + 6.0 * urand());
        for (int i = 0; i < 64; i++) w[i] = nrand() * scale;
        if (rep % 7 == 0) w[rep % 64] = -50.0f * scale; /* a negative absmax */
        if (rep % 11 == 0) /* values right on the grid */
            for (int i = 0; i < 64; i++) w[i] = nf4q_table(kind)[grid_lo(kind) + i % (16 - grid_lo(kind))] * scale;
        float a = nf4q_quantize_block(kind, w, 64, codes);
        nf4q_dequantize_block(kind, codes, 64, a, deq);
        check_block(kind, w, 64, codes, a, deq);
    }
    /* a zero block: absmax 0, all zeros, no NaN */
    memset(w, 0, sizeof w);
    w[3] = -0.0f;
    float a = nf4q_quantize_block(kind, w, 64, codes);
    nf4q_dequantize_block(kind, codes, 64, a, deq);
    CU_ASSERT_EQUAL(a, 0.0f);
    for (int i = 0; i < 64; i++) CU_ASSERT(deq[i] == 0.0f && !isnan(deq[i]));
    /* a non-finite block decodes to NaN, whatever else it holds */
    for (int i = 0; i < 64; i++) w[i] = (float)i;
    w[10] = INFINITY;
    a = nf4q_quantize_block(kind, w, 64, codes);
    nf4q_dequantize_block(kind, codes, 64, a, deq);
    CU_ASSERT(isnan(a));
    for (int i = 0; i < 64; i++) CU_ASSERT(isnan(deq[i]));
    w[10] = NAN;
    a = nf4q_quantize_block(kind, w, 64, codes);
    CU_ASSERT(isnan(a));
}

static void test_roundtrip_nf4(void) { roundtrip_kind(NF4Q_NF4); }
static void test_roundtrip_int4(void) { roundtrip_kind(NF4Q_INT4); }

/* A tensor whose last block is partial (and odd): whole-tensor calls equal
 * block-by-block calls, the padding nibble is 0, every block checks. */
static void partial_kind(int kind) {
    enum { N = 64 * 3 + 37, B = 64, NB = 4 };
    float w[N], deq[N], deq_b[B];
    uint8_t codes[(N + 1) / 2], codes_b[B / 2];
    float absmax[NB];
    for (int i = 0; i < N; i++) w[i] = nrand() * (i < 64 ? 0.01f : 1.0f);
    CU_ASSERT_EQUAL(nf4q_num_blocks(N, B), NB);
    CU_ASSERT_EQUAL(nf4q_packed_bytes(N), (N + 1) / 2);
    nf4q_quantize(kind, w, N, B, codes, absmax);
    nf4q_dequantize(kind, codes, absmax, N, B, deq);
    for (int b = 0; b < NB; b++) {
        int len = b == NB - 1 ? N - B * (NB - 1) : B;
        float a = nf4q_quantize_block(kind, w + b * B, (size_t)len, codes_b);
        CU_ASSERT_EQUAL(a, absmax[b]);
        CU_ASSERT_EQUAL(memcmp(codes_b, codes + b * B / 2, (size_t)len / 2), 0);
        nf4q_dequantize_block(kind, codes_b, (size_t)len, a, deq_b);
        CU_ASSERT_EQUAL(memcmp(deq_b, deq + b * B, (size_t)len * sizeof(float)), 0);
        check_block(kind, w + b * B, (size_t)len, codes + b * B / 2, absmax[b], deq + b * B);
    }
    CU_ASSERT_EQUAL(codes[N / 2] >> 4, 0); /* the odd tail's high nibble */
    CU_ASSERT_EQUAL(codes[N / 2] & 0xF, nf4q_get(codes, N - 1));
}

static void test_partial_nf4(void) { partial_kind(NF4Q_NF4); }
static void test_partial_int4(void) { partial_kind(NF4Q_INT4); }

/* Blocks longer than the quantizer's internal chunk, up to the largest
 * block_size (4096), with an odd partial tail. */
static void test_large_blocks(void) {
    enum { N = 4096 + 1025 };
    static float w[N], deq[N];
    static uint8_t codes[(N + 1) / 2];
    float absmax[8]; /* at most 5 blocks below */
    const size_t blocks[2] = {4096, 1030};
    for (int kind = NF4Q_NF4; kind <= NF4Q_INT4; kind++) {
        for (int bi = 0; bi < 2; bi++) {
            size_t B = blocks[bi], nb = nf4q_num_blocks(N, B);
            CU_ASSERT_FATAL(nb <= 8);
            for (int i = 0; i < N; i++) w[i] = nrand();
            nf4q_quantize(kind, w, N, B, codes, absmax);
            nf4q_dequantize(kind, codes, absmax, N, B, deq);
            for (size_t b = 0; b < nb; b++) {
                size_t len = N - b * B < B ? N - b * B : B;
                check_block(kind, w + b * B, len, codes + b * B / 2, absmax[b], deq + b * B);
            }
        }
    }
}

static void test_pack_order(void) {
    const uint8_t nib[5] = {0x1, 0x2, 0x3, 0xF, 0x9};
    uint8_t packed[3] = {0xAA, 0xAA, 0xAA}, back[5];
    nf4q_pack(nib, 5, packed);
    CU_ASSERT_EQUAL(packed[0], 0x21); /* element 0 in the low nibble */
    CU_ASSERT_EQUAL(packed[1], 0xF3);
    CU_ASSERT_EQUAL(packed[2], 0x09); /* odd tail: high nibble 0 */
    nf4q_unpack(packed, 5, back);
    CU_ASSERT_EQUAL(memcmp(back, nib, 5), 0);
    for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(nf4q_get(packed, (size_t)i), nib[i]);
    /* the quantizer uses the same order */
    float w[4] = {-1.0f, 1.0f, 0.0f, -1.0f};
    uint8_t c[2];
    nf4q_quantize_block(NF4Q_NF4, w, 4, c);
    CU_ASSERT_EQUAL(c[0], 0xF0);
    CU_ASSERT_EQUAL(c[1], 0x07);
    /* random round trip */
    uint8_t many[101], mp[51], mb[101];
    for (int i = 0; i < 101; i++) many[i] = (uint8_t)(urand() * 16);
    nf4q_pack(many, 101, mp);
    nf4q_unpack(mp, 101, mb);
    CU_ASSERT_EQUAL(memcmp(many, mb, 101), 0);
}

/* ---------------------------------------------------------------------------
 * A small JSON reader for the safetensors header: objects, arrays, strings
 * (with escapes) and non-negative integers are all it contains. */

enum { J_OBJ, J_ARR, J_STR, J_NUM };
typedef struct jv {
    int type;
    char *str;            /* J_STR                                            */
    unsigned long long num; /* J_NUM                                          */
    int n;                /* J_OBJ / J_ARR: members                           */
    char **keys;          /* J_OBJ                                            */
    struct jv **vals;
} jv;

static void jfree(jv *v) {
    if (!v) return;
    for (int i = 0; i < v->n; i++) {
        if (v->keys) free(v->keys[i]);
        jfree(v->vals[i]);
    }
    free(v->keys);
    free(v->vals);
    free(v->str);
    free(v);
}

static void jskip(const char **p) {
    while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r') (*p)++;
}

static char *jstring(const char **p) {
    if (**p != '"') return NULL;
    (*p)++;
    size_t cap = 16, len = 0;
    char *s = malloc(cap);
    while (s && **p && **p != '"') {
        char c = *(*p)++;
        if (c == '\\') {
            char e = *(*p)++;
            if (e == 'u') {
                unsigned u = 0;
                if (sscanf(*p, "%4x", &u) != 1) break;
                *p += 4;
                c = (char)u; /* the writer escapes only control characters */
            } else {
                c = e == 'n' ? '\n' : e == 't' ? '\t' : e;
            }
        }
        if (len + 2 > cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) break;
            s = t;
        }
        s[len++] = c;
    }
    if (!s || **p != '"') {
        free(s);
        return NULL;
    }
    (*p)++;
    s[len] = 0;
    return s;
}

static jv *jparse(const char **p) {
    jskip(p);
    jv *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    if (**p == '{' || **p == '[') {
        int obj = **p == '{';
        v->type = obj ? J_OBJ : J_ARR;
        (*p)++;
        jskip(p);
        if (**p == (obj ? '}' : ']')) {
            (*p)++;
            return v;
        }
        for (;;) {
            char *key = NULL;
            if (obj) {
                jskip(p);
                key = jstring(p);
                jskip(p);
                if (!key || **p != ':') {
                    free(key);
                    jfree(v);
                    return NULL;
                }
                (*p)++;
            }
            jv *m = jparse(p);
            if (!m) {
                free(key);
                jfree(v);
                return NULL;
            }
            v->vals = realloc(v->vals, (size_t)(v->n + 1) * sizeof *v->vals);
            if (obj) v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *v->keys);
            v->vals[v->n] = m;
            if (obj) v->keys[v->n] = key;
            v->n++;
            jskip(p);
            if (**p == ',') {
                (*p)++;
                continue;
            }
            if (**p == (obj ? '}' : ']')) {
                (*p)++;
                return v;
            }
            jfree(v);
            return NULL;
        }
    }
    if (**p == '"') {
        v->type = J_STR;
        v->str = jstring(p);
        if (!v->str) {
            jfree(v);
            return NULL;
        }
        return v;
    }
    if (**p >= '0' && **p <= '9') {
        v->type = J_NUM;
        char *end;
        v->num = strtoull(*p, &end, 10);
        *p = end;
        return v;
    }
    jfree(v);
    return NULL;
}

static const jv *jget(const jv *o, const char *key) {
    if (!o || o->type != J_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return o->vals[i];
    return NULL;
}

static const char *jstr(const jv *o, const char *key) {
    const jv *v = jget(o, key);
    return v && v->type == J_STR ? v->str : NULL;
}

/* ---------------------------------------------------------------------------
 * Reading an export back */

typedef struct {
    unsigned char *bytes;
    size_t size;
    uint64_t hlen;
    jv *hdr;
    const unsigned char *data; /* the data section */
} st_file;

static void st_close(st_file *f) {
    jfree(f->hdr);
    free(f->bytes);
    memset(f, 0, sizeof *f);
}

/* Read and parse; also checks the offsets: sorted by begin they start at 0,
 * touch without gaps and end exactly at the end of the file. */
static int st_open(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->bytes = malloc((size_t)sz + 1);
    f->size = (size_t)sz;
    if (!f->bytes || fread(f->bytes, 1, f->size, fp) != f->size) {
        fclose(fp);
        st_close(f);
        return -1;
    }
    fclose(fp);
    if (f->size < 8) return -1;
    for (int k = 0; k < 8; k++) f->hlen |= (uint64_t)f->bytes[k] << (8 * k);
    CU_ASSERT_EQUAL((8 + f->hlen) % 8, 0); /* data aligned to 8 */
    if (8 + f->hlen > f->size) return -1;
    char *json = malloc(f->hlen + 1);
    memcpy(json, f->bytes + 8, f->hlen);
    json[f->hlen] = 0;
    const char *p = json;
    f->hdr = jparse(&p);
    jskip(&p);
    int ok = f->hdr && f->hdr->type == J_OBJ && *p == 0; /* only padding spaces after the object */
    free(json);
    if (!ok) return -1;
    f->data = f->bytes + 8 + f->hlen;
    /* offsets: contiguous and covering the data section exactly */
    uint64_t data_size = f->size - 8 - f->hlen, pos = 0;
    int ntensors = 0;
    for (int i = 0; i < f->hdr->n; i++) ntensors += strcmp(f->hdr->keys[i], "__metadata__") != 0;
    for (int done = 0; done < ntensors; done++) {
        int found = 0;
        for (int i = 0; i < f->hdr->n; i++) {
            const jv *off = jget(f->hdr->vals[i], "data_offsets");
            if (!off) continue;
            if (off->type != J_ARR || off->n != 2) return -1;
            if (off->vals[0]->num == pos && (off->vals[1]->num > pos || done == ntensors - 1)) {
                pos = off->vals[1]->num;
                found = 1;
                break;
            }
        }
        if (!found) return -1; /* a gap or an overlap */
    }
    return pos == data_size ? 0 : -1;
}

/* binary16 bits to float, exactly (for reading F16 scales back) */
static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400), e - 25);
    return h & 0x8000 ? -v : v;
}

/* The integer float16 conversion (used where the compiler has no _Float16)
 * agrees with the compiler's on edge cases and on random bit patterns. */
static void test_f16_soft(void) {
    const float edge[] = {0.0f,   -0.0f,    1.0f,      65504.0f,   65519.99f, 65520.0f,  1e9f,     INFINITY,
                          -INFINITY, NAN,   6.1035156e-05f, 6.0975552e-05f, 5.9604645e-08f, 2.9802322e-08f,
                          2.9802326e-08f, 1e-10f, 0.33333334f, 1.0009766f, 1.0004883f, 1.0014648f, -2.5f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        uint16_t b = nf4x_f16_bits_soft(edge[i]);
        float back = half_to_float(b);
        if (isnan(edge[i])) {
            CU_ASSERT(isnan(back));
            continue;
        }
#if defined(__FLT16_MAX__)
        CU_ASSERT_EQUAL(b, nf4x_f16_bits(edge[i]));
#endif
        CU_ASSERT(back == edge[i] || isinf(back) == (fabsf(edge[i]) >= 65520.0f));
    }
    CU_ASSERT_EQUAL(nf4x_f16_bits_soft(65504.0f), 0x7bff);
    CU_ASSERT_EQUAL(nf4x_f16_bits_soft(65520.0f), 0x7c00);
    CU_ASSERT_EQUAL(nf4x_f16_bits_soft(1.0004883f), 0x3c00); /* 1 + 2^-11: a tie, to even */
    CU_ASSERT_EQUAL(nf4x_f16_bits_soft(1.0014648f), 0x3c02); /* 1 + 3 * 2^-11: a tie, to even */
    CU_ASSERT_EQUAL(nf4x_f16_bits_soft(5.9604645e-08f), 0x0001); /* 2^-24, the smallest subnormal */
    CU_ASSERT_EQUAL(nf4x_f16_bits_soft(2.9802322e-08f), 0x0000); /* 2^-25 ties to 0 */
#if defined(__FLT16_MAX__)
    for (int i = 0; i < 200000; i++) {
        uint32_t x = (uint32_t)(urand() * 4294967296.0);
        float f;
        memcpy(&f, &x, 4);
        if (isnan(f)) continue;
        uint16_t a = nf4x_f16_bits_soft(f), b = nf4x_f16_bits(f);
        if (a != b) printf("\n  f16(%a): soft %04x, _Float16 %04x\n", f, a, b);
        CU_ASSERT_EQUAL(a, b);
    }
    for (uint32_t x = 0x33000000u; x < 0x38900000u; x += 97) { /* the subnormal range, densely */
        float f;
        memcpy(&f, &x, 4);
        CU_ASSERT_EQUAL(nf4x_f16_bits_soft(f), nf4x_f16_bits(f));
    }
#endif
}

/* Check one exported weight's tensors against its codes and scales. */
static void st_check_weight(const st_file *f, const char *name, uint32_t ndim, const int64_t *shape, size_t numel,
                            size_t block, const uint8_t *codes, const float *absmax, int f16) {
    char key[256];
    snprintf(key, sizeof key, "%s.codes", name);
    const jv *c = jget(f->hdr, key);
    snprintf(key, sizeof key, "%s.absmax", name);
    const jv *a = jget(f->hdr, key);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_STRING_EQUAL(jstr(c, "dtype"), "U8");
    CU_ASSERT_STRING_EQUAL(jstr(a, "dtype"), f16 ? "F16" : "F32");
    const jv *cs = jget(c, "shape"), *as = jget(a, "shape");
    CU_ASSERT_FATAL(cs && cs->type == J_ARR && cs->n == 1 && as && as->type == J_ARR && as->n == 1);
    size_t nbytes = (numel + 1) / 2, nb = (numel + block - 1) / block;
    CU_ASSERT_EQUAL(cs->vals[0]->num, nbytes);
    CU_ASSERT_EQUAL(as->vals[0]->num, nb);
    const jv *co = jget(c, "data_offsets"), *ao = jget(a, "data_offsets");
    CU_ASSERT_EQUAL(co->vals[1]->num - co->vals[0]->num, nbytes);
    CU_ASSERT_EQUAL(ao->vals[1]->num - ao->vals[0]->num, nb * (f16 ? 2 : 4));
    CU_ASSERT_EQUAL(memcmp(f->data + co->vals[0]->num, codes, nbytes), 0);
    const unsigned char *ap = f->data + ao->vals[0]->num;
    for (size_t b = 0; b < nb; b++) {
        if (f16) {
            uint16_t bits = (uint16_t)(ap[2 * b] | ap[2 * b + 1] << 8);
            CU_ASSERT_EQUAL(bits, nf4x_f16_bits(absmax[b]));
            float v = half_to_float(bits); /* and it is absmax to half precision */
            if (absmax[b] >= 65520.0f) {
                CU_ASSERT(isinf(v));
            } else {
                CU_ASSERT(fabsf(v - absmax[b]) <= absmax[b] * (1.0f / 2048.0f) + 3e-8f);
            }
        } else {
            uint32_t bits = 0;
            for (int k = 0; k < 4; k++) bits |= (uint32_t)ap[4 * b + k] << (8 * k);
            float v;
            memcpy(&v, &bits, 4);
            CU_ASSERT_EQUAL(v, absmax[b]);
        }
    }
    /* the original shape in the metadata */
    const jv *meta = jget(f->hdr, "__metadata__");
    char want[128] = "[";
    for (uint32_t d = 0; d < ndim; d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), d ? ",%lld" : "%lld", (long long)shape[d]);
    strcat(want, "]");
    snprintf(key, sizeof key, "%s.shape", name);
    const char *got = jstr(meta, key);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got);
    CU_ASSERT_STRING_EQUAL(got, want);
}

static char tmpdir_path[64];

static int make_tmpdir(void) {
    snprintf(tmpdir_path, sizeof tmpdir_path, "/tmp/test_nf4.XXXXXX");
    return mkdtemp(tmpdir_path) ? 0 : -1;
}

/* Files in the directory (to see that no temporary file is left). */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[512];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void export_case(int f16) {
    CU_ASSERT_EQUAL_FATAL(make_tmpdir(), 0);
    const size_t block = 16;
    static const int64_t s0[2] = {5, 7}, s1[3] = {2, 3, 11}; /* 35 (odd), 66 elements */
    float w0[35], w1[66];
    for (int i = 0; i < 35; i++) w0[i] = nrand();
    for (int i = 0; i < 66; i++) w1[i] = nrand() * 100.0f;
    uint8_t c0[18], c1[33];
    float a0[3], a1[5];
    nf4q_quantize(NF4Q_NF4, w0, 35, block, c0, a0);
    nf4q_quantize(NF4Q_NF4, w1, 66, block, c1, a1);
    const nf4x_weight ws[2] = {{"layers.0.weight", 2, s0, 35, c0, a0}, {"odd \"name\"\\x", 3, s1, 66, c1, a1}};
    char path[128], err[256] = "";
    snprintf(path, sizeof path, "%s/q.safetensors", tmpdir_path);
    int rc = nf4x_write(path, "nf4", block, f16 ? NF4X_SCALE_F16 : NF4X_SCALE_F32, ws, 2, err, sizeof err);
    if (rc) printf("\n  %s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(count_files(tmpdir_path), 1); /* the temporary file was renamed */
    st_file f;
    CU_ASSERT_EQUAL_FATAL(st_open(path, &f), 0);
    const jv *meta = jget(f.hdr, "__metadata__");
    CU_ASSERT_STRING_EQUAL(jstr(meta, "format"), "kiln-nf4-1");
    CU_ASSERT_STRING_EQUAL(jstr(meta, "quant"), "nf4");
    CU_ASSERT_STRING_EQUAL(jstr(meta, "block_size"), "16");
    CU_ASSERT_STRING_EQUAL(jstr(meta, "scale_dtype"), f16 ? "float16" : "float32");
    CU_ASSERT_EQUAL(f.hdr->n, 5); /* metadata + 2 x (codes, absmax) */
    st_check_weight(&f, "layers.0.weight", 2, s0, 35, block, c0, a0, f16);
    st_check_weight(&f, "odd \"name\"\\x", 3, s1, 66, block, c1, a1, f16);
    uint64_t cb, sb;
    nf4x_sizes(ws, 2, block, f16 ? NF4X_SCALE_F16 : NF4X_SCALE_F32, &cb, &sb);
    CU_ASSERT_EQUAL(cb, 18 + 33);
    CU_ASSERT_EQUAL(sb, (3 + 5) * (f16 ? 2u : 4u));
    CU_ASSERT_EQUAL(f.size, 8 + f.hlen + cb + sb);
    st_close(&f);
    /* an unwritable target: an error message, no file */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/missing-dir/q.safetensors", tmpdir_path);
    CU_ASSERT_NOT_EQUAL(nf4x_write(bad, "nf4", block, NF4X_SCALE_F32, ws, 2, err, sizeof err), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "missing-dir"));
    rm_dir(tmpdir_path);
}

static void test_export_f32(void) { export_case(0); }
static void test_export_f16(void) { export_case(1); }

/* ---------------------------------------------------------------------------
 * The plugin under kiln's test host, on an accelerator of the test's own */

static kiln_test_host *th; /* made by the plugin suite's init */

static struct {
    int host_mem;          /* the accelerator's KILN_KERNELS_HOST_MEMORY      */
    uint8_t key;           /* "device" memory: bytes XOR key (0: host memory) */
    int d2h, h2d, casts;   /* kernel calls seen                               */
    int outstanding;       /* accelerator allocations not yet freed           */
    int order[8], norder;  /* closure call order                              */
} H;

/* The newest log line at exactly `level` ("" when none). */
static const char *last_line(int32_t level) {
    for (size_t i = kiln_test_log_count(th); i-- > 0;)
        if (kiln_test_log(th, i)->level == level) return kiln_test_log(th, i)->text;
    return "";
}

static int accel_token; /* the accelerator "instance" */

/* the kernels the plugin may use: alloc/free/copy and cast */
static int32_t k_alloc(kiln_instance *acc, size_t bytes, void **out) {
    CU_ASSERT_PTR_EQUAL(acc, (kiln_instance *)&accel_token);
    size_t n = (bytes + 63) / 64 * 64;
    *out = aligned_alloc(64, n ? n : 64);
    if (!*out) return KILN_E_NOMEM;
    memset(*out, 0, n ? n : 64);
    H.outstanding++;
    return KILN_OK;
}
static void k_free(kiln_instance *acc, void *p) {
    (void)acc;
    if (p) H.outstanding--;
    free(p);
}
/* Without KILN_KERNELS_HOST_MEMORY the mock's "device" memory holds every
 * byte XOR key, so a plugin that reads or writes it without copy() (or
 * cast()) sees garbage and the test notices. */
static void xor_bytes(void *dst, const void *src, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) ((uint8_t *)dst)[i] = ((const uint8_t *)src)[i] ^ H.key;
}
static int32_t k_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    (void)acc;
    H.d2h += kind == KILN_COPY_D2H;
    H.h2d += kind == KILN_COPY_H2D;
    if (kind == KILN_COPY_D2D) memcpy(dst, src, bytes);
    else xor_bytes(dst, src, bytes);
    return KILN_OK;
}
static uint16_t f32_to_bf16(float f) { /* round to nearest even */
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(b >> 16 | 0x40);
    return (uint16_t)((b + 0x7fffu + (b >> 16 & 1)) >> 16);
}
static int32_t k_cast(kiln_instance *acc, void *dst, uint32_t dt, const void *src, uint32_t st, size_t n) {
    (void)acc;
    if (dt != KILN_DTYPE_BF16 || st != KILN_DTYPE_F32) return KILN_E_UNSUPPORTED;
    for (size_t i = 0; i < n; i++) { /* device to device: decode, convert, encode */
        float f;
        uint16_t h;
        xor_bytes(&f, (const float *)src + i, 4);
        h = f32_to_bf16(f);
        xor_bytes((uint16_t *)dst + i, &h, 2);
    }
    H.casts++;
    return KILN_OK;
}
static kiln_kernels kernels;

static void set_memory(int host_mem) {
    H.host_mem = host_mem;
    H.key = host_mem ? 0 : 0x5A;
    kernels.flags = host_mem ? KILN_KERNELS_HOST_MEMORY : 0;
}

static const kiln_library *lib;

static const kiln_plugin_desc *find_plugin(const char *name) {
    if (!lib) return NULL;
    for (uint32_t i = 0; i < lib->plugin_count; i++)
        if (!strcmp(lib->plugins[i]->name, name)) return lib->plugins[i];
    return NULL;
}

static int load_plugin(void) {
    if (kiln_test_host_new(&th) != KILN_OK) return -1;
    kiln_test_set_log_level(th, KILN_LOG_DEBUG); /* every level enabled */
    kernels = (kiln_kernels){.struct_size = sizeof(kiln_kernels), .alloc = k_alloc, .free = k_free,
                             .copy = k_copy, .cast = k_cast};
    kiln_test_set_accelerator(th, (kiln_instance *)&accel_token, &kernels);
    return kiln_test_open(th, NF4_PLUGIN_PATH, &lib) == KILN_OK ? 0 : -1;
}

static int plugin_suite_clean(void) {
    kiln_test_host_free(th);
    th = NULL;
    return 0;
}

/* The resolved config the host would pass: every declared key. */
typedef struct {
    kiln_kv kv[6];
} cfg_t;

static cfg_t make_cfg(int64_t block, const char *compute, const char *scale, int exp, const char *file) {
    cfg_t c = {{{"block_size", KILN_V_INT(block)},
                {"compute_dtype", KILN_V_STR(compute)},
                {"scale_dtype", KILN_V_STR(scale)},
                {"export", KILN_V_BOOL(exp)},
                {"export_file", KILN_V_STR(file)},
                {NULL, KILN_V_NONE}}};
    return c;
}

static const kiln_precision_ops *pops(const kiln_plugin_desc *d) { return (const kiln_precision_ops *)d->ops; }

static kiln_instance *create_ok(const char *name, const cfg_t *c) {
    const kiln_plugin_desc *d = find_plugin(name);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    kiln_instance *inst = NULL;
    int32_t rc = kiln_test_create(th, d, c->kv, &inst);
    if (rc) printf("\n  create: %s\n", kiln_test_error(th));
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    return inst;
}

/* Three parameters: a (4, 50) weight (last block of 64 partial), a (4) bias
 * and a (3, 3, 3) weight of odd size. */
typedef struct {
    kiln_parameter p[3];
    kiln_parameter *ptrs[3];
    float data0[200], data1[4], data2[27]; /* the masters as the test sees them */
    float dev0[200], dev1[4], dev2[27];    /* p->data without host memory       */
    float *host[3];
} model_t;

/* Copy the masters to "device" memory (when the accelerator has its own). */
static void upload(model_t *m) {
    if (H.host_mem) return;
    for (int i = 0; i < 3; i++) xor_bytes(m->p[i].data, m->host[i], (size_t)m->p[i].numel * sizeof(float));
}

static void make_model(model_t *m) {
    memset(m, 0, sizeof *m);
    const struct { const char *name; uint32_t ndim; int64_t shape[3]; float *data, *dev; } spec[3] = {
        {"layers.0.weight", 2, {4, 50, 1}, m->data0, m->dev0},
        {"layers.0.bias", 1, {4, 1, 1}, m->data1, m->dev1},
        {"conv.weight", 3, {3, 3, 3}, m->data2, m->dev2},
    };
    for (int i = 0; i < 3; i++) {
        kiln_parameter *p = &m->p[i];
        p->struct_size = sizeof *p;
        p->name = spec[i].name;
        p->ndim = spec[i].ndim;
        p->numel = 1;
        for (uint32_t d = 0; d < KILN_MAX_DIMS; d++) p->shape[d] = d < spec[i].ndim ? spec[i].shape[d] : 1;
        for (uint32_t d = 0; d < spec[i].ndim; d++) p->numel *= spec[i].shape[d];
        p->data = H.host_mem ? spec[i].data : spec[i].dev;
        p->param_dtype = KILN_DTYPE_F32;
        m->host[i] = spec[i].data;
        for (int64_t j = 0; j < p->numel; j++) m->host[i][j] = nrand() * 0.1f;
        m->ptrs[i] = p;
    }
    upload(m);
}

/* p->compute holds the block-wise quantized-dequantized masters (host
 * copy `w`), rounded to bf16 when asked. */
static void expect_dequant(int kind, const float *w, const kiln_parameter *p, size_t block, int bf16) {
    size_t n = (size_t)p->numel;
    uint8_t codes[128];
    float absmax[8], deq[256], got[256];
    nf4q_quantize(kind, w, n, block, codes, absmax);
    nf4q_dequantize(kind, codes, absmax, n, block, deq);
    for (size_t b = 0; b * block < n; b++) {
        size_t len = n - b * block < block ? n - b * block : block;
        check_block(kind, w + b * block, len, codes + b * block / 2, absmax[b], deq + b * block);
    }
    xor_bytes(got, p->compute, n * (bf16 ? 2 : 4)); /* read it "back from the device" */
    if (bf16) {
        for (size_t i = 0; i < n; i++) CU_ASSERT_EQUAL(((const uint16_t *)got)[i], f32_to_bf16(deq[i]));
    } else {
        CU_ASSERT_EQUAL(memcmp(got, deq, n * sizeof(float)), 0);
    }
}

static void test_plugin_descriptors(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(lib);
    CU_ASSERT_EQUAL(lib->plugin_count, 2);
    CU_ASSERT_EQUAL(lib->min_host_minor, 2);
    CU_ASSERT_STRING_EQUAL(lib->library_name, "nf4");
    const char *names[2] = {"nf4", "int4"};
    for (int i = 0; i < 2; i++) {
        const kiln_plugin_desc *d = find_plugin(names[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(d);
        CU_ASSERT_EQUAL(d->kind, KILN_KIND_PRECISION);
        CU_ASSERT_STRING_EQUAL(kiln_kv_str(d->properties, "precision", ""), names[i]);
        CU_ASSERT_STRING_EQUAL(kiln_kv_str(d->properties, "amp_backend", ""), "kiln-example-4bit");
        CU_ASSERT_STRING_EQUAL(kiln_kv_str(d->properties, "param_dtype", ""), "float32");
        CU_ASSERT_STRING_EQUAL(kiln_kv_str(d->properties, "compute_dtype", ""), "float32");
        CU_ASSERT_EQUAL(kiln_kv_float(d->properties, "bits_per_weight", 0), 4.0);
        CU_ASSERT_EQUAL(kiln_kv_find(d->properties, "needs_grad_scaler")->type, KILN_TYPE_BOOL);
        CU_ASSERT_EQUAL(kiln_kv_int(d->properties, "needs_grad_scaler", 1), 0);
        CU_ASSERT(pops(d)->base.struct_size >= KILN_PRECISION_OPS_SIZE_1_2);
        CU_ASSERT_PTR_NOT_NULL(pops(d)->on_event);
        int nparams = 0;
        for (const kiln_param *p = d->params; p && p->key; p++, nparams++) CU_ASSERT_PTR_NOT_NULL(p->help);
        CU_ASSERT_EQUAL(nparams, 6); /* block_size, compute_dtype, scale_dtype, export, export_file, cuda_kernel */
    }
}

static void test_plugin_bad_config(void) {
    const kiln_plugin_desc *d = find_plugin("nf4");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    const struct { cfg_t c; const char *needle; } bad[] = {
        {make_cfg(3, "float32", "float32", 1, "x"), "block_size"},
        {make_cfg(0, "float32", "float32", 1, "x"), "block_size"},
        {make_cfg(-64, "float32", "float32", 1, "x"), "block_size"},
        {make_cfg(8192, "float32", "float32", 1, "x"), "block_size"},
        {make_cfg(64, "float16", "float32", 1, "x"), "compute_dtype"},
        {make_cfg(64, "", "float32", 1, "x"), "compute_dtype"},
        {make_cfg(64, "float32", "bf16", 1, "x"), "scale_dtype"},
        {make_cfg(64, "float32", "float32", 1, "../escape.safetensors"), "export_file"},
        {make_cfg(64, "float32", "float32", 1, ""), "export_file"},
        {make_cfg(64, "float32", "float32", 1, ".."), "export_file"},
        {make_cfg(64, "float32", "float32", 1, "a\nb"), "export_file"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_instance *inst = NULL;
        kiln_test_clear_error(th);
        int32_t rc = kiln_test_create(th, d, bad[i].c.kv, &inst);
        CU_ASSERT_EQUAL(rc, KILN_E_CONFIG);
        CU_ASSERT_PTR_NULL(inst);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), bad[i].needle));
    }
    cfg_t ok = make_cfg(2, "float32", "float16", 0, "w.safetensors");
    kiln_instance *inst = create_ok("int4", &ok);
    kiln_test_destroy(th, inst);
}

static void convert_case(const char *name, int kind, int host_mem, int bf16) {
    set_memory(host_mem);
    H.d2h = H.h2d = H.casts = 0;
    cfg_t c = make_cfg(64, bf16 ? "bfloat16" : "float32", "float32", 1, "q.safetensors");
    kiln_instance *inst = create_ok(name, &c);
    const kiln_precision_ops *ops = pops(find_plugin(name));
    model_t m;
    make_model(&m);
    int32_t rc = ops->setup(inst, m.ptrs, 3);
    if (rc) printf("\n  setup: %s\n", kiln_test_error(th));
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    /* weights get an accelerator copy in the compute dtype, the bias
     * computes from its masters */
    uint32_t want = bf16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
    CU_ASSERT(m.p[0].compute && m.p[0].compute != m.p[0].data && m.p[0].compute_dtype == want);
    CU_ASSERT(m.p[2].compute && m.p[2].compute != m.p[2].data && m.p[2].compute_dtype == want);
    CU_ASSERT_PTR_EQUAL(m.p[1].compute, m.p[1].data);
    CU_ASSERT_EQUAL(m.p[1].compute_dtype, KILN_DTYPE_F32);
    CU_ASSERT_EQUAL(H.outstanding, 2 + bf16); /* two compute copies (+ the bf16 fp32 scratch) */
    for (int step = 0; step < 2; step++) {
        CU_ASSERT_EQUAL_FATAL(kiln_test_convert_params(th, inst), KILN_OK);
        expect_dequant(kind, m.data0, &m.p[0], 64, bf16);
        expect_dequant(kind, m.data2, &m.p[2], 64, bf16);
        for (int i = 0; i < 200; i++) m.data0[i] += 0.01f * nrand(); /* an "optimizer step" */
        upload(&m);
    }
    if (host_mem) {
        CU_ASSERT(H.d2h == 0 && H.h2d == 0);
    } else {
        CU_ASSERT(H.d2h == 4 && H.h2d == 4); /* per convert: each weight down and back up */
    }
    CU_ASSERT_EQUAL(H.casts, bf16 ? 4 : 0);
    double scale = 0;
    CU_ASSERT_EQUAL(kiln_test_pre_backward(th, inst, 2.5, &scale), KILN_OK);
    CU_ASSERT_EQUAL(scale, 1.0);
    kiln_test_destroy(th, inst);
    CU_ASSERT_EQUAL(H.outstanding, 0); /* every accelerator buffer freed */
}

static void test_plugin_convert_nf4(void) { convert_case("nf4", NF4Q_NF4, 1, 0); }
static void test_plugin_convert_int4(void) { convert_case("int4", NF4Q_INT4, 1, 0); }
static void test_plugin_convert_device(void) { convert_case("nf4", NF4Q_NF4, 0, 0); }
static void test_plugin_convert_bf16(void) { convert_case("nf4", NF4Q_NF4, 1, 1); }
static void test_plugin_convert_bf16_device(void) { convert_case("int4", NF4Q_INT4, 0, 1); }

static void test_plugin_setup_refusals(void) {
    set_memory(1);
    const kiln_precision_ops *ops = pops(find_plugin("nf4"));
    /* fp64 masters */
    cfg_t c = make_cfg(64, "float32", "float32", 1, "q.safetensors");
    kiln_instance *inst = create_ok("nf4", &c);
    model_t m;
    make_model(&m);
    m.p[1].param_dtype = KILN_DTYPE_F64;
    kiln_test_clear_error(th);
    CU_ASSERT_EQUAL(ops->setup(inst, m.ptrs, 3), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "layers.0.bias"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "float64"));
    CU_ASSERT_EQUAL(H.outstanding, 0);
    kiln_test_destroy(th, inst);
    /* bf16 compute with a 1.1 kernel table (no cast) */
    c = make_cfg(64, "bfloat16", "float32", 1, "q.safetensors");
    inst = create_ok("nf4", &c);
    make_model(&m);
    kernels.struct_size = (uint32_t)KILN_KERNELS_SIZE_1_1;
    kiln_test_clear_error(th);
    CU_ASSERT_EQUAL(ops->setup(inst, m.ptrs, 3), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "cast"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "1.1"));
    kernels.struct_size = sizeof(kiln_kernels);
    /* ... and with a 1.2 table whose cast is NULL */
    kernels.cast = NULL;
    kiln_test_clear_error(th);
    CU_ASSERT_EQUAL(ops->setup(inst, m.ptrs, 3), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "NULL"));
    kernels.cast = k_cast;
    CU_ASSERT_EQUAL(H.outstanding, 0);
    /* the same instance still sets up once the accelerator can cast */
    CU_ASSERT_EQUAL(ops->setup(inst, m.ptrs, 3), KILN_OK);
    CU_ASSERT_EQUAL(m.p[0].compute_dtype, KILN_DTYPE_BF16);
    kiln_test_destroy(th, inst);
    CU_ASSERT_EQUAL(H.outstanding, 0);
}

static int32_t cl_main(void *ctx, double *loss) {
    (void)ctx;
    H.order[H.norder++] = 1;
    *loss = 0.5;
    return KILN_OK;
}
static int32_t cl_after(void *ctx, double *loss) {
    (void)ctx;
    (void)loss;
    H.order[H.norder++] = 2;
    return KILN_OK;
}
static int32_t opt_step(void *ctx, const kiln_closure *closure) {
    (void)ctx;
    double loss = 0;
    int32_t rc = closure->call(closure->ctx, &loss);
    CU_ASSERT_EQUAL(loss, 0.5);
    H.order[H.norder++] = 3;
    return rc;
}

static void test_plugin_optimizer_step(void) {
    cfg_t c = make_cfg(64, "float32", "float32", 1, "q.safetensors");
    kiln_instance *inst = create_ok("int4", &c);
    const kiln_precision_ops *ops = pops(find_plugin("int4"));
    kiln_closure main_cl = {sizeof(kiln_closure), 0, NULL, cl_main}, after = {sizeof(kiln_closure), 0, NULL, cl_after};
    kiln_optimizer_ref opt = {sizeof opt, 0, NULL, opt_step};
    int32_t skipped = 7;
    H.norder = 0;
    CU_ASSERT_EQUAL(ops->optimizer_step(inst, &opt, &main_cl, &after, &skipped), KILN_OK);
    CU_ASSERT_EQUAL(skipped, 0);
    CU_ASSERT_EQUAL(H.norder, 3); /* training step + backward, then after_closure, then the update */
    CU_ASSERT(H.order[0] == 1 && H.order[1] == 2 && H.order[2] == 3);
    /* the same through the test host's own closure and optimizer handle */
    CU_ASSERT_EQUAL(kiln_test_precision_step(th, inst, NULL, cl_main, NULL, &skipped), KILN_OK);
    CU_ASSERT_EQUAL(skipped, 0);
    CU_ASSERT_EQUAL(kiln_test_counters(th)->closure_calls, 1);
    CU_ASSERT_EQUAL(kiln_test_counters(th)->after_closure, 1);
    CU_ASSERT_EQUAL(kiln_test_counters(th)->updates, 1);
    CU_ASSERT_EQUAL(kiln_test_counters(th)->last_loss, 0.5);
    kiln_test_destroy(th, inst);
}

static void fit_end(kiln_instance *inst, int32_t *rc) {
    /* the trainer state is the test host's; the stage is given */
    kiln_event ev = {.id = KILN_EV_ON_FIT_END, .stage = KILN_STAGE_FIT, .batch_idx = -1};
    *rc = kiln_test_event(th, inst, &ev);
}

static void export_plugin_case(const char *name, int kind, int f16, int host_mem) {
    set_memory(host_mem);
    CU_ASSERT_EQUAL_FATAL(make_tmpdir(), 0);
    memset(kiln_test_trainer(th), 0, sizeof(kiln_trainer_state));
    kiln_test_trainer(th)->struct_size = sizeof(kiln_trainer_state);
    kiln_test_trainer(th)->run_dir = tmpdir_path;
    cfg_t c = make_cfg(64, "float32", f16 ? "float16" : "float32", 1, "w4.safetensors");
    kiln_instance *inst = create_ok(name, &c);
    const kiln_precision_ops *ops = pops(find_plugin(name));
    model_t m;
    make_model(&m);
    CU_ASSERT_EQUAL_FATAL(ops->setup(inst, m.ptrs, 3), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_convert_params(th, inst), KILN_OK);
    /* the masters move after the last forward: the export has the final ones */
    for (int i = 0; i < 200; i++) m.data0[i] = -m.data0[i] * 3.0f;
    if (f16) m.data2[5] = 1e5f; /* a scale fp16 cannot hold: inf, with a warning */
    upload(&m);
    int32_t rc;
    /* other events are ignored; ranks other than 0 write nothing */
    kiln_event other = {.struct_size = sizeof other, .id = KILN_EV_ON_TRAIN_END, .trainer = kiln_test_trainer(th)};
    CU_ASSERT_EQUAL(ops->on_event(inst, &other), KILN_OK);
    kiln_test_trainer(th)->rank = 1;
    fit_end(inst, &rc);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(count_files(tmpdir_path), 0);
    kiln_test_trainer(th)->rank = 0;
    kiln_test_clear_log(th);
    fit_end(inst, &rc);
    if (rc) printf("\n  on_fit_end: %s\n", kiln_test_error(th));
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(count_files(tmpdir_path), 1);
    if (f16) {
        CU_ASSERT_PTR_NOT_NULL(strstr(last_line(KILN_LOG_WARN), "1 block scales"));
    } else {
        CU_ASSERT_PTR_NULL(kiln_test_log_find(th, KILN_LOG_WARN, NULL));
    }
    /* the memory line: 227 weights, 114 bytes of codes, 4 + 1 scales */
    char want[256];
    size_t sbytes = 5 * (f16 ? 2u : 4u);
    snprintf(want, sizeof want, "%s: 227 weights in 4-bit: %.2f MiB codes + %.2f MiB scales = %.2f MiB vs %.2f MiB fp32",
             name, 114 / 1048576.0, sbytes / 1048576.0, (114 + sbytes) / 1048576.0, 908 / 1048576.0);
    CU_ASSERT_PTR_NOT_NULL(strstr(last_line(KILN_LOG_INFO), want));
    if (!strstr(last_line(KILN_LOG_INFO), want)) printf("\n  got \"%s\"\n  want \"%s\"\n", last_line(KILN_LOG_INFO), want);

    char path[160];
    snprintf(path, sizeof path, "%s/w4.safetensors", tmpdir_path);
    st_file f;
    CU_ASSERT_EQUAL_FATAL(st_open(path, &f), 0);
    const jv *meta = jget(f.hdr, "__metadata__");
    CU_ASSERT_STRING_EQUAL(jstr(meta, "format"), "kiln-nf4-1");
    CU_ASSERT_STRING_EQUAL(jstr(meta, "quant"), name);
    CU_ASSERT_STRING_EQUAL(jstr(meta, "block_size"), "64");
    CU_ASSERT_EQUAL(f.hdr->n, 5); /* metadata + 2 weights x 2; no bias */
    CU_ASSERT_PTR_NULL(jget(f.hdr, "layers.0.bias.codes"));
    uint8_t codes[100];
    float absmax[4];
    nf4q_quantize(kind, m.data0, 200, 64, codes, absmax);
    st_check_weight(&f, "layers.0.weight", 2, m.p[0].shape, 200, 64, codes, absmax, f16);
    nf4q_quantize(kind, m.data2, 27, 64, codes, absmax);
    st_check_weight(&f, "conv.weight", 3, m.p[2].shape, 27, 64, codes, absmax, f16);
    st_close(&f);
    unlink(path);

    /* no run directory: skipped with an info line, not an error */
    kiln_test_trainer(th)->run_dir = "";
    fit_end(inst, &rc);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(count_files(tmpdir_path), 0);
    /* no trainer state at all */
    kiln_event bare = {.struct_size = sizeof bare, .id = KILN_EV_ON_FIT_END};
    CU_ASSERT_EQUAL(ops->on_event(inst, &bare), KILN_OK);
    /* a run directory that does not exist: KILN_E_IO with the path */
    char missing[128];
    snprintf(missing, sizeof missing, "%s/gone", tmpdir_path);
    kiln_test_trainer(th)->run_dir = missing;
    kiln_test_clear_error(th);
    fit_end(inst, &rc);
    CU_ASSERT_EQUAL(rc, KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "gone"));
    kiln_test_destroy(th, inst);

    /* export = false: nothing written */
    kiln_test_trainer(th)->run_dir = tmpdir_path;
    c = make_cfg(64, "float32", "float32", 0, "w4.safetensors");
    inst = create_ok(name, &c);
    make_model(&m);
    CU_ASSERT_EQUAL_FATAL(ops->setup(inst, m.ptrs, 3), KILN_OK);
    fit_end(inst, &rc);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(count_files(tmpdir_path), 0);
    kiln_test_destroy(th, inst);
    memset(kiln_test_trainer(th), 0, sizeof(kiln_trainer_state));
    rm_dir(tmpdir_path);
}

static void test_plugin_export_nf4(void) { export_plugin_case("nf4", NF4Q_NF4, 0, 1); }
static void test_plugin_export_int4_f16(void) { export_plugin_case("int4", NF4Q_INT4, 1, 0); }

/* ---------------------------------------------------------------------------
 * Registration and main */

static int plugin_suite_init(void) { return load_plugin(); }

static void register_tests(void) {
    CU_pSuite q = CU_add_suite("nf4_quant", NULL, NULL);
    CU_add_test(q, "NF4 table equals QLoRA's normal map", test_nf4_codebook);
    CU_add_test(q, "int4 grid and encoding", test_int4_grid);
    CU_add_test(q, "nf4 round trip is nearest-code", test_roundtrip_nf4);
    CU_add_test(q, "int4 round trip is nearest-code", test_roundtrip_int4);
    CU_add_test(q, "nf4 partial last block", test_partial_nf4);
    CU_add_test(q, "int4 partial last block", test_partial_int4);
    CU_add_test(q, "blocks up to 4096 elements", test_large_blocks);
    CU_add_test(q, "pack/unpack nibble order", test_pack_order);
    CU_pSuite x = CU_add_suite("nf4_export", NULL, NULL);
    CU_add_test(x, "float16 conversion", test_f16_soft);
    CU_add_test(x, "safetensors export (F32 scales) parses", test_export_f32);
    CU_add_test(x, "safetensors export (F16 scales) parses", test_export_f16);
    CU_pSuite p = CU_add_suite("nf4_plugin", plugin_suite_init, plugin_suite_clean);
    CU_add_test(p, "descriptors and properties", test_plugin_descriptors);
    CU_add_test(p, "bad config is refused", test_plugin_bad_config);
    CU_add_test(p, "nf4 convert_params", test_plugin_convert_nf4);
    CU_add_test(p, "int4 convert_params", test_plugin_convert_int4);
    CU_add_test(p, "convert through device memory", test_plugin_convert_device);
    CU_add_test(p, "bf16 compute", test_plugin_convert_bf16);
    CU_add_test(p, "bf16 compute through device memory", test_plugin_convert_bf16_device);
    CU_add_test(p, "setup refusals", test_plugin_setup_refusals);
    CU_add_test(p, "optimizer_step closure order", test_plugin_optimizer_step);
    CU_add_test(p, "nf4 export at on_fit_end", test_plugin_export_nf4);
    CU_add_test(p, "int4 export with fp16 scales, device memory", test_plugin_export_int4_f16);
}

int main(void) { return kiln_testing_run_cunit(register_tests); }
