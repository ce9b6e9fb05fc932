/*
 * switch_disk.c - the disk's own read bandwidth, measured beside the
 * kill+session run.
 *
 * A cold restore is bound by storage: its floor is the bytes it reads over
 * the bandwidth they come at. The device profile caps that bandwidth
 * (phone: 1 GiB/s), but a shared or slow disk may deliver less than the
 * profile, and then no restore reaches the profile's floor. So `switch`
 * reads the session file itself, unthrottled and past the page cache
 * (O_DIRECT), with the queue depth a cold restore has (several 1 MiB
 * requests in flight), just before and just after the fresh process, and
 * states the floor for the slower of the two as well.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
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
