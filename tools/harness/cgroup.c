/*
 * cgroup.c - memory cgroups of our own (contract in cgroup.h).
 *
 * Does: find the memory hierarchy (v1 preferred, v2 otherwise) from
 * /proc/mounts; make "rebound-<pid>-<n>[-label]" under its root with a hard
 * limit; move processes in and back out; read the counters; remove the
 * directory; sweep stale ones of dead owners. Does not: nest cgroups, touch
 * any cgroup it did not make (the sweep removes only empty directories that
 * carry our name pattern and a dead pid, and rmdir itself refuses a
 * populated cgroup), set soft limits, swappiness or OOM control, move
 * charges (a process attached late keeps its old pages charged where they
 * were), or watch anything (pressure.c does).
 *
 * Control files, per version (all plain text, one value or "key value"
 * lines; each is opened, read or written once, closed):
 *
 *   what             v1 (<root>/<name>/...)           v2
 *   limit            memory.limit_in_bytes            memory.max
 *   swap limit       memory.memsw.limit_in_bytes      memory.swap.max = 0
 *                    (= limit, only when SwapTotal
 *                    > 0: see cg_set_limit)
 *   usage / peak     memory.usage_in_bytes /          memory.current /
 *                    memory.max_usage_in_bytes        memory.peak (5.19+)
 *   limit hits       memory.failcnt +                 memory.events "max"
 *                    memory.memsw.failcnt
 *   OOM kills        memory.oom_control "oom_kill"    memory.events "oom_kill"
 *                    (4.13+)
 *   cache / anon     memory.stat "cache" / "rss"      memory.stat "file" / "anon"
 *   major faults     memory.stat "pgmajfault"         memory.stat "pgmajfault"
 *   refaults         memory.stat "workingset_refault_file" (both)
 *   members          cgroup.procs                     cgroup.procs
 *
 * Invariants: cg->path is <root>/<name> and exists from a successful create
 * until destroy; every entry of cg->origins is a pid we attached and the
 * cgroup directory (absolute) it was in just before.
 *
 * Memory: the rb_cgroup handle and its origins array (heap, one entry per
 * attach call, ~4 KiB each); every file read uses a stack buffer.
 */
#include "cgroup.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "status.h"

#define CG_PATH_MAX 512
#define CG_LABEL_MAX 32
#define CG_MIN_LIMIT_BYTES (1u << 20)

typedef struct cg_origin {
    pid_t pid;
    char dir[CG_PATH_MAX];   /* absolute cgroup directory it came from */
} cg_origin;

struct rb_cgroup {
    rb_cgroup_version version;
    char root[CG_PATH_MAX];  /* the hierarchy's mount point */
    char name[96];
    char path[CG_PATH_MAX];  /* root + "/" + name */
    uint64_t limit_bytes;    /* as read back after setting it */
    cg_origin *origins;
    size_t n_origins, cap_origins;
};

/* The one piece of process-wide state: makes names unique per process. */
static atomic_uint rb_cgroup_seq;

/* ---- small file helpers ------------------------------------------------ */

/* Reads up to n-1 bytes of a control file into buf (NUL-terminated).
 * Returns the length, or -errno. */
static long cg_read(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    size_t len = 0;
    while (len + 1 < n) {
        ssize_t r = read(fd, buf + len, n - 1 - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            return -e;
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    close(fd);
    return (long)len;
}

/* Writes a string to a control file in one write() (the kernel parses each
 * write as one command). Returns 0 or errno. */
static int cg_write(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    size_t len = strlen(s);
    ssize_t w;
    do {
        w = write(fd, s, len);
    } while (w < 0 && errno == EINTR);
    int e = w < 0 ? errno : ((size_t)w == len ? 0 : EIO);
    close(fd);
    return e;
}

static int cg_read_u64(const char *path, uint64_t *out)
{
    char buf[64];
    long r = cg_read(path, buf, sizeof buf);
    if (r < 0) return (int)-r;
    if (strncmp(buf, "max", 3) == 0) {  /* v2 "no limit" */
        *out = UINT64_MAX;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf) return EINVAL;
    *out = (uint64_t)v;
    return 0;
}

/* Finds "key value" at the start of a line of buf; 1 found, 0 not. */
static int cg_kv(const char *buf, const char *key, uint64_t *out)
{
    size_t klen = strlen(key);
    for (const char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, key, klen) == 0 && p[klen] == ' ') {
            *out = strtoull(p + klen + 1, NULL, 10);
            return 1;
        }
    }
    return 0;
}

static int cg_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Joins dir + "/" + file into out; 0 when it does not fit. */
static int cg_join(char *out, size_t n, const char *dir, const char *file)
{
    int w = snprintf(out, n, "%s/%s", dir, file);
    return w > 0 && (size_t)w < n;
}

static void cg_sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- finding the hierarchy ------------------------------------------- */

/* Does the comma-separated option list contain `word` as a whole item? */
static int cg_has_option(const char *opts, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = opts; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == wl && strncmp(p, word, wl) == 0) return 1;
        p = c ? c + 1 : NULL;
    }
    return 0;
}

/* Is `word` one of the space-separated words of s? */
static int cg_has_word(const char *s, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = s; *p;) {
        while (*p && isspace((unsigned char)*p)) p++;
        const char *e = p;
        while (*e && !isspace((unsigned char)*e)) e++;
        if ((size_t)(e - p) == wl && strncmp(p, word, wl) == 0) return 1;
        p = e;
    }
    return 0;
}

/* Looks for a v1 hierarchy with "memory" among its mount options, else a
 * cgroup2 mount whose root offers the memory controller. Mount points with
 * spaces (octal-escaped in /proc/mounts) are not handled: they do not occur
 * for cgroup mounts in practice. */
static rb_cgroup_version cg_find_root(char *root, size_t n, char *why, size_t wn)
{
    FILE *f = fopen("/proc/mounts", "re");
    if (!f) {
        snprintf(why, wn, "cannot read /proc/mounts: %s", strerror(errno));
        return RB_CGROUP_NONE;
    }
    char line[1024], v2root[CG_PATH_MAX] = "";
    rb_cgroup_version found = RB_CGROUP_NONE;
    while (fgets(line, sizeof line, f)) {
        char dev[128], mnt[CG_PATH_MAX], type[32], opts[512];
        if (sscanf(line, "%127s %511s %31s %511s", dev, mnt, type, opts) != 4) continue;
        if (strcmp(type, "cgroup") == 0 && cg_has_option(opts, "memory")) {
            snprintf(root, n, "%s", mnt);
            found = RB_CGROUP_V1;
            break;
        }
        if (strcmp(type, "cgroup2") == 0 && !v2root[0]) snprintf(v2root, sizeof v2root, "%s", mnt);
    }
    fclose(f);
    if (found) return found;
    if (!v2root[0]) {
        snprintf(why, wn, "no memory cgroup hierarchy mounted (no cgroup v1 'memory' "
                 "or cgroup2 in /proc/mounts)");
        return RB_CGROUP_NONE;
    }
    char path[CG_PATH_MAX + 32], buf[256];
    cg_join(path, sizeof path, v2root, "cgroup.controllers");
    long r = cg_read(path, buf, sizeof buf);
    if (r < 0) {
        snprintf(why, wn, "cannot read %s: %s", path, strerror((int)-r));
        return RB_CGROUP_NONE;
    }
    if (!cg_has_word(buf, "memory")) {
        snprintf(why, wn, "cgroup2 at %s does not offer the memory controller (%s lists "
                 "'%.*s'; it is bound to a v1 hierarchy or disabled)", v2root, path,
                 (int)strcspn(buf, "\n"), buf);
        return RB_CGROUP_NONE;
    }
    snprintf(root, n, "%s", v2root);
    return RB_CGROUP_V2;
}

/* v2: children of the root get a memory.max only when the root delegates
 * the controller; enable it when it is not (systemd machines already do). */
static int cg_v2_enable_memory(const char *root)
{
    char path[CG_PATH_MAX + 32], buf[256];
    cg_join(path, sizeof path, root, "cgroup.subtree_control");
    long r = cg_read(path, buf, sizeof buf);
    if (r < 0) return (int)-r;
    if (cg_has_word(buf, "memory")) return 0;
    return cg_write(path, "+memory");
}

rb_cgroup_version rb_cgroup_probe(char *why, size_t n)
{
    char dummy[8];
    if (!why || n == 0) {
        why = dummy;
        n = sizeof dummy;
    }
    why[0] = '\0';
    char root[CG_PATH_MAX];
    rb_cgroup_version v = cg_find_root(root, sizeof root, why, n);
    if (v == RB_CGROUP_NONE) return v;

    char dir[CG_PATH_MAX + 64], file[CG_PATH_MAX + 96];
    snprintf(dir, sizeof dir, "%s/rebound-%ld-probe", root, (long)getpid());
    if (v == RB_CGROUP_V2) {
        int e = cg_v2_enable_memory(root);
        if (e) {
            snprintf(why, n, "cgroup v2 at %s: cannot enable the memory controller in "
                     "cgroup.subtree_control: %s%s", root, strerror(e),
                     e == EACCES || e == EPERM ? " (need root)" : "");
            return RB_CGROUP_NONE;
        }
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        snprintf(why, n, "mkdir %s: %s%s", dir, strerror(e),
                 e == EACCES || e == EPERM || e == EROFS ? " (need root and a writable "
                 "cgroup hierarchy)" : "");
        return RB_CGROUP_NONE;
    }
    cg_join(file, sizeof file, dir, v == RB_CGROUP_V1 ? "memory.limit_in_bytes" : "memory.max");
    int ok = cg_file_exists(file);
    rmdir(dir);
    if (!ok) {
        snprintf(why, n, "a cgroup made under %s has no %s: memory controller unusable",
                 root, v == RB_CGROUP_V1 ? "memory.limit_in_bytes" : "memory.max");
        return RB_CGROUP_NONE;
    }
    snprintf(why, n, "cgroup %s memory controller at %s", v == RB_CGROUP_V1 ? "v1" : "v2",
             root);
    return v;
}

/* ---- stale cgroups ----------------------------------------------------- */

/* "rebound-<pid>-..." -> pid, or 0 when the name is not ours. */
static pid_t cg_owner_pid(const char *name)
{
    if (strncmp(name, "rebound-", 8) != 0) return 0;
    char *end;
    long pid = strtol(name + 8, &end, 10);
    if (end == name + 8 || *end != '-' || pid <= 0 || pid > INT_MAX) return 0;
    return (pid_t)pid;
}

/* Removes our empty cgroups whose creator is dead. A pid that was reused
 * since keeps its cgroup until that process ends too: harmless. Another
 * pid namespace sharing this hierarchy could own a live "rebound-*" that
 * looks dead from here; rmdir refuses it while it has members, and the
 * window between its mkdir and its first attach is the only risk. */
static void cg_sweep_stale(const char *root)
{
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        pid_t pid = cg_owner_pid(de->d_name);
        if (pid == 0 || pid == getpid()) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;
        char dir[CG_PATH_MAX + 300], procs[CG_PATH_MAX + 320], buf[64];
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
        if (cg_read(procs, buf, sizeof buf) != 0) continue;  /* members, or unreadable */
        rmdir(dir);
    }
    closedir(d);
}

/* ---- create / attach / destroy ------------------------------------------ */

/* A /proc/meminfo figure ("MemTotal:", "SwapTotal:") in bytes; 0 if absent. */
static uint64_t cg_meminfo_bytes(const char *key)
{
    char buf[8192];
    if (cg_read("/proc/meminfo", buf, sizeof buf) <= 0) return 0;
    const char *p = strstr(buf, key);
    if (!p) return 0;
    return strtoull(p + strlen(key), NULL, 10) * 1024;
}

static uint64_t cg_mem_total_bytes(void) { return cg_meminfo_bytes("MemTotal:"); }
static uint64_t cg_swap_total_bytes(void) { return cg_meminfo_bytes("SwapTotal:"); }

static int cg_label_ok(const char *label)
{
    size_t n = strlen(label);
    if (n == 0 || n > CG_LABEL_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)label[i];
        if (!isalnum(c) && c != '_' && c != '.' && c != '-') return 0;
    }
    return 1;
}

/* Sets the limit (and the swap one) on a fresh directory. */
static rb_status cg_set_limit(rb_cgroup *cg, uint64_t limit_bytes, rb_error *err)
{
    char file[CG_PATH_MAX + 64], val[32];
    snprintf(val, sizeof val, "%" PRIu64, limit_bytes);
    const char *limit_file = cg->version == RB_CGROUP_V1 ? "memory.limit_in_bytes" : "memory.max";
    cg_join(file, sizeof file, cg->path, limit_file);
    int e = cg_write(file, val);
    if (e) return rb_error_set(err, RB_E_IO, "cgroup: write %s to %s: %s", val, file, strerror(e));
    if (cg->version == RB_CGROUP_V1) {
        /* memsw must be >= the RAM limit, so it goes second. Set only when
         * the machine has swap: without swap there is nothing to dodge, and
         * with both limits equal a failing charge fails on memsw first,
         * which kernel 6.18 counts in no failcnt at all (measured: memsw
         * limit = limit -> memory.failcnt 0 and memory.memsw.failcnt 0 after
         * an OOM kill; memsw unlimited -> memory.failcnt 71). Absent file:
         * no swap accounting in this kernel. */
        cg_join(file, sizeof file, cg->path, "memory.memsw.limit_in_bytes");
        if (cg_swap_total_bytes() > 0 && cg_file_exists(file) && (e = cg_write(file, val)) != 0)
            return rb_error_set(err, RB_E_IO, "cgroup: write %s to %s: %s", val, file,
                                strerror(e));
    } else {
        cg_join(file, sizeof file, cg->path, "memory.swap.max");
        if (cg_file_exists(file) && (e = cg_write(file, "0")) != 0)
            return rb_error_set(err, RB_E_IO, "cgroup: write 0 to %s: %s", file, strerror(e));
    }
    cg_join(file, sizeof file, cg->path, limit_file);
    if ((e = cg_read_u64(file, &cg->limit_bytes)) != 0)
        return rb_error_set(err, RB_E_IO, "cgroup: read %s: %s", file, strerror(e));
    return RB_OK;
}

rb_status rb_cgroup_create(const char *label, uint64_t limit_bytes, rb_cgroup **out,
                           rb_error *err)
{
    if (!out) return rb_error_set(err, RB_E_INVALID_ARG, "cgroup: out is NULL");
    if (label && label[0] && !cg_label_ok(label))
        return rb_error_set(err, RB_E_INVALID_ARG, "cgroup: bad label '%.64s': 1-%d "
                            "characters of [A-Za-z0-9_.-]", label, CG_LABEL_MAX);
    uint64_t ram = cg_mem_total_bytes();
    if (limit_bytes < CG_MIN_LIMIT_BYTES || (ram && limit_bytes > ram))
        return rb_error_set(err, RB_E_INVALID_ARG, "cgroup: limit %" PRIu64 " bytes out of "
                            "range [%u, %" PRIu64 "] (1 MiB .. MemTotal)", limit_bytes,
                            CG_MIN_LIMIT_BYTES, ram);
    rb_cgroup *cg = calloc(1, sizeof *cg);
    if (!cg) return rb_error_set(err, RB_E_NOMEM, "cgroup: out of memory");
    char why[512];
    cg->version = cg_find_root(cg->root, sizeof cg->root, why, sizeof why);
    if (cg->version == RB_CGROUP_NONE) {
        free(cg);
        return rb_error_set(err, RB_E_UNSUPPORTED, "cgroup: %s", why);
    }
    cg_sweep_stale(cg->root);
    if (cg->version == RB_CGROUP_V2) {
        int e = cg_v2_enable_memory(cg->root);
        if (e) {
            rb_status st = rb_error_set(err, RB_E_IO, "cgroup: enable +memory in "
                                        "%s/cgroup.subtree_control: %s", cg->root, strerror(e));
            free(cg);
            return st;
        }
    }
    /* A name taken already (an old process with our pid left it) is skipped. */
    for (int tries = 0;; tries++) {
        unsigned n = atomic_fetch_add(&rb_cgroup_seq, 1);
        if (label && label[0])
            snprintf(cg->name, sizeof cg->name, "rebound-%ld-%u-%s", (long)getpid(), n, label);
        else
            snprintf(cg->name, sizeof cg->name, "rebound-%ld-%u", (long)getpid(), n);
        int w = snprintf(cg->path, sizeof cg->path, "%s/%s", cg->root, cg->name);
        if (w < 0 || (size_t)w >= sizeof cg->path) {
            rb_status st = rb_error_set(err, RB_E_INVALID_ARG, "cgroup: path under %s too long",
                                        cg->root);
            free(cg);
            return st;
        }
        if (mkdir(cg->path, 0755) == 0) break;
        int e = errno;
        if (e != EEXIST || tries >= 16) {
            rb_status st = rb_error_set(err, RB_E_IO, "cgroup: mkdir %s: %s%s", cg->path,
                                        strerror(e), e == EACCES || e == EPERM || e == EROFS
                                        ? " (need root and a writable cgroup hierarchy)" : "");
            free(cg);
            return st;
        }
    }
    rb_status st = cg_set_limit(cg, limit_bytes, err);
    if (st != RB_OK) {
        rmdir(cg->path);
        free(cg);
        return st;
    }
    *out = cg;
    return RB_OK;
}

/* The absolute cgroup directory of `pid` in our hierarchy, from
 * /proc/<pid>/cgroup ("4:memory:/a/b" on v1, "0::/a/b" on v2). */
static int cg_dir_of(const rb_cgroup *cg, pid_t pid, char *out, size_t n)
{
    char file[64], buf[4096];
    if (pid == 0) snprintf(file, sizeof file, "/proc/self/cgroup");
    else snprintf(file, sizeof file, "/proc/%ld/cgroup", (long)pid);
    long r = cg_read(file, buf, sizeof buf);
    if (r < 0) return (int)-r;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c1 && c2) {
            *c2 = '\0';
            /* v1: the line whose controller list has "memory"; v2: "0::" */
            int match = cg->version == RB_CGROUP_V1
                            ? cg_has_option(c1 + 1, "memory")
                            : (c1[1] == '\0' && strncmp(line, "0:", 2) == 0);
            if (match) {
                const char *rel = c2 + 1;
                int w = snprintf(out, n, "%s%s", cg->root, strcmp(rel, "/") == 0 ? "" : rel);
                return w > 0 && (size_t)w < n ? 0 : ENAMETOOLONG;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return ENOENT;
}

int rb_cgroup_contains(const rb_cgroup *cg, pid_t pid)
{
    if (!cg || pid < 0) return -1;
    char dir[CG_PATH_MAX];
    if (cg_dir_of(cg, pid, dir, sizeof dir) != 0) return -1;
    return strcmp(dir, cg->path) == 0;
}

static int cg_move(const char *dir, pid_t pid)
{
    char file[CG_PATH_MAX + 32], val[24];
    if (!cg_join(file, sizeof file, dir, "cgroup.procs")) return ENAMETOOLONG;
    snprintf(val, sizeof val, "%ld", (long)pid);
    return cg_write(file, val);
}

rb_status rb_cgroup_attach(rb_cgroup *cg, pid_t pid, rb_error *err)
{
    if (!cg) return rb_error_set(err, RB_E_INVALID_ARG, "cgroup: attach to NULL");
    if (pid < 0) return rb_error_set(err, RB_E_INVALID_ARG, "cgroup: attach pid %ld < 0",
                                     (long)pid);
    pid_t real = pid ? pid : getpid();
    if (cg->n_origins == cg->cap_origins) {
        size_t cap = cg->cap_origins ? cg->cap_origins * 2 : 4;
        cg_origin *o = realloc(cg->origins, cap * sizeof *o);
        if (!o) return rb_error_set(err, RB_E_NOMEM, "cgroup: out of memory");
        cg->origins = o;
        cg->cap_origins = cap;
    }
    cg_origin *o = &cg->origins[cg->n_origins];
    o->pid = real;
    int e = cg_dir_of(cg, real, o->dir, sizeof o->dir);
    if (e) return rb_error_set(err, RB_E_IO, "cgroup: /proc/%ld/cgroup: %s", (long)real,
                               strerror(e));
    if ((e = cg_move(cg->path, real)) != 0)
        return rb_error_set(err, RB_E_IO, "cgroup: write %ld to %s/cgroup.procs: %s",
                            (long)real, cg->path, strerror(e));
    cg->n_origins++;
    return RB_OK;
}

rb_status rb_cgroup_stats_read(const rb_cgroup *cg, rb_cgroup_stats *out, rb_error *err)
{
    if (!cg || !out) return rb_error_set(err, RB_E_INVALID_ARG, "cgroup: stats of NULL");
    rb_cgroup_stats s;
    memset(&s, 0, sizeof s);
    char file[CG_PATH_MAX + 64], buf[8192];
    int e;
    int v1 = cg->version == RB_CGROUP_V1;
#define CG_U64(name, field)                                                            \
    do {                                                                               \
        cg_join(file, sizeof file, cg->path, name);                                    \
        if ((e = cg_read_u64(file, &(field))) != 0)                                    \
            return rb_error_set(err, RB_E_IO, "cgroup: read %s: %s", file, strerror(e)); \
    } while (0)
    if (v1) {
        CG_U64("memory.usage_in_bytes", s.usage_bytes);
        CG_U64("memory.max_usage_in_bytes", s.max_usage_bytes);
        CG_U64("memory.limit_in_bytes", s.limit_bytes);
        CG_U64("memory.failcnt", s.failcnt);
        /* With swap accounting the memory+swap counter is charged first, and
         * a charge that fails there never reaches the memory counter: with
         * both limits equal, the hits land in memsw.failcnt. */
        cg_join(file, sizeof file, cg->path, "memory.memsw.failcnt");
        uint64_t memsw_failcnt = 0;
        if (cg_file_exists(file) && cg_read_u64(file, &memsw_failcnt) == 0)
            s.failcnt += memsw_failcnt;
        cg_join(file, sizeof file, cg->path, "memory.oom_control");
        long r = cg_read(file, buf, sizeof buf);
        if (r < 0) return rb_error_set(err, RB_E_IO, "cgroup: read %s: %s", file,
                                       strerror((int)-r));
        uint64_t u = 0;
        if (cg_kv(buf, "under_oom", &u)) s.is_under_oom = u != 0;
        s.is_oom_kills_known = cg_kv(buf, "oom_kill", &s.n_oom_kills);
        s.oom_kills_source = s.is_oom_kills_known ? "memory.oom_control oom_kill" : "unknown";
    } else {
        CG_U64("memory.current", s.usage_bytes);
        CG_U64("memory.max", s.limit_bytes);
        cg_join(file, sizeof file, cg->path, "memory.peak");
        if (cg_file_exists(file)) CG_U64("memory.peak", s.max_usage_bytes);
        cg_join(file, sizeof file, cg->path, "memory.events");
        long r = cg_read(file, buf, sizeof buf);
        if (r < 0) return rb_error_set(err, RB_E_IO, "cgroup: read %s: %s", file,
                                       strerror((int)-r));
        cg_kv(buf, "max", &s.failcnt);
        s.is_oom_kills_known = cg_kv(buf, "oom_kill", &s.n_oom_kills);
        s.oom_kills_source = s.is_oom_kills_known ? "memory.events oom_kill" : "unknown";
    }
#undef CG_U64
    cg_join(file, sizeof file, cg->path, "memory.stat");
    long r = cg_read(file, buf, sizeof buf);
    if (r < 0) return rb_error_set(err, RB_E_IO, "cgroup: read %s: %s", file, strerror((int)-r));
    cg_kv(buf, v1 ? "cache" : "file", &s.cache_bytes);
    cg_kv(buf, v1 ? "rss" : "anon", &s.rss_bytes);
    cg_kv(buf, "pgmajfault", &s.pgmajfault);
    cg_kv(buf, "workingset_refault_file", &s.n_file_refaults);
    *out = s;
    return RB_OK;
}

/* Where a member goes on destroy: where we took it from when we know. */
static const char *cg_origin_of(const rb_cgroup *cg, pid_t pid)
{
    for (size_t i = cg->n_origins; i-- > 0;)
        if (cg->origins[i].pid == pid) return cg->origins[i].dir;
    return cg->root;
}

rb_status rb_cgroup_destroy(rb_cgroup *cg, rb_error *err)
{
    if (!cg) return RB_OK;
    rb_status st = RB_OK;
    char file[CG_PATH_MAX + 32], buf[8192];
    cg_join(file, sizeof file, cg->path, "cgroup.procs");
    /* 1. move the members out (a member may exit meanwhile: ESRCH is fine) */
    long r = cg_read(file, buf, sizeof buf);
    for (char *p = r > 0 ? buf : NULL; p && *p;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p) break;
        if (pid > 0) {
            int e = cg_move(cg_origin_of(cg, (pid_t)pid), (pid_t)pid);
            if (e && e != ESRCH) e = cg_move(cg->root, (pid_t)pid);
            if (e && e != ESRCH && st == RB_OK)
                st = rb_error_set(err, RB_E_IO, "cgroup: move pid %ld out of %s: %s", pid,
                                  cg->path, strerror(e));
        }
        p = end;
    }
    /* 2. rmdir: EBUSY lasts a moment after the last member exits (the
     *    kernel offlines the cgroup asynchronously); ~1 s of retries. */
    int e = 0;
    for (int i = 0; i < 100; i++) {
        if (rmdir(cg->path) == 0 || errno == ENOENT) {
            e = 0;
            break;
        }
        e = errno;
        if (e != EBUSY) break;
        cg_sleep_ms(10);
    }
    if (e && st == RB_OK)
        st = rb_error_set(err, RB_E_IO, "cgroup: rmdir %s: %s", cg->path, strerror(e));
    free(cg->origins);
    free(cg);
    return st;
}

const char *rb_cgroup_path(const rb_cgroup *cg) { return cg ? cg->path : ""; }
const char *rb_cgroup_name(const rb_cgroup *cg) { return cg ? cg->name : ""; }
rb_cgroup_version rb_cgroup_get_version(const rb_cgroup *cg)
{
    return cg ? cg->version : RB_CGROUP_NONE;
}
