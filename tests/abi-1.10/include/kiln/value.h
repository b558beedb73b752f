/*
 * kiln/value.h — typed values that cross the ABI boundary: plugin properties
 * (read by the host without creating an instance), the config keys a plugin
 * declares (with types and defaults, so typos fail before anything runs), and
 * the resolved config handed to create(). One tagged union serves all three.
 * kiln_value, kiln_kv and kiln_param are FROZEN for ABI major 1: arrays of
 * them are walked with sizeof() of this layout, so they can never grow.
 * New information goes into new, separately sized structs instead.
 */
#ifndef KILN_VALUE_H
#define KILN_VALUE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Value types. Fixed numbers; never renumbered. */
enum {
    KILN_TYPE_NONE = 0,        /* no value (a required param has no default)     */
    KILN_TYPE_BOOL = 1,        /* v.i is 0 or 1                                   */
    KILN_TYPE_INT = 2,         /* v.i                                             */
    KILN_TYPE_FLOAT = 3,       /* v.f                                             */
    KILN_TYPE_STRING = 4,      /* v.s, NUL-terminated UTF-8                       */
    KILN_TYPE_INT_LIST = 5,    /* v.il[count]                                     */
    KILN_TYPE_FLOAT_LIST = 6,  /* v.fl[count]                                     */
    KILN_TYPE_STRING_LIST = 7, /* v.sl[count]                                     */
};

typedef struct kiln_value {
    uint32_t type;  /* KILN_TYPE_*                                               */
    uint32_t count; /* element count for the *_LIST types, else 0                */
    union {
        int64_t i;
        double f;
        const char *s;
        const int64_t *il;
        const double *fl;
        const char *const *sl;
    } v;
} kiln_value;

/* A named value. Arrays of kiln_kv end with an entry whose key is NULL. */
typedef struct kiln_kv {
    const char *key;
    kiln_value value;
} kiln_kv;

/* Flags of a declared config key. */
#define KILN_PARAM_REQUIRED (1u << 0) /* the run file must set it          */

/* A config key a plugin accepts. Arrays end with key == NULL. The default's
 * type must equal `type` (or be KILN_TYPE_NONE for "no default"). An INT
 * value is accepted where a FLOAT is declared (and converted); nothing else
 * is converted. */
typedef struct kiln_param {
    const char *key;    /* [a-z][a-z0-9_]*                                        */
    uint32_t type;      /* KILN_TYPE_*                                            */
    uint32_t flags;     /* KILN_PARAM_*                                           */
    kiln_value def;     /* default                                                */
    const char *help;   /* one line for `kiln plugins list --verbose` and docs    */
} kiln_param;

/* Initialiser helpers for static tables. */
#define KILN_V_BOOL(x) {KILN_TYPE_BOOL, 0, {.i = (x)}}
#define KILN_V_INT(x) {KILN_TYPE_INT, 0, {.i = (x)}}
#define KILN_V_FLOAT(x) {KILN_TYPE_FLOAT, 0, {.f = (x)}}
#define KILN_V_STR(x) {KILN_TYPE_STRING, 0, {.s = (x)}}
#define KILN_V_NONE {KILN_TYPE_NONE, 0, {.i = 0}}
#define KILN_V_STRS(arr) {KILN_TYPE_STRING_LIST, (uint32_t)(sizeof(arr) / sizeof((arr)[0])), {.sl = (arr)}}
#define KILN_V_INTS(arr) {KILN_TYPE_INT_LIST, (uint32_t)(sizeof(arr) / sizeof((arr)[0])), {.il = (arr)}}
#define KILN_V_FLOATS(arr) {KILN_TYPE_FLOAT_LIST, (uint32_t)(sizeof(arr) / sizeof((arr)[0])), {.fl = (arr)}}

/* ---------------------------------------------------------------------------
 * Header-only lookups over a NULL-terminated kiln_kv array (the resolved
 * config a plugin receives in create()). The host has already checked types
 * against the plugin's declared kiln_param list and filled in defaults, so a
 * plugin may rely on every declared key being present with its declared type. */

static inline const kiln_value *kiln_kv_find(const kiln_kv *kv, const char *key) {
    for (; kv && kv->key; kv++)
        if (strcmp(kv->key, key) == 0) return &kv->value;
    return NULL;
}

static inline int64_t kiln_kv_int(const kiln_kv *kv, const char *key, int64_t fallback) {
    const kiln_value *v = kiln_kv_find(kv, key);
    return v && (v->type == KILN_TYPE_INT || v->type == KILN_TYPE_BOOL) ? v->v.i : fallback;
}

static inline double kiln_kv_float(const kiln_kv *kv, const char *key, double fallback) {
    const kiln_value *v = kiln_kv_find(kv, key);
    if (!v) return fallback;
    if (v->type == KILN_TYPE_FLOAT) return v->v.f;
    if (v->type == KILN_TYPE_INT) return (double)v->v.i;
    return fallback;
}

static inline const char *kiln_kv_str(const kiln_kv *kv, const char *key, const char *fallback) {
    const kiln_value *v = kiln_kv_find(kv, key);
    return v && v->type == KILN_TYPE_STRING ? v->v.s : fallback;
}

/* A value as short text: "16-mixed", "true", "42", "0.5", "[a,b]" (floats
 * with %g, lists comma-separated in brackets). Writes at most n bytes
 * including the NUL, truncating like snprintf; returns buf. What the run
 * summary prints for each property of the precision plugin. */
static inline char *kiln_value_format(const kiln_value *v, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    buf[0] = 0;
    if (!v) return buf;
    size_t l = 0;
#define KILN__PUT(...) do { int w_ = snprintf(buf + l, n - l, __VA_ARGS__); if (w_ < 0) return buf; \
                            l += (size_t)w_; if (l >= n) return buf; } while (0)
    switch (v->type) {
    case KILN_TYPE_BOOL: KILN__PUT("%s", v->v.i ? "true" : "false"); break;
    case KILN_TYPE_INT: KILN__PUT("%lld", (long long)v->v.i); break;
    case KILN_TYPE_FLOAT: KILN__PUT("%g", v->v.f); break;
    case KILN_TYPE_STRING: KILN__PUT("%s", v->v.s ? v->v.s : ""); break;
    case KILN_TYPE_INT_LIST:
    case KILN_TYPE_FLOAT_LIST:
    case KILN_TYPE_STRING_LIST:
        KILN__PUT("[");
        for (uint32_t i = 0; i < v->count; i++) {
            if (i) KILN__PUT(",");
            if (v->type == KILN_TYPE_INT_LIST) KILN__PUT("%lld", (long long)v->v.il[i]);
            else if (v->type == KILN_TYPE_FLOAT_LIST) KILN__PUT("%g", v->v.fl[i]);
            else KILN__PUT("%s", v->v.sl[i] ? v->v.sl[i] : "");
        }
        KILN__PUT("]");
        break;
    default: break;
    }
#undef KILN__PUT
    return buf;
}

#endif /* KILN_VALUE_H */
