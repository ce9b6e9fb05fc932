/*
 * residency_split.h - which restore path each trimmed KV page takes.
 *
 * A trimmed page comes back either from storage (the I/O workers read it:
 * they wait on the device and take almost no CPU) or from the compressed
 * RAM tier (the decode worker decodes it: CPU). The restore runs in layer
 * order while the forward pass computes, and the forward pass only waits
 * for a layer that is not back when it gets there. So:
 *
 *  - a page goes to storage when the storage path delivers it before the
 *    forward pass reaches its layer (layer * the next feed's compute per
 *    layer): it then costs the turn nothing, while decoding it would take
 *    CPU from the forward pass (on a phone's few big cores, or this 2-core
 *    machine, the forward pass fills them);
 *  - the pages storage cannot deliver in time take the path that has them
 *    back first: for a level, the path whose predicted finish time with
 *    this page is smaller, so the two paths finish together (the D/(D+R)
 *    split); for a byte count, the path with the smaller predicted restore
 *    time per byte freed (a compressed page frees only what the codec
 *    saves).
 *
 * With the compute per layer unknown (0: no feed measured yet) every page
 * takes the second rule, the split of the paper's design.
 */
#ifndef RB_RESIDENCY_SPLIT_H
#define RB_RESIDENCY_SPLIT_H

#include <stdint.h>

typedef struct rb_split_page {
    uint32_t layer;
    uint8_t saved;    /* already in the session file: storage, no write */
    uint8_t to_store; /* out: 1 storage, 0 the compressed tier */
} rb_split_page;

typedef struct rb_split_params {
    double R;               /* storage read bytes/s (> 0) */
    double D;               /* decode bytes/s of the compressed tier (> 0) */
    double latency_s;       /* per storage I/O */
    double page_bytes;
    double frame_frac;      /* compressed frame / page bytes */
    double layer_compute_s; /* the next feed's compute per layer; 0: unknown */
    /* per layer: weight bytes the restore reads before the layer's pages
       (released weights; NULL: none) - they share the storage path */
    const double *weights_bytes;
    uint32_t n_layers;
    int by_bytes;           /* a byte count (else a level) */
} rb_split_params;

/* Assigns to_store to pages[0..n) (in trim order: last layer first, each
 * layer's pages in order) walking them in restore order (first layer
 * first). Returns the RAM they free (a stored page all of it, a compressed
 * one page_bytes * (1 - frame_frac)). */
uint64_t rb_split_assign(const rb_split_params *p, rb_split_page *pages, uint32_t n);

#endif
