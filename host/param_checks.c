/*
 * host/param_checks.c — the "config_checks" rules of a plugin's config keys
 * (param_checks.h): parsing a rule, checking a value against it, checking a
 * descriptor's rules against its own declaration at load, and a run file's
 * values against them before create(). A rule is tiny on purpose: a bound,
 * an interval or a set of choices, so every value error reads the same way
 * whatever the plugin ("optimizer 'adamw' key 'lr' must be > 0, found -1").
 */
#define _GNU_SOURCE
#include "param_checks.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static const char *skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

/* A number at *p (strtod's syntax); advances *p. */
static int read_number(const char **p, double *out) {
    char *end;
    errno = 0;
    double x = strtod(*p, &end);
    if (end == *p || isnan(x)) return -1;
    *out = x;
    *p = end;
    return 0;
}

int hp_parse(const char *text, hp_check *c, char *why, size_t whylen) {
    memset(c, 0, sizeof *c);
    const char *p = skip_ws(text ? text : "");
    size_t k = 0;
    while ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= '0' && p[k] <= '9') || p[k] == '_') k++;
    if (k == 0 || k >= sizeof c->key) {
        snprintf(why, whylen, "config check \"%s\": expected a key name first", text ? text : "");
        return -1;
    }
    memcpy(c->key, p, k);
    p = skip_ws(p + k);
    if (p[0] == '>' || p[0] == '<') {
        const int gt = p[0] == '>', eq = p[1] == '=';
        p = skip_ws(p + 1 + eq);
        double x;
        if (read_number(&p, &x) || *skip_ws(p)) {
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
    p = skip_ws(p + 2);
    if (*p == '{') { /* choices */
        c->choices = 1;
        p = skip_ws(p + 1);
        while (*p && *p != '}') {
            size_t n = 0;
            while (p[n] && p[n] != ',' && p[n] != '}' && p[n] != ' ' && p[n] != '\t') n++;
            if (n == 0 || n >= sizeof c->choice[0] || c->nchoice >= HP_MAX_CHOICES) {
                snprintf(why, whylen, "config check \"%s\": expected up to %d choices of 1..63 characters", text,
                         HP_MAX_CHOICES);
                return -1;
            }
            memcpy(c->choice[c->nchoice++], p, n);
            p = skip_ws(p + n);
            if (*p == ',') p = skip_ws(p + 1);
        }
        if (*p != '}' || *skip_ws(p + 1) || c->nchoice == 0) {
            snprintf(why, whylen, "config check \"%s\": expected \"%s in {a, b, ...}\"", text, c->key);
            return -1;
        }
        return 0;
    }
    if (*p == '[' || *p == '(') { /* an interval */
        c->has_lo = c->has_hi = 1;
        c->lo_open = *p == '(';
        p = skip_ws(p + 1);
        if (read_number(&p, &c->lo)) goto bad_interval;
        p = skip_ws(p);
        if (*p != ',') goto bad_interval;
        p = skip_ws(p + 1);
        if (read_number(&p, &c->hi)) goto bad_interval;
        p = skip_ws(p);
        if (*p != ']' && *p != ')') goto bad_interval;
        c->hi_open = *p == ')';
        if (*skip_ws(p + 1) || c->lo > c->hi) goto bad_interval;
        return 0;
    }
bad_interval:
    snprintf(why, whylen, "config check \"%s\": expected \"%s in [A, B]\" (or with ( ) for open ends, A <= B)", text,
             c->key);
    return -1;
}

void hp_describe(const hp_check *c, char *buf, size_t n) {
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

static int number_ok(const hp_check *c, double x) {
    if (isnan(x)) return 0;
    if (c->has_lo && (c->lo_open ? !(x > c->lo) : !(x >= c->lo))) return 0;
    if (c->has_hi && (c->hi_open ? !(x < c->hi) : !(x <= c->hi))) return 0;
    return 1;
}

static int choice_ok(const hp_check *c, const char *s) {
    for (int i = 0; s && i < c->nchoice; i++)
        if (!strcmp(c->choice[i], s)) return 1;
    return 0;
}

int hp_value_ok(const hp_check *c, const kiln_value *v, char *found, size_t n) {
    switch (v->type) {
    case KILN_TYPE_INT:
        if (number_ok(c, (double)v->v.i)) return 1;
        snprintf(found, n, "%lld", (long long)v->v.i);
        return 0;
    case KILN_TYPE_FLOAT:
        if (number_ok(c, v->v.f)) return 1;
        snprintf(found, n, "%g", v->v.f);
        return 0;
    case KILN_TYPE_STRING:
        if (choice_ok(c, v->v.s)) return 1;
        snprintf(found, n, "\"%s\"", v->v.s ? v->v.s : "");
        return 0;
    case KILN_TYPE_INT_LIST:
        for (uint32_t i = 0; i < v->count; i++)
            if (!number_ok(c, (double)v->v.il[i])) {
                snprintf(found, n, "%lld (element %u)", (long long)v->v.il[i], i);
                return 0;
            }
        return 1;
    case KILN_TYPE_FLOAT_LIST:
        for (uint32_t i = 0; i < v->count; i++)
            if (!number_ok(c, v->v.fl[i])) {
                snprintf(found, n, "%g (element %u)", v->v.fl[i], i);
                return 0;
            }
        return 1;
    case KILN_TYPE_STRING_LIST:
        for (uint32_t i = 0; i < v->count; i++)
            if (!choice_ok(c, v->v.sl[i])) {
                snprintf(found, n, "\"%s\" (element %u)", v->v.sl[i] ? v->v.sl[i] : "", i);
                return 0;
            }
        return 1;
    default: return 1; /* a bool, or an absent optional key */
    }
}

static const kiln_value *rules_of(const kiln_kv *properties) {
    const kiln_value *v = kiln_kv_find(properties, "config_checks");
    return v && v->type == KILN_TYPE_STRING_LIST ? v : NULL;
}

int hp_validate_desc(const kiln_kv *properties, const kiln_param *params, char *why, size_t whylen) {
    const kiln_value *rules = rules_of(properties);
    for (uint32_t r = 0; rules && r < rules->count; r++) {
        hp_check c;
        if (hp_parse(rules->v.sl[r], &c, why, whylen)) return -1;
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
        if (q->def.type != KILN_TYPE_NONE && !hp_value_ok(&c, &q->def, found, sizeof found)) {
            hp_describe(&c, rule, sizeof rule);
            snprintf(why, whylen, "config check \"%s\": the default of '%s', %s, is not %s", rules->v.sl[r], c.key,
                     found, rule);
            return -1;
        }
    }
    return 0;
}

int hp_check_config(const hc_config *c, config_setting_t *sec, const kiln_kv *properties, const kiln_kv *kv,
                    const char *what, char *why, size_t whylen) {
    const kiln_value *rules = rules_of(properties);
    for (uint32_t r = 0; rules && r < rules->count; r++) {
        hp_check ck;
        char err[256];
        if (hp_parse(rules->v.sl[r], &ck, err, sizeof err)) continue; /* refused at load; cannot happen */
        const kiln_value *v = kiln_kv_find(kv, ck.key);
        char found[128];
        if (!v || hp_value_ok(&ck, v, found, sizeof found)) continue;
        char rule[512], where[PATH_MAX + 32];
        hp_describe(&ck, rule, sizeof rule);
        config_setting_t *m = sec ? config_setting_get_member(sec, ck.key) : NULL;
        if (m || sec) hc_where(c, m ? m : sec, where, sizeof where);
        else snprintf(where, sizeof where, "%s", c->path);
        hwhyf(why, whylen, "%s: %s key '%s' must be %s, found %s%s", where, what, ck.key, rule, found,
              m ? "" : " (its default)");
        return KILN_E_CONFIG;
    }
    return KILN_OK;
}

void hp_rules_for(const kiln_kv *properties, const char *key, char *buf, size_t n) {
    buf[0] = 0;
    const kiln_value *rules = rules_of(properties);
    size_t l = 0;
    for (uint32_t r = 0; rules && r < rules->count && l < n; r++) {
        hp_check ck;
        char err[256], one[512];
        if (hp_parse(rules->v.sl[r], &ck, err, sizeof err) || strcmp(ck.key, key)) continue;
        hp_describe(&ck, one, sizeof one);
        l += (size_t)snprintf(buf + l, n - l, "%s%s", l ? ", " : "", one);
    }
}
