/*
 * plugin_fail.h — the one-line error report of the plugins whose instance
 * keeps its own host services (gpt, mlp, mixed, gan): each had written out
 * kiln_errorf's body again, only to give its own first argument and to have
 * the compiler check the message's format. PLUGIN_FAIL keeps both: it is
 * kiln_errorf (the SDK's printf-style set_error, which returns the code),
 * with the format checked at compile time by a function that is never
 * called (kiln_errorf itself declares no format attribute, and the public
 * header is frozen).
 *
 * Header only. Internal to the plugins; never installed.
 */
#ifndef KILN_PLUGINS_COMMON_PLUGIN_FAIL_H
#define KILN_PLUGINS_COMMON_PLUGIN_FAIL_H

#include <kiln/kiln.h>

/* Never called (PLUGIN_FAIL puts it behind `0 &&`): its attribute has the
 * compiler check a message against its arguments. */
__attribute__((format(printf, 1, 2))) static inline int plugin_fail_format(const char *fmt, ...) {
    (void)fmt;
    return 0;
}

/* kiln_errorf(svc, hctx, code, fmt, ...) with the format checked; returns
 * code. */
#define PLUGIN_FAIL(svc, hctx, code, ...) \
    ((void)(0 && plugin_fail_format(__VA_ARGS__)), kiln_errorf((svc), (hctx), (code), __VA_ARGS__))

#endif /* KILN_PLUGINS_COMMON_PLUGIN_FAIL_H */
