/*
 * host/cli.c — `kiln plugins list|check` and `kiln config check|show`, plus
 * the run-file opening and checking every run command shares. Listing prints
 * every candidate file with its status and reason (--verbose) and every
 * plugin with its kind, version, ABI, aliases and properties; --json prints
 * the same as one JSON document. `plugins check` loads the file in a child
 * process so a plugin that crashes, hangs or exits in a constructor or its
 * init cannot take the CLI down: the verdict is what the child reports over
 * a pipe when it has finished (never its exit status alone), within
 * KILN_PLUGIN_PROBE_TIMEOUT seconds. Run commands discover plugins without
 * loading them (host/loader.h) and load only those the run file names.
 */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stack_checks.h"
#include "log.h"
#include "plugin_api.h"
#include "param_checks.h"
#include "version.h"

/* ---------------------------------------------------------------------------
 * Output helpers */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void json_value(FILE *f, const kiln_value *v) {
    switch (v->type) {
    case KILN_TYPE_BOOL: fputs(v->v.i ? "true" : "false", f); break;
    case KILN_TYPE_INT: fprintf(f, "%lld", (long long)v->v.i); break;
    case KILN_TYPE_FLOAT: fprintf(f, "%.17g", v->v.f); break;
    case KILN_TYPE_STRING: json_str(f, v->v.s); break;
    case KILN_TYPE_INT_LIST: case KILN_TYPE_FLOAT_LIST: case KILN_TYPE_STRING_LIST:
        fputc('[', f);
        for (uint32_t i = 0; i < v->count; i++) {
            if (i) fputc(',', f);
            if (v->type == KILN_TYPE_INT_LIST) fprintf(f, "%lld", (long long)v->v.il[i]);
            else if (v->type == KILN_TYPE_FLOAT_LIST) fprintf(f, "%.17g", v->v.fl[i]);
            else json_str(f, v->v.sl[i]);
        }
        fputc(']', f);
        break;
    default: fputs("null", f);
    }
}

static void text_value(FILE *f, const kiln_value *v) {
    switch (v->type) {
    case KILN_TYPE_BOOL: fputs(v->v.i ? "true" : "false", f); break;
    case KILN_TYPE_INT: fprintf(f, "%lld", (long long)v->v.i); break;
    case KILN_TYPE_FLOAT: fprintf(f, "%g", v->v.f); break;
    case KILN_TYPE_STRING: fprintf(f, "\"%s\"", v->v.s); break;
    case KILN_TYPE_INT_LIST: case KILN_TYPE_FLOAT_LIST: case KILN_TYPE_STRING_LIST:
        fputc('[', f);
        for (uint32_t i = 0; i < v->count; i++) {
            if (i) fputs(", ", f);
            if (v->type == KILN_TYPE_INT_LIST) fprintf(f, "%lld", (long long)v->v.il[i]);
            else if (v->type == KILN_TYPE_FLOAT_LIST) fprintf(f, "%g", v->v.fl[i]);
            else fprintf(f, "\"%s\"", v->v.sl[i]);
        }
        fputc(']', f);
        break;
    default: fputs("(none)", f);
    }
}

static const char *type_word(uint32_t t) {
    static const char *const n[] = {"none", "bool", "int", "float", "string", "int list", "float list", "string list"};
    return t <= KILN_TYPE_STRING_LIST ? n[t] : "?";
}

static const char *origin_name(int o) {
    return o == HL_ORIGIN_CONFIG ? "run file" : o == HL_ORIGIN_ENV ? "KILN_PLUGIN_PATH"
                                            : o == HL_ORIGIN_BUILTIN ? "built-in" : "command line";
}

static const char *status_name(int s) { return s == HL_CAND_LOADED ? "ok" : s == HL_CAND_REFUSED ? "refused" : "skipped"; }

/* ---------------------------------------------------------------------------
 * plugins list */

static void print_plugin_text(FILE *f, const hl_plugin *p, int verbose) {
    const kiln_plugin_desc *d = &p->view;
    const hl_library *lib = p->lib;
    fprintf(f, "  %-12s %-14s %-8s ABI %u.%u  %s\n", hl_kind_name(d->kind), d->name, d->version, lib->view.abi_major,
            lib->view.abi_minor, lib->path);
    for (const kiln_kv *kv = d->properties; kv && kv->key; kv++) {
        fprintf(f, "      %s = ", kv->key);
        text_value(f, &kv->value);
        fputc('\n', f);
    }
    if (!verbose) return;
    if (d->description) fprintf(f, "      description: %s\n", d->description);
    fprintf(f, "      library: %s %s (%s)%s\n", lib->view.library_name, lib->view.library_version,
            lib->view.build_info ? lib->view.build_info : "", lib->view.cuda_runtime_version ? ", CUDA" : "");
    if (d->capabilities) fprintf(f, "      capabilities: 0x%llx\n", (unsigned long long)d->capabilities);
    for (const kiln_param *q = d->params; q && q->key; q++) {
        fprintf(f, "      key %-22s %-11s default ", q->key, type_word(q->type));
        if (q->flags & KILN_PARAM_REQUIRED) fputs("(required)", f);
        else text_value(f, &q->def);
        char rules[512];
        hp_rules_for(d->properties, q->key, rules, sizeof rules);
        if (rules[0]) fprintf(f, "  (%s)", rules);
        if (q->help) fprintf(f, "  — %s", q->help);
        fputc('\n', f);
    }
}

static void print_plugin_json(FILE *f, const hl_plugin *p) {
    const kiln_plugin_desc *d = &p->view;
    fputs("{\"kind\":", f); json_str(f, hl_kind_name(d->kind));
    fputs(",\"name\":", f); json_str(f, d->name);
    fputs(",\"version\":", f); json_str(f, d->version);
    fputs(",\"description\":", f); json_str(f, d->description);
    fprintf(f, ",\"abi\":\"%u.%u\",\"capabilities\":%llu", p->lib->view.abi_major, p->lib->view.abi_minor,
            (unsigned long long)d->capabilities);
    fputs(",\"file\":", f); json_str(f, p->lib->path);
    fputs(",\"library\":", f); json_str(f, p->lib->view.library_name);
    fputs(",\"aliases\":[", f);
    for (uint32_t a = 0; a < p->naliases; a++) { if (a) fputc(',', f); json_str(f, p->aliases[a]); }
    fputs("],\"properties\":{", f);
    int first = 1;
    for (const kiln_kv *kv = d->properties; kv && kv->key; kv++) {
        if (!first) fputc(',', f);
        first = 0;
        json_str(f, kv->key); fputc(':', f); json_value(f, &kv->value);
    }
    fputs("},\"config_keys\":[", f);
    first = 1;
    for (const kiln_param *q = d->params; q && q->key; q++) {
        if (!first) fputc(',', f);
        first = 0;
        fputs("{\"key\":", f); json_str(f, q->key);
        fputs(",\"type\":", f); json_str(f, type_word(q->type));
        fprintf(f, ",\"required\":%s,\"default\":", (q->flags & KILN_PARAM_REQUIRED) ? "true" : "false");
        json_value(f, &q->def);
        fputs(",\"help\":", f); json_str(f, q->help);
        char rules[512];
        hp_rules_for(d->properties, q->key, rules, sizeof rules);
        fputs(",\"allowed\":", f); json_str(f, rules[0] ? rules : NULL);
        fputc('}', f);
    }
    fputs("]}", f);
}

static void print_listing(FILE *f, const hl_loader *L, int verbose, int json) {
    if (json) {
        fprintf(f, "{\"kiln_version\":\"%s\",\"abi\":\"%d.%d\",\"directories\":[", KILN_VERSION_STRING, KILN_ABI_MAJOR,
                KILN_ABI_MINOR);
        for (int i = 0; i < L->ndirs; i++) {
            if (i) fputc(',', f);
            fputs("{\"path\":", f); json_str(f, L->dirs[i]);
            fputs(",\"origin\":", f); json_str(f, origin_name(L->dir_origin[i]));
            fputc('}', f);
        }
        fputs("],\"candidates\":[", f);
        for (int i = 0; i < L->ncands; i++) {
            const hl_candidate *c = &L->cands[i];
            if (i) fputc(',', f);
            fputs("{\"path\":", f); json_str(f, c->path);
            fprintf(f, ",\"type\":\"%s\",\"status\":\"%s\",\"reason\":", c->is_dir ? "directory" : "file",
                    status_name(c->status));
            if (c->reason) json_str(f, c->reason); else fputs("null", f);
            fputc('}', f);
        }
        fputs("],\"plugins\":[", f);
        int first = 1;
        for (int i = 0; i < L->nlibs; i++)
            for (int j = 0; j < L->libs[i]->nplugins; j++) {
                if (!first) fputc(',', f);
                first = 0;
                print_plugin_json(f, &L->libs[i]->plugins[j]);
            }
        fputs("],\"warnings\":[", f);
        for (int i = 0; i < L->nwarnings; i++) { if (i) fputc(',', f); json_str(f, L->warnings[i]); }
        fputs("]}\n", f);
        return;
    }
    fprintf(f, "kiln %s, plugin ABI %d.%d\n", KILN_VERSION_STRING, KILN_ABI_MAJOR, KILN_ABI_MINOR);
    fprintf(f, "search path:\n");
    for (int i = 0; i < L->ndirs; i++) fprintf(f, "  %s (%s)\n", L->dirs[i], origin_name(L->dir_origin[i]));
    if (verbose) {
        fprintf(f, "candidates:\n");
        for (int i = 0; i < L->ncands; i++) {
            const hl_candidate *c = &L->cands[i];
            fprintf(f, "  [%s] %s%s\n", status_name(c->status), c->path, c->is_dir ? "/" : "");
            if (c->reason) {
                char *copy = strdup(c->reason), *save = NULL;
                for (char *ln = strtok_r(copy, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save))
                    fprintf(f, "      %s\n", ln);
                free(copy);
            }
        }
    } else {
        /* each refused file by name, with the first line of its reason:
         * a broken plugin must be visible without --verbose */
        int refused = 0;
        for (int i = 0; i < L->ncands; i++) refused += L->cands[i].status == HL_CAND_REFUSED;
        if (refused) {
            fprintf(f, "refused (%d; --verbose shows every candidate):\n", refused);
            for (int i = 0; i < L->ncands; i++) {
                const hl_candidate *c = &L->cands[i];
                if (c->status != HL_CAND_REFUSED) continue;
                const char *r = c->reason ? c->reason : c->path;
                fprintf(f, "  %.*s\n", (int)strcspn(r, "\n"), r);
            }
        }
    }
    fprintf(f, "plugins:\n");
    for (uint32_t k = 1; k <= KILN_KIND_MAX_KNOWN; k++)
        for (int i = 0; i < L->nlibs; i++)
            for (int j = 0; j < L->libs[i]->nplugins; j++)
                if (L->libs[i]->plugins[j].view.kind == k) print_plugin_text(f, &L->libs[i]->plugins[j], verbose);
    if (L->nwarnings) {
        fprintf(f, "warnings:\n");
        for (int i = 0; i < L->nwarnings; i++) fprintf(f, "  %s\n", L->warnings[i]);
    }
}

static int plugins_list(int argc, char **argv) {
    cli_args a;
    int prc = cli_parse("plugins list", argc, argv, CLI_O_VERBOSE | CLI_O_JSON | CLI_O_CONFIG | CLI_O_PLUGIN_DIR, &a);
    if (prc) return prc;
    if (a.noperands) {
        fprintf(stderr, "kiln: error: plugins list: unknown argument '%s'\n", a.operands[0]);
        cli_args_free(&a);
        return 2;
    }
    const int verbose = a.verbose, json = a.json;
    const char *cfgpath = a.config;
    hl_loader L;
    hl_loader_init(&L, hs_host_base());
    ht_error err = {0};
    for (int i = 0; i < a.ndirs; i++) {
        if (a.dirs[i][0] != '/') {
            fprintf(stderr, "kiln: error: --plugin-dir %s: expected an absolute path, found a relative one\n", a.dirs[i]);
            hl_loader_free(&L);
            cli_args_free(&a);
            return 2;
        }
        hl_add_dir(&L, a.dirs[i], HL_ORIGIN_EXPLICIT);
    }
    cli_args_free(&a);
    if (hl_check_env(&err)) {
        fprintf(stderr, "kiln: error: %s\n", err.msg);
        hl_loader_free(&L);
        return 2;
    }
    if (cfgpath) {
        hc_config c;
        int rc = cli_open_run(cfgpath, NULL, 0, &c, &L, &err);
        hc_free(&c);
        if (rc) { fprintf(stderr, "kiln: error: %s\n", err.msg); hl_loader_free(&L); return 1; }
    } else {
        hl_add_default_dirs(&L);
        hl_discover(&L);
    }
    /* a listing describes every plugin: load those whose probe passed */
    hl_load_all(&L);
    print_listing(stdout, &L, verbose, json);
    hl_shutdown(&L);
    hl_loader_free(&L);
    return 0;
}

/* ---------------------------------------------------------------------------
 * plugins check */

static int plugins_check(int argc, char **argv) {
    cli_args a;
    int prc = cli_parse("plugins check", argc, argv, CLI_O_JSON, &a);
    if (prc) return prc;
    const char *file = a.noperands ? a.operands[0] : NULL;
    const int json = a.json, extra = a.noperands > 1;
    if (extra) fprintf(stderr, "kiln: error: plugins check: unexpected argument '%s'\n", a.operands[1]);
    cli_args_free(&a); /* file still points into argv */
    if (extra) return 2;
    if (!file) { fprintf(stderr, "kiln: error: plugins check needs a FILE.so\n"); return 2; }
    char abs[2 * PATH_MAX + 2];
    if (file[0] == '/') snprintf(abs, sizeof abs, "%s", file);
    else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) { fprintf(stderr, "kiln: error: getcwd: %s\n", strerror(errno)); return 1; }
        snprintf(abs, sizeof abs, "%s/%s", cwd, file);
    }
    double tmo;
    ht_error terr = {0};
    if (hl_probe_timeout(&tmo, &terr)) { fprintf(stderr, "kiln: error: %s\n", terr.msg); return 2; }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) { fprintf(stderr, "kiln: error: pipe: %s\n", strerror(errno)); return 1; }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kiln: error: fork: %s\n", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return 1;
    }
    if (pid == 0) {
        /* Child: vet the directory (as a scan would) and the file, load it,
         * print what it offers, then report "pass" or "fail" on the pipe.
         * Only that report counts: a plugin that exit()s in its init leaves
         * a child that exits without one. */
        close(pfd[0]);
        hl_loader L;
        hl_loader_init(&L, hs_host_base());
        ht_error err = {0};
        char dir[sizeof abs];
        snprintf(dir, sizeof dir, "%s", abs);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) *slash = 0;
        const char *base = strrchr(abs, '/') + 1;
        int rc = 0;
        if (strncmp(base, "libkiln-", 8) != 0 || strlen(base) < 12 || strcmp(base + strlen(base) - 3, ".so") != 0) {
            fprintf(stderr, "kiln: error: %s: expected a file named libkiln-<name>.so, found '%s'\n", abs, base);
            rc = 1;
        } else if (hl_vet_dir(dir, 0, &err)) {
            fprintf(stderr, "kiln: error: %s\n", err.msg);
            rc = 1;
        } else if (hl_load_file(&L, abs, HL_ORIGIN_EXPLICIT, &err) != 0) {
            fprintf(stderr, "kiln: error: %s\n", err.msg);
            rc = 1;
        } else {
            hl_registry_build(&L);
            if (json) print_listing(stdout, &L, 1, 1);
            else {
                const hl_library *lib = L.libs[0];
                printf("%s: ok — library %s %s, built against ABI %u.%u (needs host >= %d.%u), %d plugin(s)\n", abs,
                       lib->view.library_name, lib->view.library_version, lib->view.abi_major, lib->view.abi_minor,
                       KILN_ABI_MAJOR, lib->view.min_host_minor, lib->nplugins);
                for (int j = 0; j < lib->nplugins; j++) print_plugin_text(stdout, &lib->plugins[j], 1);
                if (L.cands[0].reason) printf("notes:\n  %s\n", L.cands[0].reason);
            }
            hl_shutdown(&L);
        }
        hl_loader_free(&L);
        fflush(stdout);
        fflush(stderr);
        const char *verdict = rc ? "fail\n" : "pass\n";
        ssize_t w;
        do w = write(pfd[1], verdict, strlen(verdict)); while (w < 0 && errno == EINTR);
        _exit(rc);
    }
    close(pfd[1]);
    /* read the verdict within the time limit; EOF comes when the child (and
     * anything it forked) is gone */
    char rep[16] = "";
    size_t rn = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int timed_out = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double left = tmo - ((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
        if (left <= 0) { timed_out = 1; break; }
        struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        ssize_t r = read(pfd[0], rep + rn, sizeof rep - 1 - rn);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        rn += (size_t)r;
        rep[rn] = 0;
        if (strchr(rep, '\n') || rn == sizeof rep - 1) break;
    }
    close(pfd[0]);
    int st = 0;
    if (timed_out) kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (timed_out) {
        fprintf(stderr,
                "kiln: error: %s: did not finish loading and initialising within %g s (KILN_PLUGIN_PROBE_TIMEOUT), so "
                "it was stopped; the plugin is broken\n",
                abs, tmo);
        return 1;
    }
    if (!strcmp(rep, "pass\n") && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    if (!strcmp(rep, "fail\n")) return 1; /* the child said why */
    if (WIFSIGNALED(st)) {
        fprintf(stderr, "kiln: error: %s: crashed while being loaded (signal %d, %s); the plugin is broken\n", abs,
                WTERMSIG(st), strsignal(WTERMSIG(st)));
        return 1;
    }
    fprintf(stderr,
            "kiln: error: %s: exited the process (status %d) while being loaded, before the check finished; a plugin "
            "must never exit(); the plugin is broken\n",
            abs, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 1;
}

int cli_plugins(int argc, char **argv) {
    if (argc < 1) { fprintf(stderr, "kiln: error: usage: kiln plugins list|check ...\n"); return 2; }
    if (!strcmp(argv[0], "list")) return plugins_list(argc, argv);
    if (!strcmp(argv[0], "check")) return plugins_check(argc, argv);
    fprintf(stderr, "kiln: error: unknown 'plugins %s' (expected list or check)\n", argv[0]);
    return 2;
}

/* ---------------------------------------------------------------------------
 * Options (cli.h) */

/* getopt_long's codes for the long-only options, past every character. */
enum { CLI_SET = 256, CLI_CKPT, CLI_WEIGHTS_ONLY, CLI_TEST, CLI_JSON, CLI_CONFIG, CLI_PLUGIN_DIR };

void cli_args_free(cli_args *a) {
    free(a->sets);
    free(a->dirs);
    free(a->operands);
    memset(a, 0, sizeof *a);
}

int cli_parse(const char *cmd, int argc, char **argv, unsigned accepted, cli_args *a) {
    static const struct {
        unsigned bit;
        struct option opt;
    } all[] = {
        {CLI_O_SET, {"set", required_argument, NULL, CLI_SET}},
        {CLI_O_CKPT, {"ckpt", required_argument, NULL, CLI_CKPT}},
        {CLI_O_WEIGHTS_ONLY, {"weights-only", no_argument, NULL, CLI_WEIGHTS_ONLY}},
        {CLI_O_TEST, {"test", no_argument, NULL, CLI_TEST}},
        {CLI_O_VERBOSE, {"verbose", no_argument, NULL, 'v'}},
        {CLI_O_JSON, {"json", no_argument, NULL, CLI_JSON}},
        {CLI_O_CONFIG, {"config", required_argument, NULL, CLI_CONFIG}},
        {CLI_O_PLUGIN_DIR, {"plugin-dir", required_argument, NULL, CLI_PLUGIN_DIR}},
    };
    struct option longopts[sizeof all / sizeof all[0] + 1];
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (accepted & all[i].bit) longopts[n++] = all[i].opt;
    memset(&longopts[n], 0, sizeof longopts[n]);
    memset(a, 0, sizeof *a);
    a->sets = calloc((size_t)argc + 1, sizeof *a->sets);
    a->dirs = calloc((size_t)argc + 1, sizeof *a->dirs);
    a->operands = calloc((size_t)argc + 1, sizeof *a->operands);
    if (!a->sets || !a->dirs || !a->operands) {
        fprintf(stderr, "kiln: error: %s: out of memory reading the arguments\n", cmd);
        cli_args_free(a);
        return 2;
    }
    /* "-": operands come back in order (code 1) wherever they stand; ":":
     * a missing value is told apart from an unknown option. optind = 0
     * makes glibc start over on this new argv. */
    const char *shortopts = accepted & CLI_O_VERBOSE ? "-:v" : "-:";
    opterr = 0;
    optind = 0;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (c) {
        case 1: a->operands[a->noperands++] = optarg; break;
        case CLI_SET: a->sets[a->nsets++] = optarg; break;
        case CLI_CKPT: a->ckpt = optarg; break;
        case CLI_WEIGHTS_ONLY: a->weights_only = 1; break;
        case CLI_TEST: a->run_test = 1; break;
        case 'v': a->verbose = 1; break;
        case CLI_JSON: a->json = 1; break;
        case CLI_CONFIG: a->config = optarg; break;
        case CLI_PLUGIN_DIR: a->dirs[a->ndirs++] = optarg; break;
        case ':':
            fprintf(stderr, "kiln: error: %s: option '%s' expects a value (see kiln --help)\n", cmd, argv[optind - 1]);
            cli_args_free(a);
            return 2;
        default: {
            /* an unknown short option is one letter of its word; a long one
             * is the whole word getopt just passed */
            char shortname[3] = {'-', (char)optopt, 0};
            fprintf(stderr, "kiln: error: %s: unexpected argument '%s' (see kiln --help)\n", cmd,
                    optopt ? shortname : argv[optind - 1]);
            cli_args_free(a);
            return 2;
        }
        }
    }
    /* after "--", everything is an operand */
    for (; optind < argc; optind++) a->operands[a->noperands++] = argv[optind];
    return 0;
}

/* ---------------------------------------------------------------------------
 * Run files */

int cli_open_run(const char *path, char **sets, int nsets, hc_config *c, hl_loader *L, ht_error *err) {
    int rc = hc_load(c, path, err);
    for (int i = 0; rc == KILN_OK && i < nsets; i++) rc = hc_override(c, sets[i], err);
    if (rc == KILN_OK) rc = hc_check_structure(c, err);
    if (rc) return rc;
    const char **dirs;
    int ndirs, allow;
    rc = hc_plugin_dirs(c, &dirs, &ndirs, &allow, err);
    if (rc) return rc;
    if (hl_check_env(err)) {
        free((void *)dirs);
        return KILN_E_CONFIG;
    }
    L->allow_symlinks = allow;
    for (int i = 0; i < ndirs; i++) hl_add_dir(L, dirs[i], HL_ORIGIN_CONFIG);
    free((void *)dirs);
    hl_add_default_dirs(L);
    /* probes only: each plugin is loaded when the run first looks it up */
    hl_discover(L);
    return KILN_OK;
}

static int check_one(hc_config *c, hl_loader *L, uint32_t kind, const char *name, config_setting_t *sec,
                     const char *slotdesc, const hl_plugin **found, ht_error *err) {
    ht_error inner = {0};
    char where[PATH_MAX + 32];
    const hl_plugin *p = hl_find(L, kind, name, &inner);
    if (found) *found = p;
    if (!p) {
        if (sec) {
            config_setting_t *nm = config_setting_get_member(sec, "name");
            hc_where(c, nm ? nm : sec, where, sizeof where);
        } else {
            config_setting_t *s = config_lookup(&c->cfg, slotdesc);
            if (s) hc_where(c, s, where, sizeof where);
            else snprintf(where, sizeof where, "%s", c->path);
        }
        return ht_errorc(err, KILN_E_NOT_FOUND, "%s: %s: %s", where, slotdesc, inner.msg);
    }
    char what[160];
    snprintf(what, sizeof what, "%s '%s'", hl_kind_name(kind), p->view.name);
    hc_kvset kv;
    int rc = hc_resolve_host(c, sec, p->view.params, hc_host_keys(kind), what, &kv, err);
    if (rc == KILN_OK) {
        rc = hp_check_config(c, sec, p->view.properties, kv.kv, what, err);
        hc_kvset_free(&kv);
    }
    return rc;
}

int cli_check_run(hc_config *c, hl_loader *L, int need_training, ht_error *err) {
    const hl_plugin *chosen[KILN_KIND_MAX_KNOWN + 1] = {0};
    for (int s = 0; s < hc_nslots; s++) {
        const char *slot = hc_slots[s];
        config_setting_t *sec;
        const char *name = hc_slot_name(c, slot, hl_default_name(L, slot), &sec, err);
        if (!name) {
            if (err->msg[0]) return KILN_E_CONFIG;
            int required = !strcmp(slot, "module") || !strcmp(slot, "data") ||
                           (need_training && !strcmp(slot, "optimizer") && hc_optimizer_count(c) == 0);
            if (required) {
                return ht_errorc(err, KILN_E_CONFIG,
                                 "%s: missing the '%s' section (e.g. %s = { name = \"...\"; ... })", c->path,
                                 slot, slot);
            }
            continue;
        }
        uint32_t kind;
        hl_kind_from_name(slot, &kind);
        int rc = check_one(c, L, kind, name, sec, slot, &chosen[kind <= KILN_KIND_MAX_KNOWN ? kind : 0], err);
        if (rc) return rc;
    }
    /* optimizers = ( ... ): each entry a plugin, each checked against the stack */
    int nopt = hc_optimizer_count(c);
    int rc = KILN_OK;
    for (int i = 0; i < nopt && rc == KILN_OK; i++) {
        config_setting_t *e = hc_optimizer(c, i);
        const char *name = NULL;
        config_setting_lookup_string(e, "name", &name);
        char label[64];
        snprintf(label, sizeof label, "optimizers.[%d]", i);
        const hl_plugin *op = NULL;
        rc = check_one(c, L, KILN_KIND_OPTIMIZER, name, e, label, &op, err);
        if (rc) return rc; /* names its place in the file already */
        rc = stack_check(chosen[KILN_KIND_PRECISION], NULL, op, err);
    }
    if (rc == KILN_OK) {
        /* the trainer's values before they are resolved: the file's, or the defaults */
        config_setting_t *a = config_lookup(&c->cfg, "trainer.accumulate_grad_batches");
        config_setting_t *g = config_lookup(&c->cfg, "trainer.gradient_clip_val");
        double clip = !g ? 0 : config_setting_type(g) == CONFIG_TYPE_FLOAT ? config_setting_get_float(g)
                                                                          : (double)config_setting_get_int64(g);
        rc = stack_check_optimization(chosen[KILN_KIND_MODULE], nopt, a ? config_setting_get_int64(a) : 1, clip, err);
    }
    if (rc == KILN_OK)
        rc = stack_check(chosen[KILN_KIND_PRECISION], chosen[KILN_KIND_MODULE], chosen[KILN_KIND_OPTIMIZER], err);
    if (rc) {
        char inner[sizeof err->msg];
        snprintf(inner, sizeof inner, "%s", err->msg);
        ht_errorf(err, "%s: %s", c->path, inner);
        return rc;
    }
    int n = hc_callback_count(c);
    for (int i = 0; i < n; i++) {
        config_setting_t *cb = hc_callback(c, i);
        char where[PATH_MAX + 32], label[64];
        hc_where(c, cb, where, sizeof where);
        snprintf(label, sizeof label, "callbacks.[%d]", i);
        const char *name = NULL;
        if (config_setting_type(cb) == CONFIG_TYPE_STRING) name = config_setting_get_string(cb), cb = NULL;
        else if (config_setting_type(cb) != CONFIG_TYPE_GROUP || !config_setting_lookup_string(cb, "name", &name)) {
            return ht_errorc(err, KILN_E_CONFIG, "%s: %s must be a group with name = \"...\"", where, label);
        }
        rc = check_one(c, L, KILN_KIND_CALLBACK, name, cb, label, NULL, err);
        if (rc) return rc;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * config check / show */

int cli_config(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "kiln: error: usage: kiln config check|show RUN.cfg [--set KEY=VALUE]...\n"); return 2; }
    const char *verb = argv[0], *path = argv[1];
    int show = !strcmp(verb, "show");
    if (!show && strcmp(verb, "check") != 0) {
        fprintf(stderr, "kiln: error: unknown 'config %s' (expected check or show)\n", verb);
        return 2;
    }
    char cmd[32];
    snprintf(cmd, sizeof cmd, "config %s", verb);
    cli_args a;
    int prc = cli_parse(cmd, argc, argv, CLI_O_SET, &a);
    if (prc) return prc;
    if (a.noperands != 1) {
        if (a.noperands) fprintf(stderr, "kiln: error: %s: unexpected argument '%s'\n", cmd, a.operands[1]);
        else fprintf(stderr, "kiln: error: usage: kiln config check|show RUN.cfg [--set KEY=VALUE]...\n");
        cli_args_free(&a);
        return 2;
    }
    path = a.operands[0];
    char **sets = a.sets;
    const int nsets = a.nsets;
    hc_config c;
    hl_loader L;
    hl_loader_init(&L, hs_host_base());
    ht_error err = {0};
    int rc = cli_open_run(path, sets, nsets, &c, &L, &err);
    if (rc == KILN_OK) rc = cli_check_run(&c, &L, 0, &err);
    if (rc == KILN_OK) {
        if (show) config_write(&c.cfg, stdout);
        else printf("%s: ok\n", path);
    } else fprintf(stderr, "kiln: error: %s\n", err.msg);
    hc_free(&c);
    hl_shutdown(&L);
    hl_loader_free(&L);
    cli_args_free(&a);
    return rc == KILN_OK ? 0 : 1;
}
