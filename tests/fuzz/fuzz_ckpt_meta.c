/*
 * tests/fuzz/fuzz_ckpt_meta.c — fuzz target for the checkpoint metadata a
 * resume trusts to steer the loops: the "progress" text (36 loop counters)
 * and the "loops" text (epochs, steps, scheduler steps, rate factor), both
 * parsed and checked by host/checkpoint.c before any state is restored. A
 * checkpoint is not trusted (docs/security.md): a bad text must be refused
 * in one line, and an accepted one must hold counters in range (0 <= v <
 * 2^53) and a finite rate factor. Input: the progress text, then a NUL and
 * the loops text (no NUL: no loops entry, as in a file without it).
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    const char *loops = strlen(text) < size ? text + strlen(text) + 1 : NULL;
    char why[512];
    long long pv[PROGRESS_FIELDS];
    if (progress_parse(text, "ckpt", pv, why, sizeof why) == KILN_OK) {
        for (int i = 0; i < PROGRESS_FIELDS; i++)
            fz_check(pv[i] >= 0 && pv[i] < CKPT_COUNT_LIMIT, "a progress counter out of range", NULL);
    } else {
        fz_check(strchr(why, '\n') == NULL, "a progress refusal spans lines", why);
    }
    long long lv[5] = {0, 0, 0, 0, -1};
    double f = 1.0;
    int n = loops_parse(loops, "ckpt", lv, &f, why, sizeof why);
    if (n >= 0) {
        fz_check(n == 4 || n == 6, "loops_parse: a count of fields it never returns", NULL);
        for (int i = 0; i < (n == 6 ? 5 : 4); i++)
            fz_check(lv[i] >= 0 && lv[i] < CKPT_COUNT_LIMIT, "a loops counter out of range", NULL);
        fz_check(n == 4 || (isfinite(f) && f >= 0), "a bad rate factor accepted", NULL);
    } else {
        fz_check(strchr(why, '\n') == NULL, "a loops refusal spans lines", why);
    }
    free(text);
    return 0;
}
