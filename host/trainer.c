/*
 * host/trainer.c — setting up and tearing down a run: the trainer settings,
 * the plugin stack in creation order (accelerator, strategy, precision, data,
 * module, optimizer, callbacks), the parameter arenas, the run directory, the
 * services that need a trainer (accelerator, parameters, logging, stop
 * requests, seeds), hook dispatch in Lightning's order, and the summary.
 * The loops themselves are in loops.c.
 */
#define _GNU_SOURCE
#include "trainer.h"

#include <ctype.h>
#include <fnmatch.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "stack_checks.h"
#include "log.h"
#include "loops.h"
#include "lr_clip.h"
#include "param_checks.h"
#include "plugin_api.h"
#include "run_services.h"


/* ---------------------------------------------------------------------------
 * Settings */

/* limit_*_batches and val_check_interval: an int is a count, a float a
 * fraction (Lightning); the resolved kv lost that distinction, the file has it. */
static int is_int_setting(hc_config *c, const char *key) { return hc_is_int(hc_lookup(c, key)); }

static int read_settings(ht_trainer *t, ht_error *err) {
    const kiln_kv *kv = t->trainer_kv.kv;
    ht_settings *s = &t->set;
    s->max_epochs = kiln_kv_int(kv, "max_epochs", -1);
    s->max_steps = kiln_kv_int(kv, "max_steps", -1);
    s->min_epochs = kiln_kv_int(kv, "min_epochs", 0);
    s->min_steps = kiln_kv_int(kv, "min_steps", -1);
    s->limit_train = kiln_kv_float(kv, "limit_train_batches", 1.0);
    s->limit_val = kiln_kv_float(kv, "limit_val_batches", 1.0);
    s->limit_test = kiln_kv_float(kv, "limit_test_batches", 1.0);
    s->limit_train_is_count = is_int_setting(t->cfg, "trainer.limit_train_batches");
    s->limit_val_is_count = is_int_setting(t->cfg, "trainer.limit_val_batches");
    s->limit_test_is_count = is_int_setting(t->cfg, "trainer.limit_test_batches");
    s->val_check_interval = kiln_kv_float(kv, "val_check_interval", 1.0);
    s->val_check_is_count = is_int_setting(t->cfg, "trainer.val_check_interval");
    s->check_val_every_n_epoch = kiln_kv_int(kv, "check_val_every_n_epoch", 1);
    s->num_sanity_val_steps = kiln_kv_int(kv, "num_sanity_val_steps", 2);
    s->accumulate_grad_batches = kiln_kv_int(kv, "accumulate_grad_batches", 1);
    s->seed = kiln_kv_int(kv, "seed", 0);
    s->default_root_dir = kiln_kv_str(kv, "default_root_dir", "runs");
    s->log_every_n_steps = kiln_kv_int(kv, "log_every_n_steps", 50);
    s->threads = kiln_kv_int(kv, "threads", 0);
    s->gradient_clip_val = kiln_kv_float(kv, "gradient_clip_val", 0.0);
    s->peak_flops = kiln_kv_float(kv, "peak_flops", 0.0);
    const char *algo = kiln_kv_str(kv, "gradient_clip_algorithm", "norm");
    s->clip_by_value = !strcmp(algo, "value");
    const char *f = t->cfg->path;
#define BAD(cond, ...) do { if (cond) { ht_errorf(err, __VA_ARGS__); return KILN_E_CONFIG; } } while (0)
    BAD(s->max_epochs < -1, "%s: trainer.max_epochs must be >= -1, found %lld", f, (long long)s->max_epochs);
    BAD(s->max_steps < -1, "%s: trainer.max_steps must be >= -1, found %lld", f, (long long)s->max_steps);
    BAD(s->min_epochs < 0, "%s: trainer.min_epochs must be >= 0, found %lld", f, (long long)s->min_epochs);
    BAD(s->accumulate_grad_batches < 1, "%s: trainer.accumulate_grad_batches must be >= 1, found %lld", f,
        (long long)s->accumulate_grad_batches);
    BAD(s->log_every_n_steps < 1, "%s: trainer.log_every_n_steps must be >= 1, found %lld", f,
        (long long)s->log_every_n_steps);
    BAD(s->check_val_every_n_epoch < 1, "%s: trainer.check_val_every_n_epoch must be >= 1, found %lld", f,
        (long long)s->check_val_every_n_epoch);
    BAD(s->num_sanity_val_steps < -1, "%s: trainer.num_sanity_val_steps must be >= -1, found %lld", f,
        (long long)s->num_sanity_val_steps);
    BAD(s->limit_train < 0 || s->limit_val < 0 || s->limit_test < 0,
        "%s: trainer.limit_*_batches must be >= 0", f);
    BAD(!s->limit_train_is_count && s->limit_train > 1.0,
        "%s: trainer.limit_train_batches as a fraction must be <= 1.0, found %g (write an int for a count)", f,
        s->limit_train);
    BAD(!s->limit_val_is_count && s->limit_val > 1.0,
        "%s: trainer.limit_val_batches as a fraction must be <= 1.0, found %g (write an int for a count)", f,
        s->limit_val);
    BAD(!(s->val_check_interval > 0), "%s: trainer.val_check_interval must be > 0, found %g", f,
        s->val_check_interval);
    BAD(!s->val_check_is_count && s->val_check_interval > 1.0,
        "%s: trainer.val_check_interval as a fraction must be <= 1.0, found %g (write an int for a batch count)", f,
        s->val_check_interval);
    BAD(s->threads < 0, "%s: trainer.threads must be >= 0, found %lld", f, (long long)s->threads);
    BAD(!(s->peak_flops >= 0) || !isfinite(s->peak_flops),
        "%s: trainer.peak_flops must be a finite number >= 0 (FLOP/s; 0: measure), found %g", f, s->peak_flops);
    BAD(!(s->gradient_clip_val >= 0) || !isfinite(s->gradient_clip_val),
        "%s: trainer.gradient_clip_val must be a finite number >= 0, found %g", f, s->gradient_clip_val);
    BAD(strcmp(algo, "norm") && strcmp(algo, "value"),
        "%s: trainer.gradient_clip_algorithm must be \"norm\" or \"value\", found \"%s\"", f, algo);
#undef BAD
    if (s->max_epochs == -1 && s->max_steps == -1) {
        HLOG_WARN("trainer.max_epochs is not set and max_steps is -1: training stops after 1000 epochs");
        s->max_epochs = 1000;
    }
    /* _parse_loop_limits: min_steps without min_epochs means min_epochs = 1,
     * so a stop requested in the first epoch still finishes that epoch */
    if (s->min_steps != -1 && !hc_lookup(t->cfg, "trainer.min_epochs")) s->min_epochs = 1;
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Slots */

static size_t ops_size_for(uint32_t kind) {
    switch (kind) {
    /* the 1.1 sizes: a plugin built against any later minor has at least these */
    case KILN_KIND_ACCELERATOR: return KILN_ACCELERATOR_OPS_SIZE_1_1;
    case KILN_KIND_PRECISION: return KILN_PRECISION_OPS_SIZE_1_1;
    case KILN_KIND_STRATEGY: return KILN_STRATEGY_OPS_SIZE_1_1;
    case KILN_KIND_OPTIMIZER: return KILN_OPTIMIZER_OPS_SIZE_1_1;
    case KILN_KIND_CALLBACK: return KILN_CALLBACK_OPS_SIZE_1_1;
    case KILN_KIND_DATA: return KILN_DATA_OPS_SIZE_1_1;
    case KILN_KIND_MODULE: return KILN_MODULE_OPS_SIZE_1_1;
    case KILN_KIND_SCHEDULER: return KILN_SCHEDULER_OPS_SIZE_1_1;
    default: return sizeof(kiln_ops_header);
    }
}

static int make_slot(ht_trainer *t, ht_slot *s, uint32_t kind, const char *name, hc_node *sec,
                     const char *role, ht_error *err) {
    ht_error inner = {0};
    char where[PATH_MAX + 32];
    memset(s, 0, sizeof *s);
    s->role = role;
    const hl_plugin *p = hl_find(t->loader, kind, name, &inner);
    if (!p) {
        hc_node *at = sec ? hc_member(sec, "name") : hc_lookup(t->cfg, role);
        if (at) hc_where(t->cfg, at, where, sizeof where);
        else snprintf(where, sizeof where, "%s", t->cfg->path);
        ht_errorf(err, "%s: %s: %s", where, role, inner.msg);
        return KILN_E_NOT_FOUND;
    }
    size_t need = ops_size_for(kind);
    if (p->lib->view.abi_minor < 1 || p->ops->struct_size < need) {
        ht_errorf(err,
                  "%s '%s' (%s) was built against ABI 1.%u with a %u-byte ops table; training needs ABI >= 1.1 and %zu "
             "bytes (rebuild it against the current SDK)",
             hl_kind_name(kind), p->view.name, p->lib->path, p->lib->view.abi_minor, p->ops->struct_size, need);
        return KILN_E_VERSION;
    }
    char what[160];
    snprintf(what, sizeof what, "%s '%s'", hl_kind_name(kind), p->view.name);
    int rc = hc_resolve_host(t->cfg, sec, p->view.params, hc_host_keys(kind), what, &s->cfg, err);
    if (rc == KILN_OK) rc = hp_check_config(t->cfg, sec, p->view.properties, s->cfg.kv, what,
            err);
    if (rc) {
        hc_kvset_free(&s->cfg);
        return rc;
    }
    s->p = p;
    hs_ctx_init(&s->hctx, p, s->cfg.kv, t->trainer_kv.kv);
    s->hctx.trainer = t;
    s->hctx.may_register = kind == KILN_KIND_MODULE;
    rc = hs_create(&s->hctx, hs_services(), p, &s->inst, err);
    s->hctx.may_register = 0;
    if (rc) {
        hc_kvset_free(&s->cfg);
        s->p = NULL;
        return rc;
    }
    return KILN_OK;
}

static void drop_slot(ht_slot *s) {
    if (s->p && s->inst) hs_destroy(&s->hctx, s->inst);
    hc_kvset_free(&s->cfg);
    memset(s, 0, sizeof *s);
}

/* Instantiate the plugin a slot of the run file names (or its default);
 * with required = 0 an absent slot leaves s->p NULL. */
static int slot_from_config(ht_trainer *t, ht_slot *s, const char *slot, int required, ht_error *err) {
    hc_node *sec = NULL;
    err->msg[0] = 0;
    const char *name = hc_slot_name(t->cfg, slot, hl_default_name(t->loader, slot), &sec, err);
    if (!name) {
        if (err->msg[0]) return KILN_E_CONFIG;
        if (!required) return KILN_OK;
        ht_errorf(err, "%s: missing the '%s' section (e.g. %s = { name = \"...\"; ... })", t->cfg->path, slot, slot);
        return KILN_E_CONFIG;
    }
    uint32_t kind;
    hl_kind_from_name(slot, &kind);
    return make_slot(t, s, kind, name, sec, slot, err);
}

/* ---------------------------------------------------------------------------
 * Parameters */

/* One arena for the masters and one for the gradients, in the dtype the
 * precision plugin asked for (float32 unless it said float64). Every tensor
 * starts on a 16-element boundary, i.e. 64 bytes for fp32. */
static int alloc_params(ht_trainer *t, ht_error *err) {
    uint32_t dt;
    int prc = stack_param_dtype(t->precision.p, &dt, err);
    if (prc) return prc;
    size_t esz = kiln_dtype_size(dt);
    t->param_dtype = dt;
    size_t total = 0;
    for (uint32_t i = 0; i < t->nparams; i++) total += ((size_t)t->params[i]->numel + 15) & ~(size_t)15;
    if (total == 0) {
        ht_errorf(err, "module '%s' registered no parameters", t->module.p->view.name);
        return KILN_E_STATE;
    }
    /* the per-parameter arrays, now that the count is known */
    const size_t n = t->nparams;
    t->toggle_froze = calloc(n, 1);
    t->clip_x = calloc(n, sizeof *t->clip_x);
    t->clip_n = calloc(n, sizeof *t->clip_n);
    t->clip_s = calloc(n, sizeof *t->clip_s);
    if (!t->toggle_froze || !t->clip_x || !t->clip_n || !t->clip_s) {
        ht_errorf(err, "out of host memory for %u parameters", t->nparams);
        return KILN_E_NOMEM;
    }
    void *a = NULL, *g = NULL;
    int32_t rc = t->kernels->alloc(t->accel.inst, total * esz, &a);
    if (rc == KILN_OK) rc = t->kernels->alloc(t->accel.inst, total * esz, &g);
    if (rc != KILN_OK) return ht_fail(t, &t->accel, rc, "allocating parameters", err);
    t->param_arena = a;
    t->grad_arena = g;
    t->arena_numel = total;
    size_t off = 0;
    for (uint32_t i = 0; i < t->nparams; i++) {
        kiln_parameter *p = t->params[i];
        p->data = (float *)((char *)t->param_arena + off * esz);
        p->grad = (float *)((char *)t->grad_arena + off * esz);
        t->clip_x[i] = p->grad; /* the clipping norm's list, fixed from here on */
        t->clip_n[i] = (size_t)p->numel;
        p->compute = p->data;
        p->compute_dtype = dt;
        p->param_dtype = dt;
        p->flags |= KILN_PARAMF_NO_GRAD; /* no backward yet: torch's grad is None */
        off += ((size_t)p->numel + 15) & ~(size_t)15;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Optimizers: `optimizer = ...` (one, every parameter) or `optimizers = (
 * { name = ...; params = ["pattern", ...]; ... }, ... )`, each owning the
 * parameters whose names match its patterns (all when it has none).
 * Several optimizers need a module that optimises manually (Lightning
 * refuses them in automatic mode). */

/* Marks the parameters optimizer i owns; an entry without `params` owns all. */
static int assign_params(ht_trainer *t, int i, hc_node *entry, ht_error *err) {
    hc_node *pats = hc_member(entry, "params");
    uint32_t n = 0;
    t->owns[i] = calloc(t->nparams, 1);
    t->opt_params[i] = calloc(t->nparams, sizeof *t->opt_params[i]);
    if (!t->owns[i] || !t->opt_params[i]) {
        ht_errorf(err, "out of host memory for %u parameters", t->nparams);
        return KILN_E_NOMEM;
    }
    for (uint32_t k = 0; k < t->nparams; k++) {
        int own = !pats;
        for (int j = 0; pats && !own && j < hc_list_length(pats); j++)
            own = fnmatch(hc_list_string(pats, j), t->params[k]->name, 0) == 0;
        t->owns[i][k] = (unsigned char)own;
        if (own) t->opt_params[i][n++] = t->params[k];
    }
    t->opt_nparams[i] = n;
    if (n > 0) return KILN_OK;
    char where[PATH_MAX + 32], names[512] = "";
    hc_where(t->cfg, pats, where, sizeof where);
    for (uint32_t k = 0; k < t->nparams && strlen(names) < sizeof names - 40; k++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", t->params[k]->name);
    ht_errorf(err, "%s: optimizers.[%d].params matches no parameter of module '%s' (its parameters: %s%s)", where, i,
          t->module.p->view.name, names, strlen(names) >= sizeof names - 40 ? ", ..." : "");
    return KILN_E_CONFIG;
}

static int open_optimizers(ht_trainer *t, ht_error *err) {
    static char roles[HT_MAX_OPTIMIZERS][24];
    int n = hc_optimizer_count(t->cfg);
    int rc;
    t->manual = stack_is_manual(t->module.p);
    if (n > HT_MAX_OPTIMIZERS) {
        ht_errorf(err, "%s: %d optimizers configured, at most %d supported", t->cfg->path, n, HT_MAX_OPTIMIZERS);
        return KILN_E_CONFIG;
    }
    ht_error inner = {0};
    if ((rc = stack_check_optimization(t->module.p, n, t->set.accumulate_grad_batches, t->set.gradient_clip_val,
                                       &inner))) {
        ht_errorf(err, "%s: %s", t->cfg->path, inner.msg);
        return rc;
    }
    for (int i = 0; i < (n ? n : 1); i++) {
        hc_node *entry = NULL;
        if (n == 0) {
            rc = slot_from_config(t, &t->opts[0], "optimizer", 1, err);
        } else {
            entry = hc_optimizer(t->cfg, i);
            const char *name = hc_member_string(entry, "name");
            snprintf(roles[i], sizeof roles[i], "optimizers.[%d]", i);
            rc = make_slot(t, &t->opts[i], KILN_KIND_OPTIMIZER, name, entry, roles[i], err);
        }
        if (rc) return rc;
        t->nopts = i + 1;
        t->opt_ops[i] = (const kiln_optimizer_ops *)t->opts[i].p->ops;
        if (i == 0) {
            const kiln_value *rep = hl_prop(t->opts[0].p, "repeated_closure");
            t->opt_repeats = rep && rep->type == KILN_TYPE_BOOL && rep->v.i;
        }
        if ((rc = stack_check(t->precision.p, NULL, t->opts[i].p, err))) return rc;
        if ((rc = assign_params(t, i, entry, err))) return rc;
        rc = t->opt_ops[i]->setup(t->opts[i].inst, t->opt_params[i], t->opt_nparams[i]);
        if (rc) return ht_fail(t, &t->opts[i], rc, "setup", err);
    }
    for (uint32_t k = 0; k < t->nparams; k++) {
        int any = 0;
        for (int i = 0; i < t->nopts; i++) any |= t->owns[i][k];
        if (!any) HLOG_WARN("parameter %s is not updated by any optimizer (no `params` pattern matches it)",
                            t->params[k]->name);
    }
    return KILN_OK;
}

/* The optional `scheduler`, after the optimizers (it scales their rates);
 * lr_clip.c checks its host keys and sets the first rate. */
static int open_scheduler(ht_trainer *t, ht_error *err) {
    int rc = slot_from_config(t, &t->scheduler, "scheduler", 0, err);
    if (rc) return rc;
    ht_schedule_keys keys = {"step", NULL, 1};
    hc_node *sec = NULL;
    if (t->scheduler.p) hc_slot_name(t->cfg, "scheduler", NULL, &sec, err);
    if (sec) {
        const char *interval = hc_member_string(sec, "interval");
        if (interval) keys.interval = interval;
        keys.monitor = hc_member_string(sec, "monitor");
        hc_member_int64(sec, "frequency", &keys.frequency);
    }
    return ht_start_schedule(t, &keys, err);
}

/* ---------------------------------------------------------------------------
 * Open / close */

int ht_open(ht_trainer *t, hc_config *cfg, hl_loader *loader, int stage, ht_error *err) {
    memset(t, 0, sizeof *t);
    t->cfg = cfg;
    t->loader = loader;
    t->stage = stage;
    int rc = hc_resolve(cfg, hc_lookup(cfg, "trainer"), hc_trainer_params, "trainer", &t->trainer_kv,
            err);
    if (rc) return rc;
    rc = read_settings(t, err);
    if (rc) goto fail;

    /* accelerator and strategy first, everything else allocates through
     * them; the strategy's world comes before configure() because the
     * accelerator picks its device by local rank (one process per GPU) */
    rc = slot_from_config(t, &t->accel, "accelerator", 1, err);
    if (rc) goto fail;
    t->accel_ops = (const kiln_accelerator_ops *)t->accel.p->ops;

    rc = slot_from_config(t, &t->strategy, "strategy", 1, err);
    if (rc) goto fail;
    t->strategy_ops = (const kiln_strategy_ops *)t->strategy.p->ops;
    int32_t rank = 0, world = 1, local = 0;
    rc = t->strategy_ops->world(t->strategy.inst, &rank, &world, &local);
    if (rc) { rc = ht_fail(t, &t->strategy, rc, "world", err); goto fail; }
    t->state.rank = rank;
    t->state.world_size = world;

    rc = t->accel_ops->configure(t->accel.inst, (int32_t)t->set.threads, local < 0 ? 0 : local);
    if (rc) { rc = ht_fail(t, &t->accel, rc, "configure", err); goto fail; }
    t->kernels = t->accel_ops->kernels(t->accel.inst);
    if (!t->kernels || t->kernels->struct_size < KILN_KERNELS_SIZE_1_1) {
        ht_errorf(err, "accelerator '%s' (%s): kernel table missing or too small (%u < %zu bytes)",
             t->accel.p->view.name, t->accel.p->lib->path, t->kernels ? t->kernels->struct_size : 0,
             (size_t)KILN_KERNELS_SIZE_1_1);
        rc = KILN_E_VERSION;
        goto fail;
    }

    rc = slot_from_config(t, &t->precision, "precision", 1, err);
    if (rc) goto fail;
    t->precision_ops = (const kiln_precision_ops *)t->precision.p->ops;

    rc = slot_from_config(t, &t->data, "data", 1, err);
    if (rc) goto fail;
    t->data_ops = (const kiln_data_ops *)t->data.p->ops;

    rc = slot_from_config(t, &t->module, "module", 1, err);
    if (rc) goto fail;
    t->module_ops = (const kiln_module_ops *)t->module.p->ops;
    rc = stack_check(t->precision.p, t->module.p, NULL, err);
    if (rc) goto fail;
    rc = alloc_params(t, err);
    if (rc) goto fail;
    kiln_host_ctx *mh = &t->module.hctx;
    rc = t->module_ops->init_weights(t->module.inst, ht_svc_seed(mh, "module.init"));
    if (rc) { rc = ht_fail(t, &t->module, rc, "init_weights", err); goto fail; }
    rc = t->precision_ops->setup(t->precision.inst, t->params, t->nparams);
    if (rc) { rc = ht_fail(t, &t->precision, rc, "setup", err); goto fail; }
    rc = t->strategy_ops->setup(t->strategy.inst, t->params, t->nparams);
    if (rc) { rc = ht_fail(t, &t->strategy, rc, "setup", err); goto fail; }

    if (stage == KILN_STAGE_FIT && (rc = open_optimizers(t, err))) goto fail;
    if (stage == KILN_STAGE_FIT && (rc = open_scheduler(t, err))) goto fail;

    int ncb = hc_callback_count(cfg);
    if (ncb > HT_MAX_CALLBACKS) {
        ht_errorf(err, "%s: %d callbacks configured, at most %d supported", cfg->path, ncb, HT_MAX_CALLBACKS);
        rc = KILN_E_CONFIG;
        goto fail;
    }
    static char roles[HT_MAX_CALLBACKS][24];
    for (int i = 0; i < ncb; i++) {
        hc_node *cb = hc_callback(cfg, i), *sec = NULL;
        snprintf(roles[i], sizeof roles[i], "callbacks.[%d]", i);
        const char *name = hc_entry_name(cb, &sec);
        if (!name) {
            char where[PATH_MAX + 32];
            hc_where(cfg, cb, where, sizeof where);
            ht_errorf(err, "%s: %s must be a group with name = \"...\"", where, roles[i]);
            rc = KILN_E_CONFIG;
            goto fail;
        }
        rc = make_slot(t, &t->callbacks[i], KILN_KIND_CALLBACK, name, sec, roles[i], err);
        if (rc) goto fail;
        t->ncallbacks++;
    }
    ht_update_state(t);
    return KILN_OK;
fail:
    ht_close(t);
    return rc;
}

void ht_close(ht_trainer *t) {
    for (int i = t->ncallbacks - 1; i >= 0; i--) drop_slot(&t->callbacks[i]);
    t->ncallbacks = 0;
    drop_slot(&t->scheduler);
    for (int i = t->nopts - 1; i >= 0; i--) drop_slot(&t->opts[i]);
    drop_slot(&t->opts[0]); /* a failed open may leave a slot without nopts */
    t->nopts = 0;
    drop_slot(&t->module);
    drop_slot(&t->data);
    drop_slot(&t->precision);
    drop_slot(&t->strategy);
    if (t->kernels && t->accel.inst) {
        t->kernels->free(t->accel.inst, t->param_arena);
        t->kernels->free(t->accel.inst, t->grad_arena);
    }
    t->param_arena = t->grad_arena = NULL;
    t->arena_numel = 0;
    drop_slot(&t->accel);
    for (uint32_t i = 0; i < t->nparams; i++) {
        free((void *)t->params[i]->name);
        free(t->params[i]);
    }
    free(t->params);
    t->params = NULL;
    t->nparams = t->cap_params = 0;
    for (int i = 0; i < HT_MAX_OPTIMIZERS; i++) {
        free(t->owns[i]);
        free(t->opt_params[i]);
        t->owns[i] = NULL;
        t->opt_params[i] = NULL;
    }
    free(t->toggle_froze);
    free(t->clip_x);
    free(t->clip_n);
    free(t->clip_s);
    t->toggle_froze = NULL;
    t->clip_x = NULL;
    t->clip_n = NULL;
    t->clip_s = NULL;
    hc_kvset_free(&t->trainer_kv);
}

/* ---------------------------------------------------------------------------
 * Run directory */

/* Several ranks: rank 0 creates version_N and the others learn N through
 * the strategy's reduce_sum (they add 0; -1 from rank 0 means it failed). */
static int share_run_dir(ht_trainer *t, int rc0, ht_error *err) {
    if (t->state.world_size <= 1) return rc0;
    double v = -1;
    if (t->state.rank == 0 && rc0 == KILN_OK) {
        const char *u = strrchr(t->run_dir, '_');
        v = u ? strtod(u + 1, NULL) : -1;
    }
    if (t->state.rank != 0) v = 0;
    else v += 1; /* others add 0: the sum is rank 0's value + 1, 0 when it failed */
    herr_clear();
    int32_t rc = t->strategy_ops->reduce_sum(t->strategy.inst, &v, 1);
    if (rc) return ht_fail(t, &t->strategy, rc, "reduce_sum (sharing the run directory)", err);
    if (t->state.rank == 0) return rc0;
    if (v < 1) {
        ht_errorf(err, "rank %d: rank 0 could not create the run directory under %s", t->state.rank,
              t->set.default_root_dir);
        return KILN_E_IO;
    }
    snprintf(t->run_dir, sizeof t->run_dir, "%s/version_%ld", t->set.default_root_dir, (long)v - 1);
    return KILN_OK;
}

static int make_run_dir_rank0(ht_trainer *t, ht_error *err);

int ht_make_run_dir(ht_trainer *t, ht_error *err) {
    int rc = t->state.rank == 0 ? make_run_dir_rank0(t, err) : KILN_OK;
    return share_run_dir(t, rc, err);
}

/* Run numbers stay below 2^53: several ranks learn rank 0's number through
 * a reduce_sum of doubles (share_run_dir), exact only up to there. */
#define RUN_NUMBER_MAX (((int64_t)1 << 53) - 2)

/* The largest N of the version_N entries in `dir` (-1 when none), read as
 * digits only, and that entry's name; a number beyond RUN_NUMBER_MAX (or
 * beyond int64) reads as RUN_NUMBER_MAX + 1. */
static int largest_version(const char *dir, int64_t *out, char *name, size_t namelen, ht_error *err) {
    DIR *d = opendir(dir);
    if (!d) {
        ht_errorf(err, "%s: cannot read: %s", dir, strerror(errno));
        return KILN_E_IO;
    }
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "version_", 8) != 0) continue;
        const char *s = e->d_name + 8;
        int64_t v = 0;
        int digits = 0;
        for (; *s >= '0' && *s <= '9'; s++, digits++)
            if (v <= RUN_NUMBER_MAX) v = v * 10 + (*s - '0'); /* stops growing past the limit: no overflow */
        if (*s || !digits) continue; /* not a run directory's name */
        if (v > RUN_NUMBER_MAX) v = RUN_NUMBER_MAX + 1;
        if (v > best) {
            best = v;
            snprintf(name, namelen, "%s", e->d_name);
        }
    }
    closedir(d);
    *out = best;
    return KILN_OK;
}

static int make_run_dir_rank0(ht_trainer *t, ht_error *err) {
    const char *root = t->set.default_root_dir;
    char path[sizeof t->run_dir - 32];
    snprintf(path, sizeof path, "%s", root);
    int rc = ht_mkdirs(path, "trainer.default_root_dir", err);
    if (rc) return rc;
    /* version_<largest + 1>, created here: an existing directory is never
     * taken over, since two runs sharing one would overwrite each other's
     * checkpoints and logs. EEXIST means another run just took the number:
     * look again. */
    for (int attempt = 0; attempt < 100; attempt++) {
        int64_t best = -1;
        char name[300] = "";
        if ((rc = largest_version(path, &best, name, sizeof name, err))) return rc;
        if (best >= RUN_NUMBER_MAX) {
            t->run_dir[0] = 0;
            ht_errorf(err,
                      "%s: cannot number a new run: expected the largest version_N below %lld, found %s; move the old "
                  "runs away or choose another trainer.default_root_dir",
                  path, (long long)RUN_NUMBER_MAX, name);
            return KILN_E_IO;
        }
        snprintf(t->run_dir, sizeof t->run_dir, "%s/version_%lld", path, (long long)(best + 1));
        if (mkdir(t->run_dir, 0755) == 0) {
            char cfgpath[4200];
            snprintf(cfgpath, sizeof cfgpath, "%s/config.cfg", t->run_dir);
            return hc_write(t->cfg, cfgpath, err);
        }
        if (errno != EEXIST) {
            ht_errorf(err, "%s: cannot create the run directory: %s", t->run_dir, strerror(errno));
            t->run_dir[0] = 0;
            return KILN_E_IO;
        }
    }
    ht_errorf(err, "%s: cannot create a new run directory: expected a free version_N, found each one taken in 100 "
          "attempts (other runs are starting there)", path);
    t->run_dir[0] = 0;
    return KILN_E_IO;
}

/* ---------------------------------------------------------------------------
 * Summary */

/* The accelerator's GEMM rate (FLOP/s), the MFU denominator when the run
 * file names none, through the kernel table itself; 0 when it cannot be
 * measured. Run after fit, so it costs the training nothing. It is taken
 * in the dtype the step's products run in: the precision's compute dtype
 * (bf16-mixed: bfloat16 operands into a float32 product, as the step's
 * matmuls; 64-true: float64), float32 otherwise. A bf16 run measured
 * against the float32 rate would read an MFU many times too high on a GPU,
 * whose 16-bit tensor cores are ~15x its float32 units. The median of 5
 * products of n^3 after a warm-up, n = 768 on a host-memory table (a CPU:
 * milliseconds each) and 4096 on a device (a GPU nears its dense peak only
 * on large products; 768^3 would be mostly launch there). *dtype says
 * which. */
static double measure_gemm_flops(ht_trainer *t, uint32_t *dtype) {
    const kiln_kernels *k = t->kernels;
    *dtype = KILN_DTYPE_F32;
    if (!k || !k->gemm || !k->alloc || !k->synchronize) return 0;
    const kiln_value *cv = hl_prop(t->precision.p, "compute_dtype");
    uint32_t dt = cv && cv->type == KILN_TYPE_STRING ? kiln_dtype_from_name(cv->v.s) : KILN_DTYPE_F32;
    const int ex = k->struct_size >= KILN_KERNELS_SIZE_1_2 && k->gemm_ex;
    if (!ex || (dt != KILN_DTYPE_BF16 && dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_F64)) dt = KILN_DTYPE_F32;
    const uint32_t cdt = dt == KILN_DTYPE_F64 ? KILN_DTYPE_F64 : KILN_DTYPE_F32; /* the product's */
    const int n = (k->flags & KILN_KERNELS_HOST_MEMORY) ? 768 : 4096;
    const size_t nn = (size_t)n * n;
    void *buf = NULL;
    if (k->alloc(t->accel.inst, nn * (2 * kiln_dtype_size(dt) + kiln_dtype_size(cdt)), &buf) != KILN_OK || !buf)
        return 0;
    char *a = buf, *b = a + nn * kiln_dtype_size(dt), *c = b + nn * kiln_dtype_size(dt);
    double times[5];
    int ok = 1;
    for (int r = 0; r < 6 && ok; r++) {
        double t0 = ht_now();
        ok = (dt == KILN_DTYPE_F32 ? k->gemm(t->accel.inst, 0, 0, n, n, n, 1.0f, (const float *)(void *)a, n,
                                             (const float *)(void *)b, n, 0.0f, (float *)(void *)c, n)
                                   : k->gemm_ex(t->accel.inst, 0, 0, n, n, n, 1.0, a, dt, n, b, dt, n, 0.0, c, cdt, n,
                                                cdt)) == KILN_OK &&
             k->synchronize(t->accel.inst) == KILN_OK;
        if (r > 0) times[r - 1] = ht_now() - t0; /* the first call warms up */
    }
    k->free(t->accel.inst, buf);
    if (!ok) return 0;
    for (int i = 1; i < 5; i++) /* insertion sort of 5 */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double x = times[j];
            times[j] = times[j - 1];
            times[j - 1] = x;
        }
    *dtype = dt;
    return times[2] > 0 ? 2.0 * n * n * (double)n / times[2] : 0;
}

void ht_print_summary(ht_trainer *t, const char *verb) {
    if (t->state.rank != 0 || hlog_quiet() >= 2) return; /* -qq: errors only */
    const kiln_value *prec = hl_prop(t->precision.p, "precision");
    printf("\n== kiln %s summary (%s)\n", verb, t->run_dir[0] ? t->run_dir : "no run directory");
    char opts[256] = "-";
    for (int i = 0; i < t->nopts; i++)
        snprintf(opts + (i ? strlen(opts) : 0), sizeof opts - (i ? strlen(opts) : 0), "%s%s", i ? "+" : "",
                 t->opts[i].p->view.name);
    printf("stack: accelerator=%s precision=%s strategy=%s module=%s data=%s optimizer=%s%s\n",
           t->accel.p->view.name, prec && prec->type == KILN_TYPE_STRING ? prec->v.s : t->precision.p->view.name,
           t->strategy.p->view.name, t->module.p->view.name, t->data.p->view.name, opts,
           t->manual ? " (manual optimization)" : "");
    /* Everything said about precision is the plugin's own description: every
     * property it reports, in its order, but its names (aliases, default) */
    printf("precision: %s", prec && prec->type == KILN_TYPE_STRING ? prec->v.s : t->precision.p->view.name);
    for (const kiln_kv *kv = t->precision.p->view.properties; kv && kv->key; kv++) {
        if (!strcmp(kv->key, "precision") || !strcmp(kv->key, "aliases") || !strcmp(kv->key, "default")) continue;
        char text[256];
        printf(" %s=%s", kv->key, kiln_value_format(&kv->value, text, sizeof text));
    }
    printf("\n");
    if (!strcmp(verb, "fit")) {
        double tt = t->time.total > 0 ? t->time.total : 1e-9;
        /* every rank has the same number of samples (the shards are padded) */
        const long long samples = (long long)t->samples_seen * (t->state.world_size > 1 ? t->state.world_size : 1);
        printf("epochs: %lld  steps: %lld  skipped steps: %lld  samples: %lld%s  wall: %.2f s  (%.0f samples/s)\n",
               (long long)t->epoch_progress.total.completed, (long long)t->opt_step.total.completed,
               (long long)t->skipped_steps, samples, t->state.world_size > 1 ? " (all ranks)" : "", t->time.total,
               (double)samples / tt);
        if (t->tokens_seen > 0) {
            const double tokens = (double)t->tokens_seen * (t->state.world_size > 1 ? t->state.world_size : 1);
            printf("tokens: %.0f%s  (%.0f tokens/s)", tokens, t->state.world_size > 1 ? " (all ranks)" : "",
                   tokens / tt);
            if (t->flops_seen > 0) {
                /* MFU per process: this rank's FLOP/s against one device's peak */
                char how[64] = "trainer.peak_flops";
                double peak = t->set.peak_flops;
                if (peak <= 0) {
                    uint32_t dt = KILN_DTYPE_F32;
                    peak = measure_gemm_flops(t, &dt);
                    snprintf(how, sizeof how, "measured %s GEMM", kiln_dtype_name(dt));
                }
                if (peak > 0)
                    printf("  MFU %.1f%% (%.2f of %.2f TFLOP/s, %s)", 100 * t->flops_seen / tt / peak,
                           t->flops_seen / tt / 1e12, peak / 1e12, how);
            }
            printf("\n");
        }
        printf("time: data %.2f s (%.1f%%), forward %.2f s (%.1f%%), backward %.2f s (%.1f%%), zero_grad %.2f s, "
               "optimizer %.2f s (%.1f%%), validation %.2f s (%.1f%%)\n",
               t->time.data, 100 * t->time.data / tt, t->time.forward, 100 * t->time.forward / tt, t->time.backward,
               100 * t->time.backward / tt, t->time.zero_grad, t->time.optimizer, 100 * t->time.optimizer / tt,
               t->time.validation, 100 * t->time.validation / tt);
    }
    printf("metrics:");
    for (int i = 0; i < t->metrics.ncb; i++) {
        const char *n = t->metrics.cb_name[i];
        size_t l = strlen(n);
        if (l > 5 && !strcmp(n + l - 5, "_step")) continue; /* the epoch values are the summary */
        printf(" %s=%.4f", n, t->metrics.cb_value[i]);
    }
    printf("\n");
    fflush(stdout);
}

/* Lightning's _interrupt: a failed run (a plugin's error, a non-finite
 * loss, a refused checkpoint) tells every callback, and the precision plugin
 * that listens to hooks, with on_exception; `detail` is the error line. Their
 * own errors here are only logged: the first failure is the one reported.
 * The teardown hook does not follow (Lightning calls Callback.teardown only
 * after a run that succeeded); every instance's destroy still runs when the
 * run is closed. */
static void on_exception(ht_trainer *t, int rc, const char *err) {
    if (rc == KILN_OK || t->excepting) return;
    t->excepting = 1;
    ht_update_state(t);
    kiln_event ev = {sizeof ev, KILN_EV_ON_EXCEPTION, t->stage, KILN_SRC_CALLBACK, -1, NULL, NULL, 0, &t->state, err,
                     NULL, 0, 0, 0, 0, 0};
    for (int i = 0; i < t->ncallbacks; i++) {
        const kiln_callback_ops *ops = (const kiln_callback_ops *)t->callbacks[i].p->ops;
        herr_clear();
        int32_t crc = ops->on_event(t->callbacks[i].inst, &ev);
        if (crc) {
            ht_error e;
            ht_fail(t, &t->callbacks[i], crc, "on_exception failed", &e);
            HLOG_WARN("%.1023s", e.msg);
        }
    }
    const kiln_precision_ops *pops = t->precision_ops;
    if (pops && t->precision.p->ops->struct_size >= KILN_PRECISION_OPS_SIZE_1_2 && pops->on_event) {
        ev.source = KILN_SRC_PRECISION;
        herr_clear();
        int32_t crc = pops->on_event(t->precision.inst, &ev);
        if (crc) {
            ht_error e;
            ht_fail(t, &t->precision, crc, "on_exception failed", &e);
            HLOG_WARN("%.1023s", e.msg);
        }
    }
}

int ht_fit(ht_trainer *t, ht_error *err) {
    t->stage = KILN_STAGE_FIT;
    double t0 = ht_now();
    t->fitting = 1;
    t->in_loops = 1;
    int rc = ht_run_fit_loop(t, err);
    t->in_loops = 0;
    on_exception(t, rc, err->msg);
    t->fitting = 0;
    t->time.total = ht_now() - t0;
    return rc;
}

int ht_evaluate(ht_trainer *t, int stage, ht_error *err) {
    t->stage = stage;
    t->in_loops = 1;
    int rc = ht_run_eval_loop(t, stage, err);
    t->in_loops = 0;
    on_exception(t, rc, err->msg);
    return rc;
}
