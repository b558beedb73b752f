/*
 * host/stack_checks.c — property-based compatibility rules between the
 * precision, module and optimizer of a run (see stack_checks.h). Each rule
 * names both plugins and their files, what one requires and what the other declares, so the
 * fix (another plugin, or a property its author forgot) is in the message.
 */
#include <stdio.h>
#include <string.h>

#include "stack_checks.h"
#include "log.h"

static int prop_bool(const hl_plugin *p, const char *key, int dflt) {
    const kiln_value *v = hl_prop(p, key);
    return v && v->type == KILN_TYPE_BOOL ? v->v.i != 0 : dflt;
}

int stack_param_dtype(const hl_plugin *precision, uint32_t *dtype, ht_error *err) {
    *dtype = KILN_DTYPE_F32;
    const kiln_value *v = hl_prop(precision, "param_dtype");
    if (!v || v->type != KILN_TYPE_STRING) return KILN_OK;
    uint32_t dt = kiln_dtype_from_name(v->v.s);
    if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F64) {
        return ht_errorc(err, KILN_E_CONFIG,
              "precision '%s' (%s): property param_dtype is \"%s\"; the host keeps master weights in \"float32\" "
              "or \"float64\" (reduced-precision copies belong in the plugin's compute weights)",
              precision->view.name, precision->lib->path, v->v.s);
    }
    *dtype = dt;
    return KILN_OK;
}

/* Does `p` list `dtype` in its "param_dtypes" property? Without the property
 * a plugin handles float32 only: that is all a 1.1 plugin could. */
static int handles_dtype(const hl_plugin *p, uint32_t dtype) {
    const kiln_value *v = hl_prop(p, "param_dtypes");
    if (!v || v->type != KILN_TYPE_STRING_LIST) return dtype == KILN_DTYPE_F32;
    for (uint32_t i = 0; i < v->count; i++)
        if (kiln_dtype_from_name(v->v.sl[i]) == dtype) return 1;
    return 0;
}

static int check_dtype(const hl_plugin *precision, const hl_plugin *p, uint32_t dtype, ht_error *err) {
    if (!p || handles_dtype(p, dtype)) return KILN_OK;
    return ht_errorc(err, KILN_E_CONFIG,
          "precision '%s' (%s) keeps master weights in %s, but %s '%s' (%s) does not list \"%s\" in its "
          "param_dtypes property (it handles float32 only); use a precision with float32 masters or a %s that "
          "supports %s",
          precision->view.name, precision->lib->path, kiln_dtype_name(dtype), hl_kind_name(p->view.kind),
          p->view.name, p->lib->path, kiln_dtype_name(dtype), hl_kind_name(p->view.kind),
          kiln_dtype_name(dtype));
}

int stack_check(const hl_plugin *precision, const hl_plugin *module, const hl_plugin *optimizer, ht_error *err) {
    if (!precision) return KILN_OK;
    uint32_t dt;
    int rc = stack_param_dtype(precision, &dt, err);
    if (rc) return rc;
    if ((rc = check_dtype(precision, module, dt, err))) return rc;
    if ((rc = check_dtype(precision, optimizer, dt, err))) return rc;
    /* Lightning refuses LBFGS under native AMP: the scaler unscales and
     * checks the gradients once per optimizer step, but a repeating
     * optimizer would run backward (with the scaled loss) several times. */
    if (optimizer && prop_bool(optimizer, "repeated_closure", 0) &&
        !prop_bool(precision, "allows_repeated_closure", 1)) {
        return ht_errorc(err, KILN_E_CONFIG,
              "precision '%s' (%s) cannot drive optimizer '%s' (%s): the optimizer calls its closure several times "
              "per step (repeated_closure = true) and this precision unscales and checks the gradients once per "
              "step (allows_repeated_closure = false); use a precision without loss scaling (e.g. one whose "
              "needs_grad_scaler is false) or another optimizer",
              precision->view.name, precision->lib->path, optimizer->view.name, optimizer->lib->path);
    }
    return KILN_OK;
}

int stack_is_manual(const hl_plugin *module) {
    return module && !prop_bool(module, "automatic_optimization", 1);
}

int stack_check_optimization(const hl_plugin *module, int nopts, int64_t accumulate, double clip, ht_error *err) {
    if (!module) return KILN_OK;
    if (nopts > 1 && !stack_is_manual(module)) {
        return ht_errorc(err, KILN_E_CONFIG,
              "%d optimizers configured, but module '%s' uses automatic optimization, which drives exactly one (as in "
              "Lightning); a module with several optimizers must optimise manually (its automatic_optimization "
              "property false; %s)",
              nopts, module->view.name, module->lib->path);
    }
    if (!stack_is_manual(module)) return KILN_OK;
    if (clip > 0) {
        return ht_errorc(err, KILN_E_CONFIG,
              "trainer.gradient_clip_val = %g, but module '%s' optimises manually: automatic clipping is not "
              "available in manual optimization (as in Lightning); clip in the module",
              clip, module->view.name);
    }
    if (accumulate != 1) {
        return ht_errorc(err, KILN_E_CONFIG,
              "trainer.accumulate_grad_batches = %lld, but module '%s' optimises manually: automatic "
              "accumulation is not available in manual optimization (as in Lightning); accumulate in the module",
              (long long)accumulate, module->view.name);
    }
    return KILN_OK;
}
