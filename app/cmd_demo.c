/*
 * cmd_demo.c - `rebound demo`: the README's main command. Makes a model if
 * none is given (a generated qwen3-0.6b-shape Q8_0: KV-heavy, 112 KiB per
 * token, the setting of DESIGN.md; cached so the second run starts at
 * once), then runs `rebound switch` on it with the phone profile and
 * writes the timeline picture next to the JSON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static void print_usage(FILE *f)
{
    fprintf(f,
        "usage: rebound demo [-m MODEL] [-c CONTEXT] [--device D] [-o PREFIX]\n"
        "  -m MODEL     a GGUF model (default: a generated qwen3-0.6b-shape Q8_0, cached in\n"
        "               $XDG_CACHE_HOME/rebound or ~/.cache/rebound)\n"
        "  -c N         tokens of conversation (default 2048)\n"
        "  --device D   storage profile: phone (default), watch, host\n"
        "  -o PREFIX    output files PREFIX.svg and PREFIX.json (default rebound-demo)\n"
        "  -t N         threads (default: all cores)\n");
}

/* mkdir -p for the cache folder (two levels at most) */
static int ensure_dir(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    return mkdir(tmp, 0755) == 0 || access(tmp, W_OK) == 0 ? 0 : -1;
}

int rb_cmd_demo(int argc, char **argv)
{
    const char *model = NULL, *ctx = "2048", *device = "phone", *prefix = "rebound-demo";
    const char *threads = NULL;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            print_usage(stdout);
            return 0;
        }
        if (!v) {
            print_usage(stderr);
            return rb_cli_fail("demo", "an option needs a value (or is unknown)", o);
        }
        if (!strcmp(o, "-m") || !strcmp(o, "--model")) model = v;
        else if (!strcmp(o, "-c") || !strcmp(o, "--ctx-size")) ctx = v;
        else if (!strcmp(o, "--device")) device = v;
        else if (!strcmp(o, "-o")) prefix = v;
        else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) threads = v;
        else {
            print_usage(stderr);
            return rb_cli_fail("demo", "unknown option", o);
        }
    }
    char path[1100];
    if (!model) {
        char dir[1024];
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg)
            snprintf(dir, sizeof dir, "%s/rebound", xdg);
        else
            snprintf(dir, sizeof dir, "%s/.cache/rebound", home && *home ? home : "/tmp");
        if (ensure_dir(dir) != 0)
            return rb_cli_fail("demo", "cannot create the model cache folder", dir);
        snprintf(path, sizeof path, "%s/demo-qwen3-0.6b-q8_0.gguf", dir);
        if (access(path, R_OK) != 0) {
            fprintf(stderr, "rebound demo: making a qwen3-0.6b-shape Q8_0 model (random "
                    "weights) in %s\n", path);
            char *mm[] = {"make-model", "--shape", "qwen3-0.6b", "--type", "q8_0", "-o", path,
                          NULL};
            if (rb_cmd_make_model(7, mm) != 0)
                return 1;
        } else {
            fprintf(stderr, "rebound demo: using the cached model %s\n", path);
        }
        model = path;
    }
    char svg[1100], json[1100];
    snprintf(svg, sizeof svg, "%s.svg", prefix);
    snprintf(json, sizeof json, "%s.json", prefix);
    char *sw[16] = {"switch", "-m", (char *)model, "-c", (char *)ctx, "--device", (char *)device,
                    "--plot", svg, "--json", json};
    int n = 11;
    if (threads) {
        sw[n++] = "-t";
        sw[n++] = (char *)threads;
    }
    sw[n] = NULL;
    int rc = rb_cmd_switch(n, sw);
    if (rc == 0)
        printf("every figure: %s\n", json);
    return rc;
}
