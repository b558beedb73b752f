/*
 * host/registry.c — the registry: which plugin answers to a name (or
 * alias) of a kind, built from the probes of discovery (loader.c) without
 * loading any library, with conflicts settled the same way every time (a
 * name beats an alias, a built-in is never replaced implicitly, then search
 * order) and each one reported once; lookups load the winning library into
 * the process on first use, and a name nothing answers to gets the refused
 * file that probably meant it, or the closest name.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "log.h"

static void add_warning(hl_loader *L, const char *w) {
    L->warnings = hmem_realloc(L->warnings, sizeof(char *) * (size_t)(L->nwarnings + 1));
    L->warnings[L->nwarnings++] = hmem_strdup(w);
    HLOG_WARN("%s", w);
}

/* Which of two plugins keeps a key: an exact name beats an alias; a built-in
 * beats a plugin from another directory (built-ins are replaced only by
 * explicit "stem:name" selection); otherwise the earlier in search order. */
static int keeps(const struct hl_regent *old, const hl_probe *p, int is_alias) {
    if (old->is_alias != is_alias) return !old->is_alias;
    int ob = old->pr->origin == HL_ORIGIN_BUILTIN, nb = p->origin == HL_ORIGIN_BUILTIN;
    if (ob != nb) return ob;
    return 1;
}

static void reg_put(hl_loader *L, hl_probe *p, int pi, const char *key, int is_alias) {
    const hl_pmeta *m = &p->plugins[pi];
    for (int i = 0; i < L->nreg; i++) {
        struct hl_regent *r = &L->reg[i];
        if (r->kind != m->kind || strcmp(r->key, key) != 0) continue;
        if (r->pr == p && r->pi == pi) return;
        int old_wins = keeps(r, p, is_alias);
        const hl_probe *w = old_wins ? r->pr : p, *lo = old_wins ? p : r->pr;
        const hl_pmeta *lom = old_wins ? m : &r->pr->plugins[r->pi];
        char msg[2048];
        snprintf(msg, sizeof msg,
                 "%s '%s' provided by both %s and %s; using %s (%s). Select the other explicitly with name = "
                 "\"%s:%s\"",
                 hl_kind_name(m->kind), key, r->pr->path, p->path, w->path,
                 w->origin == HL_ORIGIN_BUILTIN && lo->origin != HL_ORIGIN_BUILTIN ? "built-ins are not "
                                                                                   "replaced implicitly"
                 : (r->is_alias != is_alias) ? "a name beats an alias"
                                             : "search-path order",
                 lo->stem, lom->name);
        add_warning(L, msg);
        if (!old_wins) { r->pr = p; r->pi = pi; r->is_alias = is_alias; }
        return;
    }
    L->reg = hmem_realloc(L->reg, sizeof(*L->reg) * (size_t)(L->nreg + 1));
    L->reg[L->nreg++] = (struct hl_regent){m->kind, key, p, pi, is_alias};
}

void hl_registry_build(hl_loader *L) {
    free(L->reg);
    L->reg = NULL;
    L->nreg = 0;
    /* Names first, then aliases, so an alias never shadows a real name. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < L->nprobes; i++) {
            hl_probe *p = L->probes[i];
            if (p->failed) continue;
            for (int j = 0; j < p->nplugins; j++) {
                hl_pmeta *m = &p->plugins[j];
                if (pass == 0) reg_put(L, p, j, m->name, 0);
                else
                    for (uint32_t a = 0; a < m->naliases; a++) reg_put(L, p, j, m->aliases[a], 1);
            }
        }
}

const kiln_value *hl_prop(const hl_plugin *p, const char *key) {
    for (const kiln_kv *kv = p->view.properties; kv && kv->key; kv++)
        if (strcmp(kv->key, key) == 0) return &kv->value;
    return NULL;
}

/* The plugin a slot uses when the run file leaves it out: the first (in
 * search order) of its kind whose "default" property is true. The host
 * names no plugin itself: 32-true, cpu and single declare themselves.
 * Answered from the probes: no library is loaded to ask. */
const char *hl_default_name(const hl_loader *L, const char *slot) {
    uint32_t kind;
    if (hl_kind_from_name(slot, &kind) != 0) return NULL;
    for (int i = 0; i < L->nreg; i++) {
        const struct hl_regent *e = &L->reg[i];
        if (e->kind != kind || e->is_alias) continue;
        if (e->pr->plugins[e->pi].is_default) return e->pr->plugins[e->pi].name;
    }
    return NULL;
}

/* The probe's plugin pi, loaded into this process on first use. */
static const hl_plugin *resolve(hl_loader *L, hl_probe *p, int pi, ht_error *err) {
    if (hl_probe_load(L, p, err)) return NULL;
    const hl_pmeta *m = &p->plugins[pi];
    for (int j = 0; j < p->lib->nplugins; j++)
        if (p->lib->plugins[j].view.kind == m->kind && !strcmp(p->lib->plugins[j].view.name, m->name))
            return &p->lib->plugins[j];
    ht_errorf(err, "%s: %s '%s' is missing once loaded", p->path, hl_kind_name(m->kind), m->name);
    return NULL;
}

/* A refused file that the query probably meant: libkiln-<query>.so (or the
 * stem of "stem:name"). Its reason, which names the file, or NULL. */
static const char *refused_namesake(const hl_loader *L, const char *stem, size_t sl) {
    for (int i = 0; i < L->ncands; i++) {
        const hl_candidate *c = &L->cands[i];
        if (c->is_dir || c->status != HL_CAND_REFUSED || !c->reason) continue;
        char s[256];
        hl_lib_stem(c->path, s, sizeof s);
        if (strlen(s) == sl && !strncmp(s, stem, sl)) return c->reason;
    }
    return NULL;
}

const hl_plugin *hl_find(hl_loader *L, uint32_t kind, const char *query, ht_error *err) {
    const char *kn = hl_kind_name(kind);
    const char *colon = strchr(query, ':');
    if (colon) {
        size_t sl = (size_t)(colon - query);
        const char *name = colon + 1;
        for (int i = 0; i < L->nprobes; i++) {
            hl_probe *p = L->probes[i];
            if (p->failed || strlen(p->stem) != sl || strncmp(p->stem, query, sl) != 0) continue;
            for (int j = 0; j < p->nplugins; j++) {
                const hl_pmeta *m = &p->plugins[j];
                if (m->kind != kind) continue;
                int hit = !strcmp(m->name, name);
                for (uint32_t a = 0; !hit && a < m->naliases; a++) hit = !strcmp(m->aliases[a], name);
                if (hit) return resolve(L, p, j, err);
            }
            ht_errorf(err, "library libkiln-%.*s.so has no %s plugin answering to '%s'", (int)sl, query, kn, name);
            return NULL;
        }
        const char *ref = refused_namesake(L, query, sl);
        if (ref) {
            ht_errorf(err, "%s '%s' cannot be used: %.*s", kn, query, (int)strcspn(ref, "\n"), ref);
            return NULL;
        }
        ht_errorf(err, "no loaded library libkiln-%.*s.so for %s '%s'", (int)sl, query, kn, query);
        return NULL;
    }
    for (int i = 0; i < L->nreg; i++)
        if (L->reg[i].kind == kind && !strcmp(L->reg[i].key, query))
            return resolve(L, L->reg[i].pr, L->reg[i].pi, err);
    /* Not found: a refused file of that name is the likely reason. */
    const char *ref = refused_namesake(L, query, strlen(query));
    if (ref) {
        ht_errorf(err, "%s '%s' cannot be used: %.*s", kn, query, (int)strcspn(ref, "\n"), ref);
        return NULL;
    }
    /* Otherwise list what exists and the closest match. */
    char known[512] = "";
    const char *best = NULL;
    size_t bestd = HEDIT_FAR;
    for (int i = 0; i < L->nreg; i++) {
        if (L->reg[i].kind != kind) continue;
        if (!L->reg[i].is_alias) {
            size_t n = strlen(known);
            snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "", L->reg[i].key);
        }
        size_t d = hedit_distance(query, L->reg[i].key);
        if (d < bestd) { bestd = d; best = L->reg[i].key; }
    }
    int refused = 0;
    for (int i = 0; i < L->ncands; i++) refused += !L->cands[i].is_dir && L->cands[i].status == HL_CAND_REFUSED;
    char hint[256] = "";
    if (best && bestd <= 2 + strlen(query) / 4) snprintf(hint, sizeof hint, "; did you mean '%s'?", best);
    char ref2[160] = "";
    if (refused)
        snprintf(ref2, sizeof ref2, " (%d plugin file(s) were refused; see `kiln plugins list --verbose`)", refused);
    ht_errorf(err, "no %s plugin answers to '%s' (available: %s)%s%s", kn, query, *known ? known : "none", hint,
             ref2);
    return NULL;
}

