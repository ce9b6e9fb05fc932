/*
 * store.h - the STORED tier: one spill file of segments keyed by a
 * caller-chosen 64-bit id, each written with a checksum, read back straight
 * into the caller's buffer, and timed like the device being emulated.
 *
 * The residency manager puts a KV page here when it evicts it to storage
 * and gets it back when it restores it. The store knows bytes and ids, not
 * layers, pages or tiers; it decides nothing about what to spill.
 *
 * The file: created in a directory (default $TMPDIR, else /tmp) and
 * unlinked right after it is opened, so nothing is left behind even when
 * the process is killed: the store keeps the descriptor and the kernel frees
 * the blocks when it is closed. A spill is therefore only good for the life
 * of the process (a spill is a cache of what the session tokens can
 * rebuild, never the only copy).
 *
 * Page-cache bypass: the file is opened with O_DIRECT, so that a restore
 * really reads the device (on the host the page cache would otherwise serve
 * it from RAM, and RAM is what was being freed). O_DIRECT needs buffers,
 * lengths and offsets aligned (rb_store_align(), 4096 or the file system's
 * larger figure): an aligned caller buffer is transferred with no copy, an
 * unaligned one through an internal aligned bounce buffer. Where O_DIRECT is
 * refused (EINVAL at open), the store falls back to buffered I/O and drops
 * the written and read ranges from the page cache
 * (sync_file_range + posix_fadvise(DONTNEED)), and rb_store_io_mode() says
 * so.
 *
 * Threads: one rb_store may be used by several threads at once: put, get,
 * drop, has, len and stats of DIFFERENT ids may run concurrently (an I/O
 * worker restores while the main thread trims). A mutex guards the index;
 * the I/O itself runs outside it, so two gets proceed in parallel. The same
 * id must not be used by two calls at once when one of them is a put or a
 * drop (a get racing a replace or a drop of its id may read a reused slot:
 * it would then fail its checksum, but that is a caller bug, not a
 * supported mode); serialising per id is the caller's job (residency does
 * it by segment state). open and close must not race with anything.
 *
 * Errors: messages start with "store: " and name the segment (0x%016llx),
 * the path, the offset and errno's text as they apply.
 */
#ifndef RB_STORE_H
#define RB_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "os.h"
#include "rebound.h"
#include "throttle.h"

typedef struct rb_store rb_store;

typedef struct rb_store_params {
    const char *dir;          /* where the spill file is created; NULL or
                                 "": $TMPDIR, else /tmp. Copied at open. */
    double bw_bytes_per_s;    /* throttle bandwidth (0 = unlimited) */
    double latency_s;         /* throttle latency per I/O (0 = none);
                                 both 0 = the host as is */
    rb_throttle *throttle;    /* optional: a throttle shared with other
                                 users of the same emulated device (e.g. the
                                 weight cache); when set, bw and latency are
                                 ignored. Borrowed: must outlive the store. */
    const rb_os *os;          /* NULL = rb_os_default(); borrowed, must
                                 outlive the store */
    int is_no_direct;         /* nonzero: do not try O_DIRECT (buffered +
                                 fadvise from the start); for comparisons */
} rb_store_params;

typedef struct rb_store_stats {
    uint64_t n_segments;      /* ids held */
    uint64_t held_bytes;      /* sum of the held segments' lengths */
    uint64_t slot_bytes;      /* sum of their slots (lengths rounded up) */
    uint64_t file_bytes;      /* high-water end of the file's slots */
    uint64_t free_bytes;      /* freed slots awaiting reuse */
    uint64_t n_puts, n_gets;  /* successful calls */
    uint64_t written_bytes;   /* bytes sent to the file (slot-rounded) */
    uint64_t read_bytes;      /* bytes read from the file (slot-rounded) */
    uint64_t n_bounced;       /* puts/gets that went through the bounce buffer */
    uint64_t n_io_errors;     /* failed reads or writes (incl. ENOSPC) */
    uint64_t n_checksum_errors;
    double io_s;              /* wall time inside put/get I/O incl. throttle
                                 sleep, summed over threads */
    rb_throttle_stats throttle; /* of the store's throttle (shared: all users) */
} rb_store_stats;

/* Defaults: dir NULL ($TMPDIR or /tmp), unthrottled, default os table,
 * O_DIRECT tried. */
rb_store_params rb_store_default_params(void);

/*
 * Creates and opens a new, empty spill file in p->dir and unlinks it at
 * once. p may be NULL (defaults).
 * out   receives the handle on success; unchanged on failure.
 * Errors: RB_E_IO (the directory is missing or not writable, open or unlink
 *         failed: the message names the path and errno), RB_E_INVALID_ARG
 *         (throttle parameters out of range), RB_E_NOMEM. On failure no file
 *         is left behind, unless the unlink itself failed (then the message
 *         names the file that remains).
 */
rb_status rb_store_open(const rb_store_params *p, rb_store **out, rb_error *err);

/* Closes the file (its blocks are freed: it was unlinked at open) and
 * frees the index. Every segment is gone. NULL is a no-op. No other call
 * on s may be running. */
void rb_store_close(rb_store *s);

/*
 * Writes len bytes of buf as segment id, replacing any earlier copy of id,
 * and records offset, length and a 64-bit checksum (rb_kvcodec_hash64) in
 * the in-RAM index. The bytes are on the device (O_DIRECT) or at least
 * written back and dropped from the page cache (fallback) when it returns;
 * it does not fsync: the file does not outlive the process, so a power cut
 * loses nothing that matters.
 * buf: read only, borrowed for the call. No copy when buf is
 *      rb_store_align()-aligned and len a multiple of it (or in buffered
 *      mode); an unaligned buf or a ragged tail goes through the bounce
 *      buffer. len may be 0.
 * Replacement writes a new slot and switches the index only once the write
 * has succeeded, so on ANY failure the earlier copy of id stays readable
 * and unchanged, and an id that was absent stays absent.
 * Errors: RB_E_IO (write error; ENOSPC for a full disk: "store: segment
 *         0x...: write of N bytes at offset O: No space left on device"),
 *         RB_E_INVALID_ARG (buf NULL with len > 0), RB_E_NOMEM (index or
 *         bounce buffer).
 */
rb_status rb_store_put(rb_store *s, uint64_t id, const void *buf, size_t len,
                       rb_error *err);

/*
 * Reads segment id into buf (len bytes, which must equal the length it was
 * put with) and verifies its checksum. buf is the final destination: when
 * aligned, the device writes into it directly. The segment stays in the
 * store (drop it when it is no longer wanted).
 * On failure buf's contents are unspecified and the segment is kept as is:
 * the caller decides (residency rebuilds from the tokens and drops it).
 * Errors: RB_E_NOT_FOUND (no such id), RB_E_INVALID_ARG (len differs from
 *         the stored length, or buf NULL with len > 0), RB_E_FORMAT
 *         ("store: segment 0x...: checksum mismatch (stored 0x..., read
 *         0x...)"), RB_E_IO (read error, or the file ends before the
 *         segment), RB_E_NOMEM (bounce buffer).
 */
rb_status rb_store_get(rb_store *s, uint64_t id, void *buf, size_t len, rb_error *err);

/* Forgets id and frees its slot for reuse by a segment of the same rounded
 * size. Unknown ids are ignored. Never fails, does no I/O. */
void rb_store_drop(rb_store *s, uint64_t id);

/* 1 if id is held, else 0. */
int rb_store_has(const rb_store *s, uint64_t id);

/* Length id was put with in *len_out. RB_E_NOT_FOUND (and *len_out
 * unchanged) when id is not held; no message: the caller knows the id. */
rb_status rb_store_len(const rb_store *s, uint64_t id, size_t *len_out);

/* How the file is accessed, for reports: "O_DIRECT (ext4)" or "buffered +
 * fadvise(DONTNEED) (O_DIRECT refused by tmpfs: Invalid argument)". A
 * RAM-backed file system is flagged ("...; tmpfs is RAM: reads do not
 * touch a device"). Lives as long as s. */
const char *rb_store_io_mode(const rb_store *s);

/* 1 when the file is opened with O_DIRECT, else 0. */
int rb_store_is_direct(const rb_store *s);

/* The alignment that makes put/get copy-free (4096, or more if the file
 * system asks for more); 1 in buffered mode. */
size_t rb_store_align(const rb_store *s);
/* RAM the store holds: its index and its cached bounce buffer. */
uint64_t rb_store_ram_bytes(rb_store *s);

/* A snapshot of the counters (taken under the index mutex). */
void rb_store_get_stats(const rb_store *s, rb_store_stats *out);

#endif /* RB_STORE_H */
