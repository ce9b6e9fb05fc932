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
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE",
         "a GGUF model (default: a generated qwen3-0.6b-shape Q8_0, cached in\n"
         "$XDG_CACHE_HOME/rebound or ~/.cache/rebound)", &model, 0, 0, NULL, NULL},
        {"-c|--ctx-size", RB_OPT_STR, "N", "tokens of conversation (default 2048)", &ctx, 0, 0,
         NULL, NULL},
        {"--device", RB_OPT_STR, "D", "storage profile: phone (default), watch, host", &device, 0,
         0, NULL, NULL},
        {"-o|--output", RB_OPT_STR, "PREFIX",
         "output files PREFIX.svg and PREFIX.json (default rebound-demo)", &prefix, 0, 0, NULL,
         NULL},
        {"-t|--threads", RB_OPT_STR, "N", "threads (default: all cores)", &threads, 0, 0, NULL,
         NULL},
        {0},
    };
    const rb_cli_cmd cmd = {
        "demo", "[-m MODEL] [-c CONTEXT] [--device D] [-o PREFIX] [-t N]",
        "The app-switch experiment (`rebound switch`) on the phone profile, with the\n"
        "timeline picture next to the JSON; -c, --device and -t go to switch as they are.",
        opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
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
