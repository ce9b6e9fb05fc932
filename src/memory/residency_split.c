/*
 * residency_split.c - the restore path of each trimmed KV page (the rule is
 * in residency_split.h).
 *
 * Pages arrive in trim order (last layer first); the restore reads them in
 * layer order, so the walk goes backwards through the array, layer by
 * layer, keeping the predicted finish time of each path: S for storage
 * (released weights first, then the stored pages, in layer order) and C
 * for the decode worker. A layer's deadline is layer * compute per layer:
 * the time the forward pass gets there if it never waits.
 */
#include "residency_split.h"

uint64_t rb_split_assign(const rb_split_params *p, rb_split_page *pages, uint32_t n)
{
    const double pb = p->page_bytes, R = p->R, D = p->D;
    const double fc = pb * (1.0 - p->frame_frac); /* a compressed page frees */
    double S = 0, C = 0, freed = 0;
    uint32_t k = n; /* pages[k..n) are done; they hold layers below the next */
    for (uint32_t l = 0; l < p->n_layers; l++) {
        if (p->weights_bytes)
            S += p->weights_bytes[l] / R;
        const double deadline = (double)l * p->layer_compute_s;
        /* this layer's pages: the run just before pages[k] */
        uint32_t hi = k;
        while (k > 0 && pages[k - 1].layer == l)
            k--;
        for (uint32_t i = k; i < hi; i++) {
            rb_split_page *pg = &pages[i];
            const double end_s = S + pb / R + p->latency_s, end_c = C + pb / D;
            int store;
            if (pg->saved || (p->layer_compute_s > 0 && end_s <= deadline))
                store = 1;
            else if (!p->by_bytes)
                store = end_s < end_c;
            else {
                /* the later path per byte freed, with this page on each */
                double ms_c = end_c > S ? end_c : S, ms_s = end_s > C ? end_s : C;
                store = fc <= 0 || ms_s * (freed + fc) < ms_c * (freed + pb);
            }
            pg->to_store = (uint8_t)store;
            if (store) {
                S = end_s;
                freed += pb;
            } else {
                C = end_c;
                freed += fc;
            }
        }
    }
    return (uint64_t)freed;
}
