/*
 * host/param_checks.h — allowed values of a plugin's config keys (ABI 1.5).
 * A plugin lists them in its descriptor's properties under the key
 * "config_checks", a string list of short rules over its declared keys:
 *
 *   "lr > 0"   "eps >= 0"   "threads <= 256"       a bound (< <= > >=)
 *   "momentum in [0, 1)"    "p in (0, 1]"          an interval
 *   "mode in {min, max}"                           choices (strings)
 *
 * Bounds apply to int and float keys and to each element of int and float
 * lists; choices to string keys and each element of string lists. The
 * loader refuses a descriptor whose rules do not parse, name an undeclared
 * key, do not fit its type, or reject the key's own default; the host
 * enforces them on every run file (`kiln config check` included) before the
 * plugin is created, and `kiln plugins list --verbose` shows them per key.
 * Plain text rather than a struct, so the descriptor (and every positional
 * initializer of it) keeps its 1.0 layout.
 */
#ifndef KILN_HOST_PARAM_CHECKS_H
#define KILN_HOST_PARAM_CHECKS_H

#include <stddef.h>

#include "config.h"
#include "error.h"
#include "kiln/config_checks.h"
#include "kiln/value.h"

/* The rules of a descriptor, checked against its declared params: 0, or -1
 * with a message (no file name) in err. */
int hp_validate_desc(const kiln_kv *properties, const kiln_param *params, ht_error *err);
/* Every rule of `properties` against the resolved config `kv` of the run
 * file section `sec` (NULL: all defaults): 0, or KILN_E_CONFIG with
 * "<file>:<line>: <what> key 'k' must be ..., found ..." in err. */
int hp_check_config(const hc_config *c, config_setting_t *sec, const kiln_kv *properties, const kiln_kv *kv,
                    const char *what, ht_error *err);
/* The rules for `key` as one text ("> 0, < 1"), empty when none. */
void hp_rules_for(const kiln_kv *properties, const char *key, char *buf, size_t n);

#endif
