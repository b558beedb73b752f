/*
 * sample.c — the "sample" callback plugin: text generation from a language
 * model while it trains. Every `every_n_steps` optimizer steps (at
 * on_train_batch_end) and once at on_fit_end, rank 0 grows a sequence from
 * a prompt by `num_tokens` tokens, one module prediction at a time: it asks
 * the host for the module's predict_step on the tokens so far (svc->predict,
 * ABI 1.4: the logits of the last position), divides the logits by the
 * temperature, keeps the top_k largest, and draws the next token from the
 * softmax with its own random stream. The stream is seeded from `seed` and
 * the global step, so the sample taken at a given step is the same in a run
 * that was interrupted and resumed as in one that was not, and sampling
 * never disturbs the training's own random streams. Temperature 0 (or
 * top_k 1) is greedy decoding. Each sample is logged and appended to
 * <run_dir>/samples.txt; a byte-level model (vocabulary of at most 256) is
 * written as text, any other as token ids. No KV cache: each new token
 * re-runs the forward over the context (at most the model's block size),
 * which is cheap next to training for the models this is meant for.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/rng.h>

#define SMP_VERSION "0.1.0"
#define SMP_MAX_TOKENS 100000 /* num_tokens above this is surely a typo */

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int64_t every_n_steps;   /* 0: only at the end of fit                        */
    int64_t num_tokens;      /* tokens generated per sample                      */
    double temperature;      /* 0: greedy                                        */
    int64_t top_k;           /* 0: the whole vocabulary                          */
    uint64_t seed;
    int64_t context;         /* most recent tokens fed to the model (0: all)     */
    int32_t *prompt;         /* (nprompt) the prompt's token ids                 */
    int64_t nprompt;
    const char *file;        /* relative to the run directory, or absolute       */
    int32_t *seq;            /* (nprompt + num_tokens) the sequence being grown  */
    double *prob;            /* (vocab) work row, grown on first use             */
    int32_t *order;          /* (vocab) indices for top-k                        */
    int64_t vocab_cap;
    int64_t last_step;       /* global step of the last sample (-1: none)        */
};

static void smp_destroy(kiln_instance *self) {
    if (!self) return;
    free(self->prompt);
    free(self->seq);
    free(self->prob);
    free(self->order);
    free(self);
}

static int32_t smp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    if (svc->abi_minor < 4 || !svc->predict)
        return kiln_errorf(svc, hctx, KILN_E_HOST_TOO_OLD,
                           "sample: needs the host's predict service (ABI 1.4); this host provides %u.%u",
                           (unsigned)svc->abi_major, (unsigned)svc->abi_minor);
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "sample: cannot allocate the instance");
    self->svc = svc;
    self->hctx = hctx;
    self->last_step = -1;
    self->every_n_steps = kiln_kv_int(config, "every_n_steps", 0);
    self->num_tokens = kiln_kv_int(config, "num_tokens", 200);
    self->temperature = kiln_kv_float(config, "temperature", 1.0);
    self->top_k = kiln_kv_int(config, "top_k", 0);
    self->seed = (uint64_t)kiln_kv_int(config, "seed", 1234);
    self->context = kiln_kv_int(config, "context", 0);
    self->file = kiln_kv_str(config, "file", "samples.txt");
    int32_t rc = KILN_OK;
    if (self->every_n_steps < 0)
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "sample: every_n_steps must be >= 0 (0: only at the end), got %lld",
                         (long long)self->every_n_steps);
    else if (self->num_tokens < 1 || self->num_tokens > SMP_MAX_TOKENS)
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "sample: num_tokens must be in [1, %d], got %lld", SMP_MAX_TOKENS,
                         (long long)self->num_tokens);
    else if (!(self->temperature >= 0) || !isfinite(self->temperature))
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "sample: temperature must be a finite number >= 0, got %g",
                         self->temperature);
    else if (self->top_k < 0)
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "sample: top_k must be >= 0 (0: no limit), got %lld",
                         (long long)self->top_k);
    else if (self->context < 0)
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "sample: context must be >= 0 (0: the whole sequence), got %lld",
                         (long long)self->context);
    else if (!self->file[0])
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "sample: file must name a file, got an empty string");
    if (rc != KILN_OK) goto fail;

    /* The prompt: token ids when prompt_tokens lists any (>= 0), else the
     * bytes of `prompt` (byte-level models). */
    const kiln_value *ids = kiln_kv_find(config, "prompt_tokens");
    const char *text = kiln_kv_str(config, "prompt", "\n");
    int use_ids = ids && ids->type == KILN_TYPE_INT_LIST && ids->count > 0 && !(ids->count == 1 && ids->v.il[0] < 0);
    self->nprompt = use_ids ? (int64_t)ids->count : (int64_t)strlen(text);
    if (self->nprompt == 0) {
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG,
                         "sample: the prompt is empty; give `prompt` (text, byte-level models) or `prompt_tokens`");
        goto fail;
    }
    self->prompt = malloc((size_t)self->nprompt * sizeof *self->prompt);
    self->seq = malloc((size_t)(self->nprompt + self->num_tokens) * sizeof *self->seq);
    if (!self->prompt || !self->seq) {
        rc = kiln_errorf(svc, hctx, KILN_E_NOMEM, "sample: out of memory for %lld tokens",
                         (long long)(self->nprompt + self->num_tokens));
        goto fail;
    }
    for (int64_t i = 0; i < self->nprompt; i++) {
        int64_t v = use_ids ? ids->v.il[i] : (int64_t)(unsigned char)text[i];
        if (v < 0 || v > INT32_MAX) {
            rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "sample: prompt_tokens[%lld] must be a token id >= 0, got %lld",
                             (long long)i, (long long)v);
            goto fail;
        }
        self->prompt[i] = (int32_t)v;
    }
    *out = self;
    return KILN_OK;
fail:
    smp_destroy(self);
    return rc;
}

/* Work rows for a vocabulary of n (grown once, on the first prediction). */
static int32_t smp_reserve(kiln_instance *self, int64_t n) {
    if (n <= self->vocab_cap) return KILN_OK;
    double *p = realloc(self->prob, (size_t)n * sizeof *p);
    if (p) self->prob = p;
    int32_t *o = p ? realloc(self->order, (size_t)n * sizeof *o) : NULL;
    if (o) self->order = o;
    if (!p || !o) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "sample: out of memory for a vocabulary of %lld",
                                     (long long)n);
    self->vocab_cap = n;
    return KILN_OK;
}

/* Descending by value, ties to the lower index: a total order, so top-k and
 * the draw are the same on every libc. */
static const double *smp_sort_vals;
static int smp_cmp_desc(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const double x = smp_sort_vals[i], y = smp_sort_vals[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

/* The next token from one row of logits(V): greedy, or a draw from
 * softmax(logits / temperature) over the top_k largest. */
static int32_t smp_pick(kiln_instance *self, const float *logits, int64_t V, kiln_rng *rng, int32_t *tok) {
    int64_t best = 0;
    for (int64_t i = 0; i < V; i++) {
        if (isnan(logits[i]))
            return kiln_errorf(self->svc, self->hctx, KILN_E_NONFINITE,
                               "sample: the model predicted NaN for token %lld; the weights are not finite", (long long)i);
        if (logits[i] > logits[best]) best = i;
    }
    if (self->temperature == 0 || self->top_k == 1 || V == 1) {
        *tok = (int32_t)best;
        return KILN_OK;
    }
    int64_t k = self->top_k > 0 && self->top_k < V ? self->top_k : V;
    for (int64_t i = 0; i < V; i++) {
        self->prob[i] = (double)logits[i] / self->temperature;
        self->order[i] = (int32_t)i;
    }
    if (k < V) {
        smp_sort_vals = self->prob;
        qsort(self->order, (size_t)V, sizeof *self->order, smp_cmp_desc);
    }
    const double mx = (double)logits[best] / self->temperature;
    double total = 0;
    for (int64_t j = 0; j < k; j++) total += exp(self->prob[self->order[j]] - mx);
    double u = (double)(kiln_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0) * total;
    for (int64_t j = 0; j < k; j++) {
        u -= exp(self->prob[self->order[j]] - mx);
        if (u < 0 || j == k - 1) {
            *tok = self->order[j];
            return KILN_OK;
        }
    }
    *tok = (int32_t)best; /* not reached */
    return KILN_OK;
}

/* The sample as one line of text: bytes (printable, escapes for the rest)
 * when the vocabulary is byte-level, else space-separated ids. */
static char *smp_render(const int32_t *t, int64_t n, int64_t V) {
    size_t cap = (size_t)n * (V <= 256 ? 4 : 12) + 1, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (V <= 256) {
            unsigned c = (unsigned)t[i];
            if (c == '\n' || c == '\t' || (c >= 32 && c != 127)) s[len++] = (char)c;
            else len += (size_t)snprintf(s + len, cap - len, "\\x%02x", c);
        } else {
            len += (size_t)snprintf(s + len, cap - len, "%s%d", i ? " " : "", (int)t[i]);
        }
    }
    s[len] = '\0';
    return s;
}

static int32_t smp_generate(kiln_instance *self, const kiln_trainer_state *ts, const char *when) {
    const int64_t step = ts ? ts->global_step : 0;
    kiln_rng rng;
    kiln_rng_seed(&rng, self->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(step + 1)));
    memcpy(self->seq, self->prompt, (size_t)self->nprompt * sizeof *self->seq);
    int64_t n = self->nprompt, V = 0;
    for (int64_t g = 0; g < self->num_tokens; g++) {
        int64_t ctx = self->context > 0 && n > self->context ? self->context : n;
        kiln_tensor in = {self->seq + (n - ctx), KILN_DTYPE_I32, 2, {1, ctx, 1, 1}};
        kiln_batch batch = {sizeof batch, 1, &in, 1};
        kiln_tensor out;
        int32_t rc = self->svc->predict(self->hctx, &batch, &out);
        if (rc != KILN_OK) return rc; /* the host or module set the message */
        if (out.dtype != KILN_DTYPE_F32 || out.ndim < 1 || !out.data || out.shape[out.ndim - 1] < 1)
            return kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                               "sample: predict returned %s with %u dimensions; expected the logits (1, vocab) float32",
                               kiln_dtype_name(out.dtype), (unsigned)out.ndim);
        V = out.shape[out.ndim - 1];
        if ((rc = smp_reserve(self, V)) != KILN_OK) return rc;
        if ((rc = smp_pick(self, (const float *)out.data, V, &rng, &self->seq[n])) != KILN_OK) return rc;
        n++;
    }
    char *text = smp_render(self->seq, n, V);
    if (!text) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "sample: out of memory rendering the sample");
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "sample %s (step %lld):\n%s", when, (long long)step, text);
    char path[4096];
    const char *run = ts && ts->run_dir ? ts->run_dir : "";
    int len = self->file[0] == '/' || !run[0] ? snprintf(path, sizeof path, "%s", self->file)
                                               : snprintf(path, sizeof path, "%s/%s", run, self->file);
    int32_t rc = KILN_OK;
    FILE *f = len > 0 && (size_t)len < sizeof path ? fopen(path, "a") : NULL;
    if (!f) {
        rc = kiln_errorf(self->svc, self->hctx, KILN_E_IO, "sample: cannot append to %s: %s", path,
                         len > 0 && (size_t)len < sizeof path ? strerror(errno) : "path too long");
    } else {
        fprintf(f, "=== step %lld, epoch %lld, %s (temperature %g, top_k %lld, seed %llu)\n%s\n\n", (long long)step,
                (long long)(ts ? ts->current_epoch : 0), when, self->temperature, (long long)self->top_k,
                (unsigned long long)self->seed, text);
        if (fclose(f) != 0) rc = kiln_errorf(self->svc, self->hctx, KILN_E_IO, "sample: writing %s failed", path);
    }
    free(text);
    self->last_step = step;
    return rc;
}

static int32_t smp_on_event(kiln_instance *self, kiln_event *ev) {
    if (!ev) return KILN_E_INVALID_ARG;
    const kiln_trainer_state *ts = ev->trainer;
    if (!ts && self->svc->trainer_state) ts = self->svc->trainer_state(self->hctx);
    if (ts && ts->rank != 0) return KILN_OK; /* one rank speaks */
    if (ts && (ts->sanity_checking || ev->stage == KILN_STAGE_SANITY)) return KILN_OK;
    if (ev->id == KILN_EV_ON_TRAIN_BATCH_END && self->every_n_steps > 0 && ts && ts->global_step > 0 &&
        ts->global_step % self->every_n_steps == 0 && ts->global_step != self->last_step)
        return smp_generate(self, ts, "during training");
    /* at the end, unless the last step already sampled (same weights, same
     * stream: the same text twice) */
    if (ev->id == KILN_EV_ON_FIT_END && !(ts && ts->global_step == self->last_step))
        return smp_generate(self, ts, "at the end of fit");
    return KILN_OK;
}

static const kiln_callback_ops smp_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops), .create = smp_create, .destroy = smp_destroy},
    .on_event = smp_on_event,
};

static const int64_t smp_no_ids[] = {-1};
static const kiln_param smp_params[] = {
    {"every_n_steps", KILN_TYPE_INT, 0, KILN_V_INT(0), "also sample every N optimizer steps (0: only at the end of fit)"},
    {"num_tokens", KILN_TYPE_INT, 0, KILN_V_INT(200), "tokens generated per sample"},
    {"temperature", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0), "logits are divided by it; 0 is greedy decoding"},
    {"top_k", KILN_TYPE_INT, 0, KILN_V_INT(0), "draw from the k most likely tokens only (0: all)"},
    {"seed", KILN_TYPE_INT, 0, KILN_V_INT(1234), "seed of the sampling stream (mixed with the global step)"},
    {"prompt", KILN_TYPE_STRING, 0, KILN_V_STR("\n"), "prompt text for byte-level models (its bytes are the tokens)"},
    {"prompt_tokens", KILN_TYPE_INT_LIST, 0, KILN_V_INTS(smp_no_ids),
     "prompt as token ids (any tokenizer); [-1]: use `prompt`"},
    {"context", KILN_TYPE_INT, 0, KILN_V_INT(0), "feed at most this many recent tokens (0: all; the module crops "
                                                 "to its block size)"},
    {"file", KILN_TYPE_STRING, 0, KILN_V_STR("samples.txt"), "samples are appended here (relative to the run directory)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const smp_checks[] = {"every_n_steps >= 0", "num_tokens >= 1", "temperature >= 0", "top_k >= 0",
                                         "context >= 0"};
static const kiln_kv smp_props[] = {
    {"config_checks", KILN_V_STRS(smp_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc smp_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "sample",
    .version = SMP_VERSION,
    .description = "generates text from a language model every N steps and at the end of fit (samples.txt)",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = smp_props,
    .params = smp_params,
    .ops = &smp_ops,
};

KILN_DEFINE_LIBRARY("sample", SMP_VERSION, 4, &smp_desc)
