/*
 * cli_opts.c - the flags `run` and `chat` share, parsed in one place: the
 * session's shape and memory manager (-c -b -t --device --spill-dir
 * --mem-budget --weights-budget --policy --restore --ram-codec) and the sampler (--temp --top-k
 * --top-p --min-p --repeat-penalty --repeat-last-n --seed).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "rebound_experimental.h"

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

int rb_cli_session_opt(const char *o, const char *v, rb_session_params *p, int *bad)
{
    uint64_t u = 0;
    int r;
    if (!strcmp(o, "-c") || !strcmp(o, "--ctx-size")) {
        *bad = rb_cli_parse_u64(v, &u) || u > UINT32_MAX;
        p->n_ctx = (uint32_t)u;
    } else if (!strcmp(o, "-b") || !strcmp(o, "--batch-size")) {
        *bad = rb_cli_parse_u64(v, &u) || u > 65536;
        if (u) /* 0: the default */
            p->n_batch = (uint32_t)u;
    } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
        *bad = rb_cli_parse_u64(v, &u) || u > 256;
        p->n_threads = (int)u;
    } else if (!strcmp(o, "--device")) {
        static rb_experimental_params x; /* p keeps a pointer to it */
        x = p->experimental ? *p->experimental : rb_experimental_default_params();
        x.device = v;
        p->experimental = &x;
        *bad = !v;
    } else if (!strcmp(o, "--spill-dir")) {
        *bad = !v, p->spill_dir = v;
    } else if (!strcmp(o, "--mem-budget")) {
        *bad = rb_cli_parse_u64(v, &p->budget_bytes) || p->budget_bytes == 0;
    } else if (!strcmp(o, "--weights-budget")) {
        *bad = rb_cli_parse_u64(v, &p->weights_budget_bytes) || p->weights_budget_bytes == 0;
    } else if (!strcmp(o, "--policy")) {
        *bad = !v, p->weights_policy = v;
    } else if (!strcmp(o, "--restore")) {
        *bad = (r = rb_cli_parse_restore(v)) < 0;
        p->restore = (rb_restore_mode)(r < 0 ? 0 : r);
    } else if (!strcmp(o, "--ram-codec")) {
        *bad = (r = rb_cli_parse_ram_codec(v)) < 0;
        p->ram_codec = (rb_ram_codec)(r < 0 ? 0 : r);
    } else {
        return 0;
    }
    return 1;
}

int rb_cli_sampler_opt(const char *o, const char *v, rb_sampler_params *sp, int *bad)
{
    if (!strcmp(o, "--temp")) {
        *bad = !v || sscanf(v, "%f", &sp->temp) != 1;
    } else if (!strcmp(o, "--top-k")) {
        *bad = !v || sscanf(v, "%d", &sp->top_k) != 1;
    } else if (!strcmp(o, "--top-p")) {
        *bad = !v || sscanf(v, "%f", &sp->top_p) != 1;
    } else if (!strcmp(o, "--min-p")) {
        *bad = !v || sscanf(v, "%f", &sp->min_p) != 1;
    } else if (!strcmp(o, "--repeat-penalty")) {
        *bad = !v || sscanf(v, "%f", &sp->repeat_penalty) != 1;
    } else if (!strcmp(o, "--repeat-last-n")) {
        *bad = !v || sscanf(v, "%d", &sp->repeat_last_n) != 1;
    } else if (!strcmp(o, "--seed")) {
        uint64_t seed = 0;
        *bad = rb_cli_parse_u64(v, &seed);
        sp->seed = seed;
    } else {
        return 0;
    }
    return 1;
}

void rb_cli_warn_ctx(const char *cmd, rb_model *model, uint32_t n_ctx)
{
    rb_model_info mi;
    rb_model_get_info(model, &mi);
    if (n_ctx > mi.n_ctx_train && mi.n_ctx_train > 0)
        fprintf(stderr, "rebound %s: warning: context %u exceeds the model's trained context "
                "%u; quality may degrade\n", cmd, (unsigned)n_ctx, (unsigned)mi.n_ctx_train);
}
