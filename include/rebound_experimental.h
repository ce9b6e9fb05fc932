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

/* The weight cache's research baselines (rb_session_params.weights_policy,
 * beside "class" and "lru"): "fifo", "clock", "2q", "arc", "lirs", "mru",
 * the policies the class policy is measured against. */

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

#ifdef __cplusplus
}
#endif
#endif /* REBOUND_EXPERIMENTAL_H */
