/*
 * tests/fuzz/fuzz_ckpt_meta.c — fuzz target for the checkpoint metadata a
 * resume trusts to steer the loops: the "progress" object (36 loop
 * counters), the "loops" object (epochs, steps, scheduler steps, rate
 * factor), the "metrics" object (the metric store) and a "state.<role>"
 * entry (plugin and state version), all JSON parsed with jansson and
 * checked by host/checkpoint.c and host/metrics.c before any state is
 * restored. A checkpoint is not trusted (docs/security.md): a bad text must
 * be refused in one line, and an accepted one must hold counters in range
 * (0 <= v < 2^53), a finite rate factor and finite epoch sums. Input: the
 * four texts separated by NUL bytes; a text missing at the end is an entry
 * missing from the file.
 *
 * The parsers are static, so this file includes host/checkpoint.c itself;
 * the rest of the host comes from kiln_hostcore, whose own copy of
 * checkpoint.c is then never pulled from the archive (every symbol it
 * defines is already defined here).
 */
#include "checkpoint.c"

#include "fuzz_util.h"

static void fz_check(int ok, const char *what, const char *why) {
    if (!ok) {
        fprintf(stderr, "fuzz_ckpt_meta: invariant broken: %s (%s)\n", what, why ? why : "");
        abort();
    }
}

/* The text after the NUL that ends `s`, or NULL when `s` ran to the end. */
static const char *next_text(const char *s, const char *text, size_t size) {
    if (!s) return NULL;
    size_t at = (size_t)(s - text) + strlen(s);
    return at < size ? text + at + 1 : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 8192) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    const char *progress = size ? text : NULL;
    const char *loops = next_text(progress, text, size);
    const char *metrics = next_text(loops, text, size);
    const char *state = next_text(metrics, text, size);
    ht_error err = {0};
    long long pv[PROGRESS_FIELDS];
    if (progress_parse(progress, "ckpt", pv, &err) == KILN_OK) {
        for (int i = 0; i < PROGRESS_FIELDS; i++)
            fz_check(pv[i] >= 0 && pv[i] < CKPT_COUNT_LIMIT, "a progress counter out of range", NULL);
    } else {
        fz_check(strchr(err.msg, '\n') == NULL, "a progress refusal spans lines", err.msg);
    }
    long long lv[5] = {0, 0, 0, 0, 0};
    double f = 1.0;
    if (loops_parse(loops, "ckpt", lv, &f, &err) == 0) {
        for (int i = 0; i < 5; i++)
            fz_check(lv[i] >= 0 && lv[i] < CKPT_COUNT_LIMIT, "a loops counter out of range", NULL);
        fz_check(isfinite(f) && f >= 0, "a bad rate factor accepted", NULL);
    } else {
        fz_check(strchr(err.msg, '\n') == NULL, "a loops refusal spans lines", err.msg);
    }
    if (metrics) {
        ht_metrics *m = malloc(sizeof *m);
        if (m && hm_import(m, metrics, &err) == 0) {
            fz_check(m->n <= HM_MAX && m->ncb <= HM_MAX * 3, "more metrics than the store holds", NULL);
            for (int i = 0; i < m->n; i++)
                fz_check(isfinite(m->m[i].sum) && m->m[i].weight > 0, "a bad epoch sum accepted", m->m[i].name);
            /* what was accepted is written back and read again unchanged */
            char *again = hm_export(m);
            ht_metrics *m2 = malloc(sizeof *m2);
            if (again && m2) {
                fz_check(hm_import(m2, again, &err) == 0, "an exported store is refused", err.msg);
                fz_check(m2->n == m->n && m2->ncb == m->ncb, "the store changed in a round trip", NULL);
            }
            free(m2);
            free(again);
        } else if (m) {
            fz_check(strchr(err.msg, '\n') == NULL, "a metrics refusal spans lines", err.msg);
        }
        free(m);
    }
    if (state) {
        char plugin[128], found[300];
        uint32_t ver;
        if (state_parse(state, plugin, sizeof plugin, &ver, found, sizeof found) == 0)
            fz_check(plugin[0] != 0 && strlen(plugin) < sizeof plugin, "a bad plugin name accepted", plugin);
        else
            fz_check(strchr(found, '\n') == NULL, "a state refusal spans lines", found);
    }
    free(text);
    return 0;
}
