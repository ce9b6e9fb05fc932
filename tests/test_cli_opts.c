/*
 * test_cli_opts.c - the `rebound` command's option parser (app/cli_opts.c)
 * on its own: whole-name matching (llama.cpp's -sys beside -s), values that
 * start with '-', --name=value, every kind's range and overflow, comma
 * lists, positionals and "--", the exit statuses, the help generated from
 * the table, and the prompt helpers (-f's file reading, -e's escapes).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli.h"

/* the options of one parse, reset before each */
static struct {
    const char *model, *sys, *pos[2];
    int flag, n_pos, threads, given_seed, given_dim, rest_at;
    int64_t n;
    uint32_t ctx;
    uint64_t size, seed;
    float temp;
    double bw;
    rb_cli_list list;
} o;

static int seed_fn(void *dest, const char *v, char *why, size_t why_n)
{
    return rb_cli_opt_seed(dest, v, why, why_n);
}

static const rb_opt OPTS[] = {
    {"-m|--model", RB_OPT_STR, "FILE", "model", &o.model, 0, 0, NULL, NULL},
    {"-sys|--system-prompt", RB_OPT_STR, "TEXT", "system", &o.sys, 0, 0, NULL, NULL},
    {"-s|--seed", RB_OPT_CALL, "S", "seed", &o.seed, 0, 0, seed_fn, &o.given_seed},
    {"-n|--n-predict", RB_OPT_I64, "N", "tokens", &o.n, -2, 9.2e18, NULL, NULL},
    {"-c|--ctx-size", RB_OPT_U32, "N", "context", &o.ctx, 0, 0, NULL, &o.given_dim},
    {"--size", RB_OPT_SIZE, "B", "bytes", &o.size, 0, 0, NULL, NULL},
    {"-t", RB_OPT_INT, "N", "threads", &o.threads, 1, 256, NULL, NULL},
    {NULL, RB_OPT_SECTION, NULL, "a heading:", NULL, 0, 0, NULL, NULL},
    {"--temp", RB_OPT_FLOAT, "T", "temperature", &o.temp, 0, 0, NULL, NULL},
    {"--bw", RB_OPT_DOUBLE, "MIB_S", "bandwidth\nsecond line", &o.bw, 1e-9, 1e18, NULL, NULL},
    {"-p|--list", RB_OPT_LIST, "N[,N..]", "list", &o.list, 0, 65536, NULL, NULL},
    {"--flag", RB_OPT_FLAG, NULL, "a flag", &o.flag, 0, 0, NULL, NULL},
    {"--no-flag", RB_OPT_FLAG_OFF, NULL, "its opposite", &o.flag, 0, 0, NULL, NULL},
    {"-ngl", RB_OPT_IGNORED, "N", "not here", NULL, 0, 0, NULL, NULL},
    {"-ub", RB_OPT_REFUSED, "N", "use -b", NULL, 0, 0, NULL, NULL},
    {0},
};

/* parses the NULL-terminated words after argv[0]; positionals allowed */
static int parse(int with_pos, int with_rest, ...)
{
    memset(&o, 0, sizeof o);
    char *argv[32] = {"cmd"};
    int argc = 1;
    va_list ap;
    va_start(ap, with_rest);
    for (char *w; (w = va_arg(ap, char *)) && argc < 31;)
        argv[argc++] = w;
    va_end(ap);
    const rb_cli_cmd c = {
        "test", "[options] [A [B]]", "about", OPTS, "footer\n", with_pos ? o.pos : NULL,
        with_pos ? 2 : 0, with_pos ? &o.n_pos : NULL, with_rest ? &o.rest_at : NULL,
    };
    return rb_cli_parse(&c, argc, argv);
}
#define P(...) parse(0, 0, __VA_ARGS__, (char *)NULL)

static void test_names_and_values(void)
{
    /* whole names: -sys is not -s */
    CHECK_EQ_INT(P("-sys", "Be brief.", "-s", "5"), -1);
    CHECK(o.sys && !strcmp(o.sys, "Be brief."));
    CHECK_EQ_INT(o.seed, 5);
    CHECK_EQ_INT(o.given_seed, 1);
    CHECK_EQ_INT(P("-sy", "x"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--system", "x"), RB_CLI_EXIT_USAGE); /* no prefixes */
    /* -s -1: a random seed, as if not given */
    CHECK_EQ_INT(P("-s", "7", "-s", "-1"), -1);
    CHECK_EQ_INT(o.given_seed, 0);
    CHECK_EQ_INT(P("-s", "x"), RB_CLI_EXIT_USAGE);
    /* a value that starts with '-' */
    CHECK_EQ_INT(P("-n", "-1"), -1);
    CHECK_EQ_INT(o.n, -1);
    CHECK_EQ_INT(P("-n", "-3"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-m", "-n"), -1);
    CHECK(o.model && !strcmp(o.model, "-n"));
    /* --name=value, double-dash only */
    CHECK_EQ_INT(P("--model=a=b.gguf", "--n-predict=12"), -1);
    CHECK(o.model && !strcmp(o.model, "a=b.gguf"));
    CHECK_EQ_INT(o.n, 12);
    CHECK_EQ_INT(P("-m=x"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--flag=1"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--model="), -1); /* an empty value is a value */
    CHECK(o.model && !strcmp(o.model, ""));
    /* a missing value */
    CHECK_EQ_INT(P("-m"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-n"), RB_CLI_EXIT_USAGE);
    /* flags, the last one wins */
    CHECK_EQ_INT(P("--flag"), -1);
    CHECK_EQ_INT(o.flag, 1);
    CHECK_EQ_INT(P("--flag", "--no-flag"), -1);
    CHECK_EQ_INT(o.flag, 0);
    /* ignored: accepted with its value */
    CHECK_EQ_INT(P("-ngl", "99", "--flag"), -1);
    CHECK_EQ_INT(o.flag, 1);
    CHECK_EQ_INT(P("--frobnicate"), RB_CLI_EXIT_USAGE);
}

static void test_numbers(void)
{
    CHECK_EQ_INT(P("-c", "4294967295"), -1);
    CHECK_EQ_INT(o.ctx, 4294967295u);
    CHECK_EQ_INT(o.given_dim, 1);
    CHECK_EQ_INT(P("-c", "4294967296"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-c", "4G"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-c", "3G"), -1);
    CHECK_EQ_INT(o.ctx, 3221225472u);
    CHECK_EQ_INT(P("-c", "-1"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-c", "12x"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-c", ""), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--size", "1K"), -1);
    CHECK_EQ_INT(o.size, 1024);
    CHECK_EQ_INT(P("--size", "17179869184G"), RB_CLI_EXIT_USAGE); /* 2^64 */
    CHECK_EQ_INT(P("-t", "0"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-t", "256"), -1);
    CHECK_EQ_INT(o.threads, 256);
    CHECK_EQ_INT(P("-t", "257"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-t", "99999999999"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--temp", "0.25"), -1);
    CHECK(o.temp == 0.25f);
    CHECK_EQ_INT(P("--temp", "nan"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--temp", "1e999"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--temp", "0.5x"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--bw", "0"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("--bw", "100.5"), -1);
    CHECK(o.bw == 100.5);
}

static void test_lists(void)
{
    CHECK_EQ_INT(P("-p", "16,32,1K"), -1);
    CHECK_EQ_INT(o.list.n, 3);
    CHECK_EQ_INT(o.list.v[2], 1024);
    CHECK_EQ_INT(P("-p", "0"), -1);
    CHECK_EQ_INT(o.list.n, 1);
    CHECK_EQ_INT(P("-p", "1,,2"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-p", "1,"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-p", ""), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-p", "65537"), RB_CLI_EXIT_USAGE);
    CHECK_EQ_INT(P("-p", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"), -1);
    CHECK_EQ_INT(o.list.n, 16);
    CHECK_EQ_INT(P("-p", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"), RB_CLI_EXIT_USAGE);
}

static void test_positionals(void)
{
    CHECK_EQ_INT(parse(1, 0, "a", "-m", "x", "b", "c", "-", (char *)NULL), -1);
    CHECK_EQ_INT(o.n_pos, 4); /* all counted, the first two kept */
    CHECK(o.pos[0] && !strcmp(o.pos[0], "a") && o.pos[1] && !strcmp(o.pos[1], "b"));
    CHECK_EQ_INT(P("stray"), RB_CLI_EXIT_USAGE); /* no positionals wanted */
    /* "--" ends the options: what follows is positional */
    CHECK_EQ_INT(parse(1, 0, "--", "--flag", (char *)NULL), -1);
    CHECK_EQ_INT(o.flag, 0);
    CHECK_EQ_INT(o.n_pos, 1);
    CHECK(o.pos[0] && !strcmp(o.pos[0], "--flag"));
    /* or, with rest_at, hands the rest to the command */
    CHECK_EQ_INT(parse(0, 1, "--flag", "--", "prog", "--bogus", (char *)NULL), -1);
    CHECK_EQ_INT(o.rest_at, 3);
    CHECK_EQ_INT(o.flag, 1);
}

static void test_help(void)
{
    const rb_cli_cmd c = {"test", "[options]", "about", OPTS, "footer\n", NULL, 0, NULL, NULL};
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return;
    rb_cli_help(&c, f);
    long n = ftell(f);
    char *buf = calloc(1, (size_t)n + 1);
    rewind(f);
    CHECK(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    if (!buf)
        return;
    CHECK(!strncmp(buf, "usage: rebound test [options]\n", 30));
    /* every spelling of every row is in the help, with its value's name */
    for (const rb_opt *r = OPTS; r->kind != RB_OPT_END; r++) {
        if (r->kind == RB_OPT_SECTION) {
            CHECK(strstr(buf, r->help) != NULL);
            continue;
        }
        for (const char *p = r->names; *p;) {
            char name[64];
            size_t k = strcspn(p, "|");
            snprintf(name, sizeof name, "%.*s", (int)k, p);
            if (!strstr(buf, name)) {
                fprintf(stderr, "help lacks %s:\n%s", name, buf);
                CHECK(0);
            }
            p += k + (p[k] == '|');
        }
    }
    CHECK(strstr(buf, "  -n, --n-predict N     ") != NULL);
    CHECK(strstr(buf, "\n                          second line\n") != NULL);
    CHECK(strstr(buf, "  -h, --help") != NULL);
    CHECK(strstr(buf, "footer\nexit status: 0 success, 1 failure, 2 usage error\n") != NULL);
    free(buf);
    char *argv[] = {"cmd", "-m", "x", "--help", "--bogus"};
    CHECK_EQ_INT(rb_cli_parse(&c, 5, argv), RB_CLI_EXIT_OK); /* help wins, stops */
}

static void test_text_helpers(void)
{
    char s1[] = "a\\nb\\tc\\\\d\\x41\\q\\'\\\"\\x4", s2[] = "end\\";
    rb_cli_unescape(s1);
    CHECK(!strcmp(s1, "a\nb\tc\\dA\\q'\"\\x4"));
    rb_cli_unescape(s2);
    CHECK(!strcmp(s2, "end\\"));
    char path[512];
    snprintf(path, sizeof path, "%s/test_cli_opts.txt", REBOUND_TEST_TMP);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    for (int i = 0; i < 3000; i++) /* longer than the first read */
        fputs("ab", f);
    fputs("\n\n", f);
    fclose(f);
    char *t = rb_cli_read_text(path);
    CHECK(t != NULL);
    if (t) {
        CHECK_EQ_INT(strlen(t), 6001); /* one final newline dropped */
        CHECK(t[6000] == '\n' && t[5999] == 'b');
    }
    free(t);
    remove(path);
    CHECK(rb_cli_read_text(path) == NULL);
}

/* -r's matcher: an occurrence ending in the new bytes, across pieces,
 * never twice for the same one; the window keeps the newest bytes */
static void test_stops(void)
{
    rb_cli_stops st = {0};
    char why[96];
    CHECK(rb_cli_stops_push(&st, "abc", 3) == 0); /* no stop strings: never */
    CHECK(rb_cli_opt_reverse_prompt(&st, "", why, sizeof why) == -1);
    CHECK(rb_cli_opt_reverse_prompt(&st, "User:", why, sizeof why) == 0);
    CHECK(rb_cli_stops_push(&st, "Hello ", 6) == 0);
    CHECK(rb_cli_stops_push(&st, "Us", 2) == 0);
    CHECK(rb_cli_stops_push(&st, "er", 2) == 0);
    CHECK(rb_cli_stops_push(&st, ": x", 3) == 1); /* "User:" across three pieces */
    CHECK(rb_cli_stops_push(&st, "yz", 2) == 0);  /* the same one is not seen again */
    rb_cli_stops_reset(&st);
    CHECK(rb_cli_stops_push(&st, "r:", 2) == 0);  /* a new reply: no old bytes */
    for (int i = 0; i < 1000; i++)                /* the window slides */
        CHECK(rb_cli_stops_push(&st, "ab", 2) == 0);
    CHECK(rb_cli_stops_push(&st, "User", 4) == 0);
    CHECK(rb_cli_stops_push(&st, ":", 1) == 1);
    for (int i = 1; i < RB_CLI_STOPS_MAX; i++)
        CHECK(rb_cli_opt_reverse_prompt(&st, "x", why, sizeof why) == 0);
    CHECK(rb_cli_opt_reverse_prompt(&st, "y", why, sizeof why) == -1); /* the ninth */
    /* a llama.cpp flag rebound refuses: a usage error, never a silent skip */
    CHECK_EQ_INT(P("-ub", "512"), RB_CLI_EXIT_USAGE);
}

/* --exact-attention (run, chat, serve, bench): off unless given, then
 * rb_session_params.exact_attention = 1, in the shared session rows */
static void test_exact_attention(void)
{
    rb_session_params p = rb_session_default_params();
    const rb_opt opts[] = {RB_CLI_SESSION_OPTS(&p), {0}};
    const rb_cli_cmd c = {"test", "[options]", NULL, opts, NULL, NULL, 0, NULL, NULL};
    char *none[] = {"cmd", "-t", "2"}, *given[] = {"cmd", "--exact-attention"};
    CHECK_EQ_INT(rb_cli_parse(&c, 3, none), -1);
    CHECK_EQ_INT(p.exact_attention, 0);
    CHECK_EQ_INT(rb_cli_parse(&c, 2, given), -1);
    CHECK_EQ_INT(p.exact_attention, 1);
    char *bad[] = {"cmd", "--exact-attention=1"};
    CHECK_EQ_INT(rb_cli_parse(&c, 2, bad), RB_CLI_EXIT_USAGE);
}

int main(void)
{
    test_names_and_values();
    test_numbers();
    test_lists();
    test_positionals();
    test_help();
    test_text_helpers();
    test_stops();
    test_exact_attention();
    return check_report();
}
