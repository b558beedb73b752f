/*
 * host/param_checks.c — the "config_checks" rules of a plugin's config keys
 * applied by the host: the rules themselves (parse, check a value, check a
 * descriptor's rules against its declaration) are the SDK's
 * kiln/config_checks.h, so a test host applies exactly the same; here they
 * meet the run file, for messages that say where a value was set. A rule is tiny on purpose: a bound,
 * an interval or a set of choices, so every value error reads the same way
 * whatever the plugin ("optimizer 'adamw' key 'lr' must be > 0, found -1").
 */
#define _GNU_SOURCE
#include "param_checks.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

int hp_validate_desc(const kiln_kv *properties, const kiln_param *params, ht_error *err) {
    /* the SDK's rules (kiln/config_checks.h, shared with test hosts) write
     * into a plain buffer: the plugin ABI's headers know no ht_error */
    return kiln_config_rules_validate(properties, params, err->msg, sizeof err->msg);
}

int hp_check_config(const hc_config *c, config_setting_t *sec, const kiln_kv *properties, const kiln_kv *kv,
                    const char *what, ht_error *err) {
    const kiln_value *rules = kiln_config_rules_of(properties);
    for (uint32_t r = 0; rules && r < rules->count; r++) {
        kiln_config_rule ck;
        char bad[256];
        if (kiln_config_rule_parse(rules->v.sl[r], &ck, bad, sizeof bad)) continue; /* refused at load; cannot happen */
        const kiln_value *v = kiln_kv_find(kv, ck.key);
        char found[128];
        if (!v || kiln_config_rule_ok(&ck, v, found, sizeof found)) continue;
        char rule[512], where[PATH_MAX + 32];
        kiln_config_rule_describe(&ck, rule, sizeof rule);
        config_setting_t *m = sec ? config_setting_get_member(sec, ck.key) : NULL;
        if (m || sec) hc_where(c, m ? m : sec, where, sizeof where);
        else snprintf(where, sizeof where, "%s", c->path);
        return ht_errorc(err, KILN_E_CONFIG, "%s: %s key '%s' must be %s, found %s%s", where, what, ck.key, rule,
                         found, m ? "" : " (its default)");
    }
    return KILN_OK;
}

void hp_rules_for(const kiln_kv *properties, const char *key, char *buf, size_t n) {
    buf[0] = 0;
    const kiln_value *rules = kiln_config_rules_of(properties);
    size_t l = 0;
    for (uint32_t r = 0; rules && r < rules->count && l < n; r++) {
        kiln_config_rule ck;
        char err[256], one[512];
        if (kiln_config_rule_parse(rules->v.sl[r], &ck, err, sizeof err) || strcmp(ck.key, key)) continue;
        kiln_config_rule_describe(&ck, one, sizeof one);
        l += (size_t)snprintf(buf + l, n - l, "%s%s", l ? ", " : "", one);
    }
}
