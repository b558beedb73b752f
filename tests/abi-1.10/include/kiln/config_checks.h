/*
 * kiln/config_checks.h — the rules a plugin states for the values of its
 * config keys (ABI 1.5), header-only: the same functions kiln applies before
 * a plugin's create() and in `kiln config check`, for a test host, a tool or
 * a plugin that wants to apply them itself. A plugin lists its rules in its
 * descriptor's properties under "config_checks", a string list:
 *
 *   "lr > 0"   "eps >= 0"   "threads <= 256"       a bound (< <= > >=)
 *   "momentum in [0, 1)"    "p in (0, 1]"          an interval
 *   "mode in {min, max}"                           choices (strings)
 *
 * Bounds apply to int and float keys and each element of int and float
 * lists; choices to string keys and each element of string lists. Not part
 * of the binary ABI (nothing here crosses the boundary).
 */
#ifndef KILN_CONFIG_CHECKS_H
#define KILN_CONFIG_CHECKS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/value.h"

#define KILN_CONFIG_RULE_MAX_CHOICES 32

/* One parsed rule. */
typedef struct kiln_config_rule {
    char key[64];
    int choices;                 /* 1: choice[] holds the allowed strings     */
    int has_lo, has_hi;          /* bounds present                            */
    int lo_open, hi_open;        /* > rather than >=, < rather than <=        */
    double lo, hi;
    int nchoice;
    char choice[KILN_CONFIG_RULE_MAX_CHOICES][64];
} kiln_config_rule;

static inline const char *kiln__cr_skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

/* A number at *p (strtod's syntax); advances *p. */
static inline int kiln__cr_number(const char **p, double *out) {
    char *end;
    double x = strtod(*p, &end);
    if (end == *p || isnan(x)) return -1;
    *out = x;
    *p = end;
    return 0;
}

static inline int kiln_config_rule_parse(const char *text, kiln_config_rule *c, char *why, size_t whylen) {
    memset(c, 0, sizeof *c);
    const char *p = kiln__cr_skip_ws(text ? text : "");
    size_t k = 0;
    while ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= '0' && p[k] <= '9') || p[k] == '_') k++;
    if (k == 0 || k >= sizeof c->key) {
        snprintf(why, whylen, "config check \"%s\": expected a key name first", text ? text : "");
        return -1;
    }
    memcpy(c->key, p, k);
    p = kiln__cr_skip_ws(p + k);
    if (p[0] == '>' || p[0] == '<') {
        const int gt = p[0] == '>', eq = p[1] == '=';
        p = kiln__cr_skip_ws(p + 1 + eq);
        double x;
        if (kiln__cr_number(&p, &x) || *kiln__cr_skip_ws(p)) {
            snprintf(why, whylen, "config check \"%s\": expected \"%s %s NUMBER\"", text, c->key,
                     gt ? (eq ? ">=" : ">") : (eq ? "<=" : "<"));
            return -1;
        }
        if (gt) c->has_lo = 1, c->lo = x, c->lo_open = !eq;
        else c->has_hi = 1, c->hi = x, c->hi_open = !eq;
        return 0;
    }
    if (strncmp(p, "in", 2) != 0 || (p[2] != ' ' && p[2] != '\t')) {
        snprintf(why, whylen, "config check \"%s\": expected \"%s > N\", \"%s in [A, B]\" or \"%s in {a, b}\"", text,
                 c->key, c->key, c->key);
        return -1;
    }
    p = kiln__cr_skip_ws(p + 2);
    if (*p == '{') { /* choices */
        c->choices = 1;
        p = kiln__cr_skip_ws(p + 1);
        while (*p && *p != '}') {
            size_t n = 0;
            while (p[n] && p[n] != ',' && p[n] != '}' && p[n] != ' ' && p[n] != '\t') n++;
            if (n == 0 || n >= sizeof c->choice[0] || c->nchoice >= KILN_CONFIG_RULE_MAX_CHOICES) {
                snprintf(why, whylen, "config check \"%s\": expected up to %d choices of 1..63 characters", text,
                         KILN_CONFIG_RULE_MAX_CHOICES);
                return -1;
            }
            memcpy(c->choice[c->nchoice++], p, n);
            p = kiln__cr_skip_ws(p + n);
            if (*p == ',') p = kiln__cr_skip_ws(p + 1);
        }
        if (*p != '}' || *kiln__cr_skip_ws(p + 1) || c->nchoice == 0) {
            snprintf(why, whylen, "config check \"%s\": expected \"%s in {a, b, ...}\"", text, c->key);
            return -1;
        }
        return 0;
    }
    if (*p == '[' || *p == '(') { /* an interval */
        c->has_lo = c->has_hi = 1;
        c->lo_open = *p == '(';
        p = kiln__cr_skip_ws(p + 1);
        if (kiln__cr_number(&p, &c->lo)) goto bad_interval;
        p = kiln__cr_skip_ws(p);
        if (*p != ',') goto bad_interval;
        p = kiln__cr_skip_ws(p + 1);
        if (kiln__cr_number(&p, &c->hi)) goto bad_interval;
        p = kiln__cr_skip_ws(p);
        if (*p != ']' && *p != ')') goto bad_interval;
        c->hi_open = *p == ')';
        if (*kiln__cr_skip_ws(p + 1) || c->lo > c->hi) goto bad_interval;
        return 0;
    }
bad_interval:
    snprintf(why, whylen, "config check \"%s\": expected \"%s in [A, B]\" (or with ( ) for open ends, A <= B)", text,
             c->key);
    return -1;
}

static inline void kiln_config_rule_describe(const kiln_config_rule *c, char *buf, size_t n) {
    if (c->choices) {
        size_t l = (size_t)snprintf(buf, n, "one of ");
        for (int i = 0; i < c->nchoice && l < n; i++)
            l += (size_t)snprintf(buf + l, n - l, "%s\"%s\"", i ? ", " : "", c->choice[i]);
    } else if (c->has_lo && c->has_hi) {
        snprintf(buf, n, "in %c%g, %g%c", c->lo_open ? '(' : '[', c->lo, c->hi, c->hi_open ? ')' : ']');
    } else if (c->has_lo) {
        snprintf(buf, n, "%s %g", c->lo_open ? ">" : ">=", c->lo);
    } else {
        snprintf(buf, n, "%s %g", c->hi_open ? "<" : "<=", c->hi);
    }
}

static inline int kiln__cr_number_ok(const kiln_config_rule *c, double x) {
    if (isnan(x)) return 0;
    if (c->has_lo && (c->lo_open ? !(x > c->lo) : !(x >= c->lo))) return 0;
    if (c->has_hi && (c->hi_open ? !(x < c->hi) : !(x <= c->hi))) return 0;
    return 1;
}

static inline int kiln__cr_choice_ok(const kiln_config_rule *c, const char *s) {
    for (int i = 0; s && i < c->nchoice; i++)
        if (!strcmp(c->choice[i], s)) return 1;
    return 0;
}

static inline int kiln_config_rule_ok(const kiln_config_rule *c, const kiln_value *v, char *found, size_t n) {
    switch (v->type) {
    case KILN_TYPE_INT:
        if (kiln__cr_number_ok(c, (double)v->v.i)) return 1;
        snprintf(found, n, "%lld", (long long)v->v.i);
        return 0;
    case KILN_TYPE_FLOAT:
        if (kiln__cr_number_ok(c, v->v.f)) return 1;
        snprintf(found, n, "%g", v->v.f);
        return 0;
    case KILN_TYPE_STRING:
        if (kiln__cr_choice_ok(c, v->v.s)) return 1;
        snprintf(found, n, "\"%s\"", v->v.s ? v->v.s : "");
        return 0;
    case KILN_TYPE_INT_LIST:
        for (uint32_t i = 0; i < v->count; i++)
            if (!kiln__cr_number_ok(c, (double)v->v.il[i])) {
                snprintf(found, n, "%lld (element %u)", (long long)v->v.il[i], i);
                return 0;
            }
        return 1;
    case KILN_TYPE_FLOAT_LIST:
        for (uint32_t i = 0; i < v->count; i++)
            if (!kiln__cr_number_ok(c, v->v.fl[i])) {
                snprintf(found, n, "%g (element %u)", v->v.fl[i], i);
                return 0;
            }
        return 1;
    case KILN_TYPE_STRING_LIST:
        for (uint32_t i = 0; i < v->count; i++)
            if (!kiln__cr_choice_ok(c, v->v.sl[i])) {
                snprintf(found, n, "\"%s\" (element %u)", v->v.sl[i] ? v->v.sl[i] : "", i);
                return 0;
            }
        return 1;
    default: return 1; /* a bool, or an absent optional key */
    }
}

static inline const kiln_value *kiln_config_rules_of(const kiln_kv *properties) {
    const kiln_value *v = kiln_kv_find(properties, "config_checks");
    return v && v->type == KILN_TYPE_STRING_LIST ? v : NULL;
}

static inline int kiln_config_rules_validate(const kiln_kv *properties, const kiln_param *params, char *why, size_t whylen) {
    const kiln_value *rules = kiln_config_rules_of(properties);
    for (uint32_t r = 0; rules && r < rules->count; r++) {
        kiln_config_rule c;
        if (kiln_config_rule_parse(rules->v.sl[r], &c, why, whylen)) return -1;
        const kiln_param *q = params;
        while (q && q->key && strcmp(q->key, c.key)) q++;
        if (!q || !q->key) {
            snprintf(why, whylen, "config check \"%s\": '%s' is not one of its declared config keys", rules->v.sl[r],
                     c.key);
            return -1;
        }
        const int numeric = q->type == KILN_TYPE_INT || q->type == KILN_TYPE_FLOAT || q->type == KILN_TYPE_INT_LIST ||
                            q->type == KILN_TYPE_FLOAT_LIST;
        const int text = q->type == KILN_TYPE_STRING || q->type == KILN_TYPE_STRING_LIST;
        if (c.choices ? !text : !numeric) {
            snprintf(why, whylen, "config check \"%s\": %s fit %s keys, and '%s' is not one", rules->v.sl[r],
                     c.choices ? "choices" : "bounds", c.choices ? "string" : "int and float", c.key);
            return -1;
        }
        char found[128], rule[512];
        if (q->def.type != KILN_TYPE_NONE && !kiln_config_rule_ok(&c, &q->def, found, sizeof found)) {
            kiln_config_rule_describe(&c, rule, sizeof rule);
            /* a message longer than why is cut (the count is looked at, so
             * compilers know that is meant) */
            int cut = snprintf(why, whylen, "config check \"%.160s\": the default of '%s', %.100s, is not %.200s",
                               rules->v.sl[r], c.key, found, rule);
            (void)cut;
            return -1;
        }
    }
    return 0;
}

/* Every rule of `properties` against a resolved config (keys absent from
 * `config` are not checked): 0, or -1 with "key 'k' must be ..., found ..."
 * in why (the caller adds where). */
static inline int kiln_config_rules_check(const kiln_kv *properties, const kiln_kv *config, char *why,
                                          size_t whylen) {
    const kiln_value *rules = kiln_config_rules_of(properties);
    for (uint32_t r = 0; rules && r < rules->count; r++) {
        kiln_config_rule ck;
        char err[256];
        if (kiln_config_rule_parse(rules->v.sl[r], &ck, err, sizeof err)) continue; /* refused at load */
        const kiln_value *v = kiln_kv_find(config, ck.key);
        char found[128], rule[512];
        if (!v || kiln_config_rule_ok(&ck, v, found, sizeof found)) continue;
        kiln_config_rule_describe(&ck, rule, sizeof rule);
        int cut = snprintf(why, whylen, "key '%s' must be %.300s, found %.100s", ck.key, rule, found);
        (void)cut;
        return -1;
    }
    return 0;
}

#endif /* KILN_CONFIG_CHECKS_H */
