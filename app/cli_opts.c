/*
 * cli_opts.c - the option parser of every `rebound` command, the help it
 * generates from the same table, and the rows run and chat share (the
 * session's shape and memory manager, the sampler, llama.cpp's GPU flags).
 *
 * A command describes its options in a table of rb_opt rows (cli.h); this
 * file walks argv once against it. Names are matched whole, never as
 * prefixes or bundles: "-sys" is llama.cpp's system prompt, not -s -y -s,
 * which is why this is not getopt_long. Nothing is allocated: values point
 * into argv, numbers go straight to the row's destination.
 */
#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "rebound_experimental.h"

int rb_cli_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30;
    if (mul != 1)
        end++;
    if (*end != 0 || (v != 0 && mul > UINT64_MAX / v))
        return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

/* "pipelined" / "eager" / "recompute" -> mode; -1 when unknown */
int rb_cli_parse_restore(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "pipelined")) return RB_RESTORE_PIPELINED;
    if (!strcmp(s, "eager")) return RB_RESTORE_EAGER;
    if (!strcmp(s, "recompute")) return RB_RESTORE_RECOMPUTE;
    return -1;
}

/* "lossless" / "q8" / "lz4" / "zstd" -> codec; -1 when unknown */
int rb_cli_parse_ram_codec(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "lossless")) return RB_RAM_CODEC_LOSSLESS;
    if (!strcmp(s, "q8")) return RB_RAM_CODEC_Q8;
    if (!strcmp(s, "lz4")) return RB_RAM_CODEC_LZ4;
    if (!strcmp(s, "zstd")) return RB_RAM_CODEC_ZSTD;
    return -1;
}

int rb_cli_opt_restore(void *dest, const char *v, char *why, size_t why_n)
{
    int r = rb_cli_parse_restore(v);
    if (r < 0) {
        snprintf(why, why_n, "pipelined, eager or recompute");
        return -1;
    }
    *(rb_restore_mode *)dest = (rb_restore_mode)r;
    return 0;
}

int rb_cli_opt_kv_type(void *dest, const char *v, char *why, size_t why_n)
{
    int r = rb_kv_type_from_name(v);
    if (r < 0) {
        snprintf(why, why_n, "f16, q8_0 or q4_0");
        return -1;
    }
    *(rb_kv_type *)dest = (rb_kv_type)r;
    return 0;
}

int rb_cli_opt_ram_codec(void *dest, const char *v, char *why, size_t why_n)
{
    int r = rb_cli_parse_ram_codec(v);
    if (r < 0) {
        snprintf(why, why_n, "lossless, q8, lz4 or zstd");
        return -1;
    }
    *(rb_ram_codec *)dest = (rb_ram_codec)r;
    return 0;
}

/* --device: the emulated storage profile, an experimental knob; the
 * params keep a pointer to the copy here, which lives as long as the
 * process (one command line is parsed per process) */
int rb_cli_opt_device(void *dest, const char *v, char *why, size_t why_n)
{
    static rb_experimental_params x;
    rb_session_params *p = dest;
    (void)why, (void)why_n;
    x = p->experimental ? *p->experimental : rb_experimental_default_params();
    x.device = v;
    p->experimental = &x;
    return 0;
}

/* 0 keeps the library's default batch */
int rb_cli_opt_batch(void *dest, const char *v, char *why, size_t why_n)
{
    uint64_t u;
    if (rb_cli_parse_u64(v, &u) || u > 65536) {
        snprintf(why, why_n, "a token count from 0 to 65536");
        return -1;
    }
    if (u)
        *(uint32_t *)dest = (uint32_t)u;
    return 0;
}

/* llama.cpp's -s: an unsigned number, or -1 (its default) for a random one */
int rb_cli_opt_seed(void *dest, const char *v, char *why, size_t why_n)
{
    uint64_t u;
    if (!strcmp(v, "-1"))
        return 1; /* random: rb_cli_seed picks one */
    if (rb_cli_parse_u64(v, &u)) {
        snprintf(why, why_n, "a non-negative integer, or -1 for a random seed");
        return -1;
    }
    *(uint64_t *)dest = u;
    return 0;
}

int rb_cli_quiet;

int rb_cli_opt_reverse_prompt(void *dest, const char *v, char *why, size_t why_n)
{
    rb_cli_stops *st = dest;
    if (!*v || strlen(v) >= sizeof st->tail / 2) {
        snprintf(why, why_n, "a non-empty text of at most %zu bytes", sizeof st->tail / 2 - 1);
        return -1;
    }
    if (st->n == RB_CLI_STOPS_MAX) {
        snprintf(why, why_n, "one more: at most %d -r are taken", RB_CLI_STOPS_MAX);
        return -1;
    }
    st->s[st->n++] = v;
    return 0;
}

void rb_cli_stops_reset(rb_cli_stops *st) { st->len = 0; }

int rb_cli_stops_push(rb_cli_stops *st, const char *text, size_t k)
{
    if (st->n == 0 || k == 0)
        return 0;
    const size_t cap = sizeof st->tail;
    if (k >= cap) { /* a piece longer than the window: its end only */
        text += k - (cap - 1), k = cap - 1;
        st->len = 0;
    }
    if (st->len + k > cap) { /* keep the newest bytes */
        size_t drop = st->len + k - cap;
        memmove(st->tail, st->tail + drop, st->len - drop);
        st->len -= drop;
    }
    memcpy(st->tail + st->len, text, k);
    st->len += k;
    for (int i = 0; i < st->n; i++) {
        size_t n = strlen(st->s[i]);
        if (n > st->len)
            continue;
        /* an occurrence that ends inside the new bytes (earlier ones were
           seen by an earlier push) */
        size_t from = st->len - k + 1 > n ? st->len - k + 1 - n : 0;
        if (memmem(st->tail + from, st->len - from, st->s[i], n))
            return 1;
    }
    return 0;
}

int rb_cli_eog_init(rb_cli_eog *e, rb_model *model, size_t n_vocab)
{
    memset(e, 0, sizeof *e);
    e->n_vocab = n_vocab;
    e->logits = malloc(n_vocab * sizeof *e->logits);
    if (!e->logits)
        return -1;
    for (size_t i = 0; i < n_vocab; i++) {
        if (!rb_model_token_is_eog(model, (int32_t)i))
            continue;
        int32_t *t = realloc(e->ids, (e->n_ids + 1) * sizeof *t);
        if (!t)
            return -1;
        e->ids = t;
        e->ids[e->n_ids++] = (int32_t)i;
    }
    return 0;
}

const float *rb_cli_eog_mask(rb_cli_eog *e, const float *logits)
{
    memcpy(e->logits, logits, e->n_vocab * sizeof *e->logits);
    for (size_t i = 0; i < e->n_ids; i++)
        e->logits[e->ids[i]] = -INFINITY;
    return e->logits;
}

void rb_cli_eog_free(rb_cli_eog *e)
{
    free(e->ids);
    free(e->logits);
    memset(e, 0, sizeof *e);
}

void rb_cli_seed(const char *cmd, uint64_t *seed, int seed_given)
{
    if (!seed_given) {
        /* 32 bits, as llama.cpp's seeds: short enough to type back */
        uint64_t x = 0;
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(&x, sizeof x, 1, f) != 1) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            x = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid();
        }
        if (f)
            fclose(f);
        *seed = x & 0xffffffffu;
    }
    if (rb_cli_quiet)
        return;
    fprintf(stderr, "rebound %s: seed %llu%s\n", cmd, (unsigned long long)*seed,
            seed_given ? "" : " (random; -s with it repeats this run)");
}

char *rb_cli_read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            errno = ENOMEM;
            break;
        }
        buf = nb, cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
        errno = EIO;
    }
    fclose(f);
    if (!buf)
        return NULL;
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    buf[n] = 0;
    return buf;
}

void rb_cli_unescape(char *s)
{
    char *out = s;
    for (const char *in = s; *in; in++) {
        if (in[0] != '\\' || !in[1]) {
            *out++ = *in;
            continue;
        }
        char c = *++in;
        switch (c) {
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case '\'': case '"': case '\\': *out++ = c; break;
        case 'x': {
            char hex[3] = {0}, *end;
            if (in[1] && in[2]) {
                hex[0] = in[1], hex[1] = in[2];
                long v = strtol(hex, &end, 16);
                if (end == hex + 2) {
                    *out++ = (char)v;
                    in += 2;
                    break;
                }
            }
        }
            /* fall through */
        default:
            *out++ = '\\';
            *out++ = c;
        }
    }
    *out = 0;
}

int rb_cli_usage_error(const char *cmd, const char *msg, const char *hint)
{
    fprintf(stderr, "rebound %s: error: %s\n", cmd, msg);
    if (hint)
        fprintf(stderr, "hint: %s\n", hint);
    else
        fprintf(stderr, "hint: `rebound %s --help` lists the options\n", cmd);
    return RB_CLI_EXIT_USAGE;
}

/* 1 when arg is one of the row's '|'-separated names; *eq_value is set when
 * arg is "--name=value" */
static int name_matches(const char *names, const char *arg, const char **eq_value)
{
    const char *eq = strchr(arg, '=');
    size_t arg_len = strlen(arg), key_len = eq && arg[1] == '-' ? (size_t)(eq - arg) : arg_len;
    for (const char *p = names; *p;) {
        size_t n = strcspn(p, "|");
        if (n == arg_len && !strncmp(p, arg, n)) {
            *eq_value = NULL;
            return 1;
        }
        if (n == key_len && key_len < arg_len && !strncmp(p, arg, n)) {
            *eq_value = eq + 1;
            return 1;
        }
        p += n + (p[n] == '|');
    }
    return 0;
}

static int takes_value(const rb_opt *o)
{
    switch (o->kind) {
    case RB_OPT_FLAG:
    case RB_OPT_FLAG_OFF:
        return 0;
    case RB_OPT_CALL:
    case RB_OPT_IGNORED:
    case RB_OPT_REFUSED:
        return o->arg != NULL;
    default:
        return 1;
    }
}

static int has_range(const rb_opt *o) { return o->lo != 0 || o->hi != 0; }

/* " from LO to HI" for the messages */
static void range_text(const rb_opt *o, char *buf, size_t n)
{
    buf[0] = 0;
    if (!has_range(o))
        return;
    if (o->hi >= 1e18)
        snprintf(buf, n, " of at least %.15g", o->lo);
    else
        snprintf(buf, n, " from %.15g to %.15g", o->lo, o->hi);
}

static int parse_int64(const char *s, int64_t *out)
{
    if (!s || !*s)
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* Stores value into o's destination; 0, or -1 with what was expected in
 * want, or 1 when a RB_OPT_CALL row took the value as "the default". */
static int store(const rb_opt *o, const char *v, char *want, size_t want_n)
{
    char range[96];
    range_text(o, range, sizeof range);
    int64_t i;
    uint64_t u;
    double d;
    switch (o->kind) {
    case RB_OPT_STR:
        *(const char **)o->dest = v;
        return 0;
    case RB_OPT_INT:
    case RB_OPT_I64: {
        int64_t lo = o->kind == RB_OPT_INT ? -2147483647 - 1 : INT64_MIN;
        int64_t hi = o->kind == RB_OPT_INT ? 2147483647 : INT64_MAX;
        if (parse_int64(v, &i) || i < lo || i > hi ||
            (has_range(o) && ((double)i < o->lo || (double)i > o->hi))) {
            snprintf(want, want_n, "an integer%s", range);
            return -1;
        }
        if (o->kind == RB_OPT_INT)
            *(int *)o->dest = (int)i;
        else
            *(int64_t *)o->dest = i;
        return 0;
    }
    case RB_OPT_U32:
    case RB_OPT_SIZE:
        if (rb_cli_parse_u64(v, &u) || (o->kind == RB_OPT_U32 && u > UINT32_MAX) ||
            (has_range(o) && ((double)u < o->lo || (double)u > o->hi))) {
            snprintf(want, want_n, "a non-negative integer%s (suffixes K, M, G: x1024)", range);
            return -1;
        }
        if (o->kind == RB_OPT_U32)
            *(uint32_t *)o->dest = (uint32_t)u;
        else
            *(uint64_t *)o->dest = u;
        return 0;
    case RB_OPT_FLOAT:
    case RB_OPT_DOUBLE:
        if (parse_double(v, &d) || (has_range(o) && (d < o->lo || d > o->hi))) {
            snprintf(want, want_n, "a number%s", range);
            return -1;
        }
        if (o->kind == RB_OPT_FLOAT)
            *(float *)o->dest = (float)d;
        else
            *(double *)o->dest = d;
        return 0;
    case RB_OPT_LIST: {
        rb_cli_list *l = o->dest;
        l->n = 0;
        const char *p = v;
        for (;;) {
            char item[64];
            size_t n = strcspn(p, ",");
            if (n == 0 || n >= sizeof item || l->n == RB_CLI_LIST_MAX) {
                l->n = 0;
                snprintf(want, want_n, "a comma-separated list of at most %d integers%s",
                         RB_CLI_LIST_MAX, range);
                return -1;
            }
            memcpy(item, p, n);
            item[n] = 0;
            if (rb_cli_parse_u64(item, &u) ||
                (has_range(o) && ((double)u < o->lo || (double)u > o->hi))) {
                l->n = 0;
                snprintf(want, want_n, "a comma-separated list of integers%s", range);
                return -1;
            }
            l->v[l->n++] = u;
            if (!p[n])
                return 0;
            p += n + 1;
        }
    }
    case RB_OPT_CALL:
        want[0] = 0;
        return o->fn(o->dest, v, want, want_n);
    default:
        return 0;
    }
}

/* "-n, --n-predict" as the help shows it */
static int format_names(const rb_opt *o, char *buf, size_t n)
{
    size_t k = 0;
    for (const char *p = o->names; *p && k + 1 < n;) {
        size_t len = strcspn(p, "|");
        k += (size_t)snprintf(buf + k, n - k, "%s%.*s", k ? ", " : "", (int)len, p);
        if (k >= n)
            k = n - 1;
        p += len + (p[len] == '|');
    }
    if (takes_value(o) && o->arg && k + 1 < n)
        k += (size_t)snprintf(buf + k, n - k, " %s", o->arg);
    return (int)(k < n ? k : n - 1);
}

void rb_cli_help(const rb_cli_cmd *c, FILE *f)
{
    enum { COL = 26 };
    const char *u = c->usage ? c->usage : "[options]";
    /* one "usage:" per line of the usage text */
    for (int first = 1; *u; first = 0) {
        size_t n = strcspn(u, "\n");
        fprintf(f, "%s rebound %s %.*s\n", first ? "usage:" : "      ", c->name, (int)n, u);
        u += n + (u[n] == '\n');
    }
    if (c->about)
        fprintf(f, "\n%s\n", c->about);
    fprintf(f, "\noptions:\n");
    for (const rb_opt *o = c->opts; o && o->kind != RB_OPT_END; o++) {
        if (o->kind == RB_OPT_SECTION) {
            fprintf(f, "%s\n", o->help);
            continue;
        }
        char names[128];
        int k = format_names(o, names, sizeof names);
        fprintf(f, "  %s", names);
        if (k + 4 > COL)
            fprintf(f, "\n%*s", COL, "");
        else
            fprintf(f, "%*s", COL - 2 - k, "");
        for (const char *h = o->help ? o->help : ""; *h;) {
            size_t n = strcspn(h, "\n");
            fprintf(f, "%.*s\n", (int)n, h);
            h += n;
            if (*h == '\n' && *++h)
                fprintf(f, "%*s", COL, "");
        }
        if (!o->help || !*o->help)
            fputc('\n', f);
    }
    fprintf(f, "  -h, --help%*sthis help\n", COL - 12, "");
    if (c->footer)
        fprintf(f, "%s%s", c->footer, c->footer[strlen(c->footer) - 1] == '\n' ? "" : "\n");
    fprintf(f, "exit status: 0 success, 1 failure, 2 usage error\n");
}

int rb_cli_parse(const rb_cli_cmd *c, int argc, char **argv)
{
    int n_pos = 0, options_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options_done || a[0] != '-' || a[1] == 0) {
            if (!c->n_pos) {
                char msg[256];
                snprintf(msg, sizeof msg, "unexpected argument '%.200s'", a);
                return rb_cli_usage_error(c->name, msg, NULL);
            }
            if (n_pos < c->max_pos)
                c->pos[n_pos] = a;
            n_pos++;
            continue;
        }
        if (!strcmp(a, "--")) {
            if (c->rest_at) {
                *c->rest_at = i + 1;
                break;
            }
            options_done = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            rb_cli_help(c, stdout);
            return RB_CLI_EXIT_OK;
        }
        const rb_opt *o = c->opts;
        const char *eq = NULL;
        for (; o && o->kind != RB_OPT_END; o++)
            if (o->kind != RB_OPT_SECTION && name_matches(o->names, a, &eq))
                break;
        if (!o || o->kind == RB_OPT_END) {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option '%.200s'", a);
            return rb_cli_usage_error(c->name, msg, NULL);
        }
        const char *v = NULL;
        if (takes_value(o)) {
            if (eq) {
                v = eq;
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                char msg[256];
                snprintf(msg, sizeof msg, "option %s needs a value (%s)", a,
                         o->arg ? o->arg : "an argument");
                return rb_cli_usage_error(c->name, msg, NULL);
            }
        } else if (eq) {
            char msg[256];
            snprintf(msg, sizeof msg, "option %.*s takes no value: '%.100s'",
                     (int)(eq - 1 - a), a, eq);
            return rb_cli_usage_error(c->name, msg, NULL);
        }
        switch (o->kind) {
        case RB_OPT_REFUSED: {
            char msg[256];
            snprintf(msg, sizeof msg, "%s is a llama.cpp option rebound %s does not take", a,
                     c->name);
            return rb_cli_usage_error(c->name, msg, o->help);
        }
        case RB_OPT_FLAG:
            *(int *)o->dest = 1;
            break;
        case RB_OPT_FLAG_OFF:
            *(int *)o->dest = 0;
            break;
        case RB_OPT_IGNORED:
            fprintf(stderr, "rebound %s: note: %s%s%s is ignored: %s\n", c->name, a, v ? " " : "",
                    v ? v : "", o->help);
            break;
        case RB_OPT_CALL:
            if (!v) {
                char why[8];
                o->fn(o->dest, NULL, why, sizeof why);
                break;
            }
            /* fall through */
        default: {
            char want[160];
            int r = store(o, v, want, sizeof want);
            if (r > 0) { /* e.g. llama.cpp's -s -1: as if not given */
                if (o->given)
                    *o->given = 0;
                continue;
            }
            if (r < 0) {
                char msg[512];
                int name_len = eq ? (int)(eq - 1 - a) : (int)strlen(a);
                snprintf(msg, sizeof msg, "option %.*s needs a valid value: '%.200s' is not %s",
                         name_len, a, v, want[0] ? want : "valid");
                return rb_cli_usage_error(c->name, msg, NULL);
            }
        }
        }
        if (o->given)
            *o->given = 1;
    }
    if (c->n_pos)
        *c->n_pos = n_pos;
    return -1;
}

void rb_cli_warn_ctx(const char *cmd, rb_model *model, uint32_t n_ctx)
{
    rb_model_info mi;
    rb_model_get_info(model, &mi);
    if (n_ctx > mi.n_ctx_train && mi.n_ctx_train > 0)
        fprintf(stderr, "rebound %s: warning: context %u exceeds the model's trained context "
                "%u; quality may degrade\n", cmd, (unsigned)n_ctx, (unsigned)mi.n_ctx_train);
}

void rb_cli_warn_recovery(const char *cmd, const rb_session *s)
{
    rb_session_stats st;
    if (rb_session_get_stats(s, &st) != RB_OK || !st.file_recovery)
        return;
    if (st.file_lost_tokens)
        fprintf(stderr, "rebound %s: warning: %s: %" PRIu64 " tokens lost\n", cmd,
                st.file_recovery, st.file_lost_tokens);
    else
        fprintf(stderr, "rebound %s: warning: %s\n", cmd, st.file_recovery);
}

void rb_cli_warn_pressure(const char *cmd, const rb_session *s, int *warned)
{
    rb_session_stats st;
    if (*warned || rb_session_get_stats(s, &st) != RB_OK || !st.n_disk_full)
        return;
    *warned = 1;
    fprintf(stderr, "rebound %s: warning: the storage tier took no pages (%" PRIu64 " kept in "
            "RAM, compressed); %.2f MiB stay over the memory budget\n", cmd, st.n_disk_full,
            (double)st.budget_over_bytes / (1024.0 * 1024.0));
}
