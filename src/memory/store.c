/*
 * store.c - the spill file behind the STORED tier (contract in store.h).
 *
 * Does: keep segments (id -> bytes) in one unlinked file, each in a slot
 * of its length rounded up to the alignment unit; check each with a 64-bit
 * checksum on the way back; bypass the page cache (O_DIRECT, or buffered
 * I/O whose pages are written back and dropped); charge every transfer to a
 * device throttle. Does not: decide what to spill or when (residency does),
 * keep anything across processes (the file is unlinked at open), fsync
 * (nothing survives a crash by design), compress, or retry a failed write.
 *
 * File layout (slots of one size class are interchangeable; the file is
 * never truncated, so its size is the high-water mark of `end`):
 *
 *   offset 0                                                  end   file size
 *   | slot: seg 0x7  | slot: free   | slot: seg 0x2a | slot:  |      |
 *   | len 262144     | (256 KiB     | len 1000, pad  | in-    | free |
 *   | = 64 x 4 KiB   |  class list) | to 4096 with 0 | flight | tail |
 *   +----------------+--------------+----------------+--------+------+
 *   every slot starts at a multiple of slot_align (4096, or the file
 *   system's larger direct-I/O unit) and is round_up(len) bytes long; in
 *   buffered mode too, so that fadvise ranges cover whole pages and never
 *   a neighbour's. Freeing the slot just below `end` lowers `end`.
 *
 * RAM (all guarded by s->mu):
 *   index     open-addressing hash table id -> {offset, len, slot, checksum},
 *             linear probing, backward-shift deletion (no tombstones);
 *   classes   one LIFO stack of free offsets per slot size: KV pages all
 *             have one size, so a freed page's slot is the next page's;
 *   end       first byte past the last reserved slot.
 *
 * put, step by step (labels in rb_store_put):
 *   1. checksum the caller's bytes (no lock);
 *   2. reserve a slot: a free one of the same size, else at `end` (lock);
 *   3. write the slot, then the throttle (no lock: other threads go on);
 *   4. on failure: give the slot back (lock); the index is untouched, so an
 *      earlier copy of the id is still there and still readable;
 *   5. on success: point the index at the new slot, free the old one (lock).
 *
 * Invariants (under s->mu): every slot in the index or a free list lies in
 * [0, end) and starts at a multiple of slot_align; no two of them overlap;
 * a slot reserved by a put in flight is in neither; held_bytes is the sum
 * of the indexed lengths. The file's bytes of an indexed slot are those
 * whose checksum the index holds, unless the device corrupted them.
 *
 * Memory: the rb_store and its index (heap: 48-byte entries, at most 2 per
 * segment held, as the load stays <= 1/2), the free lists (8 bytes per free
 * slot); one cached 1 MiB aligned bounce buffer, allocated on the
 * first unaligned transfer in O_DIRECT mode, plus a temporary one for each
 * concurrent unaligned transfer that finds it busy (freed at once);
 * nothing per aligned transfer. The spill bytes are on the device, not in
 * RAM, which is the point.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/vfs.h>
#endif

#include "kvcodec.h"
#include "status.h"

/* The alignment unit: 4096 covers every logical block size in use (512 on
 * this host's ext4, 4096 on 4Kn disks and most phone flash) and the page
 * size, so that fadvise ranges in buffered mode cover whole pages. */
#define STORE_MIN_ALIGN 4096u
/* Bounce buffer: large enough that a chunked unaligned transfer costs few
 * syscalls, small enough to keep around. */
#define STORE_BOUNCE_BYTES (1u << 20)
#define STORE_INDEX_MIN 64u

typedef struct store_entry {
    uint64_t id;
    uint64_t off;        /* slot start in the file */
    uint64_t len;        /* bytes put */
    uint64_t slot;       /* round_up(len, slot_align) */
    uint64_t sum;        /* rb_kvcodec_hash64 of the len bytes */
    int is_used;
} store_entry;

typedef struct store_class {
    uint64_t slot;       /* slot size of this class */
    uint64_t *offs;      /* free slot offsets, LIFO */
    size_t n, cap;
} store_class;

struct rb_store {
    /* set at open, read-only afterwards */
    const rb_os *os;
    int fd;
    int is_direct;
    size_t slot_align;          /* slot size and offset unit */
    rb_throttle *throttle;      /* &own_throttle or the caller's */
    rb_throttle own_throttle;
    int has_own_throttle;
    char path[PATH_MAX];        /* as created (now unlinked), for messages */
    char io_mode[PATH_MAX / 16];

    pthread_mutex_t mu;         /* guards everything below */
    store_entry *tab;           /* mu: index, tab_cap entries (power of 2) */
    size_t tab_cap, n_used;
    store_class *classes;       /* mu: free slots by size */
    size_t n_classes, cap_classes;
    uint64_t end;               /* mu: end of the reserved slots */
    uint64_t file_bytes;        /* mu: high-water mark of end */
    uint64_t held_bytes, slot_bytes, free_bytes; /* mu */
    void *bounce;               /* mu: cached bounce buffer or NULL */
    int is_bounce_busy;         /* mu */
    uint64_t n_puts, n_gets, written_bytes, read_bytes, n_bounced; /* mu */
    uint64_t n_io_errors, n_checksum_errors;                       /* mu */
    double io_s;                                                   /* mu */
};

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- index --------------------------------------------------------------- */

/* splitmix64's finaliser: ids are often small consecutive integers (layer
 * << 32 | page), which must not land in consecutive buckets. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Slot index of id, or of the empty slot where it would go. */
static size_t index_pos(const store_entry *tab, size_t cap, uint64_t id)
{
    size_t mask = cap - 1, i = (size_t)mix64(id) & mask;
    while (tab[i].is_used && tab[i].id != id)
        i = (i + 1) & mask;
    return i;
}

static store_entry *index_find(const rb_store *s, uint64_t id)
{
    if (!s->tab)
        return NULL;
    size_t i = index_pos(s->tab, s->tab_cap, id);
    return s->tab[i].is_used ? &s->tab[i] : NULL;
}

/* Makes room for one more entry (load stays <= 1/2, so probes stay short). */
static int index_reserve(rb_store *s)
{
    if (s->tab && (s->n_used + 1) * 2 <= s->tab_cap)
        return 0;
    size_t cap = s->tab ? s->tab_cap * 2 : STORE_INDEX_MIN;
    store_entry *tab = calloc(cap, sizeof *tab);
    if (!tab)
        return -1;
    for (size_t i = 0; s->tab && i < s->tab_cap; i++)
        if (s->tab[i].is_used)
            tab[index_pos(tab, cap, s->tab[i].id)] = s->tab[i];
    free(s->tab);
    s->tab = tab;
    s->tab_cap = cap;
    return 0;
}

/* Removes the entry at i, shifting later members of its probe run back so
 * that every remaining entry stays reachable from its home bucket. */
static void index_remove_at(rb_store *s, size_t i)
{
    size_t mask = s->tab_cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!s->tab[j].is_used)
            break;
        size_t home = (size_t)mix64(s->tab[j].id) & mask;
        /* entry j may move to the hole i unless its home lies cyclically
         * in (i, j]: then the hole is before its home and it stays */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            s->tab[i] = s->tab[j];
            i = j;
        }
    }
    s->tab[i].is_used = 0;
    s->n_used--;
}

/* ---- slots --------------------------------------------------------------- */

static store_class *class_find(rb_store *s, uint64_t slot)
{
    for (size_t i = 0; i < s->n_classes; i++)
        if (s->classes[i].slot == slot)
            return &s->classes[i];
    return NULL;
}

/* Step 2 of put: a free slot of this size, else fresh space at the end. */
static int slot_take(rb_store *s, uint64_t slot, uint64_t *off)
{
    store_class *c = class_find(s, slot);
    if (c && c->n > 0) {
        *off = c->offs[--c->n];
        s->free_bytes -= slot;
        return 0;
    }
    if (s->end > (uint64_t)INT64_MAX - slot)
        return -1; /* off_t would overflow: cannot happen below 8 EiB */
    *off = s->end;
    s->end += slot;
    if (s->end > s->file_bytes)
        s->file_bytes = s->end;
    return 0;
}

/* Gives a slot back: the tail slot shrinks `end`; any other goes on its
 * class's free list. If that list cannot grow (out of memory), the slot is
 * abandoned: the file keeps a hole, nothing is lost or corrupted. */
static void slot_release(rb_store *s, uint64_t off, uint64_t slot)
{
    if (slot == 0)
        return;
    if (off + slot == s->end) {
        s->end = off;
        return;
    }
    store_class *c = class_find(s, slot);
    if (!c) {
        if (s->n_classes == s->cap_classes) {
            size_t cap = s->cap_classes ? s->cap_classes * 2 : 4;
            store_class *nc = realloc(s->classes, cap * sizeof *nc);
            if (!nc)
                return;
            s->classes = nc;
            s->cap_classes = cap;
        }
        c = &s->classes[s->n_classes++];
        *c = (store_class){.slot = slot};
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        uint64_t *no = realloc(c->offs, cap * sizeof *no);
        if (!no)
            return;
        c->offs = no;
        c->cap = cap;
    }
    c->offs[c->n++] = off;
    s->free_bytes += slot;
}

/* ---- bounce buffer ------------------------------------------------------- */

static size_t bounce_bytes(const rb_store *s)
{
    return STORE_BOUNCE_BYTES > s->slot_align ? STORE_BOUNCE_BYTES : s->slot_align;
}

/* The cached buffer when free, else a temporary one (NULL: out of memory).
 * The cached one is allocated by the first caller that finds it free. */
static void *bounce_get(rb_store *s)
{
    pthread_mutex_lock(&s->mu);
    int is_cached = !s->is_bounce_busy;
    if (is_cached)
        s->is_bounce_busy = 1;
    void *p = is_cached ? s->bounce : NULL;
    pthread_mutex_unlock(&s->mu);
    if (p)
        return p;
    if (posix_memalign(&p, s->slot_align, bounce_bytes(s)) != 0)
        p = NULL;
    if (is_cached) {
        pthread_mutex_lock(&s->mu);
        if (p)
            s->bounce = p;
        else
            s->is_bounce_busy = 0;
        pthread_mutex_unlock(&s->mu);
    }
    return p;
}

static void bounce_put(rb_store *s, void *p)
{
    pthread_mutex_lock(&s->mu);
    int is_cached = p == s->bounce;
    if (is_cached)
        s->is_bounce_busy = 0;
    pthread_mutex_unlock(&s->mu);
    if (!is_cached)
        free(p);
}

/* ---- transfers ----------------------------------------------------------- */

/* One whole read or write of n bytes at off, with the error message. */
static rb_status xfer_raw(rb_store *s, int is_write, uint64_t id, void *buf, size_t n,
                          uint64_t off, rb_error *err)
{
    int e = 0;
    if (is_write) {
        if (rb_os_write_full(s->os, s->fd, buf, n, off, &e) == RB_OK)
            return RB_OK;
        return rb_error_set(err, RB_E_IO,
                            "store: segment 0x%016" PRIx64 ": write of %zu bytes at offset "
                            "%" PRIu64 " in spill file '%s' (unlinked): %s",
                            id, n, off, s->path, strerror(e));
    }
    size_t got = 0;
    rb_status st = rb_os_read_full(s->os, s->fd, buf, n, off, &got, &e);
    if (st == RB_OK)
        return RB_OK;
    if (st == RB_E_SHORT_READ)
        return rb_error_set(err, RB_E_IO,
                            "store: segment 0x%016" PRIx64 ": spill file '%s' (unlinked) "
                            "ends at offset %" PRIu64 ", inside the segment's %zu bytes "
                            "at offset %" PRIu64,
                            id, s->path, off + got, n, off);
    return rb_error_set(err, RB_E_IO,
                        "store: segment 0x%016" PRIx64 ": read of %zu bytes at offset "
                        "%" PRIu64 " in spill file '%s' (unlinked): %s",
                        id, n, off, s->path, strerror(e));
}

/* Buffered mode: make the written range clean, then drop it (and a read
 * range) from the page cache, so that the next read comes from the device
 * and the cache does not hold the memory the spill was meant to free.
 * Only the write-back can fail (EIO); the fadvise is advice. */
static rb_status drop_cached(rb_store *s, int is_write, uint64_t id, uint64_t off,
                             uint64_t n, rb_error *err)
{
#if defined(__linux__) && (!defined(__ANDROID__) || __ANDROID_API__ >= 26)
    /* (bionic has sync_file_range from API 26; below it, fsync) */
    if (is_write &&
        sync_file_range(s->fd, (off_t)off, (off_t)n,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER) != 0)
        return rb_error_set(err, RB_E_IO,
                            "store: segment 0x%016" PRIx64 ": write-back of %" PRIu64
                            " bytes at offset %" PRIu64 " in spill file '%s': %s",
                            id, n, off, s->path, strerror(errno));
#else
    if (is_write && s->os->fsync(s->fd) != 0)
        return rb_error_set(err, RB_E_IO, "store: segment 0x%016" PRIx64 ": fsync of "
                            "spill file '%s': %s", id, s->path, strerror(errno));
#endif
    posix_fadvise(s->fd, (off_t)off, (off_t)n, POSIX_FADV_DONTNEED);
    return RB_OK;
}

/*
 * Moves len bytes between buf and the slot at off. O_DIRECT rules: buffer,
 * length and offset all multiples of slot_align. An aligned buf goes to the
 * device directly for its whole-unit head; its ragged tail (and all of an
 * unaligned buf) goes through the bounce buffer, chunk by chunk, padded
 * with zeros to the unit (the padding is inside the slot).
 */
static rb_status xfer(rb_store *s, int is_write, uint64_t id, void *buf, size_t len,
                      uint64_t off, int *is_bounced, rb_error *err)
{
    *is_bounced = 0;
    if (len == 0)
        return RB_OK;
    if (!s->is_direct) {
        rb_status st = xfer_raw(s, is_write, id, buf, len, off, err);
        if (st == RB_OK)
            st = drop_cached(s, is_write, id, off, round_up(len, s->slot_align), err);
        return st;
    }
    size_t a = s->slot_align, done = 0;
    if ((uintptr_t)buf % a == 0) {
        done = len - len % a;
        if (done) {
            rb_status st = xfer_raw(s, is_write, id, buf, done, off, err);
            if (st != RB_OK)
                return st;
        }
        if (done == len)
            return RB_OK;
    }
    *is_bounced = 1;
    unsigned char *b = bounce_get(s);
    if (!b)
        return rb_error_set(err, RB_E_NOMEM,
                            "store: segment 0x%016" PRIx64 ": bounce buffer of %zu bytes: "
                            "out of memory", id, bounce_bytes(s));
    rb_status st = RB_OK;
    while (st == RB_OK && done < len) {
        size_t n = len - done < bounce_bytes(s) ? len - done : bounce_bytes(s);
        size_t n_io = (size_t)round_up(n, a);
        if (is_write) {
            memcpy(b, (unsigned char *)buf + done, n);
            memset(b + n, 0, n_io - n);
        }
        st = xfer_raw(s, is_write, id, b, n_io, off + done, err);
        if (st == RB_OK && !is_write)
            memcpy((unsigned char *)buf + done, b, n);
        done += n;
    }
    bounce_put(s, b);
    return st;
}

/* ---- open / close -------------------------------------------------------- */

rb_store_params rb_store_default_params(void)
{
    rb_store_params p = {0};
    return p;
}

/* Name of the file system holding fd, for the io-mode report. */
static const char *fs_name(int fd, int *is_ram)
{
    *is_ram = 0;
#if defined(__linux__)
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return "an unknown file system";
    switch ((unsigned long)sf.f_type) {
    case 0xEF53ul: return "ext4";
    case 0x58465342ul: return "xfs";
    case 0x9123683Eul: return "btrfs";
    case 0xF2F52010ul: return "f2fs";
    case 0x794c7630ul: return "overlayfs";
    case 0x6969ul: return "nfs";
    case 0x65735546ul: return "fuse";
    case 0x01021997ul: return "9p";
    case 0x2fc12fc1ul: return "zfs";
    case 0x01021994ul: *is_ram = 1; return "tmpfs";
    case 0x858458f6ul: *is_ram = 1; return "ramfs";
    default: return "an unrecognised file system";
    }
#else
    (void)fd;
    return "an unknown file system";
#endif
}

/* The file system's direct-I/O alignment if it reports one (statx,
 * Linux >= 6.1), never below STORE_MIN_ALIGN. */
static size_t dio_align(int fd)
{
    size_t a = STORE_MIN_ALIGN;
#if defined(__linux__) && defined(STATX_DIOALIGN) && \
    (!defined(__ANDROID__) || __ANDROID_API__ >= 30) /* bionic's statx: API 30 */
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN)) {
        size_t m = sx.stx_dio_mem_align, o = sx.stx_dio_offset_align;
        /* only powers of two make sense as units; ignore anything else */
        if (m > a && (m & (m - 1)) == 0)
            a = m;
        if (o > a && (o & (o - 1)) == 0)
            a = o;
    }
#else
    (void)fd;
#endif
    return a;
}

/* Creates the file under a fresh name: O_DIRECT first unless told not to;
 * EINVAL with O_DIRECT = the file system refuses it (the errno text goes
 * into *refused). Sets s->fd and s->is_direct. */
static rb_status create_file(rb_store *s, const char *dir, int is_try_direct, char *refused,
                             size_t refused_n, rb_error *err)
{
    refused[0] = 0;
    for (int attempt = 0; attempt < 16; attempt++) {
        /* pid + this handle's address + attempt + clock: unique among live
         * stores of all processes without any global counter */
        int n = snprintf(s->path, sizeof s->path, "%s/rebound-spill-%ld-%lx-%d-%06lx", dir,
                         (long)getpid(), (unsigned long)(uintptr_t)s, attempt,
                         (unsigned long)(rb_throttle_now_ns() & 0xffffff));
        if (n < 0 || (size_t)n >= sizeof s->path)
            return rb_error_set(err, RB_E_INVALID_ARG, "store: directory '%s': path too long",
                                dir);
        int flags = O_RDWR | O_CREAT | O_EXCL;
#if defined(O_DIRECT)
        if (is_try_direct) {
            s->fd = s->os->open(s->path, flags | O_DIRECT, 0600);
            if (s->fd >= 0) {
                s->is_direct = 1;
                return RB_OK;
            }
            if (errno == EEXIST)
                continue;
            if (errno != EINVAL)
                return rb_error_set(err, RB_E_IO, "store: cannot create spill file '%s': %s",
                                    s->path, strerror(errno));
            snprintf(refused, refused_n, "%s", strerror(errno));
            /* Linux creates the file before it checks O_DIRECT, so the
             * name may exist now: remove it (it is ours: O_EXCL, a name
             * with our pid) before the buffered attempt. */
            s->os->unlink(s->path);
        }
#else
        (void)is_try_direct;
        snprintf(refused, refused_n, "not available on this system");
#endif
        s->fd = s->os->open(s->path, flags, 0600);
        if (s->fd >= 0)
            return RB_OK;
        if (errno != EEXIST)
            return rb_error_set(err, RB_E_IO, "store: cannot create spill file '%s': %s",
                                s->path, strerror(errno));
    }
    return rb_error_set(err, RB_E_IO,
                        "store: cannot create spill file in '%s': 16 fresh names all taken",
                        dir);
}

rb_status rb_store_open(const rb_store_params *p, rb_store **out, rb_error *err)
{
    rb_store_params d = rb_store_default_params();
    if (!p)
        p = &d;
    const char *dir = p->dir && p->dir[0] ? p->dir : getenv("TMPDIR");
    if (!dir || !dir[0])
        dir = "/tmp";

    rb_store *s = calloc(1, sizeof *s);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "store: out of memory");
    s->os = p->os ? p->os : rb_os_default();
    s->fd = -1;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return rb_error_set(err, RB_E_NOMEM, "store: pthread_mutex_init failed");
    }
    if (p->throttle) {
        s->throttle = p->throttle;
    } else {
        rb_status tst = rb_throttle_init(&s->own_throttle, p->bw_bytes_per_s, p->latency_s,
                                         err);
        if (tst != RB_OK) {
            pthread_mutex_destroy(&s->mu);
            free(s);
            return tst;
        }
        s->throttle = &s->own_throttle;
        s->has_own_throttle = 1;
    }

    char refused[128];
    rb_status st = create_file(s, dir, !p->is_no_direct, refused, sizeof refused, err);
    if (st != RB_OK) {
        s->fd = -1;
        rb_store_close(s); /* nothing to close */
        return st;
    }
    /* Unlink now: from here on, a crash or kill leaves no file behind. */
    if (s->os->unlink(s->path) != 0) {
        int e = errno;
        rb_error_set(err, RB_E_IO, "store: cannot unlink spill file '%s' after creating it: %s",
                     s->path, strerror(e));
        rb_store_close(s);
        return RB_E_IO;
    }

    int is_ram = 0;
    const char *fs = fs_name(s->fd, &is_ram);
    s->slot_align = s->is_direct ? dio_align(s->fd) : STORE_MIN_ALIGN;
    int n;
    if (s->is_direct)
        n = snprintf(s->io_mode, sizeof s->io_mode, "O_DIRECT (%s)", fs);
    else if (p->is_no_direct)
        n = snprintf(s->io_mode, sizeof s->io_mode,
                     "buffered + fadvise(DONTNEED) (O_DIRECT not tried, on %s)", fs);
    else
        n = snprintf(s->io_mode, sizeof s->io_mode,
                     "buffered + fadvise(DONTNEED) (O_DIRECT refused by %s: %s)", fs, refused);
    if (is_ram && n > 0 && (size_t)n < sizeof s->io_mode)
        snprintf(s->io_mode + n, sizeof s->io_mode - (size_t)n,
                 "; %s is RAM: reads do not touch a device", fs);
    *out = s;
    return RB_OK;
}

void rb_store_close(rb_store *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        s->os->close(s->fd);
    for (size_t i = 0; i < s->n_classes; i++)
        free(s->classes[i].offs);
    free(s->classes);
    free(s->tab);
    free(s->bounce);
    pthread_mutex_destroy(&s->mu);
    if (s->has_own_throttle)
        rb_throttle_deinit(&s->own_throttle);
    free(s);
}

/* ---- put / get / drop ---------------------------------------------------- */

rb_status rb_store_put(rb_store *s, uint64_t id, const void *buf, size_t len, rb_error *err)
{
    static const unsigned char empty[1];
    if (!buf && len > 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "store: segment 0x%016" PRIx64 ": NULL buffer for %zu bytes", id,
                            len);
    if (!buf)
        buf = empty;

    /* 1. checksum */
    uint64_t sum = rb_kvcodec_hash64(buf, len);
    uint64_t slot = round_up(len, s->slot_align), off = 0;

    /* 2. reserve a slot */
    pthread_mutex_lock(&s->mu);
    int rc = slot ? slot_take(s, slot, &off) : 0;
    pthread_mutex_unlock(&s->mu);
    if (rc != 0)
        return rb_error_set(err, RB_E_IO,
                            "store: segment 0x%016" PRIx64 ": %zu bytes would pass the "
                            "largest file offset", id, len);

    /* 3. write, then let the device model catch up */
    int64_t t0 = rb_throttle_now_ns();
    int is_bounced = 0;
    /* xfer takes a non-const buffer for both directions; a write only
     * reads it */
    rb_status st = xfer(s, 1, id, (void *)buf, len, off, &is_bounced, err);
    if (st == RB_OK && slot)
        rb_throttle_io_since(s->throttle, slot, t0);
    double dt = (double)(rb_throttle_now_ns() - t0) * 1e-9;

    pthread_mutex_lock(&s->mu);
    if (st == RB_OK && index_reserve(s) != 0)
        st = rb_error_set(err, RB_E_NOMEM,
                          "store: segment 0x%016" PRIx64 ": index of %zu entries: out of "
                          "memory", id, s->tab_cap * 2);
    if (st != RB_OK) {
        /* 4. failure: the slot goes back; the index never saw it */
        slot_release(s, off, slot);
        s->n_io_errors += st == RB_E_IO;
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    /* 5. publish, then free the earlier copy's slot */
    size_t i = index_pos(s->tab, s->tab_cap, id);
    store_entry *e = &s->tab[i];
    if (e->is_used) {
        slot_release(s, e->off, e->slot);
        s->held_bytes -= e->len;
        s->slot_bytes -= e->slot;
    } else {
        s->n_used++;
    }
    *e = (store_entry){.id = id, .off = off, .len = len, .slot = slot, .sum = sum,
                       .is_used = 1};
    s->held_bytes += len;
    s->slot_bytes += slot;
    s->n_puts++;
    s->written_bytes += slot;
    s->n_bounced += is_bounced;
    s->io_s += dt;
    pthread_mutex_unlock(&s->mu);
    return RB_OK;
}

rb_status rb_store_get(rb_store *s, uint64_t id, void *buf, size_t len, rb_error *err)
{
    if (!buf && len > 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "store: segment 0x%016" PRIx64 ": NULL buffer for %zu bytes", id,
                            len);
    pthread_mutex_lock(&s->mu);
    store_entry *f = index_find(s, id);
    store_entry e = f ? *f : (store_entry){0};
    pthread_mutex_unlock(&s->mu);
    if (!e.is_used)
        return rb_error_set(err, RB_E_NOT_FOUND,
                            "store: segment 0x%016" PRIx64 ": not in the spill file (never "
                            "put, or dropped)", id);
    if (e.len != len)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "store: segment 0x%016" PRIx64 ": holds %" PRIu64 " bytes, "
                            "asked for %zu", id, e.len, len);

    int64_t t0 = rb_throttle_now_ns();
    int is_bounced = 0;
    rb_status st = xfer(s, 0, id, buf, len, e.off, &is_bounced, err);
    if (st != RB_OK) {
        pthread_mutex_lock(&s->mu);
        s->n_io_errors += st == RB_E_IO;
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    if (e.slot)
        rb_throttle_io_since(s->throttle, e.slot, t0);
    double dt = (double)(rb_throttle_now_ns() - t0) * 1e-9;

    uint64_t sum = rb_kvcodec_hash64(len ? buf : (const void *)"", len);
    pthread_mutex_lock(&s->mu);
    s->read_bytes += e.slot;
    s->n_bounced += is_bounced;
    s->io_s += dt;
    if (sum == e.sum)
        s->n_gets++;
    else
        s->n_checksum_errors++;
    pthread_mutex_unlock(&s->mu);
    if (sum != e.sum)
        return rb_error_set(err, RB_E_FORMAT,
                            "store: segment 0x%016" PRIx64 ": checksum mismatch (stored "
                            "0x%016" PRIx64 ", read 0x%016" PRIx64 "; %" PRIu64 " bytes at "
                            "offset %" PRIu64 " in spill file '%s')",
                            id, e.sum, sum, e.len, e.off, s->path);
    return RB_OK;
}

void rb_store_drop(rb_store *s, uint64_t id)
{
    pthread_mutex_lock(&s->mu);
    if (s->tab) {
        size_t i = index_pos(s->tab, s->tab_cap, id);
        store_entry *e = &s->tab[i];
        if (e->is_used) {
            slot_release(s, e->off, e->slot);
            s->held_bytes -= e->len;
            s->slot_bytes -= e->slot;
            index_remove_at(s, i);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* The const accessors lock the mutex, which is not part of the store's
 * observable state. */
int rb_store_has(const rb_store *s, uint64_t id)
{
    rb_store *m = (rb_store *)s;
    pthread_mutex_lock(&m->mu);
    int is_held = index_find(s, id) != NULL;
    pthread_mutex_unlock(&m->mu);
    return is_held;
}

rb_status rb_store_len(const rb_store *s, uint64_t id, size_t *len_out)
{
    rb_store *m = (rb_store *)s;
    pthread_mutex_lock(&m->mu);
    const store_entry *e = index_find(s, id);
    if (e)
        *len_out = (size_t)e->len;
    pthread_mutex_unlock(&m->mu);
    return e ? RB_OK : RB_E_NOT_FOUND;
}

const char *rb_store_io_mode(const rb_store *s) { return s->io_mode; }

int rb_store_is_direct(const rb_store *s) { return s->is_direct; }

size_t rb_store_align(const rb_store *s) { return s->is_direct ? s->slot_align : 1; }

uint64_t rb_store_ram_bytes(rb_store *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t b = (uint64_t)s->tab_cap * sizeof *s->tab + (s->bounce ? bounce_bytes(s) : 0);
    pthread_mutex_unlock(&s->mu);
    return b;
}

void rb_store_get_stats(const rb_store *s, rb_store_stats *out)
{
    rb_store *m = (rb_store *)s;
    pthread_mutex_lock(&m->mu);
    *out = (rb_store_stats){
        .n_segments = s->n_used,
        .held_bytes = s->held_bytes,
        .slot_bytes = s->slot_bytes,
        .file_bytes = s->file_bytes,
        .free_bytes = s->free_bytes,
        .n_puts = s->n_puts,
        .n_gets = s->n_gets,
        .written_bytes = s->written_bytes,
        .read_bytes = s->read_bytes,
        .n_bounced = s->n_bounced,
        .n_io_errors = s->n_io_errors,
        .n_checksum_errors = s->n_checksum_errors,
        .io_s = s->io_s,
    };
    pthread_mutex_unlock(&m->mu);
    rb_throttle_get_stats(s->throttle, &out->throttle);
}
