/*
 * kiln/sdk.h — header-only conveniences for plugin authors: the
 * KILN_DEFINE_LIBRARY macro that generates the one exported entry point and
 * the static library descriptor, and a few formatting helpers for reporting
 * errors through the host. Nothing here links against the host; include it
 * once per library, in the file that lists the library's plugins.
 *
 *   static const kiln_plugin_desc my_sgd = { sizeof(kiln_plugin_desc), ... };
 *   KILN_DEFINE_LIBRARY("acme-optim", "1.2.0", 0, &my_sgd, &my_lion)
 */
#ifndef KILN_SDK_H
#define KILN_SDK_H

#include <stdarg.h>
#include <stdio.h>

#include "kiln/plugin.h"

#ifndef KILN_BUILD_INFO
#if defined(__clang__)
#define KILN_BUILD_INFO "clang " __clang_version__
#elif defined(__GNUC__)
#define KILN_BUILD_INFO "gcc " __VERSION__
#else
#define KILN_BUILD_INFO "unknown compiler"
#endif
#endif

/* The services granted at init, for code that runs before create(). */
#define KILN_LIBRARY_SERVICES() (kiln__library_services)

/* KILN_DEFINE_LIBRARY(name, version, min_host_minor, &desc1, &desc2, ...)
 * defines kiln_plugin_init_v1 and the library descriptor. min_host_minor is
 * the lowest host ABI minor whose services and behaviour the library needs
 * (not KILN_ABI_MINOR unless it truly needs the newest). */
#define KILN_DEFINE_LIBRARY(lib_name, lib_version, min_minor, ...)                                    \
    static const kiln_plugin_desc *const kiln__library_plugins[] = {__VA_ARGS__};                     \
    static const kiln_host_services *kiln__library_services;                                          \
    static const kiln_library kiln__library = {                                                       \
        sizeof(kiln_library), KILN_ABI_MAJOR, KILN_ABI_MINOR, (min_minor), 0, 0,                      \
        (lib_name), (lib_version), KILN_BUILD_INFO,                                                   \
        (uint32_t)(sizeof(kiln__library_plugins) / sizeof(kiln__library_plugins[0])), 0,              \
        kiln__library_plugins, NULL, {NULL, NULL, NULL, NULL}};                                       \
    KILN_EXPORT int32_t kiln_plugin_init_v1(const kiln_host_base *host, const kiln_library **out) {   \
        if (!host || !out || host->struct_size < sizeof(kiln_host_base)) return KILN_E_INVALID_ARG;   \
        if (host->abi_major != KILN_ABI_MAJOR) return KILN_E_VERSION;                                 \
        kiln__library_services = host->get_services(KILN_ABI_MAJOR, (min_minor));                    \
        if (!kiln__library_services) {                                                               \
            const kiln_host_services *base = host->get_services(KILN_ABI_MAJOR, 0);                   \
            if (base && base->set_error) {                                                            \
                char msg[160];                                                                        \
                snprintf(msg, sizeof msg, "%s needs host ABI >= %d.%d; host provides %d.%d",          \
                         (lib_name), KILN_ABI_MAJOR, (int)(min_minor), host->abi_major,              \
                         host->abi_minor);                                                            \
                base->set_error(NULL, KILN_E_HOST_TOO_OLD, msg);                                      \
            }                                                                                         \
            return KILN_E_HOST_TOO_OLD;                                                               \
        }                                                                                             \
        *out = &kiln__library;                                                                        \
        return KILN_OK;                                                                               \
    }

/* kiln_errorf: printf-style set_error; returns `code` so a plugin can write
 * `return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lr must be > 0, got %g", lr);` */
static inline int32_t kiln_errorf(const kiln_host_services *svc, kiln_host_ctx *hctx, int32_t code,
                                  const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (svc && svc->set_error) svc->set_error(hctx, code, msg);
    return code;
}

/* kiln_logf: printf-style log through the host (skips formatting when off). */
static inline void kiln_logf(const kiln_host_services *svc, kiln_host_ctx *hctx, int32_t level, const char *fmt,
                             ...) {
    if (!svc || !svc->log || (svc->log_enabled && !svc->log_enabled(hctx, level))) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    svc->log(hctx, level, msg);
}

#endif /* KILN_SDK_H */
