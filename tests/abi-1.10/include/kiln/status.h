/*
 * kiln/status.h — the status codes every SDK call, plugin op and host service
 * returns, defined once as an X-macro so the numbers, the names and
 * kiln_strerror() can never drift apart. 0 is success, negative is failure.
 * Codes <= -1000 are free for a plugin's private use; the host treats any
 * negative code it does not know as KILN_E_INTERNAL. Positive values are not
 * statuses: a plugin op or service never returns one (the host reports a
 * positive return as KILN_E_INTERNAL, "returned N, which is not a kiln
 * status"). Values are never renumbered or reused within ABI major 1 (see
 * docs/abi.md).
 */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include <stdint.h>

/* X(NAME, value, "text") */
#define KILN_STATUS_LIST(X)                                                        \
    X(KILN_OK,             0,   "success")                                         \
    X(KILN_E_INVALID_ARG, -1,   "invalid argument")                                \
    X(KILN_E_NOMEM,       -2,   "out of memory")                                   \
    X(KILN_E_UNSUPPORTED, -3,   "operation not supported")                         \
    X(KILN_E_HOST_TOO_OLD,-4,   "host ABI too old for this plugin")                \
    X(KILN_E_VERSION,     -5,   "version mismatch")                                \
    X(KILN_E_CUDA,        -6,   "CUDA error")                                      \
    X(KILN_E_COMM,        -7,   "communication (collective) error")                \
    X(KILN_E_STATE,       -8,   "invalid or incompatible state")                   \
    X(KILN_E_INTERNAL,    -9,   "internal error")                                  \
    X(KILN_E_IO,          -10,  "I/O error")                                       \
    X(KILN_E_CONFIG,      -11,  "invalid configuration")                           \
    X(KILN_E_NOT_FOUND,   -12,  "not found")                                       \
    X(KILN_E_DATA,        -13,  "malformed or corrupt data")                       \
    X(KILN_E_NONFINITE,   -14,  "non-finite value")

typedef enum kiln_status {
#define KILN__STATUS_ENUM(name, value, text) name = value,
    KILN_STATUS_LIST(KILN__STATUS_ENUM)
#undef KILN__STATUS_ENUM
} kiln_status;

/* First code reserved for plugin-private errors (and everything below it). */
#define KILN_E_PLUGIN_BASE (-1000)

/* kiln_strerror: a static, human-readable text for any status code. */
static inline const char *kiln_strerror(int32_t code) {
    switch (code) {
#define KILN__STATUS_CASE(name, value, text) case value: return text;
        KILN_STATUS_LIST(KILN__STATUS_CASE)
#undef KILN__STATUS_CASE
    default:
        return code <= KILN_E_PLUGIN_BASE ? "plugin-specific error" : "unknown error";
    }
}

/* kiln_status_name: the identifier ("KILN_E_CONFIG") for messages and logs. */
static inline const char *kiln_status_name(int32_t code) {
    switch (code) {
#define KILN__STATUS_NAME(name, value, text) case value: return #name;
        KILN_STATUS_LIST(KILN__STATUS_NAME)
#undef KILN__STATUS_NAME
    default:
        return code <= KILN_E_PLUGIN_BASE ? "KILN_E_PLUGIN" : "KILN_E_UNKNOWN";
    }
}

#endif /* KILN_STATUS_H */
