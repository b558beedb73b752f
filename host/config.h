/*
 * host/config.h — run files: libconfig parsing with @include resolved
 * relative to the including file, `--set a.b.c=VALUE` overrides typed by
 * libconfig's own parser, the schema of a run file (trainer, plugins, one
 * group per plugin slot, a callbacks list), and the resolution of a plugin's
 * section against the config keys the plugin declares: unknown keys rejected
 * with a did-you-mean, types checked, defaults filled in. Errors are one line,
 * "file:line: message".
 */
#ifndef KILN_HOST_CONFIG_H
#define KILN_HOST_CONFIG_H

#include <libconfig.h>
#include <stddef.h>

#include "error.h"
#include "kiln/plugin.h"

typedef struct hc_config {
    config_t cfg;
    char *path;  /* as given                                                  */
    int loaded;
} hc_config;

/* A setting of the run file. Outside config.c only the hc_* functions read
 * one, so the trainer and the schedule never touch libconfig. */
typedef config_setting_t hc_node;

/* A resolved section: a NULL-terminated kiln_kv array and the memory behind it. */
typedef struct hc_kvset {
    kiln_kv *kv;
    int n;
    void **owned;
    int nowned;
} hc_kvset;

/* The plugin slots of a run file, in creation order. */
extern const char *const hc_slots[];
extern const int hc_nslots;

int hc_load(hc_config *c, const char *path, ht_error *err);
int hc_load_string(hc_config *c, const char *text, const char *label, ht_error *err);
void hc_free(hc_config *c);

/* Apply "a.b.c=VALUE". */
int hc_override(hc_config *c, const char *assignment, ht_error *err);

/* Top-level keys, the plugins group and the trainer section. */
int hc_check_structure(hc_config *c, ht_error *err);

/* plugins.dirs and plugins.allow_symlinks. *dirs is an array the caller
 * frees (its strings point into the config). */
int hc_plugin_dirs(hc_config *c, const char ***dirs, int *ndirs, int *allow_symlinks, ht_error *err);

/* The plugin name a slot asks for: `slot = "name"` or `slot = { name = ... }`.
 * Returns the name or `fallback` when the slot is absent; NULL with the reason in err
 * when the slot is malformed. *section receives the group (or NULL). */
const char *hc_slot_name(hc_config *c, const char *slot, const char *fallback, hc_node **section, ht_error *err);
/* Number of entries in the callbacks list (0 when absent). */
int hc_callback_count(hc_config *c);
hc_node *hc_callback(hc_config *c, int i);
/* Entries of the `optimizers` list (0 when absent; then `optimizer` is the
 * one optimizer). Each is a group with `name` and an optional `params`
 * list of parameter-name patterns (fnmatch) the optimizer owns. */
int hc_optimizer_count(hc_config *c);
hc_node *hc_optimizer(hc_config *c, int i);

/* Resolve `section` (may be NULL: all defaults) against `params`. `what` names
 * the owner for messages ("optimizer 'sgd'"). */
int hc_resolve(const hc_config *c, hc_node *section, const kiln_param *params, const char *what,
               hc_kvset *out, ht_error *err);
/* The same, with `host_keys` (NULL-terminated; NULL: just "name") left to the
 * host instead of the plugin. */
int hc_resolve_host(const hc_config *c, hc_node *section, const kiln_param *params,
                    const char *const *host_keys, const char *what, hc_kvset *out, ht_error *err);
/* The host keys of a plugin section of `kind` (KILN_KIND_*): "name", plus an
 * optimizer's `params` and a scheduler's `interval`, `frequency`, `monitor`. */
const char *const *hc_host_keys(uint32_t kind);
void hc_kvset_free(hc_kvset *s);

/* The trainer's own keys (host/trainer_params.c). */
extern const kiln_param hc_trainer_params[];

/* Write the effective config (after includes and overrides). */
int hc_write(hc_config *c, const char *path, ht_error *err);

/* "file:line" of a setting, or "--set" for one created by an override. */
void hc_where(const hc_config *c, const hc_node *s, char *buf, size_t n);

/* The setting at `path` ("trainer.min_epochs"), or NULL when absent. */
hc_node *hc_lookup(const hc_config *c, const char *path);
/* Whether a setting was written as an int (int or int64); 0 for NULL. */
int hc_is_int(const hc_node *s);
/* A member of a group (NULL when absent or s is NULL); a string member
 * (NULL when absent or not a string); an int member (1 when it is an int
 * or int64, then *out holds it). */
hc_node *hc_member(const hc_node *s, const char *key);
const char *hc_member_string(const hc_node *s, const char *key);
int hc_member_int64(const hc_node *s, const char *key, int64_t *out);
/* Entries of a list (0 for NULL) and a string entry (NULL if not one). */
int hc_list_length(const hc_node *s);
const char *hc_list_string(const hc_node *s, int i);
/* A list entry naming a plugin: `"name"` (section NULL) or a group with
 * name = "..." (section = the group); NULL for anything else. */
const char *hc_entry_name(hc_node *entry, hc_node **section);
/* The effective run file as text (malloc'd; NULL when out of memory). */
char *hc_text(const hc_config *c);

/* Closest of `cands` to `word` if reasonably close, else NULL. */
const char *hc_did_you_mean(const char *word, const char *const *cands, int n);

#endif
