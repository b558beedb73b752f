/*
 * host/checkpoint.c — saving and loading the weights checkpoint described in
 * checkpoint.h. Parameters live on the accelerator, so they are copied to
 * host buffers (one allocation per save, freed after the atomic write) and
 * back through the kernel table's copy entry.
 */
#define _GNU_SOURCE
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "safetensors.h"
#include "version.h"

/* The effective run file as text, for the metadata (caller frees). */
static char *config_text(ht_trainer *t) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    config_write(&t->cfg->cfg, f);
    fclose(f);
    return buf;
}

int ht_ckpt_save(ht_trainer *t, const char *path, char *why, size_t whylen) {
    size_t total = 0;
    for (uint32_t i = 0; i < t->nparams; i++) total += (size_t)t->params[i]->numel;
    float *host = malloc((total ? total : 1) * sizeof(float));
    kst_writer *w = kst_writer_new();
    char *cfgtext = config_text(t);
    int rc = host && w && cfgtext ? KILN_OK : KILN_E_NOMEM;
    if (rc) hwhyf(why, whylen, "%s: out of memory preparing a checkpoint of %zu parameters", path, total);
    size_t off = 0;
    for (uint32_t i = 0; rc == KILN_OK && i < t->nparams; i++) {
        kiln_parameter *p = t->params[i];
        size_t nbytes = (size_t)p->numel * sizeof(float);
        herr_clear();
        int32_t crc = t->K->copy(t->accel.inst, host + off, p->data, nbytes, KILN_COPY_D2H);
        if (crc) { rc = ht_fail(t, &t->accel, crc, "copy of a parameter for the checkpoint", why, whylen); break; }
        rc = kst_add_tensor(w, p->name, "F32", p->shape, (int)p->ndim, host + off, nbytes, why, whylen);
        off += (size_t)p->numel;
    }
    char num[64], stack[512], abi[16];
    snprintf(stack, sizeof stack, "accelerator=%s precision=%s strategy=%s module=%s data=%s optimizer=%s",
             t->accel.p->view.name, t->precision.p->view.name, t->strategy.p->view.name, t->module.p->view.name,
             t->data.p->view.name, t->optimizer.p ? t->optimizer.p->view.name : "-");
    snprintf(abi, sizeof abi, "%d.%d", KILN_ABI_MAJOR, KILN_ABI_MINOR);
    if (rc == KILN_OK) rc = kst_add_metadata(w, "format", HT_CKPT_FORMAT, why, whylen);
    if (rc == KILN_OK) rc = kst_add_metadata(w, "kiln_version", KILN_VERSION_STRING, why, whylen);
    if (rc == KILN_OK) rc = kst_add_metadata(w, "abi", abi, why, whylen);
    if (rc == KILN_OK) rc = kst_add_metadata(w, "stack", stack, why, whylen);
    snprintf(num, sizeof num, "%lld", (long long)t->epoch_progress.current.completed);
    if (rc == KILN_OK) rc = kst_add_metadata(w, "epoch", num, why, whylen);
    snprintf(num, sizeof num, "%lld", (long long)t->opt_step.total.completed);
    if (rc == KILN_OK) rc = kst_add_metadata(w, "global_step", num, why, whylen);
    if (rc == KILN_OK) rc = kst_add_metadata(w, "config", cfgtext, why, whylen);
    if (rc == KILN_OK) rc = kst_write_atomic(w, path, why, whylen);
    kst_writer_free(w);
    free(cfgtext);
    free(host);
    return rc;
}

int ht_ckpt_save_last(ht_trainer *t, char *why, size_t whylen) {
    if (t->state.rank != 0 || !t->run_dir[0]) return KILN_OK; /* rank 0 writes */
    char dir[sizeof t->run_dir + 16], path[sizeof dir + 32];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->run_dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        hwhyf(why, whylen, "%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
        return KILN_E_IO;
    }
    snprintf(path, sizeof path, "%s/last.safetensors", dir);
    return ht_ckpt_save(t, path, why, whylen);
}

int ht_ckpt_load_weights(ht_trainer *t, const char *path, char *why, size_t whylen) {
    kst_file *f = NULL;
    int rc = kst_open(path, &f, why, whylen);
    if (rc) return rc;
    const char *fmt = kst_metadata(f, "format");
    if (!fmt || strcmp(fmt, HT_CKPT_FORMAT) != 0) {
        hwhyf(why, whylen, "%s: expected a kiln checkpoint (__metadata__ format = \"%s\"), found %s%s%s", path,
              HT_CKPT_FORMAT, fmt ? "\"" : "", fmt ? fmt : "no format entry", fmt ? "\"" : "");
        kst_close(f);
        return KILN_E_DATA;
    }
    for (uint32_t i = 0; rc == KILN_OK && i < t->nparams; i++) {
        kiln_parameter *p = t->params[i];
        const kst_tensor *x = kst_find(f, p->name);
        char want[96] = "", got[96] = "";
        for (uint32_t d = 0; d < p->ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "", (long long)p->shape[d]);
        if (!x) {
            hwhyf(why, whylen, "%s: has no tensor '%s' (%s) that module '%s' expects (stack in the file: %s)", path,
                  p->name, want, t->module.p->view.name, kst_metadata(f, "stack") ? kst_metadata(f, "stack") : "?");
            rc = KILN_E_STATE;
            break;
        }
        int same = x->ndim == (int)p->ndim && !strcmp(x->dtype, "F32");
        for (int d = 0; d < x->ndim; d++) {
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)x->shape[d]);
            if (same && x->shape[d] != p->shape[d]) same = 0;
        }
        if (!same) {
            hwhyf(why, whylen, "%s: tensor '%s' is %s [%s], module '%s' expects F32 [%s]", path, p->name, x->dtype, got,
                  t->module.p->view.name, want);
            rc = KILN_E_STATE;
            break;
        }
        herr_clear();
        int32_t crc = t->K->copy(t->accel.inst, p->data, x->data, x->nbytes, KILN_COPY_H2D);
        if (crc) rc = ht_fail(t, &t->accel, crc, "copy of a checkpoint tensor", why, whylen);
    }
    if (rc == KILN_OK && (size_t)kst_count(f) != t->nparams)
        HLOG_WARN("%s: %d tensors in the file, the module uses %u; the others are ignored", path, kst_count(f),
                  t->nparams);
    if (rc == KILN_OK) {
        const char *e = kst_metadata(f, "epoch"), *s = kst_metadata(f, "global_step");
        HLOG_INFO("loaded weights from %s (epoch %s, global step %s)", path, e ? e : "?", s ? s : "?");
    }
    kst_close(f);
    return rc;
}

int ht_ckpt_resolve(const ht_trainer *t, const char *arg, char *out, size_t outlen, char *why, size_t whylen) {
    if (strcmp(arg, "last") != 0) {
        snprintf(out, outlen, "%s", arg);
        return KILN_OK;
    }
    const char *root = t->set.default_root_dir;
    DIR *d = opendir(root);
    long best = -1;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            if (strncmp(e->d_name, "version_", 8) != 0) continue;
            long v = strtol(e->d_name + 8, &end, 10);
            if (*end || v <= best) continue;
            char p[4096];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s/checkpoints/last.safetensors", root, e->d_name);
            if (stat(p, &st) == 0) best = v;
        }
        closedir(d);
    }
    if (best < 0) {
        hwhyf(why, whylen, "--ckpt last: no %s/version_N/checkpoints/last.safetensors found (trainer.default_root_dir = "
              "\"%s\"); train first or give a path", root, root);
        return KILN_E_NOT_FOUND;
    }
    snprintf(out, outlen, "%s/version_%ld/checkpoints/last.safetensors", root, best);
    return KILN_OK;
}
