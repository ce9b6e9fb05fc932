/* SPDX-License-Identifier: MIT */
/*
 * rebound_experimental.h - research and benchmark knobs of librebound.
 *
 * What an app does not need and a researcher reproducing the memory
 * experiments does: an emulated storage device (so that a host's NVMe disk
 * behaves like a phone's UFS or a watch's eMMC), the tier split's rates
 * fixed instead of measured, and the baselines rebound is measured against
 * (storage offloading that reads everything back before compute; the
 * kernel's zRAM codecs). These may change between minor versions; the
 * conventions of rebound.h hold.
 */
#ifndef REBOUND_EXPERIMENTAL_H
#define REBOUND_EXPERIMENTAL_H

#include "rebound.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The storage-offload baseline (rb_session_params.restore): every trimmed
 * page to storage, read back completely before compute. */
#define RB_RESTORE_EAGER ((rb_restore_mode)1)

/* The zRAM baselines (rb_session_params.ram_codec): lz4 / zstd -1 on the
 * raw KV bytes, RAM only (nothing spilled). Present when the build found
 * the libraries, else rb_session_create and rb_session_set_restore fail
 * with RB_E_UNSUPPORTED. */
#define RB_RAM_CODEC_LZ4 ((rb_ram_codec)2)
#define RB_RAM_CODEC_ZSTD ((rb_ram_codec)3)

/* rb_session_params.experimental points to one of these (copied at
 * creation); rb_experimental_default_params() gives the defaults. */
typedef struct rb_experimental_params {
    const char *device;         /* emulated storage: "phone" (UFS 4.0, 1000
                                   MiB/s), "watch" (eMMC, 100 MiB/s), "host"
                                   (the disk as it is, unthrottled: the
                                   default); every storage read and write
                                   of the session is throttled to it */
    double decode_bytes_per_s;  /* D of the tier split; 0: measured */
    double storage_bytes_per_s; /* R of the tier split; 0: the device's
                                   bandwidth, or measured on "host" */
} rb_experimental_params;

RB_API rb_experimental_params rb_experimental_default_params(void);

/*
 * Decodes one token in each of n sessions of one model in one forward
 * pass: tokens[i] is appended to sessions[i] and computed, each weight
 * read once for all of them (in groups of the smallest n_batch of the
 * set). Each session ends exactly as rb_session_feed(sessions[i],
 * &tokens[i], 1, NULL) would leave it: the same logits bit for bit (the
 * forward pass computes each row by the same operations whatever the
 * number of rows), its evicted context restored, its file committed, its
 * budget enforced. A session whose restore stops the shared pass, or finds
 * damaged pages, completes its feed alone.
 * Errors: RB_E_INVALID_ARG (NULL arguments, a session given twice,
 * sessions of different models or thread counts, a token outside the
 * vocabulary: then no session changed), RB_E_BUDGET (a session's context
 * is full: no session changed), RB_E_UNSUPPORTED (a session streams its
 * weights under a budget: feed it alone); after the pass, a session's own
 * feed error (RB_E_NOMEM, RB_E_IO, RB_E_FORMAT): that session is as a
 * failed rb_session_feed leaves it, the others are fed. The message in
 * err names the session's index (its own rb_session_errmsg has its part).
 * Threads: the caller must be the only user of all n sessions for the
 * call; the pass runs on the thread pool of one of them.
 * Cost: one forward pass per group; per call, one allocation of the feeds'
 * state and the group's logits (n_batch x n_vocab floats at most).
 */
RB_API rb_status rb_session_decode_multi(rb_session **sessions, const int32_t *tokens,
                                         size_t n, rb_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REBOUND_EXPERIMENTAL_H */
