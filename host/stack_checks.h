/*
 * host/stack_checks.h — the checks that decide whether a precision, a
 * module and an optimizer can run together, from their declared properties alone. The
 * host knows no precision by name: a precision says in which dtype it keeps
 * master weights ("param_dtype") and whether it can drive an optimizer that
 * calls its closure several times per step ("allows_repeated_closure");
 * modules and optimizers say which master dtypes they handle
 * ("param_dtypes") and whether they repeat the closure
 * ("repeated_closure"). `kiln config check` and every run apply the same
 * rules, so an incompatible stack fails before anything is created.
 */
#ifndef KILN_HOST_STACK_CHECKS_H
#define KILN_HOST_STACK_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "loader.h"

/* The master-weight dtype a precision plugin asks for (F32 when it says
 * nothing); KILN_E_CONFIG with a message for anything but F32/F64. */
int stack_param_dtype(const hl_plugin *precision, uint32_t *dtype, ht_error *err);

/* Whether the stack can run; module and optimizer may be NULL (not checked). */
int stack_check(const hl_plugin *precision, const hl_plugin *module, const hl_plugin *optimizer, ht_error *err);

/* The module's "automatic_optimization" property is false. */
int stack_is_manual(const hl_plugin *module);

/* Lightning's rules on how a module optimises: several optimizers need
 * manual optimization, which in turn refuses automatic clipping (clip > 0)
 * and accumulation (accumulate != 1). The message has no file prefix. */
int stack_check_optimization(const hl_plugin *module, int nopts, int64_t accumulate, double clip, ht_error *err);

#endif /* KILN_HOST_STACK_CHECKS_H */
