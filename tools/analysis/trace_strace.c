/*
 * trace_strace.c - the strace importer (contract in trace_strace.h).
 *
 * The log format it reads, one system call per line:
 *
 *   [PID |[pid PID] ]HH:MM:SS.ffffff name(args) = result
 *   PID HH:MM:SS.ffffff read(3, <unfinished ...>
 *   PID HH:MM:SS.ffffff <... read resumed>"\177ELF"..., 832) = 832
 *   PID HH:MM:SS.ffffff +++ exited with 0 +++        (ignored)
 *   PID HH:MM:SS.ffffff --- SIGCHLD {...} ---        (ignored)
 *
 * Descriptors are followed to files: openat/open bind fd -> file (and
 * position 0), read advances the position, lseek sets it (SEEK_SET/CUR/END
 * by its result, which strace prints), pread64 leaves it, close unbinds.
 * One descriptor table for the whole log: threads share theirs, and a
 * forked child that only reads what its parent opened sees the same files;
 * a child reusing a number for another file rebinds it at its open.
 * An "unfinished" call is kept per pid until its "resumed" half arrives.
 *
 * dup/dup2/dup3, when the log has them (add them to -e trace=), copy the
 * binding to the new descriptor.
 *
 * Does not see: page faults of mmap'ed files (counted in stats, no record),
 * readv/preadv, sendfile/copy_file_range, O_DIRECT alignment.
 *
 * Memory: the trace's arrays; a descriptor table grown to the largest fd;
 * one pending line per pid with an unfinished call (a small list).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"
#include "trace_strace.h"

typedef struct fd_slot {
    int64_t file;       /* trace file id, -1 unbound, -2 bound but filtered out */
    uint64_t pos;
} fd_slot;

typedef struct pending {
    long pid;
    char *head;         /* "name(args up to <unfinished" */
} pending;

typedef struct importer {
    rb_trace *t;
    const char *only;
    fd_slot *fds;
    size_t n_fds;
    pending *pend;
    size_t n_pend, cap_pend;
    int have_t0;
    uint64_t t0_ns;
    rb_strace_stats *st;
    rb_error *err;
} importer;

static fd_slot *slot(importer *im, long fd)
{
    if (fd < 0 || fd > (1 << 24))
        return NULL;
    if ((size_t)fd >= im->n_fds) {
        size_t n = (size_t)fd + 64;
        fd_slot *nf = realloc(im->fds, n * sizeof *nf);
        if (!nf)
            return NULL;
        for (size_t i = im->n_fds; i < n; i++)
            nf[i] = (fd_slot){-1, 0};
        im->fds = nf;
        im->n_fds = n;
    }
    return &im->fds[fd];
}

/* Skips a C-escaped "string" (and strace's trailing "..." when truncated). */
static const char *skip_string(const char *p)
{
    if (*p != '"')
        return p;
    p++;
    while (*p && *p != '"') {
        if (*p == '\\' && p[1])
            p++;
        p++;
    }
    if (*p == '"')
        p++;
    if (strncmp(p, "...", 3) == 0)
        p += 3;
    return p;
}

/* Splits "a, "s,s", c" into up to max argument start pointers; returns n. */
static int split_args(const char *p, const char **arg, int max)
{
    int n = 0, depth = 0;
    while (*p == ' ')
        p++;
    if (*p == ')')
        return 0;
    arg[n++] = p;
    while (*p) {
        if (*p == '"') {
            p = skip_string(p);
            continue;
        }
        if (*p == '(' || *p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        else if (*p == ')') {
            if (depth == 0)
                break;
            depth--;
        } else if (*p == ',' && depth == 0) {
            p++;
            while (*p == ' ')
                p++;
            if (n < max)
                arg[n++] = p;
            continue;
        }
        p++;
    }
    return n;
}

static int num_arg(const char *a, int64_t *out)
{
    errno = 0;
    char *end;
    long long v = strtoll(a, &end, 0);
    if (errno || end == a)
        return -1;
    *out = v;
    return 0;
}

/* The result after the last ")   = " of the line (strace pads short calls
 * with spaces before the '='); -1 on failure or "?". */
static int result_of(const char *line, int64_t *out)
{
    const char *r = NULL;
    for (const char *e = strstr(line, " = "); e; e = strstr(e + 1, " = ")) {
        const char *b = e;
        while (b > line && b[-1] == ' ')
            b--;
        if (b > line && b[-1] == ')')
            r = e + 3;
    }
    if (!r || *r == '?')
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(r, &end, 0);
    if (errno || end == r || v < 0)
        return -1;
    *out = v;
    return 0;
}

/* A quoted path argument into buf; -1 if not a plain string. */
static int path_arg(const char *a, char *buf, size_t cap)
{
    if (*a != '"')
        return -1;
    const char *e = skip_string(a);
    if (e - a < 2 || e[-1] != '"')
        return -1; /* truncated ("...") */
    size_t n = (size_t)(e - a - 2);
    if (n + 1 > cap)
        return -1;
    memcpy(buf, a + 1, n);
    buf[n] = 0;
    return 0;
}

static rb_status add_read(importer *im, fd_slot *s, uint64_t off, int64_t n, uint64_t t_ns)
{
    if (n <= 0 || s->file < 0)
        return RB_OK;
    rb_trace_rec r = {t_ns, off, (uint64_t)n, -1, (uint32_t)s->file, RB_PHASE_OTHER};
    return rb_trace_add(im->t, &r, im->err);
}

/* One complete call "name(args) = result"; returns NULL or why it is bad. */
static const char *do_call(importer *im, const char *call, uint64_t t_ns, rb_status *st)
{
    const char *paren = strchr(call, '(');
    if (!paren)
        return "no '(' after the system call name";
    size_t nl = (size_t)(paren - call);
    const char *arg[8];
    int na = split_args(paren + 1, arg, 8);
    int64_t res = -1;
    int ok = result_of(call, &res) == 0;
#define IS(s) (nl == strlen(s) && strncmp(call, s, nl) == 0)
    if (IS("openat") || IS("open")) {
        const char *pa = IS("openat") ? (na >= 2 ? arg[1] : NULL) : (na >= 1 ? arg[0] : NULL);
        char path[4096];
        if (!pa || path_arg(pa, path, sizeof path) != 0)
            return "open: path argument is not a complete string";
        im->st->n_opens++;
        if (!ok) {
            im->st->n_ignored++;
            return NULL;
        }
        fd_slot *s = slot(im, (long)res);
        if (!s)
            return "open: descriptor out of range";
        s->pos = 0;
        s->file = -2;
        if (im->only && !strstr(path, im->only))
            return NULL;
        for (uint32_t i = 0; i < im->t->n_files; i++)
            if (strcmp(im->t->files[i].path, path) == 0) {
                s->file = i;
                return NULL;
            }
        uint32_t id;
        if ((*st = rb_trace_add_file(im->t, path, 0, &id, im->err)) != RB_OK)
            return "out of memory";
        s->file = id;
        return NULL;
    }
    if (IS("read") || IS("pread64")) {
        int is_p = IS("pread64");
        int64_t fd, off = 0;
        if (na < (is_p ? 4 : 3) || num_arg(arg[0], &fd) ||
            (is_p && num_arg(arg[3], &off)) || off < 0)
            return is_p ? "pread64: expected (fd, buf, count, offset)"
                        : "read: expected (fd, buf, count)";
        is_p ? im->st->n_preads++ : im->st->n_reads++;
        fd_slot *s = slot(im, (long)fd);
        if (!ok || !s || s->file == -1) {
            im->st->n_ignored++;
            return NULL;
        }
        uint64_t at = is_p ? (uint64_t)off : s->pos;
        if (!is_p)
            s->pos += (uint64_t)res;
        *st = add_read(im, s, at, res, t_ns);
        return *st ? "out of memory" : NULL;
    }
    if (IS("lseek")) {
        int64_t fd;
        if (na < 3 || num_arg(arg[0], &fd))
            return "lseek: expected (fd, offset, whence)";
        im->st->n_lseeks++;
        fd_slot *s = slot(im, (long)fd);
        if (!ok || !s) {
            im->st->n_ignored++;
            return NULL;
        }
        s->pos = (uint64_t)res; /* the new position, whatever the whence */
        return NULL;
    }
    if (IS("mmap") || IS("mmap2")) {
        int64_t fd;
        if (na < 6 || num_arg(arg[4], &fd))
            return "mmap: expected (addr, length, prot, flags, fd, offset)";
        fd_slot *s = fd >= 0 ? slot(im, (long)fd) : NULL;
        if (s && s->file >= 0)
            im->st->n_mmaps++;
        return NULL;
    }
    if (IS("dup") || IS("dup2") || IS("dup3")) {
        /* the new descriptor names the same file and shares the position
           (tracked per descriptor here: exact unless both are read) */
        int64_t fd;
        if (na < 1 || num_arg(arg[0], &fd))
            return "dup: expected (fd, ...)";
        fd_slot *to = ok ? slot(im, (long)res) : NULL;
        fd_slot *from = slot(im, (long)fd); /* after `to`: growing moves the array */
        if (from && to)
            *to = *from;
        return NULL;
    }
    if (IS("close")) {
        int64_t fd;
        if (na < 1 || num_arg(arg[0], &fd))
            return "close: expected (fd)";
        im->st->n_closes++;
        fd_slot *s = slot(im, (long)fd);
        if (s)
            *s = (fd_slot){-1, 0};
        return NULL;
    }
#undef IS
    im->st->n_ignored++; /* another system call: not part of the file picture */
    return NULL;
}

static pending *find_pending(importer *im, long pid)
{
    for (size_t i = 0; i < im->n_pend; i++)
        if (im->pend[i].pid == pid)
            return &im->pend[i];
    return NULL;
}

/* One log line; returns NULL or why it is bad. */
static const char *do_line(importer *im, char *line, rb_status *st)
{
    char *p = line;
    long pid = 0;
    line[strcspn(line, "\r\n")] = 0;
    if (strncmp(p, "[pid", 4) == 0) {
        pid = strtol(p + 4, &p, 10);
        if (*p != ']')
            return "malformed '[pid N]' prefix";
        p++;
    } else if (*p >= '0' && *p <= '9') {
        /* "PID HH:MM:SS..." (strace -f -o) or a bare "HH:MM:SS..." */
        const char *sp = strchr(p, ' '), *colon = strchr(p, ':');
        if (sp && colon && sp < colon)
            pid = strtol(p, &p, 10);
    }
    while (*p == ' ')
        p++;
    unsigned hh, mm, ss, us;
    int used = 0;
    if (sscanf(p, "%2u:%2u:%2u.%6u%n", &hh, &mm, &ss, &us, &used) != 4 || used < 15)
        return "expected a HH:MM:SS.ffffff timestamp (strace -tt)";
    p += used;
    while (*p == ' ')
        p++;
    uint64_t t_ns = ((uint64_t)hh * 3600 + mm * 60 + ss) * 1000000000ull + (uint64_t)us * 1000;
    if (!im->have_t0) {
        im->t0_ns = t_ns;
        im->have_t0 = 1;
    }
    t_ns = t_ns >= im->t0_ns ? t_ns - im->t0_ns : t_ns + 86400000000000ull - im->t0_ns;
    if (strncmp(p, "+++", 3) == 0 || strncmp(p, "---", 3) == 0)
        return NULL; /* exits and signals */
    char *unf = strstr(p, " <unfinished ...>");
    if (unf) {
        *unf = 0;
        pending *pe = find_pending(im, pid);
        if (!pe) {
            if (im->n_pend == im->cap_pend) {
                size_t cap = im->cap_pend ? im->cap_pend * 2 : 8;
                pending *np = realloc(im->pend, cap * sizeof *np);
                if (!np) {
                    *st = RB_E_NOMEM;
                    return "out of memory";
                }
                im->pend = np;
                im->cap_pend = cap;
            }
            pe = &im->pend[im->n_pend++];
            pe->pid = pid;
            pe->head = NULL;
        }
        free(pe->head);
        pe->head = strdup(p);
        if (!pe->head) {
            *st = RB_E_NOMEM;
            return "out of memory";
        }
        return NULL;
    }
    if (strncmp(p, "<... ", 5) == 0) {
        char *rest = strstr(p, " resumed>");
        pending *pe = find_pending(im, pid);
        if (!rest || !pe || !pe->head)
            return "'resumed' without an earlier 'unfinished' call of this pid";
        rest += 9;
        size_t n = strlen(pe->head) + strlen(rest) + 1;
        char *whole = malloc(n);
        if (!whole) {
            *st = RB_E_NOMEM;
            return "out of memory";
        }
        snprintf(whole, n, "%s%s", pe->head, rest);
        free(pe->head);
        *pe = im->pend[--im->n_pend];
        const char *why = do_call(im, whole, t_ns, st);
        free(whole);
        return why;
    }
    return do_call(im, p, t_ns, st);
}

rb_status rb_trace_import_strace(const char *path, const char *only, rb_trace *out,
                                 rb_trace_diag *diag, rb_strace_stats *stats, rb_error *err)
{
    rb_trace_diag dd;
    rb_strace_stats ds;
    if (!diag)
        diag = &dd;
    if (!stats)
        stats = &ds;
    memset(diag, 0, sizeof *diag);
    memset(stats, 0, sizeof *stats);
    FILE *f = fopen(path, "r");
    if (!f)
        return rb_error_set(err, RB_E_IO, "strace: cannot open '%s': %s", path, strerror(errno));
    importer im = {.t = out, .only = only, .st = stats, .err = err};
    rb_status st = RB_OK;
    size_t cap = 1 << 16;
    char *line = malloc(cap);
    if (!line) {
        fclose(f);
        return rb_error_set(err, RB_E_NOMEM, "strace: out of memory");
    }
    while (st == RB_OK && fgets(line, (int)cap, f)) {
        diag->n_lines++;
        size_t len = strlen(line);
        if (len == cap - 1 && line[len - 1] != '\n') {
            rb_trace_diag_bad(diag, diag->n_lines, "line longer than 64 KiB");
            int c;
            while ((c = fgetc(f)) != EOF && c != '\n')
                ;
            continue;
        }
        if (line[strspn(line, " \t\r\n")] == 0)
            continue;
        const char *why = do_line(&im, line, &st);
        if (st != RB_OK)
            break;
        if (why)
            rb_trace_diag_bad(diag, diag->n_lines, why);
        else
            diag->n_parsed++;
    }
    free(line);
    free(im.fds);
    for (size_t i = 0; i < im.n_pend; i++)
        free(im.pend[i].head);
    free(im.pend);
    fclose(f);
    if (st == RB_E_NOMEM)
        return rb_error_set(err, st, "strace: out of memory at line %" PRIu64, diag->n_lines);
    if (st != RB_OK)
        return st;
    if (diag->n_parsed == 0)
        return rb_error_set(err, RB_E_FORMAT,
                            "strace: no line of '%s' parses (%" PRIu64 " lines%s%" PRIu64
                            "); expected `strace -f -tt` output", path, diag->n_lines,
                            diag->n_bad ? ", first bad at line " : "",
                            diag->n_bad ? diag->bad_line[0] : 0);
    if (out->n_recs == 0)
        return rb_error_set(err, RB_E_FORMAT,
                            "strace: '%s' has no successful read of an opened file%s%s%s", path,
                            only ? " whose path contains '" : "", only ? only : "",
                            only ? "'" : "");
    return RB_OK;
}
