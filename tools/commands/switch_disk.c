/*
 * switch_disk.c - what the machine's storage delivers, measured beside the
 * kill+session run.
 *
 * A cold restore is bound by storage: its floor is the bytes it reads over
 * the bandwidth they come at. The device profile caps that bandwidth
 * (phone: 1000 MiB/s), but a shared or slow disk may deliver less than the
 * profile, and then no restore reaches the profile's floor. So `switch`
 * measures two rates beside the fresh process:
 *  - the disk's, just before and just after it: the session file read
 *    unthrottled and past the page cache (O_DIRECT) into reused buffers,
 *    with the queue depth a cold restore has (several 1 MiB requests in
 *    flight);
 *  - a bare read's, after it: the same files (model and session) read
 *    through the page cache, their cached copies dropped first, as `cat`
 *    would, doing nothing else. Not before the fresh process: its page
 *    cache, dropped, leaves 4 KiB pages that a VM's host still backs (free
 *    page reporting returns only whole 2 MiB blocks), and the fresh process
 *    would land its bytes in them, where after a kill it finds memory the
 *    host must back again, a fault per page (measured: 0.6-1.0 GB/s
 *    against 1.5-2.4 GB/s for the same read into backed memory). After it,
 *    the bare read finds the fresh process's pages: its rate is the best
 *    this machine gives these bytes.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "switch.h"

#define REQ_BYTES (1u << 20)
#define MAX_STREAMS 8

typedef struct stream {
    int fd;
    uint64_t from, to; /* byte range, REQ_BYTES aligned */
    int failed;
} stream;

static void *read_stream(void *arg)
{
    stream *st = arg;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, REQ_BYTES) != 0) {
        st->failed = 1;
        return NULL;
    }
    for (uint64_t at = st->from; at < st->to; at += REQ_BYTES)
        if (pread(st->fd, buf, REQ_BYTES, (off_t)at) <= 0) {
            st->failed = 1;
            break;
        }
    free(buf);
    return NULL;
}

double sw_disk_read_bw(const char *path, uint64_t max_bytes, int n_streams)
{
    if (n_streams < 1 || n_streams > MAX_STREAMS)
        n_streams = MAX_STREAMS;
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return 0;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return 0;
    }
    uint64_t n = (uint64_t)sb.st_size < max_bytes ? (uint64_t)sb.st_size : max_bytes;
    uint64_t per = n / REQ_BYTES / (uint64_t)n_streams * REQ_BYTES;
    if (per == 0) {
        close(fd);
        return 0;
    }
    stream st[MAX_STREAMS];
    pthread_t th[MAX_STREAMS];
    int started = 0;
    double t0 = rb_cli_now_s();
    for (int i = 0; i < n_streams; i++) {
        st[i] = (stream){fd, (uint64_t)i * per, (uint64_t)(i + 1) * per, 0};
        if (pthread_create(&th[i], NULL, read_stream, &st[i]) != 0)
            break;
        started++;
    }
    int failed = started < n_streams;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        failed |= st[i].failed;
    }
    double dt = rb_cli_now_s() - t0;
    close(fd);
    return failed || dt <= 0 ? 0 : (double)(per * (uint64_t)n_streams) / dt;
}

/* ---- a bare read of the files a cold restore reads ---------------------- */

/* Drops the files' cached copies, so that the next reader reads storage. */
static void drop_cached(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        posix_fadvise(fds[i], 0, 0, POSIX_FADV_DONTNEED);
}

#define MAX_FILES 4

typedef struct bare_read {
    int fd[MAX_FILES];
    uint64_t chunks[MAX_FILES + 1]; /* chunk index where file i begins */
    int n_files;
    atomic_uint_fast64_t next;
    atomic_int failed;
} bare_read;

/* One stream: takes the next 1 MiB chunk of the files laid end to end, as
 * the restore's workers take the next job, into one reused buffer. */
static void *bare_stream(void *arg)
{
    bare_read *b = arg;
    void *buf = malloc(REQ_BYTES);
    if (!buf) {
        atomic_store(&b->failed, 1);
        return NULL;
    }
    for (;;) {
        uint64_t c = atomic_fetch_add(&b->next, 1);
        if (c >= b->chunks[b->n_files])
            break;
        int i = 0;
        while (c >= b->chunks[i + 1])
            i++;
        if (pread(b->fd[i], buf, REQ_BYTES, (off_t)((c - b->chunks[i]) * REQ_BYTES)) < 0) {
            atomic_store(&b->failed, 1);
            break;
        }
    }
    free(buf);
    return NULL;
}

double sw_bare_read_bw(const char *const *paths, int n_files, int n_streams)
{
    if (n_files < 1 || n_files > MAX_FILES || n_streams < 1 || n_streams > MAX_STREAMS)
        return 0;
    bare_read b = {.n_files = n_files};
    uint64_t bytes = 0;
    int opened = 0;
    for (; opened < n_files; opened++) {
        struct stat sb;
        b.fd[opened] = open(paths[opened], O_RDONLY | O_CLOEXEC);
        if (b.fd[opened] < 0 || fstat(b.fd[opened], &sb) != 0)
            break;
        bytes += (uint64_t)sb.st_size;
        b.chunks[opened + 1] =
            b.chunks[opened] + ((uint64_t)sb.st_size + REQ_BYTES - 1) / REQ_BYTES;
    }
    double bw = 0;
    if (opened == n_files) {
        drop_cached(b.fd, n_files);
        pthread_t th[MAX_STREAMS];
        int started = 0;
        double t0 = rb_cli_now_s();
        for (; started < n_streams; started++)
            if (pthread_create(&th[started], NULL, bare_stream, &b) != 0)
                break;
        for (int i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        double dt = rb_cli_now_s() - t0;
        bw = started == n_streams && !atomic_load(&b.failed) && dt > 0 ? (double)bytes / dt : 0;
        drop_cached(b.fd, n_files);
    } else if (b.fd[opened] >= 0) {
        close(b.fd[opened]);
    }
    for (int i = 0; i < opened; i++)
        close(b.fd[i]);
    return bw;
}

/* ---- whether the host takes free memory back ---------------------------- */

/* The first line of a sysfs file into buf; 0 when it cannot be read. */
static int read_line(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    int ok = f && fgets(buf, (int)n, f);
    if (f)
        fclose(f);
    return ok;
}

int sw_host_reclaims_free_memory(void)
{
    /* the guest reports blocks of 2^order pages; above the buddy
       allocator's largest order (10) it reports none */
    char line[80];
    if (!read_line("/sys/module/page_reporting/parameters/page_reporting_order", line,
                   sizeof line) || atoi(line) > 10)
        return 0;
    const char *dir = "/sys/bus/virtio/drivers/virtio_balloon";
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int yes = 0;
    for (struct dirent *e; !yes && (e = readdir(d));) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s/features", dir, e->d_name);
        /* one character per feature bit; VIRTIO_BALLOON_F_REPORTING is 5 */
        yes = !strncmp(e->d_name, "virtio", 6) && read_line(path, line, sizeof line) &&
              strlen(line) > 5 && line[5] == '1';
    }
    closedir(d);
    return yes;
}
