/*
 * sessfile.h - the session file: a conversation that survives the process.
 *
 * Holds the tokens, a caller blob (sampler state, chat history), the
 * model's fingerprint, and the KV pages of every layer, each with a
 * checksum. Crash-consistent without a journal: two superblocks and two
 * catalog areas alternate, so a commit writes the new catalog where the old
 * one is not, then the superblock that points to it; a kill -9 at any
 * instant leaves the previous or the new state, never a mix.
 *
 * File layout (little-endian; A = 4 KiB):
 *
 *   0        superblock slot 0 (A)   \ the one with the higher sequence
 *   A        superblock slot 1 (A)   / and a good checksum wins
 *   2A       catalog area 0 (C bytes, C a multiple of A)
 *   2A + C   catalog area 1 (C)
 *   2A + 2C  page records, appended, each page_alloc bytes (A-aligned)
 *
 *   superblock: "RBSESS01" | u64 seq | u64 model fingerprint | u32 n_layers
 *     | u32 n_kv_heads | u32 head_dim_k | u32 head_dim_v | u32 page_tokens
 *     | u32 pages_per_layer | u64 page_bytes | u64 catalog area bytes C
 *     | u32 active area | u32 0 | u64 catalog bytes | u64 catalog hash
 *     | u64 data end | u64 hash of the bytes before it
 *   catalog: u64 n_tokens | i32 tokens[n_tokens] | per (layer, page):
 *     u64 offset (0: none) | u64 hash | u32 tokens held | u32 flags |
 *     u32 blob bytes | blob [| "RBPF" | u32 prefix tokens]
 *
 *   flags 1: the page's record is in the prefix file (offset 0 here; the
 *   prefix file's catalog holds it, under the same hash). A prefix file
 *   is a session file of the first N tokens of conversations that share
 *   them, FOLDER/.rbprefix-KEY-N, written once and never changed; each
 *   file that uses it holds a hard link to it at path.base (the link
 *   count is its reference count). Without the prefix file (not copied
 *   along, say) those pages are lost pages: recomputed from the tokens.
 *
 *   (the u32 after "active area" is the -c the file was saved with, 0 in
 *   files written before it was kept)
 *
 * Page records are written with O_DIRECT straight from the page buffers
 * (bypassing the page cache, as the spill store) and read back the same
 * way through the storage throttle, a cold restore too: never mapped, so
 * that a file cut by another program under a running session is a read
 * error naming it, not SIGBUS; a new file is written under
 * path.new-PID-K and renamed over path; superblocks and catalogs go through
 * the page cache (small, and kill -9 cannot lose what pwrite returned).
 * fsync only on request (power-loss durability; its cost is measured in
 * the README). A page that has been saved full never changes (positions
 * below the context's end are immutable), so it is written once; the
 * partly filled last page is written when a save asks for it, and an older
 * copy becomes garbage, reclaimed by rb_sessfile_compact.
 *
 * Threads: one thread at a time per handle, except rb_sessfile_read_page
 * and _page_tokens, which restore workers call concurrently, for saved
 * pages only, with at most a commit and its compaction running (a commit
 * writes other pages and entries: a saved page's entry changes only at a
 * rewind's truncate, which waits for the commit and runs between feeds,
 * and at a compaction, which moves every record under the handle's
 * rwlock while those two hold it shared).
 */
#ifndef RB_SESSFILE_H
#define RB_SESSFILE_H

#include <stddef.h>
#include <stdint.h>

#include "os.h"
#include "rebound.h"
#include "throttle.h"

typedef struct rb_sessfile_geom {
    uint32_t n_layers, n_kv_heads, head_dim_k, head_dim_v, page_tokens, pages_per_layer;
    uint64_t page_bytes;     /* K+V of one page */
    uint64_t page_alloc;     /* its buffer size (4 KiB multiple) */
    uint32_t max_blob;       /* room for the caller blob */
    uint32_t n_ctx;          /* tokens the session holds (0: pages x page_tokens) */
    uint32_t n_vocab;        /* token ids must be below it (0: unchecked) */
    int is_lock_wait;        /* not geometry: a file another process holds is
                                waited for (1) or refused (0: RB_E_BUSY) */
} rb_sessfile_geom;

typedef struct rb_sessfile rb_sessfile;

/* Creates a session file for a model of this fingerprint and geometry,
 * empty, under a temporary name (path.new-PID-K, mode 0600): it appears at
 * path only with the first commit after this call, renamed over the file
 * there (locked meanwhile) or linked where none is. A symbolic link at path
 * is followed (its target is replaced), one that leads nowhere refused.
 * throttle may be NULL; os NULL for the default. Errors: RB_E_IO naming
 * the path; RB_E_BUSY (another process holds the file at path: its pid in
 * the message; or, at that first commit, created one at path meanwhile);
 * RB_E_INVALID_ARG (a name too long for the file system). */
rb_status rb_sessfile_create(const char *path, uint64_t fingerprint, const rb_sessfile_geom *g,
                             const rb_os *os, rb_throttle *throttle, rb_sessfile **out,
                             rb_error *err);

/*
 * Opens an existing session file and takes its writer lock (an OFD lock,
 * held until close; a dead holder's lock is gone with it). Picks the
 * newest superblock whose checksum, catalog and bounds check out (a
 * damaged newest one falls back to the other: rb_sessfile_recovery says
 * so). Every field is checked against the file's size and this geometry
 * before use: superblock (catalog area, data end), catalog (token count
 * against the context, token ids against n_vocab, page records inside the
 * data and the tokens). Errors: RB_E_NOT_FOUND (no file), RB_E_BUSY
 * (another process holds it: its pid in the message), RB_E_FORMAT (not a
 * session file, both states damaged, or a token outside the vocabulary:
 * the message says what), RB_E_UNSUPPORTED (saved with another context
 * length, or more tokens than n_ctx: the message says which n_ctx opens it),
 * RB_E_INVALID_ARG (written for another model: its dimensions or
 * fingerprints in the message). fingerprint NULL: the model is not
 * checked here (a cold start reads pages while it computes the model's
 * fingerprint) - rb_sessfile_check_model must then follow.
 */
rb_status rb_sessfile_open(const char *path, const uint64_t *fingerprint,
                           const rb_sessfile_geom *g, const rb_os *os, rb_throttle *throttle,
                           rb_sessfile **out, rb_error *err);
/* rb_sessfile_open of the file open at fd, for reading only: the handle
 * keeps a duplicate of fd (the caller keeps fd); nothing is ever written,
 * locked or removed (no commit may follow: the caller reads the state and
 * closes it). name: the file in messages. */
rb_status rb_sessfile_open_fd(int fd, const char *name, const uint64_t *fingerprint,
                              const rb_sessfile_geom *g, const rb_os *os, rb_throttle *throttle,
                              rb_sessfile **out, rb_error *err);
/* The tokens per KV page of the file at path (fd >= 0: the file open at
 * fd, read with pread; path then only names it), from its newest readable
 * superblock: 0 when neither superblock reads back whole (the open that
 * follows says why). Lets a session adopt the page size a file was saved
 * with. Reads 8 KiB; opens nothing else. */
uint32_t rb_sessfile_peek_page_tokens(const char *path, int fd, const rb_os *os);
/* RB_OK, or RB_E_INVALID_ARG when the file was written for another model. */
rb_status rb_sessfile_check_model(const rb_sessfile *f, uint64_t fingerprint, rb_error *err);
void rb_sessfile_close(rb_sessfile *f);

/* NULL when the open found the newest state; else why it fell back to an
 * older one (or found a superblock damaged), and *lost_tokens (may be
 * NULL) the tokens the newer state claimed beyond it (0: unknown). */
const char *rb_sessfile_recovery(const rb_sessfile *f, uint64_t *lost_tokens);

/* The committed state. Tokens and blob live until the next commit. */
size_t rb_sessfile_n_tokens(const rb_sessfile *f);
const int32_t *rb_sessfile_tokens(const rb_sessfile *f);
const void *rb_sessfile_blob(const rb_sessfile *f, size_t *n);
/* Tokens a saved page holds (0: not saved). */
uint32_t rb_sessfile_page_tokens(const rb_sessfile *f, uint32_t layer, uint32_t page);

/* The checksum of a saved page's K/V bytes (0 when not saved). */
uint64_t rb_sessfile_page_hash(const rb_sessfile *f, uint32_t layer, uint32_t page);

/* Reads a saved page into buf (page_alloc bytes, 4 KiB aligned) and
 * checks its checksum. RB_E_NOT_FOUND (not saved), RB_E_FORMAT (checksum,
 * naming layer and page), RB_E_IO / RB_E_SHORT_READ (file cut short). */
/* Reads pages page0 .. page0 + n - 1 of a layer into bufs[i] (each
 * page_alloc bytes, 4 KiB aligned) with one request per run of records
 * that lie side by side in one file (a commit appends a layer's pages in
 * order; a fork's first pages are a run in its prefix file, the rest one
 * in its own), and checks each checksum. RB_OK: all n read and checked;
 * RB_E_UNSUPPORTED: a page not saved, or a file opened through another
 * rb_os than the default (its reads are the test's to fail one by one),
 * nothing read; any other status: something failed, and the caller reads
 * the pages one by one with rb_sessfile_read_page, whose message names
 * the page. */
rb_status rb_sessfile_read_pages(rb_sessfile *f, uint32_t layer, uint32_t page0, uint32_t n,
                                 void *const *bufs, rb_error *err);
rb_status rb_sessfile_read_page(rb_sessfile *f, uint32_t layer, uint32_t page, void *buf,
                                rb_error *err);
/*
 * Where a commit takes page contents from. get() returns the buffer of
 * (layer, page) (page_alloc bytes, 4 KiB aligned) and keeps it unchanged
 * until the matching put(), or NULL when the page is not in RAM now (its
 * saved copy is left as it was). get and put run on the committing thread;
 * NULL source: no pages are written.
 */
typedef struct rb_sessfile_source {
    const void *(*get)(void *ctx, uint32_t layer, uint32_t page);
    void (*put)(void *ctx, uint32_t layer, uint32_t page);
    void *ctx;
} rb_sessfile_source;

/* A source over a plain slot table ([n_layers][pages_per_layer], NULL = not
 * in RAM) that nothing changes during the commit; the table struct must
 * outlive the commit. */
typedef struct rb_sessfile_slot_table {
    void *const *slots;
    uint32_t pages_per_layer;
} rb_sessfile_slot_table;
rb_sessfile_source rb_sessfile_slots(const rb_sessfile_slot_table *t);

/*
 * Commits: writes every page the source has that holds more tokens than
 * its saved copy - full pages always, the last partial page only when
 * with_tail - then the tokens and blob into the inactive catalog area,
 * then the superblock. fsync: fdatasync before and after the superblock.
 * *pages_written receives the pages written (may be NULL).
 * Errors: RB_E_IO (disk full: the previous state stays the file's state),
 * RB_E_INVALID_ARG (more tokens than the catalog holds, blob too large),
 * RB_E_FORMAT (a crafted file whose sequence number is UINT64_MAX: no
 * later state could win over it; the state stays).
 * Threads: the caller's, or the session's storage worker; concurrent with
 * rb_sessfile_read_page of pages it does not write (a restore).
 */
rb_status rb_sessfile_commit(rb_sessfile *f, const int32_t *tokens, size_t n_tokens,
                             const rb_sessfile_source *src, int with_tail, const void *blob,
                             size_t blob_n, int fsync, uint32_t *pages_written, rb_error *err);

/*
 * rb_sessfile_commit, where the caller says that the pages of tokens
 * [0, n_shared) are shared with other sessions (a fork's): at a file's
 * first commit of them, the prefix file of those tokens (FOLDER/.rbprefix-
 * KEY-N, a session file of only them, written once and never changed) is
 * found in the file's folder, or written there from src, and path.base is
 * a hard link to it; the catalog then names the prefix file's records for
 * every page whose checksum is its own, and writes only the rest. So K
 * conversations sharing a prompt hold it once on storage. A failure there
 * (no room, another file under the name) only writes the pages here.
 */
rb_status rb_sessfile_commit_shared(rb_sessfile *f, const int32_t *tokens, size_t n_tokens,
                                    size_t n_shared, const rb_sessfile_source *src,
                                    int with_tail, const void *blob, size_t blob_n,
                                    int do_fsync, uint32_t *pages_written, rb_error *err);
/* Pages whose record is in the file's prefix file. */
size_t rb_sessfile_base_pages(const rb_sessfile *f);

/*
 * Removes the session file at path, its link to a prefix file (path.base),
 * and each prefix file of that folder that no file links to any more (and
 * a link whose file is gone: what a kill between the two left). RB_OK also
 * when there was no file; RB_E_IO naming what could not be removed.
 */
rb_status rb_sessfile_remove(const char *path, rb_error *err);

/*
 * Reclaims the garbage (older copies of rewritten last pages, pages of
 * rewound positions) once it exceeds the live page records (or a page per
 * layer, when they are fewer): the live records and the committed state
 * are written to a new file that is renamed over the old one. So a file's
 * data stays within twice its live KV, plus the two catalog areas. Same
 * writer lock, same state; a kill leaves the old file or the new one
 * (and, before the rename, a FILE.new-PID-K that the next open removes).
 * RB_OK also when nothing was done. Errors: RB_E_IO (the file stays as it
 * was). Threads: the committing thread, after a commit (no other commit
 * runs); rb_sessfile_read_page and _page_tokens may run meanwhile.
 */
rb_status rb_sessfile_compact(rb_sessfile *f, int fsync, rb_error *err);

/* Forgets saved pages holding positions >= n_tokens (a rewind): they are
 * rewritten by later commits. The page the cut falls in keeps its record
 * for the positions before the cut (a restore reads it whole; a later
 * commit writes it again once it holds more). The file changes at the
 * next commit. */
void rb_sessfile_truncate(rb_sessfile *f, size_t n_tokens);

#endif
