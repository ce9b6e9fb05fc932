/* cli.h - the rebound command's subcommands and the helpers they share. */
#ifndef RB_CLI_H
#define RB_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rebound.h"

/* the product's commands (app/) */
int rb_cmd_info(int argc, char **argv);
int rb_cmd_make_model(int argc, char **argv);
int rb_cmd_quantize(int argc, char **argv);
int rb_cmd_run(int argc, char **argv);
int rb_cmd_chat(int argc, char **argv);
int rb_cmd_bench(int argc, char **argv);
int rb_cmd_demo(int argc, char **argv);
int rb_cmd_kvquality(int argc, char **argv);
/* the HTTP service (cmd_serve.c over serve/); built with libmicrohttpd and jansson */
int rb_cmd_serve(int argc, char **argv);

/* the research commands, beside the harness they drive (tools/commands/) */
int rb_cmd_switch(int argc, char **argv);
int rb_cmd_trace(int argc, char **argv);
int rb_cmd_classify(int argc, char **argv);
int rb_cmd_sim(int argc, char **argv);
int rb_cmd_plan(int argc, char **argv);

/* the load generators, beside the benchmarks (bench/cmd/) */
/* bench --weights-budget ...: decode under a weight budget (cmd_bench_stream.c) */
int rb_cmd_bench_stream(int argc, char **argv);
int rb_cmd_bench_pool(int argc, char **argv);
/* the workload driver for OpenAI-compatible servers (cmd_bench_serve.c);
 * built with libcurl and jansson */
int rb_cmd_bench_serve(int argc, char **argv);

/* --trace FILE of run/bench (app/cli_trace.c): opens a trace writer on path and
 * attaches it to model (file recorded as model_path); detach closes it.
 * Both print their error and return 1 on failure, else 0. */
struct rb_trace_writer;
int rb_cli_trace_attach(const char *cmd, rb_model *model, const char *model_path,
                        const char *path, struct rb_trace_writer **out);
int rb_cli_trace_detach(const char *cmd, struct rb_trace_writer *w);

/* Reads a trace file (tools/analysis/trace.h), prints its malformed lines as warnings
 * with their line numbers, and expands it to 4 KiB block accesses; prints
 * the error and returns 1 when nothing usable is left (tools/commands/cmd_trace.c). */
struct rb_trace;
struct rb_block_stream;
int rb_cli_load_trace(const char *cmd, const char *path, struct rb_trace *t,
                      struct rb_block_stream *s);

/* CLOCK_MONOTONIC in seconds (main.c). */
double rb_cli_now_s(void);

/* The CPU's model name from /proc/cpuinfo ("unknown" when there is none),
 * for the benchmarks' reports (main.c). */
void rb_cli_cpu_name(char *buf, size_t n);

/* Prints "rebound <cmd>: error: <msg>" (and "hint: <hint>" when given) to
 * stderr; returns the exit status for errors (1). */
int rb_cli_fail(const char *cmd, const char *msg, const char *hint);

/* Parses an unsigned integer with an optional K/M/G suffix (powers of
 * 1024); 0 on success, -1 when not a number or out of range (cli_opts.c). */
int rb_cli_parse_u64(const char *s, uint64_t *out);

/* A session's memory by category and tier, and its last restore
 * (cli_stats.c). */
#include <stdio.h>
void rb_cli_print_stats(FILE *f, const rb_session_stats *stats);
/* cli_opts.c. "pipelined|eager|recompute" and "lossless|q8|lz4|zstd";
 * -1 when unknown. */
int rb_cli_parse_restore(const char *s);
int rb_cli_parse_ram_codec(const char *s);

/*
 * The option parser every command uses (cli_opts.c): a table per command,
 * one row per option, from which both the parsing and the help text come,
 * so that the help never lists an option that does not work nor misses
 * one that does.
 *
 * Spellings are matched whole, so llama.cpp's single-dash long options
 * (-sys, -no-cnv, -ngl) are options like any other; "--name=value" also
 * works for the double-dash ones. An option that takes a value always
 * takes the next argument, even when it starts with '-' (-n -1). "--"
 * ends the options. Exit statuses: RB_CLI_EXIT_OK, RB_CLI_EXIT_FAIL (the
 * work failed), RB_CLI_EXIT_USAGE (the command line is wrong).
 */
enum { RB_CLI_EXIT_OK = 0, RB_CLI_EXIT_FAIL = 1, RB_CLI_EXIT_USAGE = 2 };

typedef enum rb_opt_kind {
    RB_OPT_END = 0,   /* ends a table */
    RB_OPT_SECTION,   /* no option: help is a heading for the rows after it */
    RB_OPT_FLAG,      /* no value: *(int *)dest = 1 */
    RB_OPT_FLAG_OFF,  /* no value: *(int *)dest = 0 */
    RB_OPT_STR,       /* *(const char **)dest = the argument (argv outlives it) */
    RB_OPT_INT,       /* *(int *)dest: a decimal integer, may be negative */
    RB_OPT_I64,       /* *(int64_t *)dest: the same, 64-bit */
    RB_OPT_U32,       /* *(uint32_t *)dest: non-negative, K/M/G suffix (x1024) */
    RB_OPT_SIZE,      /* *(uint64_t *)dest: the same, 64-bit (bytes, counts) */
    RB_OPT_FLOAT,     /* *(float *)dest */
    RB_OPT_DOUBLE,    /* *(double *)dest */
    RB_OPT_LIST,      /* *(rb_cli_list *)dest: comma-separated RB_OPT_SIZE values */
    RB_OPT_CALL,      /* fn(dest, value): value is NULL when arg is NULL */
    RB_OPT_IGNORED,   /* accepted, not honoured: one line on stderr says so and
                         why (help holds the reason); takes a value if arg */
    RB_OPT_REFUSED,   /* a llama.cpp flag rebound does not take: a usage error
                         whose hint is help (the nearest rebound option) */
} rb_opt_kind;

#define RB_CLI_LIST_MAX 16
typedef struct rb_cli_list {
    uint64_t v[RB_CLI_LIST_MAX];
    int n;
} rb_cli_list;

typedef struct rb_opt {
    const char *names;  /* every spelling, '|'-separated: "-n|--n-predict" */
    rb_opt_kind kind;
    const char *arg;    /* the value's name in the help ("N", "FILE"); NULL: none
                           (for RB_OPT_CALL and RB_OPT_IGNORED: takes no value) */
    const char *help;   /* one line or several ('\n'); defaults belong here */
    void *dest;
    double lo, hi;      /* numeric kinds: the inclusive range, unless both 0 */
    /* RB_OPT_CALL: 0 when value is valid (and stored); 1 when it is valid
       and means "as if not given" (llama.cpp's -s -1); -1 when invalid, with
       what it expects written into why (why_n bytes) for the message */
    int (*fn)(void *dest, const char *value, char *why, size_t why_n);
    int *given;         /* when set: *given = 1 when the option appears */
} rb_opt;

typedef struct rb_cli_cmd {
    const char *name;       /* "run": the messages' "rebound run:" */
    const char *usage;      /* what follows "usage: rebound run " (lines: '\n') */
    const char *about;      /* a paragraph after the usage, or NULL */
    const rb_opt *opts;     /* ends with a row of kind RB_OPT_END */
    const char *footer;     /* text after the options, or NULL */
    const char **pos;       /* positional arguments: the first max_pos go here */
    int max_pos;
    int *n_pos;             /* all positionals seen (may exceed max_pos); NULL:
                               a positional is a usage error */
    int *rest_at;           /* set: "--" stops, *rest_at = the index after it */
} rb_cli_cmd;

/*
 * Parses argv[1..argc) against c's table. Returns -1 when the command
 * should go on; otherwise the exit status to return at once: 0 after
 * -h/--help printed the help to stdout, 2 after a usage error was printed
 * (an unknown option, a missing or bad value: the message names the
 * option and the value).
 */
int rb_cli_parse(const rb_cli_cmd *c, int argc, char **argv);

/* The help generated from c's table, to f. */
void rb_cli_help(const rb_cli_cmd *c, FILE *f);

/* Prints "rebound <cmd>: error: <msg>" (and the hint, or "rebound <cmd>
 * --help lists the options") and returns RB_CLI_EXIT_USAGE: for the
 * checks a command makes after parsing (a missing -m, exclusive options). */
int rb_cli_usage_error(const char *cmd, const char *msg, const char *hint);

/* The rows run and chat share, as initializers for a table:
 * RB_CLI_SESSION_OPTS(p): -c -b -t --exact-attention --device --spill-dir --mem-budget
 * --weights-budget --policy --restore --ram-codec -ctk -ctv into *p;
 * RB_CLI_SAMPLER_OPTS(sp, seed_given): --temp --top-k --top-p --min-p
 * --repeat-penalty --repeat-last-n --presence-penalty --frequency-penalty
 * -s/--seed into *sp;
 * RB_CLI_GPU_OPTS: llama.cpp's GPU and locking flags, accepted and
 * ignored with a note. */
int rb_cli_opt_restore(void *dest, const char *v, char *why, size_t why_n);
int rb_cli_opt_ram_codec(void *dest, const char *v, char *why, size_t why_n);
int rb_cli_opt_kv_type(void *dest, const char *v, char *why, size_t why_n);
int rb_cli_opt_device(void *dest, const char *v, char *why, size_t why_n);
int rb_cli_opt_batch(void *dest, const char *v, char *why, size_t why_n);
int rb_cli_opt_seed(void *dest, const char *v, char *why, size_t why_n);
/* --exact-attention into (p)->exact_attention (run, chat, serve, bench) */
#define RB_CLI_EXACT_ATTENTION_OPT(p)                                                         \
    {"--exact-attention", RB_OPT_FLAG, NULL,                                                  \
     "attend every position in llama.cpp's one-query arithmetic (logits bit-identical\n"      \
     "to it fed one token at a time); default: positions 256+ in tiled f32",                  \
     &(p)->exact_attention, 0, 0, NULL, NULL}
#define RB_CLI_SESSION_OPTS(p)                                                                \
    {"-c|--ctx-size", RB_OPT_U32, "N", "context length (default: the model's trained context)", \
     &(p)->n_ctx, 0, 0, NULL, NULL},                                                          \
    {"-b|--batch-size", RB_OPT_CALL, "N", "prefill batch (default 128; 0: the default)",     \
     &(p)->n_batch, 0, 0, rb_cli_opt_batch, NULL},                                            \
    {"-t|--threads", RB_OPT_INT, "N", "threads (default: all cores)", &(p)->n_threads, 0, 256, \
     NULL, NULL},                                                                             \
    RB_CLI_EXACT_ATTENTION_OPT(p),                                                            \
    {NULL, RB_OPT_SECTION, NULL, "memory manager:", NULL, 0, 0, NULL, NULL},                 \
    {"--device", RB_OPT_CALL, "D", "storage profile for the memory manager: phone, watch, host", \
     (p), 0, 0, rb_cli_opt_device, NULL},                                                     \
    {"--mem-budget", RB_OPT_SIZE, "BYTES",                                                    \
     "RAM the session may hold (K/M/G); beyond it, it trims itself", &(p)->budget_bytes, 1,   \
     1e19, NULL, NULL},                                                                       \
    {"--weights-budget", RB_OPT_SIZE, "BYTES",                                                \
     "RAM for the weights (K/M/G): the hot set and a loop prefix stay, the rest\n"            \
     "streams from the file every token", &(p)->weights_budget_bytes, 1, 1e19, NULL, NULL},  \
    {"--policy", RB_OPT_STR, "P", "weight cache policy under --weights-budget: class (default), lru", \
     &(p)->weights_policy, 0, 0, NULL, NULL},                                                 \
    {"--restore", RB_OPT_CALL, "MODE", "pipelined (default), eager, recompute", &(p)->restore, \
     0, 0, rb_cli_opt_restore, NULL},                                                         \
    {"--ram-codec", RB_OPT_CALL, "C", "the compressed RAM tier: lossless (default), q8, lz4, zstd", \
     &(p)->ram_codec, 0, 0, rb_cli_opt_ram_codec, NULL},                                      \
    {"-ctk|--cache-type-k", RB_OPT_CALL, "T",                                                 \
     "KV cache type of K: f16 (default), q8_0, q4_0 (llama.cpp's layout)", &(p)->kv_type_k,  \
     0, 0, rb_cli_opt_kv_type, NULL},                                                         \
    {"-ctv|--cache-type-v", RB_OPT_CALL, "T", "the same for V", &(p)->kv_type_v, 0, 0,        \
     rb_cli_opt_kv_type, NULL},                                                               \
    {"--spill-dir", RB_OPT_STR, "DIR", "where evicted KV goes on storage (default $TMPDIR or /tmp)", \
     &(p)->spill_dir, 0, 0, NULL, NULL}
#define RB_CLI_SAMPLER_OPTS(sp, seed_given)                                                   \
    {NULL, RB_OPT_SECTION, NULL, "sampling:", NULL, 0, 0, NULL, NULL},                        \
    {"--temp", RB_OPT_FLOAT, "T", "temperature (default 0.8; 0: greedy)", &(sp)->temp, 0, 0,   \
     NULL, NULL},                                                                             \
    {"--top-k", RB_OPT_INT, "N", "top-k (default 40; 0: off)", &(sp)->top_k, 0, 0, NULL, NULL}, \
    {"--top-p", RB_OPT_FLOAT, "P", "top-p (default 0.95; 1: off)", &(sp)->top_p, 0, 0, NULL,  \
     NULL},                                                                                   \
    {"--min-p", RB_OPT_FLOAT, "P", "min-p (default 0.05; 0: off)", &(sp)->min_p, 0, 0, NULL,  \
     NULL},                                                                                   \
    {"--repeat-penalty", RB_OPT_FLOAT, "R", "repetition penalty (default 1.0: off)",          \
     &(sp)->repeat_penalty, 0, 0, NULL, NULL},                                                \
    {"--repeat-last-n", RB_OPT_INT, "N", "tokens the penalty looks at (default 64; -1: all)",  \
     &(sp)->repeat_last_n, -1, 2147483647.0, NULL, NULL},                                     \
    {"--presence-penalty", RB_OPT_FLOAT, "P",                                                 \
     "subtracted once from each token in the penalty window (default 0: off)",               \
     &(sp)->presence_penalty, 0, 0, NULL, NULL},                                              \
    {"--frequency-penalty", RB_OPT_FLOAT, "F",                                                \
     "subtracted per occurrence in the penalty window (default 0: off)",                     \
     &(sp)->frequency_penalty, 0, 0, NULL, NULL},                                             \
    {"-s|--seed", RB_OPT_CALL, "S", "sampling seed (default -1: a random one, printed on stderr)", \
     &(sp)->seed, 0, 0, rb_cli_opt_seed, (seed_given)}
/* llama.cpp's flags that run and chat share (besides the rows above):
 * RB_CLI_LLAMA_OPTS(stops, ignore_eos, color, no_display, quiet):
 * -r/--reverse-prompt into *stops, --ignore-eos, --color/-co,
 * --no-display-prompt and --log-disable as int flags, and -ub refused
 * (rebound's one batch size is -b). */
#define RB_CLI_STOPS_MAX 8
typedef struct rb_cli_stops {
    const char *s[RB_CLI_STOPS_MAX]; /* point into argv */
    int n;
    char tail[512];                  /* the end of the text so far */
    size_t len;
} rb_cli_stops;
int rb_cli_opt_reverse_prompt(void *dest, const char *v, char *why, size_t why_n);
/* Appends k bytes of generated text; 1 when the text now contains one of
 * the stop strings (ending inside these k bytes), else 0. */
int rb_cli_stops_push(rb_cli_stops *st, const char *text, size_t k);
/* Forgets the text so far (a new reply). */
void rb_cli_stops_reset(rb_cli_stops *st);

/* --ignore-eos: a copy of the logits with every end-of-generation token at
 * -inf, as llama.cpp's logit bias does. rb_cli_eog_init lists them (NULL
 * buffers and 0 on success; -1 out of memory). */
typedef struct rb_cli_eog {
    int32_t *ids;
    size_t n_ids;
    float *logits; /* n_vocab floats */
    size_t n_vocab;
} rb_cli_eog;
int rb_cli_eog_init(rb_cli_eog *e, rb_model *model, size_t n_vocab);
const float *rb_cli_eog_mask(rb_cli_eog *e, const float *logits);
void rb_cli_eog_free(rb_cli_eog *e);

/* --log-disable: rb_cli_seed and the commands' informational stderr lines
 * stay silent (errors and warnings are still printed). */
extern int rb_cli_quiet;

#define RB_CLI_LLAMA_OPTS(stops, ignore_eos, color, no_display, quiet)                        \
    {NULL, RB_OPT_SECTION, NULL, "llama.cpp's generation flags:", NULL, 0, 0, NULL, NULL},    \
    {"-r|--reverse-prompt", RB_OPT_CALL, "TEXT",                                              \
     "stop generating when the text produced contains TEXT (it is printed);\n"                \
     "up to 8 of them", (stops), 0, 0, rb_cli_opt_reverse_prompt, NULL},                      \
    {"--ignore-eos", RB_OPT_FLAG, NULL,                                                       \
     "never sample an end-of-generation token: go on until -n or the context", (ignore_eos),  \
     0, 0, NULL, NULL},                                                                       \
    {"-co|--color", RB_OPT_FLAG, NULL,                                                        \
     "colours on a terminal: the prompt or your input apart from the generated text",         \
     (color), 0, 0, NULL, NULL},                                                              \
    {"--no-display-prompt", RB_OPT_FLAG, NULL, "do not print the prompt, only what follows",  \
     (no_display), 0, 0, NULL, NULL},                                                         \
    {"--log-disable", RB_OPT_FLAG, NULL,                                                      \
     "no informational lines on stderr (seed, load, speed); errors still are", (quiet), 0, 0, \
     NULL, NULL},                                                                             \
    {"-ub|--ubatch-size", RB_OPT_REFUSED, "N",                                                \
     "rebound computes a prefill in one batch size: -b N sets it (llama.cpp's -ub)", NULL, 0, \
     0, NULL, NULL}

#define RB_CLI_GPU_OPTS                                                                       \
    {NULL, RB_OPT_SECTION, NULL, "llama.cpp flags accepted and ignored (a note says so):", NULL, \
     0, 0, NULL, NULL},                                                                       \
    {"-ngl|--gpu-layers|--n-gpu-layers", RB_OPT_IGNORED, "N",                                 \
     "rebound computes on the CPU only", NULL, 0, 0, NULL, NULL},                             \
    {"-fa|--flash-attn", RB_OPT_IGNORED, "on|off|auto",                                       \
     "rebound's attention is always flash attention (see --exact-attention)", NULL, 0, 0,     \
     NULL, NULL},                                                                             \
    {"--mlock", RB_OPT_IGNORED, NULL,                                                         \
     "rebound's memory manager decides what stays in RAM", NULL, 0, 0, NULL, NULL}

/* A whole text file, NUL-terminated, with one final newline dropped (as
 * llama.cpp's -f); NULL with errno set on failure. The caller frees it. */
char *rb_cli_read_text(const char *path);

/* llama.cpp's escapes, in place: \n \r \t \' \" \\ and \xHH; any other
 * backslash stays as it is. */
void rb_cli_unescape(char *s);

/* After parsing: when no -s was given, a random seed into *seed, printed
 * on stderr ("rebound <cmd>: seed N") so that -s N repeats the run. */
void rb_cli_seed(const char *cmd, uint64_t *seed, int seed_given);

/* Warns on stderr when n_ctx exceeds the model's trained context. */
void rb_cli_warn_ctx(const char *cmd, rb_model *model, uint32_t n_ctx);
/* A session opened from a file that fell back to an older state (damage):
 * one warning line on stderr saying why and how many tokens were lost. */
void rb_cli_warn_recovery(const char *cmd, const rb_session *s);
/* The storage tier took no pages (full disk, missing folder) and RAM stays
 * over the budget: one warning line with the bytes over and the pages kept
 * in RAM. Prints only when *warned is 0 and then sets it. */
void rb_cli_warn_pressure(const char *cmd, const rb_session *s, int *warned);

/* "1.23 GiB" style, into buf. */
const char *rb_cli_bytes(uint64_t bytes, char *buf, int size);

/* Thousands-grouped decimal ("1,171,200"), into buf. */
const char *rb_cli_grouped(uint64_t v, char *buf, int size);

#endif
