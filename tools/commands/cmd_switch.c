/*
 * cmd_switch.c - `rebound switch`: the app-switch experiment.
 *
 * Holds a long conversation (a context of C tokens), measures the time to
 * the first token of a new user turn while everything is in RAM (warm),
 * then for each strategy: takes memory away the way that strategy would
 * (a trim of the same bytes), comes back with the same user turn and
 * measures the time to its first token again, with the per-phase times and
 * the timeline of what was restored when. Between strategies the turn is
 * rewound, so every strategy starts from the same context.
 *
 *   kill        a fresh process (exec'd) loads the model and recomputes the
 *               context and the turn: what a phone does after the
 *               low-memory killer
 *   kill+session  the same fresh process, but the conversation was kept in a
 *               session file: it reads weights and KV in layer order while it
 *               computes, and only the turn is new
 *   recompute   weights kept, the trimmed KV dropped and rebuilt from tokens
 *   zram        (zram-lz4, zram-zstd) the KV compressed in RAM by a general
 *               codec, as the kernel's zRAM would, decompressed before
 *               compute; present when the build found liblz4 / libzstd
 *   storage     the trimmed KV written to storage, read back completely
 *               before compute (eager): storage-based offloading
 *   rebound     layer order, both tiers (lossless RAM codec + storage),
 *               restore overlapped with compute: exact
 *   rebound-q8  the same with the 8-bit RAM tier (lossy; its top-1
 *               agreement with the warm turn is reported beside it); run
 *               last because it changes the context's KV
 *
 * Uses only the public API and POSIX.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "rebound.h"
#include "rebound_experimental.h"
#include "switch.h"

static const char *ALL_STRATEGIES =
    "kill,kill+session,recompute,zram,storage,rebound,rebound-q8";

/* A conversation to fill the context with: prompt and turns as text,
 * repeated until the context is full. */
static const char *CONVERSATION =
    "User: I am planning a week of hiking in the mountains. What should I pack?\n"
    "Assistant: Pack layers you can add and remove: a base layer that wicks sweat, a warm "
    "fleece, and a waterproof shell. Bring broken-in boots, two pairs of wool socks per day "
    "of walking, a hat and gloves even in summer, sunscreen, a map and a compass, a first "
    "aid kit, a headlamp, and enough water to reach the next reliable source.\n"
    "User: How much food do I need for each day?\n"
    "Assistant: Plan on roughly one kilogram of dry food per person per day, more when it is "
    "cold or the climbs are long. Mix quick sugars for the trail with slow meals for the "
    "evening, and keep one spare day of food in case the weather holds you back.\n";

static const char *TURN = "\nUser: Thanks! One more question: which map should I buy for the "
                          "northern ridge?\nAssistant:";

typedef struct sw_opts {
    const char *model, *trim, *device, *strategies, *json, *plot, *spill_dir, *pressure;
    const char *context; /* --context FILE, or NULL */
    uint32_t n_ctx, n_turn;
    int n_threads;
} sw_opts;

static int parse_args(int argc, char **argv, sw_opts *o)
{
    memset(o, 0, sizeof *o);
    o->trim = "50%";
    o->pressure = "explicit";
    o->device = "phone";
    o->strategies = ALL_STRATEGIES;
    o->n_ctx = 2048;
    o->n_turn = 8;
    char strategies_help[256];
    snprintf(strategies_help, sizeof strategies_help, "comma-separated, of %s", ALL_STRATEGIES);
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model (read into RAM, not mapped)", &o->model, 0,
         0, NULL, NULL},
        {"-c|--ctx-size", RB_OPT_U32, "N", "tokens of conversation before the turn (default 2048)",
         &o->n_ctx, 1, 1u << 24, NULL, NULL},
        {"--turn", RB_OPT_U32, "N", "tokens of the returning user turn (default 8)", &o->n_turn, 1,
         1u << 24, NULL, NULL},
        {"--trim", RB_OPT_STR, "SPEC[,SPEC..]",
         "memory taken away: P% of the KV bytes (default 50%), a byte\n"
         "count (K/M/G), or a level: background, moderate, complete\n"
         "(complete also evicts every layer's weights); up to 4\n"
         "amounts on one context, a table (and files) for each", &o->trim, 0, 0, NULL, NULL},
        {"--device", RB_OPT_STR, "D", "storage profile: phone, watch, host (default phone)",
         &o->device, 0, 0, NULL, NULL},
        {"--strategies", RB_OPT_STR, "LIST", strategies_help, &o->strategies, 0, 0, NULL, NULL},
        {"--json", RB_OPT_STR, "FILE", "every figure as JSON", &o->json, 0, 0, NULL, NULL},
        {"--plot", RB_OPT_STR, "FILE", "the timeline picture (SVG)", &o->plot, 0, 0, NULL, NULL},
        {"-t|--threads", RB_OPT_INT, "N", "threads (default: all cores)", &o->n_threads, 1,
         1u << 24, NULL, NULL},
        {"--spill-dir", RB_OPT_STR, "DIR", "where the spill file goes (default $TMPDIR or /tmp)",
         &o->spill_dir, 0, 0, NULL, NULL},
        {"--context", RB_OPT_STR, "FILE",
         "keep the built context in FILE (a session file) and start\n"
         "from it when it holds this model's context of the same\n"
         "length (building 8192 tokens takes minutes)", &o->context, 0, 0, NULL, NULL},
        {"--pressure", RB_OPT_STR, "MODE",
         "explicit (default): trim as --trim says; cgroup: share a\n"
         "memory cgroup with a competing process that grows, and trim\n"
         "on the kernel's pressure signals (needs root and a memory\n"
         "cgroup; otherwise says why and uses --trim)", &o->pressure, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cli = {
        "switch", "-m MODEL [options]",
        "The app-switch experiment: builds a context of -c tokens, measures the time\n"
        "to the first token of a user turn warm, then per strategy after memory was\n"
        "taken away.",
        opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc = rb_cli_parse(&cli, argc, argv);
    if (rc >= 0)
        return rc;
    if (strcmp(o->pressure, "explicit") && strcmp(o->pressure, "cgroup"))
        return rb_cli_usage_error("switch", "--pressure is explicit or cgroup", o->pressure);
    if (!o->model)
        return rb_cli_usage_error("switch", "no model: -m MODEL", "make one: rebound make-model "
                                  "--shape qwen3-0.6b --type q8_0 -o m.gguf");
    return -1;
}

/* "50%" -> fraction 0.5; a level name -> level; else bytes. -1 on error. */
static int parse_trim(const char *spec, double *fraction, rb_trim_level *level,
                      uint64_t *bytes)
{
    *fraction = 0;
    *level = RB_TRIM_BYTES;
    *bytes = 0;
    if (!strcmp(spec, "background")) *level = RB_TRIM_BACKGROUND;
    else if (!strcmp(spec, "moderate")) *level = RB_TRIM_MODERATE;
    else if (!strcmp(spec, "complete")) *level = RB_TRIM_COMPLETE;
    else if (spec[0] && spec[strlen(spec) - 1] == '%') {
        char *end;
        double p = strtod(spec, &end);
        if (end == spec || *end != '%' || !(p > 0 && p <= 100))
            return -1;
        *fraction = p / 100.0;
    } else if (rb_cli_parse_u64(spec, bytes) != 0 || *bytes == 0) {
        return -1;
    }
    return 0;
}

static int argmax(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return (int)b;
}

/* Tokens of the conversation, repeated to exactly n (BOS first when the
 * model wants one). */
static int32_t *build_context_tokens(rb_model *m, uint32_t n)
{
    size_t cap = strlen(CONVERSATION) + 16, k = 0;
    int32_t *conv = malloc(cap * sizeof *conv);
    int32_t *out = malloc((size_t)n * sizeof *out);
    if (!conv || !out ||
        rb_model_tokenize(m, CONVERSATION, strlen(CONVERSATION), 0, 1, conv, cap, &k) !=
            RB_OK || k == 0) {
        free(conv);
        free(out);
        return NULL;
    }
    uint32_t i = 0;
    int32_t bos = rb_model_token_bos(m);
    if (bos >= 0 && n > 0)
        out[i++] = bos;
    while (i < n)
        for (size_t j = 0; j < k && i < n; j++)
            out[i++] = conv[j];
    free(conv);
    return out;
}

/* The kill strategies: a fresh `rebound run` (exec'd) that answers with one
 * token, timed from the fork to its first token (it reports the
 * system-wide monotonic time of that token). kill: it loads the model and
 * recomputes context + turn; kill+session (session != NULL): it opens the
 * session file (weights and KV read in layer order as it computes) and
 * feeds the turn only. */
static double run_fresh_process(const sw_opts *o, const int32_t *toks, size_t n,
                                const char *session, uint32_t n_ctx, char *note, size_t note_n)
{
    char path[] = "/tmp/rebound-switch-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        snprintf(note, note_n, "cannot write the token file: %s", strerror(errno));
        return -1;
    }
    FILE *f = fdopen(fd, "w");
    for (size_t i = 0; f && i < n; i++)
        fprintf(f, "%" PRId32 "\n", toks[i]);
    if (f)
        fclose(f);
    char ctx[32], thr[32], errpath[64];
    snprintf(ctx, sizeof ctx, "%" PRIu32, n_ctx);
    snprintf(thr, sizeof thr, "%d", o->n_threads);
    snprintf(errpath, sizeof errpath, "%s.err", path);
    char *args[24] = {"rebound", "run", "-m", (char *)o->model, "--tokens", path, "-n", "1",
                      "-c", ctx, "--temp", "0", "--report-ttft", "--device", (char *)o->device};
    int k = 15;
    if (session) {
        args[k++] = "--session";
        args[k++] = (char *)session;
    }
    if (o->n_threads > 0) {
        args[k++] = "-t";
        args[k++] = thr;
    }
    args[k] = NULL;
    double t0 = rb_cli_now_s();
    pid_t pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        int ef = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (dn >= 0)
            dup2(dn, 1);
        if (ef >= 0)
            dup2(ef, 2);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) {
        snprintf(note, note_n, "cannot start a process: %s", strerror(errno));
        unlink(path);
        unlink(errpath);
        return -1;
    }
    double t_exit = rb_cli_now_s(), t_first = -1;
    FILE *ef = fopen(errpath, "r");
    char line[512], last[512] = "";
    while (ef && fgets(line, sizeof line, ef)) {
        double v;
        if (sscanf(line, "rebound run: first token at monotonic %lf", &v) == 1)
            t_first = v;
        if (strstr(line, "error"))
            snprintf(last, sizeof last, "%s", line);
    }
    if (ef)
        fclose(ef);
    unlink(path);
    unlink(errpath);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || t_first < 0) {
        last[strcspn(last, "\n")] = 0;
        snprintf(note, note_n, "the fresh process failed (status %d) %s", status, last);
        return -1;
    }
    if (session)
        snprintf(note, note_n, "fresh process: opens the session file, feeds the turn; "
                 "exit %.0f ms later", (t_exit - t_first) * 1e3);
    else
        snprintf(note, note_n, "fresh process: load + %zu tokens recomputed", n);
    return t_first - t0;
}

/* Feeds the turn, times it to its first token, keeps the logits of every
 * turn position in logits (n_turn x V). */
static rb_status timed_turn(rb_session *s, const int32_t *turn, uint32_t n, float *logits,
                            double *ttft)
{
    double t0 = rb_cli_now_s();
    rb_status st = rb_session_feed(s, turn, n, logits);
    if (st == RB_OK)
        (void)argmax(logits + (size_t)(n - 1) * rb_session_n_vocab(s), rb_session_n_vocab(s));
    *ttft = rb_cli_now_s() - t0;
    return st;
}

static int is_known_strategy(const char *name)
{
    static const char *known[] = {"kill", "kill+session", "recompute", "zram-lz4", "zram-zstd",
                                  "storage", "rebound", "rebound-q8"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(name, known[i]))
            return 1;
    return 0;
}

/* base "sw.json" + spec "25%" -> "sw-25pct.json" when there are several */
static const char *spec_path(char *out, size_t n, const char *base, const char *spec,
                             int n_specs)
{
    if (n_specs <= 1) {
        snprintf(out, n, "%s", base);
        return out;
    }
    char tag[64];
    size_t k = 0;
    for (const char *c = spec; *c && k + 4 < sizeof tag; c++) {
        if (*c == '%') {
            memcpy(tag + k, "pct", 3);
            k += 3;
        } else {
            tag[k++] = *c;
        }
    }
    tag[k] = 0;
    const char *dot = strrchr(base, '.');
    if (!dot || strchr(dot, '/'))
        snprintf(out, n, "%s-%s", base, tag);
    else
        snprintf(out, n, "%.*s-%s%s", (int)(dot - base), base, tag, dot);
    return out;
}

/* What one strategy needs of the experiment. */
typedef struct sw_ctx {
    const sw_opts *o;
    rb_session *s;
    const int32_t *all, *turn;
    float *logits, *warm_logits;
    uint32_t V, n_ctx_session;
    const char *snapshot, *snapshot_err;
    uint64_t total_bytes;
    uint64_t cold_read_bytes; /* what a cold restore reads: weights + the context's KV */
    double profile_bw;        /* the profile's storage bandwidth; 0: unthrottled */
    sw_pressure *pressure;
    int *hog_next;
} sw_ctx;

/* Read for the disk's bandwidth beside kill+session (switch_disk.c): a
 * third of a second or so on this kind of disk, twice. */
#define DISK_PROBE_BYTES (384ull << 20)

/* The mean of a rate measured before and after (a shared disk's rate
 * moves within seconds); 0 unless both were measured. */
static double mean_rate(double before, double after)
{
    return before > 0 && after > 0 ? 0.5 * (before + after) : 0;
}

/* The floor of reading bytes at the slower of the profile and a measured
 * rate (0: not measured). */
static double floor_at(uint64_t bytes, double profile_bw, double measured)
{
    double bw = profile_bw > 0 && (measured <= 0 || profile_bw < measured) ? profile_bw : measured;
    return bw > 0 ? (double)bytes / bw : 0;
}

/* kill+session's floors: at the profile; at the slower of the profile and
 * what the disk delivered around the run; at the slower of the profile and
 * what a bare read of the same files took after it (switch_disk.c). */
static void cold_floor(const sw_ctx *x, const char *const *files, sw_result *r)
{
    r->disk_bw_after = sw_disk_read_bw(x->snapshot, DISK_PROBE_BYTES, 4);
    r->bare_bw = sw_bare_read_bw(files, 2, 4);
    r->cold_read_bytes = x->cold_read_bytes;
    double disk = mean_rate(r->disk_bw_before, r->disk_bw_after);
    r->io_floor_s = x->profile_bw > 0 ? (double)x->cold_read_bytes / x->profile_bw : 0;
    r->disk_floor_s = floor_at(x->cold_read_bytes, x->profile_bw, disk);
    r->bare_floor_s = floor_at(x->cold_read_bytes, x->profile_bw, r->bare_bw);
    size_t k = strlen(r->note);
    char b[32];
    if (r->io_floor_s > 0)
        k += (size_t)snprintf(r->note + k, sizeof r->note - k, "; I/O floor (%s) %.0f ms at "
                              "the profile: %.2fx", rb_cli_bytes(x->cold_read_bytes, b, sizeof b),
                              r->io_floor_s * 1e3, r->ttft_s / r->io_floor_s);
    if (disk > 0 && k < sizeof r->note)
        k += (size_t)snprintf(r->note + k, sizeof r->note - k, "; the disk read %.2f/%.2f GB/s "
                              "before/after: %.0f ms at the slower of disk and profile, %.2fx",
                              r->disk_bw_before * 1e-9, r->disk_bw_after * 1e-9,
                              r->disk_floor_s * 1e3, r->ttft_s / r->disk_floor_s);
    if (r->bare_bw > 0 && k < sizeof r->note)
        k += (size_t)snprintf(r->note + k, sizeof r->note - k, "; a bare read of the same files "
                              "after it %.2f GB/s: %.0f ms at the slower of it and profile, "
                              "%.2fx", r->bare_bw * 1e-9, r->bare_floor_s * 1e3,
                              r->ttft_s / r->bare_floor_s);
    r->host_reclaims_memory = sw_host_reclaims_free_memory();
    if (r->host_reclaims_memory && k < sizeof r->note)
        snprintf(r->note + k, sizeof r->note - k, "; this VM's host takes free memory back "
                 "(free page reporting): each page the restore fills costs a host fault");
}

static void run_strategy(const sw_ctx *x, const char *name, uint64_t bytes_to_free,
                         rb_trim_level level, sw_result *r)
{
    const sw_opts *o = x->o;
    rb_session *s = x->s;
    rb_restore_mode mode;
    rb_ram_codec codec = RB_RAM_CODEC_LOSSLESS;
    if (!strcmp(name, "kill") || !strcmp(name, "kill+session")) {
        int with_session = name[4] == '+';
        if (with_session && !x->snapshot[0]) {
            snprintf(r->note, sizeof r->note, "no session file: %s", x->snapshot_err);
            return;
        }
        const char *files[2] = {o->model, x->snapshot};
        if (with_session)
            r->disk_bw_before = sw_disk_read_bw(x->snapshot, DISK_PROBE_BYTES, 4);
        r->ttft_s = with_session
                        ? run_fresh_process(o, x->turn, o->n_turn, x->snapshot, x->n_ctx_session,
                                            r->note, sizeof r->note)
                        : run_fresh_process(o, x->all, (size_t)o->n_ctx + o->n_turn, NULL,
                                            x->n_ctx_session, r->note, sizeof r->note);
        r->ran = r->ttft_s >= 0;
        if (with_session && r->ran)
            cold_floor(x, files, r);
        r->freed_bytes = x->total_bytes; /* the whole process */
        return;
    }
    if (!strcmp(name, "recompute")) {
        mode = RB_RESTORE_RECOMPUTE;
    } else if (!strcmp(name, "storage")) {
        mode = RB_RESTORE_EAGER;
    } else if (!strcmp(name, "rebound")) {
        mode = RB_RESTORE_PIPELINED;
    } else if (!strcmp(name, "rebound-q8")) {
        mode = RB_RESTORE_PIPELINED;
        codec = RB_RAM_CODEC_Q8;
    } else {
        /* zram-lz4 / zram-zstd: what the kernel's zRAM does: compress in
           RAM, decompress all before use; frees only what a general codec
           saves on fp16 */
        mode = RB_RESTORE_EAGER;
        codec = !strcmp(name, "zram-lz4") ? RB_RAM_CODEC_LZ4 : RB_RAM_CODEC_ZSTD;
    }
    if (rb_session_set_restore(s, mode, codec) != RB_OK) {
        /* a baseline this build lacks (lz4/zstd) is a row that says so */
        snprintf(r->note, sizeof r->note, "%s", rb_session_errmsg(s));
        return;
    }
    if (x->pressure) {
        if (sw_pressure_run(x->pressure, (*x->hog_next)++, s, r) != 0)
            return;
    } else {
        double ts = rb_cli_now_s();
        rb_status tst = rb_session_trim(s, bytes_to_free, level, &r->freed_bytes);
        r->trim_s = rb_cli_now_s() - ts;
        if (tst != RB_OK) {
            snprintf(r->note, sizeof r->note, "trim failed: %s", rb_session_errmsg(s));
            return;
        }
    }
    rb_session_stats held;
    rb_session_get_stats(s, &held);
    r->held_bytes = held.total_bytes;
    if (timed_turn(s, x->turn, o->n_turn, x->logits, &r->ttft_s) != RB_OK) {
        snprintf(r->note, sizeof r->note, "turn failed: %s", rb_session_errmsg(s));
        rb_session_rewind(s, o->n_ctx);
        return;
    }
    r->ran = 1;
    rb_session_get_stats(s, &r->st);
    r->ev = malloc(8192 * sizeof *r->ev);
    r->n_ev = r->ev ? rb_session_restore_events(s, r->ev, 8192) : 0;
    if (r->n_ev > 8192)
        r->n_ev = 8192;
    for (uint32_t i = 0; i < o->n_turn; i++) {
        const float *a = x->logits + (size_t)i * x->V, *w = x->warm_logits + (size_t)i * x->V;
        r->n_agree += argmax(a, x->V) == argmax(w, x->V);
        r->n_compared++;
        for (uint32_t j = 0; j < x->V; j++) {
            double d = fabs((double)a[j] - w[j]);
            r->max_logit_diff = d > r->max_logit_diff ? d : r->max_logit_diff;
        }
    }
    rb_session_rewind(s, o->n_ctx);
}

/* The session holding the context, all of it in RAM: read from --context
 * FILE when that holds this model's context (the same tokens, the same
 * length), else built by feeding it (and then saved to FILE, if given).
 * *from_file tells which. A file that does not fit is built again, with a
 * line saying why. 0, or the exit code after an error message. */
static int context_session(rb_model *m, const rb_session_params *sp, const sw_opts *o,
                           const int32_t *ctx, const int32_t *turn, rb_session **out,
                           int *from_file)
{
    rb_error err;
    rb_session *s = NULL;
    *from_file = 0;
    if (o->context && access(o->context, F_OK) == 0) {
        const char *why = NULL;
        if (rb_session_open_saved(m, sp, o->context, &s, &err) != RB_OK)
            why = err.message;
        else if (rb_session_n_tokens(s) != o->n_ctx ||
                 memcmp(rb_session_get_tokens(s), ctx, (size_t)o->n_ctx * sizeof *ctx) != 0)
            why = "it holds another conversation";
        /* unbound: the strategies' feeds must not change the file; then a
           turn (rewound) so that every page is in RAM and computed */
        else if (rb_session_unbind(s) != RB_OK ||
                 rb_session_feed(s, turn, o->n_turn, NULL) != RB_OK ||
                 rb_session_rewind(s, o->n_ctx) != RB_OK)
            why = rb_session_errmsg(s);
        if (!why) {
            *from_file = 1;
            *out = s;
            return 0;
        }
        fprintf(stderr, "rebound switch: --context %s: %s; building the context again\n",
                o->context, why);
        rb_session_destroy(s);
        s = NULL;
    }
    if (rb_session_create(m, sp, &s, &err) != RB_OK)
        return rb_cli_fail("switch", err.message,
                           err.status == RB_E_NOT_FOUND ? "devices: phone, watch, host" : NULL);
    fprintf(stderr, "rebound switch: building a context of %" PRIu32 " tokens on %s...\n",
            o->n_ctx, o->model);
    if (rb_session_feed(s, ctx, o->n_ctx, NULL) != RB_OK) {
        int rc = rb_cli_fail("switch", rb_session_errmsg(s), "a smaller -c");
        rb_session_destroy(s);
        return rc;
    }
    if (o->context && rb_session_save(s, o->context, RB_SAVE_SNAPSHOT) != RB_OK)
        fprintf(stderr, "rebound switch: --context %s: %s (the run goes on without it)\n",
                o->context, rb_session_errmsg(s));
    *out = s;
    return 0;
}

int rb_cmd_switch(int argc, char **argv)
{
    sw_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    /* --trim A[,B...]: several amounts on one context */
    char trim_list[256], *specs[4];
    double spec_fraction[4];
    rb_trim_level spec_level[4];
    uint64_t spec_bytes[4];
    int n_specs = 0;
    snprintf(trim_list, sizeof trim_list, "%s", o.trim);
    for (char *save = NULL, *t = strtok_r(trim_list, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        if (n_specs == 4)
            return rb_cli_usage_error("switch", "--trim takes at most 4 amounts", o.trim);
        if (parse_trim(t, &spec_fraction[n_specs], &spec_level[n_specs],
                       &spec_bytes[n_specs]) != 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "--trim '%s' is not a percentage (1%%..100%%), a byte "
                     "count or one of background, moderate, complete", t);
            return rb_cli_usage_error("switch", msg, NULL);
        }
        specs[n_specs++] = t;
    }
    if (n_specs == 0)
        return rb_cli_usage_error("switch", "--trim is empty", NULL);

    rb_error err;
    rb_model *m = NULL;
    if (rb_model_open(o.model, NULL, &m, &err) != RB_OK)
        return rb_cli_fail("switch", err.message, NULL);
    rb_model_info info;
    rb_model_get_info(m, &info);
    uint32_t V = info.n_vocab;

    /* --pressure cgroup: join the cgroup before anything big is allocated.
       Its limit fits rebound alone: the weights, the KV of the context in
       whole 256-token pages, and room for the rest (run state, code). */
    sw_pressure *pressure = NULL;
    char pressure_note[512] = "explicit trim";
    if (!strcmp(o.pressure, "cgroup")) {
        uint64_t kv_tokens = ((uint64_t)o.n_ctx + o.n_turn + 16 + 255) / 256 * 256;
        uint64_t limit = info.tensor_data_bytes + info.kv_bytes_per_token * kv_tokens +
                         (uint64_t)V * o.n_turn * sizeof(float) * 2 + (160ull << 20);
        int n_hogs = 2; /* one per strategy ("zram" is two), per amount */
        for (const char *c = o.strategies; *c; c++)
            n_hogs += *c == ',';
        for (const char *c = o.trim; *c; c++)
            n_hogs += (*c == ',') * 8;
        if (sw_pressure_setup(&pressure, limit, n_hogs, pressure_note,
                              sizeof pressure_note) != 0)
            fprintf(stderr, "rebound switch: %s\n", pressure_note);
    }

    rb_session_params sp = rb_session_default_params();
    sp.n_ctx = o.n_ctx + o.n_turn + 16;
    sp.n_threads = o.n_threads;
    rb_experimental_params sx = rb_experimental_default_params();
    sx.device = o.device;
    sp.experimental = &sx;
    sp.spill_dir = o.spill_dir;
    rb_session *s = NULL;

    static sw_result res[4][12]; /* [trim amount][strategy] */
    memset(res, 0, sizeof res);
    char snapshot[600] = "", snapshot_err[RB_ERROR_MESSAGE_MAX] = "";
    sw_setup su;
    memset(&su, 0, sizeof su);
    su.model_path = o.model;
    su.model_name = info.name && *info.name ? info.name : info.architecture;
    su.device = o.device;
    su.trim_spec = o.trim;
    su.pressure = pressure_note;
    su.is_cgroup = pressure != NULL;
    su.n_ctx_tokens = o.n_ctx;
    su.n_turn = o.n_turn;
    su.n_threads = o.n_threads;
    struct utsname un;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (uname(&un) == 0)
        snprintf(su.machine, sizeof su.machine, "%s %s, %ld cores", un.machine, un.release,
                 cores);

    /* 1. the conversation and the returning turn (its text's first
          --turn tokens, repeated if it is shorter) */
    int32_t *ctx = build_context_tokens(m, o.n_ctx);
    int32_t *turn = malloc((size_t)o.n_turn * sizeof *turn);
    float *warm_logits = malloc((size_t)o.n_turn * V * sizeof(float));
    float *logits = malloc((size_t)o.n_turn * V * sizeof(float));
    int32_t *all = malloc(((size_t)o.n_ctx + o.n_turn) * sizeof *all);
    int32_t turn_text[512];
    size_t n_turn_tok = 0;
    if (!ctx || !turn || !warm_logits || !logits || !all ||
        rb_model_tokenize(m, TURN, strlen(TURN), 0, 1, turn_text, 512, &n_turn_tok) != RB_OK ||
        n_turn_tok == 0) {
        rc = rb_cli_fail("switch", "cannot tokenize the conversation", rb_model_errmsg(m));
        goto done;
    }
    for (uint32_t i = 0; i < o.n_turn; i++)
        turn[i] = turn_text[i % n_turn_tok];
    memcpy(all, ctx, (size_t)o.n_ctx * sizeof *all);
    memcpy(all + o.n_ctx, turn, (size_t)o.n_turn * sizeof *all);

    double t0 = rb_cli_now_s();
    if ((rc = context_session(m, &sp, &o, ctx, turn, &s, &su.context_from)) != 0)
        goto done;
    su.build_s = rb_cli_now_s() - t0;
    rb_session_stats st0;
    rb_session_get_stats(s, &st0);
    su.kv_bytes = st0.kv_raw_bytes;
    /* the context as a session file, for kill+session (a copy: this session
       stays unbound) */
    if (strstr(o.strategies, "kill+session")) {
        snprintf(snapshot, sizeof snapshot, "%s/rebound-switch-%d.session",
                 o.spill_dir ? o.spill_dir : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp"),
                 (int)getpid());
        if (rb_session_save(s, snapshot, RB_SAVE_SNAPSHOT) != RB_OK) {
            snprintf(snapshot_err, sizeof snapshot_err, "%s", rb_session_errmsg(s));
            snapshot[0] = 0;
        }
    }
    snprintf(su.storage_io, sizeof su.storage_io, "%s", st0.storage_io ? st0.storage_io : "");

    /* 2. warm: the median of 3 */
    double warm[3];
    for (int i = 0; i < 3; i++) {
        if (timed_turn(s, turn, o.n_turn, warm_logits, &warm[i]) != RB_OK) {
            rc = rb_cli_fail("switch", rb_session_errmsg(s), NULL);
            goto done;
        }
        rb_session_rewind(s, o.n_ctx);
    }
    double a = warm[0], b = warm[1], c = warm[2];
    su.warm_ttft_s = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
    int hog_next = 0;
    rb_model_info mi;
    uint64_t weight_bytes = rb_model_get_info(m, &mi) == RB_OK ? mi.tensor_data_bytes : 0;
    sw_ctx x = {&o, s, all, turn, logits, warm_logits, V, sp.n_ctx, snapshot, snapshot_err,
                st0.total_bytes, weight_bytes + st0.kv_raw_bytes, st0.device_bytes_per_s,
                pressure, &hog_next};

    /* 3. the strategies, in the order given (rebound-q8 changes the KV:
          it runs where it is listed, so list it last) */
    char list[256] = "";
    /* "zram" is both of its codecs */
    for (const char *q = o.strategies; *q && strlen(list) + 20 < sizeof list; q++) {
        if (!strncmp(q, "zram", 4) && (q[4] == ',' || q[4] == 0) &&
            (q == o.strategies || q[-1] == ',')) {
            strcat(list, "zram-lz4,zram-zstd");
            q += 3;
        } else {
            size_t k = strlen(list);
            list[k] = *q;
            list[k + 1] = 0;
        }
    }
    /* Several trim amounts share the context: kill, kill+session and
       recompute do not depend on the amount (they run for the first only);
       rebound-q8 changes the context's KV (lossy), so it runs after every
       other strategy of every amount. */
    char *names[12];
    int n_names = 0;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name && n_names < 12;
         name = strtok_r(NULL, ",", &save))
        names[n_names++] = name;
    for (int i = 0; i < n_names; i++)
        if (!is_known_strategy(names[i])) {
            char msg[200];
            snprintf(msg, sizeof msg, "unknown strategy '%s' (of %s)", names[i], ALL_STRATEGIES);
            rc = rb_cli_usage_error("switch", msg, NULL);
            goto done;
        }
    for (int phase = 0; phase < 2; phase++)
        for (int k = 0; k < n_specs; k++)
            for (int i = 0; i < n_names; i++) {
                int is_q8 = !strcmp(names[i], "rebound-q8");
                if (is_q8 != phase)
                    continue;
                sw_result *r = &res[k][i];
                snprintf(r->name, sizeof r->name, "%s", names[i]);
                if (k > 0 && (!strcmp(names[i], "kill") || !strcmp(names[i], "kill+session") ||
                              !strcmp(names[i], "recompute"))) {
                    snprintf(r->note, sizeof r->note, "as with --trim %s: it does not depend "
                             "on the amount", specs[0]);
                    continue;
                }
                uint64_t bytes = spec_fraction[k] > 0
                                     ? (uint64_t)(spec_fraction[k] * (double)su.kv_bytes)
                                     : spec_bytes[k];
                fprintf(stderr, "rebound switch: --trim %s: %s...\n", specs[k], names[i]);
                run_strategy(&x, names[i], bytes, spec_level[k], r);
            }

    /* 4. the reports, one per trim amount */
    for (int k = 0; k < n_specs; k++) {
        su.trim_spec = specs[k];
        sw_print_table(&su, res[k], n_names);
        char path[700];
        if (o.json && sw_write_json(spec_path(path, sizeof path, o.json, specs[k], n_specs),
                                    &su, res[k], n_names) != 0) {
            char msg[800];
            snprintf(msg, sizeof msg, "cannot write %s: %s", path, strerror(errno));
            rc = rb_cli_fail("switch", msg, NULL);
        }
        if (o.plot) {
            spec_path(path, sizeof path, o.plot, specs[k], n_specs);
            if (sw_write_svg(path, &su, res[k], n_names) != 0) {
                char msg[800];
                snprintf(msg, sizeof msg, "cannot write %s: %s", path, strerror(errno));
                rc = rb_cli_fail("switch", msg, NULL);
            } else {
                printf("timeline picture: %s\n", path);
            }
        }
    }
done:
    if (snapshot[0])
        unlink(snapshot);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 12; i++)
            free(res[k][i].ev);
    sw_pressure_teardown(pressure); /* moves rebound back out of the cgroup */
    free(ctx);
    free(turn);
    free(warm_logits);
    free(logits);
    free(all);
    rb_session_destroy(s);
    rb_model_close(m);
    return rc;
}
