/*
 * switch_report.c - the reports of `rebound switch`: the table (stdout),
 * JSON with every figure, and the SVG timeline (one panel per strategy:
 * per layer, when its restore ran on the I/O path and on the decode path,
 * when the forward pass waited for it and when it computed).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "switch.h"

static const sw_result *find(const sw_result *r, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (r[i].ran && !strcmp(r[i].name, name))
            return &r[i];
    return NULL;
}

void sw_print_table(const sw_setup *su, const sw_result *r, int n)
{
    char b1[32], b2[32], b3[32], b4[32];
    printf("\nrebound switch: %s, %" PRIu32 " tokens of context + a %" PRIu32 "-token turn\n",
           su->model_name, su->n_ctx_tokens, su->n_turn);
    printf("device profile %s; trim %s; KV in RAM before the trim %s; %s\n", su->device,
           su->trim_spec, rb_cli_bytes(su->kv_bytes, b1, sizeof b1), su->pressure);
    printf("machine: %s; spill: %s\n", su->machine, su->storage_io);
    printf("context %s in %.1f s; warm TTFT %.1f ms (median of 3)\n\n",
           su->context_from ? "read from --context" : "built", su->build_s,
           su->warm_ttft_s * 1e3);
    const sw_result *storage = find(r, n, "storage");
    double warm = su->warm_ttft_s;
    printf("%-11s %10s %8s %9s %10s %10s %10s %19s %19s %8s  %s\n", "strategy", "TTFT ms",
           "x warm", "x storage", "added ms", "vs storage", "freed", "restore I/O",
           "restore decode", "waited", "notes");
    for (int i = 0; i < n; i++) {
        const sw_result *x = &r[i];
        if (!x->ran) {
            printf("%-11s %10s  %s\n", x->name, "-", x->note);
            continue;
        }
        double added = x->ttft_s - warm;
        char vs_storage[16] = "-", added_vs[16] = "-";
        if (storage && storage->ttft_s > 0)
            snprintf(vs_storage, sizeof vs_storage, "%.2f", x->ttft_s / storage->ttft_s);
        /* nothing added (within the noise of the warm median): "0" */
        if (storage && storage->ttft_s - warm > 0)
            snprintf(added_vs, sizeof added_vs, added > 0 ? "1/%.1f" : "0",
                     (storage->ttft_s - warm) / added);
        char io[40] = "-", dec[40] = "-";
        if (x->st.restore_bytes_io)
            snprintf(io, sizeof io, "%s %.0f ms", rb_cli_bytes(x->st.restore_bytes_io, b2,
                     sizeof b2), x->st.restore_io_s * 1e3);
        if (x->st.restore_bytes_decoded)
            snprintf(dec, sizeof dec, "%s %.0f ms", rb_cli_bytes(x->st.restore_bytes_decoded,
                     b3, sizeof b3), x->st.restore_decode_s * 1e3);
        char note[700];
        if (x->n_compared && x->max_logit_diff > 0)
            snprintf(note, sizeof note, "top-1 %d/%d of the turn as warm, max |dlogit| %.3g",
                     x->n_agree, x->n_compared, x->max_logit_diff);
        else if (x->n_compared)
            snprintf(note, sizeof note, "logits identical to warm%s%s",
                     x->st.restore_recomputed_tokens ? "; recomputed " : "",
                     x->st.restore_recomputed_tokens ? "context" : "");
        else
            snprintf(note, sizeof note, "%s", x->note);
        printf("%-11s %10.1f %8.2f %9s %10.1f %10s %10s %19s %19s %8.1f  %s\n", x->name,
               x->ttft_s * 1e3, x->ttft_s / warm, vs_storage, added * 1e3, added_vs,
               rb_cli_bytes(x->freed_bytes, b4, sizeof b4), io, dec,
               x->st.restore_wait_s * 1e3, note);
    }
    printf("\nx warm / x storage: TTFT ratios; added: TTFT - warm; vs storage: the added "
           "latency as a fraction of storage's\n");
    if (!su->is_cgroup)
        return;
    static const char *LEVEL[] = {"-", "background", "moderate", "complete"};
    printf("\nwhat the kernel did (the competing process grows to the cgroup's limit) and what "
           "rebound did:\n%-11s %8s %6s %11s %14s %10s %9s %12s\n", "strategy", "signals",
           "trims", "max level", "competitor", "OOM kills", "failcnt", "max usage");
    for (int i = 0; i < n; i++) {
        const sw_result *x = &r[i];
        if (!x->ran || !strcmp(x->name, "kill"))
            continue;
        char hb[32], mu[32];
        printf("%-11s %8" PRIu64 " %6d %11s %9s %4s %10" PRIu64 " %9" PRIu64 " %12s\n",
               x->name, x->n_kernel_events, x->n_trims,
               LEVEL[x->max_trim_level >= 0 && x->max_trim_level <= 3 ? x->max_trim_level : 0],
               rb_cli_bytes(x->hog_bytes, hb, sizeof hb), x->hog_oom_killed ? "oom" : "held",
               x->cg_oom_kills, x->cg_failcnt, rb_cli_bytes(x->cg_max_usage, mu, sizeof mu));
    }
}

int sw_write_json(const char *path, const sw_setup *su, const sw_result *r, int n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\n  \"model\": \"%s\", \"model_path\": \"%s\", \"device\": \"%s\", "
            "\"trim\": \"%s\", \"pressure\": \"%s\",\n", su->model_name, su->model_path,
            su->device, su->trim_spec, su->pressure);
    fprintf(f, "  \"machine\": \"%s\", \"spill\": \"%s\", \"context_tokens\": %" PRIu32
            ", \"turn_tokens\": %" PRIu32 ",\n", su->machine, su->storage_io, su->n_ctx_tokens,
            su->n_turn);
    fprintf(f, "  \"build_s\": %.6f, \"warm_ttft_s\": %.6f, \"kv_bytes\": %" PRIu64 ",\n",
            su->build_s, su->warm_ttft_s, su->kv_bytes);
    fprintf(f, "  \"strategies\": [\n");
    for (int i = 0; i < n; i++) {
        const sw_result *x = &r[i];
        const rb_session_stats *s = &x->st;
        fprintf(f, "    {\"name\": \"%s\", \"ran\": %s, \"note\": \"%s\", \"ttft_s\": %.6f, "
                "\"trim_s\": %.6f, \"freed_bytes\": %" PRIu64 ", \"held_bytes\": %" PRIu64 ",\n",
                x->name, x->ran ? "true" : "false", x->note, x->ttft_s, x->trim_s,
                x->freed_bytes, x->held_bytes);
        fprintf(f, "     \"restore_io_s\": %.6f, \"restore_decode_s\": %.6f, \"restore_wait_s\": "
                "%.6f, \"restore_bytes_io\": %" PRIu64 ", \"restore_bytes_decoded\": %" PRIu64
                ", \"recomputed_tokens\": %" PRIu32 ",\n", s->restore_io_s, s->restore_decode_s,
                s->restore_wait_s, s->restore_bytes_io, s->restore_bytes_decoded,
                s->restore_recomputed_tokens);
        fprintf(f, "     \"decode_bytes_per_s\": %.0f, \"storage_bytes_per_s\": %.0f, "
                "\"top1_agree\": %d, \"compared\": %d, \"max_logit_diff\": %.6g,\n",
                s->decode_bytes_per_s, s->storage_bytes_per_s, x->n_agree, x->n_compared,
                x->max_logit_diff);
        if (x->cold_read_bytes)
            fprintf(f, "     \"cold_read_bytes\": %" PRIu64 ", \"io_floor_s\": %.6f, "
                    "\"disk_bytes_per_s_before\": %.0f, \"disk_bytes_per_s_after\": %.0f, "
                    "\"disk_floor_s\": %.6f, \"bare_read_bytes_per_s\": %.0f, "
                    "\"bare_floor_s\": %.6f, \"host_reclaims_free_memory\": %d,\n",
                    x->cold_read_bytes, x->io_floor_s, x->disk_bw_before, x->disk_bw_after,
                    x->disk_floor_s, x->bare_bw, x->bare_floor_s, x->host_reclaims_memory);
        fprintf(f, "     \"kernel_signals\": %" PRIu64 ", \"trims\": %d, \"max_trim_level\": %d, "
                "\"competitor_bytes\": %" PRIu64 ", \"competitor_oom_killed\": %d, "
                "\"cgroup_failcnt\": %" PRIu64 ", \"cgroup_oom_kills\": %" PRIu64
                ", \"cgroup_max_usage\": %" PRIu64 ",\n", x->n_kernel_events, x->n_trims,
                x->max_trim_level, x->hog_bytes, x->hog_oom_killed, x->cg_failcnt,
                x->cg_oom_kills, x->cg_max_usage);
        fprintf(f, "     \"events\": [");
        for (size_t e = 0; e < x->n_ev; e++)
            fprintf(f, "%s[%d, %" PRIu32 ", %.6f, %.6f]", e ? ", " : "", (int)x->ev[e].kind,
                    x->ev[e].layer, x->ev[e].start_s, x->ev[e].end_s);
        fprintf(f, "]}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ],\n  \"event_kinds\": [\"restore_io\", \"restore_decode\", \"compute\", "
            "\"wait\"]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- the timeline ---------------------------------------------------------- */

static const char *COLOR[4] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759"};
static const char *LABEL[4] = {"restore: storage read", "restore: RAM-tier decode",
                               "compute", "forward pass waits"};

int sw_write_svg(const char *path, const sw_setup *su, const sw_result *r, int n)
{
    const double W = 980, left = 70, right = 20, row_h = 9;
    uint32_t n_layers = 1;
    for (int i = 0; i < n; i++)
        for (size_t e = 0; e < r[i].n_ev; e++)
            if (r[i].ev[e].layer + 1 > n_layers)
                n_layers = r[i].ev[e].layer + 1;
    /* each panel on its own time scale (a recompute takes seconds, a
       restore milliseconds: one scale would hide the overlap); the warm
       TTFT mark makes them comparable */
    double panel_h = 34 + n_layers * row_h + 26;
    double H = 70 + panel_h * n + 40;
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"10\" y=\"20\" font-size=\"14\">rebound switch: %s, %" PRIu32
            " tokens + %" PRIu32 "-token turn, trim %s, device %s</text>\n", su->model_name,
            su->n_ctx_tokens, su->n_turn, su->trim_spec, su->device);
    for (int k = 0; k < 4; k++)
        fprintf(f, "<rect x=\"%.0f\" y=\"32\" width=\"12\" height=\"10\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"41\">%s</text>\n", 10 + k * 200.0, COLOR[k],
                26 + k * 200.0, LABEL[k]);
    double y0 = 60;
    const double plot_w = W - left - right;
    for (int i = 0; i < n; i++, y0 += panel_h) {
        const sw_result *x = &r[i];
        fprintf(f, "<text x=\"10\" y=\"%.0f\" font-size=\"12\" font-weight=\"bold\">%s</text>",
                y0 + 16, x->name);
        if (!x->ran) {
            fprintf(f, "<text x=\"120\" y=\"%.0f\">%s</text>\n", y0 + 16, x->note);
            continue;
        }
        fprintf(f, "<text x=\"120\" y=\"%.0f\">TTFT %.1f ms (warm %.1f ms)%s</text>\n", y0 + 16,
                x->ttft_s * 1e3, su->warm_ttft_s * 1e3,
                x->n_ev ? "" : " - no timeline: a separate process");
        double t_max = (x->ttft_s > su->warm_ttft_s ? x->ttft_s : su->warm_ttft_s) * 1.04;
        for (size_t e = 0; e < x->n_ev; e++)
            t_max = x->ev[e].end_s > t_max ? x->ev[e].end_s : t_max;
        double top = y0 + 26;
        /* layer labels and the time axis */
        for (uint32_t l = 0; l < n_layers; l += (n_layers > 16 ? 4 : 1))
            fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\" font-size=\"8\">L%"
                    PRIu32 "</text>", left - 4, top + l * row_h + 7, l);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#999\"/>\n",
                left, top + n_layers * row_h + 2, W - right, top + n_layers * row_h + 2);
        for (int tick = 0; tick <= 5; tick++) {
            double t = t_max * tick / 5;
            fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" font-size=\"9\">"
                    "%.0f ms</text>", left + plot_w * tick / 5, top + n_layers * row_h + 14,
                    t * 1e3);
        }
        /* warm TTFT and this TTFT as vertical marks */
        double xw = left + plot_w * su->warm_ttft_s / t_max;
        double xt = left + plot_w * (x->ttft_s < t_max ? x->ttft_s : t_max) / t_max;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#59a14f\" "
                "stroke-dasharray=\"3,2\"/>", xw, top - 2, xw, top + n_layers * row_h);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"black\"/>\n",
                xt, top - 2, xt, top + n_layers * row_h);
        for (size_t e = 0; e < x->n_ev; e++) {
            const rb_restore_event *ev = &x->ev[e];
            if ((int)ev->kind < 0 || ev->kind > 3 || ev->start_s > t_max)
                continue;
            double x0 = left + plot_w * ev->start_s / t_max;
            double x1 = left + plot_w * (ev->end_s < t_max ? ev->end_s : t_max) / t_max;
            double w = x1 - x0 < 0.6 ? 0.6 : x1 - x0;
            /* storage on the upper half of the row, decode on the lower,
               compute and waits across it */
            double y = top + ev->layer * row_h, h = row_h - 1;
            if (ev->kind == RB_EVENT_RESTORE_IO) h = (row_h - 1) / 2;
            if (ev->kind == RB_EVENT_RESTORE_DECODE) { y += (row_h - 1) / 2; h = (row_h - 1) / 2; }
            fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>",
                    x0, y, w, h, COLOR[ev->kind]);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "<text x=\"10\" y=\"%.0f\" fill=\"#555\">dashed green: warm TTFT; black: this "
            "strategy's TTFT; machine: %s</text>\n", H - 14, su->machine);
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}
