/*
 * tests/fuzz/fuzz_config.c — fuzz target for run files and `--set`
 * overrides (host/config.c over libconfig). The run file is trusted in the
 * sense that it says what kiln runs, but it is still text a person types and
 * `--set` values come from shell lines and scripts: bad text must be refused
 * in one line, never crash kiln or be misread (an int past int32 silently
 * wrapping was such a misreading). Input layout: the run file text, then
 * any number of NUL-separated `--set` assignments (KEY=VALUE). The target
 * loads the text, applies each assignment (a refused one is skipped, as if
 * the user fixed it), checks the structure, asks every
 * question the host asks of a run file (plugin dirs, slots, callbacks,
 * optimizers, the trainer section resolved against its declared keys, a
 * section resolved against keys of every type), and finally writes the
 * effective config and loads it back: what kiln writes into a run directory
 * must load again. Inputs with @include are skipped: an include names a
 * file to read, which is the run file's privilege (docs/security.md), and
 * reading arbitrary paths (/dev/zero) is not what this target is about.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_util.h"

static void fz_check(int ok, const char *what, const char *why) {
    if (!ok) {
        fprintf(stderr, "fuzz_config: invariant broken: %s (%s)\n", what, why ? why : "");
        abort();
    }
}

/* keys of every declared type, as a plugin could declare them */
static const kiln_param fz_params[] = {
    {"b", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "a bool"},
    {"i", KILN_TYPE_INT, 0, KILN_V_INT(3), "an int"},
    {"f", KILN_TYPE_FLOAT, 0, KILN_V_INT(2), "a float with an int default"},
    {"s", KILN_TYPE_STRING, 0, KILN_V_STR("x"), "a string"},
    {"il", KILN_TYPE_INT_LIST, 0, KILN_V_NONE, "ints"},
    {"fl", KILN_TYPE_FLOAT_LIST, 0, KILN_V_NONE, "floats"},
    {"sl", KILN_TYPE_STRING_LIST, 0, KILN_V_NONE, "strings"},
    {"lr", KILN_TYPE_FLOAT, KILN_PARAM_REQUIRED, KILN_V_NONE, "a required float"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* Walk a resolved set: every value is read as its type says. */
static unsigned fz_walk(const hc_kvset *s) {
    unsigned h = 0;
    for (int i = 0; i < s->n; i++) {
        const kiln_kv *kv = &s->kv[i];
        h += (unsigned)strlen(kv->key);
        switch (kv->value.type) {
        case KILN_TYPE_STRING: h += (unsigned)strlen(kv->value.v.s); break;
        case KILN_TYPE_INT_LIST:
            for (uint32_t k = 0; k < kv->value.count; k++) h += (unsigned)kv->value.v.il[k];
            break;
        case KILN_TYPE_FLOAT_LIST:
            for (uint32_t k = 0; k < kv->value.count; k++) h += (unsigned)(kv->value.v.fl[k] != 0);
            break;
        case KILN_TYPE_STRING_LIST:
            for (uint32_t k = 0; k < kv->value.count; k++) h += (unsigned)strlen(kv->value.v.sl[k]);
            break;
        default: break;
        }
    }
    return h;
}

static void fz_questions(hc_config *c) {
    ht_error err = {0};
    unsigned h = 0;
    hc_check_structure(c, &err);
    const char **dirs = NULL;
    int nd = 0, sym = 0;
    if (hc_plugin_dirs(c, &dirs, &nd, &sym, &err) == KILN_OK) {
        for (int i = 0; i < nd; i++) {
            fz_check(dirs[i] && dirs[i][0] == '/', "a relative plugin dir was accepted", dirs[i]);
            h += (unsigned)strlen(dirs[i]);
        }
        free((void *)dirs);
    }
    for (int i = 0; i < hc_nslots; i++) {
        config_setting_t *sec = NULL;
        const char *name = hc_slot_name(c, hc_slots[i], NULL, &sec, &err);
        if (name) h += (unsigned)strlen(name);
        hc_kvset kv;
        if (hc_resolve_host(c, sec, fz_params, hc_host_keys((uint32_t)(i + 1)), "fuzz", &kv, &err) ==
            KILN_OK) {
            h += fz_walk(&kv);
            hc_kvset_free(&kv);
        }
    }
    int ncb = hc_callback_count(c);
    for (int i = 0; i < ncb; i++) {
        config_setting_t *cb = hc_callback(c, i);
        hc_kvset kv;
        if (cb && config_setting_is_group(cb) &&
            hc_resolve(c, cb, fz_params, "callback", &kv, &err) == KILN_OK) {
            h += fz_walk(&kv);
            hc_kvset_free(&kv);
        }
    }
    int nopt = hc_optimizer_count(c);
    for (int i = 0; i < nopt; i++) {
        config_setting_t *o = hc_optimizer(c, i);
        char where[512];
        hc_where(c, o, where, sizeof where);
        h += (unsigned)strlen(where);
    }
    config_setting_t *tr = config_lookup(&c->cfg, "trainer");
    hc_kvset kv;
    if (hc_resolve(c, tr && config_setting_is_group(tr) ? tr : NULL, hc_trainer_params, "trainer", &kv, &err) ==
        KILN_OK) {
        h += fz_walk(&kv);
        hc_kvset_free(&kv);
    }
    (void)h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 16)) return 0;
    /* NUL-terminated copies of every piece */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    if (memmem(data, size, "@include", 8)) {
        free(text);
        return 0;
    }
    ht_error err = {0};
    hc_config c;
    int rc = hc_load_string(&c, text, "fuzz.cfg", &err);
    if (rc != KILN_OK) {
        fz_check(memchr(err.msg, '\n', strnlen(err.msg, sizeof err.msg)) == NULL, "multi-line load message", err.msg);
        hc_free(&c);
        free(text);
        return 0;
    }
    size_t first = strlen(text);
    for (size_t off = first + 1; off <= size; off += strlen(text + off) + 1) {
        const char *a = text + off;
        /* no one-line check here: a refusal echoes the assignment, and a
         * newline the user typed into it stays theirs */
        hc_override(&c, a, &err);
    }
    fz_questions(&c);
    /* the effective config kiln writes must load again */
    char path[512];
    snprintf(path, sizeof path, "%s/effective.cfg", fz_tmpdir());
    if (hc_write(&c, path, &err) == KILN_OK) {
        hc_config back;
        rc = hc_load(&back, path, &err);
        fz_check(rc == KILN_OK, "the effective config does not load again", err.msg);
        hc_free(&back);
    }
    hc_free(&c);
    free(text);
    return 0;
}
