/*
 * test_trace.c - the trace format (round trip; malformed lines reported
 * with their numbers and skipped; fatal only when nothing parses), block
 * streams (keys, file separators, token spans), the strace importer on a
 * hand-written log and on a real strace run when strace is installed, and
 * rebound's own trace of a tiny model (load scan + per-token tensors).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "gguf.h"
#include "model.h"
#include "synth.h"
#include "trace.h"
#include "trace_strace.h"

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void round_trip(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/trace-rt.trace", REBOUND_TEST_TMP);
    rb_trace t;
    rb_trace_init(&t);
    rb_error err;
    uint32_t a, b;
    CHECK(rb_trace_add_file(&t, "/models/a b.gguf", 1 << 20, &a, &err) == RB_OK);
    CHECK(rb_trace_add_file(&t, "tok.json", 0, &b, &err) == RB_OK);
    rb_trace_rec r1 = {5, 0, 8192, -1, a, RB_PHASE_LOAD};
    rb_trace_rec r2 = {99, 100, 10, 3, b, RB_PHASE_DECODE};
    CHECK(rb_trace_add(&t, &r1, &err) == RB_OK);
    CHECK(rb_trace_add(&t, &r2, &err) == RB_OK);
    rb_trace_rec bad = {0, 0, 0, 0, a, 0};
    CHECK_EQ_INT(rb_trace_add(&t, &bad, &err), RB_E_INVALID_ARG);
    CHECK(rb_trace_write(&t, path, "a note", &err) == RB_OK);
    rb_trace u;
    rb_trace_diag d;
    CHECK(rb_trace_read(path, &u, &d, &err) == RB_OK);
    CHECK_EQ_INT(d.n_bad, 0);
    CHECK_EQ_INT(u.n_files, 2);
    CHECK_EQ_INT(u.n_recs, 2);
    CHECK_STR_EQ(u.files[0].path, "/models/a b.gguf");
    CHECK_EQ_U64(u.files[0].size, 1 << 20);
    CHECK(memcmp(&u.recs[1], &r2, sizeof r2) == 0);
    /* block stream: file 0 has 256 blocks, one separator, then file 1 */
    rb_block_stream s;
    CHECK(rb_block_stream_build(&u, &s, &err) == RB_OK);
    CHECK_EQ_INT(s.n, 3);
    CHECK_EQ_INT(s.key[0], 0);
    CHECK_EQ_INT(s.key[1], 1);
    CHECK_EQ_INT(s.key[2], 257);
    CHECK_EQ_INT(s.n_tok, 1);
    CHECK_EQ_INT(s.tok_start[0], 2);
    CHECK_EQ_INT(s.tok_id[0], 3);
    CHECK_EQ_INT(rb_block_stream_file(&s, 255), 0);
    CHECK_EQ_INT(rb_block_stream_file(&s, 256), 2); /* the separator */
    CHECK_EQ_INT(rb_block_stream_file(&s, 257), 1);
    rb_block_stream_free(&s);
    rb_trace_free(&u);
    rb_trace_free(&t);
}

static void malformed(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/trace-bad.trace", REBOUND_TEST_TMP);
    write_file(path,
               "# rebound-trace 1\n"
               "F 0 4096 m.gguf\n"
               "A 1 0 0 4096 -1 load\n"          /* 3: ok */
               "A 2 0 0 4096 -1 lunch\n"         /* 4: bad phase */
               "A 3 7 0 4096 -1 load\n"          /* 5: undeclared file */
               "garbage\n"                       /* 6 */
               "A 4 0 0 0 2 decode\n"            /* 7: length 0 */
               "F 5 10 x\n"                      /* 8: id out of order */
               "\n"
               "A 5 0 4096 4096 2 decode\n");    /* 10: ok */
    rb_trace t;
    rb_trace_diag d;
    rb_error err;
    CHECK(rb_trace_read(path, &t, &d, &err) == RB_OK);
    CHECK_EQ_INT(t.n_recs, 2);
    CHECK_EQ_INT(d.n_bad, 5);
    CHECK_EQ_INT(d.bad_line[0], 4);
    CHECK_CONTAINS(d.bad_why[0], "A line");
    CHECK_EQ_INT(d.bad_line[1], 5);
    CHECK_CONTAINS(d.bad_why[1], "not declared");
    CHECK_EQ_INT(d.bad_line[2], 6);
    CHECK_EQ_INT(d.bad_line[3], 7);
    CHECK_CONTAINS(d.bad_why[3], "length 0");
    CHECK_EQ_INT(d.bad_line[4], 8);
    rb_trace_free(&t);
    /* nothing parses: fatal, with the count and the first bad line */
    write_file(path, "# rebound-trace 1\nnope\nA x\n");
    CHECK_EQ_INT(rb_trace_read(path, &t, &d, &err), RB_E_FORMAT);
    CHECK_CONTAINS(err.message, "no access record");
    CHECK_CONTAINS(err.message, "2 malformed, first at line 2");
    write_file(path, "12:00:00.000000 read(3, \"\", 1) = 0\n");
    CHECK_EQ_INT(rb_trace_read(path, &t, &d, &err), RB_E_FORMAT);
    CHECK_CONTAINS(err.message, "not a rebound trace");
    CHECK_EQ_INT(rb_trace_read("/nonexistent/x.trace", &t, &d, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "cannot open '/nonexistent/x.trace'");
}

static void strace_log(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/trace.strace", REBOUND_TEST_TMP);
    write_file(path,
        "4242 10:00:00.000001 openat(AT_FDCWD, \"/m/model.gguf\", O_RDONLY) = 3\n"
        "4242 10:00:00.000002 read(3, \"GGUF\\3\\0\\0\\0\"..., 8192) = 8192\n"
        "4242 10:00:00.000003 read(3, \"a, \\\"b\\\") = 1\"..., 4096) = 4096\n"
        "4242 10:00:00.000004 lseek(3, 65536, SEEK_SET) = 65536\n"
        "4242 10:00:00.000005 read(3,  <unfinished ...>\n"
        "4243 10:00:00.000006 openat(AT_FDCWD, \"/etc/missing\", O_RDONLY) = -1 ENOENT (No such file or directory)\n"
        "4242 10:00:00.000007 <... read resumed>\"\\0\\0\"..., 1048576) = 1048576\n"
        "[pid  4243] 10:00:00.000008 pread64(3, \"x\"..., 4096, 409600) = 4096\n"
        "4242 10:00:00.000009 mmap(NULL, 2000000, PROT_READ, MAP_SHARED, 3, 0) = 0x7f0000000000\n"
        "this line is not strace output\n"
        "4242 10:00:00.000010 close(3) = 0\n"
        "4242 10:00:00.000011 read(3, \"\", 10) = -1 EBADF (Bad file descriptor)\n"
        "4242 10:00:00.000012 openat(AT_FDCWD, \"/m/tok.json\", O_RDONLY|O_CLOEXEC) = 3\n"
        "4242 10:00:00.000013 read(3, \"{\"..., 100) = 100\n"
        "4242 10:00:01.500000 +++ exited with 0 +++\n");
    rb_trace t;
    rb_trace_init(&t);
    rb_trace_diag d;
    rb_strace_stats ss;
    rb_error err;
    CHECK(rb_trace_import_strace(path, NULL, &t, &d, &ss, &err) == RB_OK);
    CHECK_EQ_INT(d.n_bad, 1);
    CHECK_EQ_INT(d.bad_line[0], 10);
    CHECK_EQ_INT(t.n_files, 2);
    CHECK_STR_EQ(t.files[0].path, "/m/model.gguf");
    CHECK_EQ_INT(t.n_recs, 5);
    if (t.n_recs == 5) {
        CHECK_EQ_U64(t.recs[0].offset, 0);
        CHECK_EQ_U64(t.recs[0].length, 8192);
        CHECK_EQ_U64(t.recs[1].offset, 8192);   /* read advances the position */
        CHECK_EQ_U64(t.recs[2].offset, 65536);  /* after lseek, resumed call */
        CHECK_EQ_U64(t.recs[2].length, 1048576);
        CHECK_EQ_U64(t.recs[3].offset, 409600); /* pread64 at its offset */
        CHECK_EQ_U64(t.recs[3].t_ns, 7000);
        CHECK_EQ_INT(t.recs[4].file, 1);        /* fd 3 reused for another file */
    }
    CHECK_EQ_U64(ss.n_mmaps, 1);
    rb_trace_free(&t);
    /* --only keeps one file */
    rb_trace_init(&t);
    CHECK(rb_trace_import_strace(path, "tok.json", &t, &d, &ss, &err) == RB_OK);
    CHECK_EQ_INT(t.n_files, 1);
    CHECK_EQ_INT(t.n_recs, 1);
    rb_trace_free(&t);
    /* nothing parses */
    write_file(path, "hello\nworld\n");
    rb_trace_init(&t);
    CHECK_EQ_INT(rb_trace_import_strace(path, NULL, &t, &d, &ss, &err), RB_E_FORMAT);
    CHECK_CONTAINS(err.message, "no line of");
    CHECK_CONTAINS(err.message, "first bad at line 1");
    rb_trace_free(&t);
}

/* Every prefix of every line of a valid log, and of a valid trace, each on
 * its own line: the parsers skip or accept each one, never read out of
 * bounds (run under ASan in CI). */
static void truncations(void)
{
    static const char *lines[] = {
        "4242 10:00:00.000001 openat(AT_FDCWD, \"/m/model.gguf\", O_RDONLY) = 3",
        "[pid  4243] 10:00:00.000008 pread64(3, \"x\\\"y\"..., 4096, 409600) = 4096",
        "4242 10:00:00.000005 read(3,  <unfinished ...>",
        "4242 10:00:00.000007 <... read resumed>\"\\0\\0\"..., 1048576) = 1048576",
        "4242 10:00:00.000009 mmap(NULL, 2000000, PROT_READ, MAP_SHARED, 3, 0) = 0x7f00",
        "4242 10:00:00.000004 lseek(3, 65536, SEEK_SET) = 65536",
        "4242 10:00:00.000010 dup2(3, 0)        = 0",
        "F 0 4096 m.gguf",
        "A 5 0 4096 4096 2 decode",
    };
    char path[512];
    snprintf(path, sizeof path, "%s/trace-trunc.log", REBOUND_TEST_TMP);
    for (int as_trace = 0; as_trace < 2; as_trace++) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f)
            return;
        if (as_trace)
            fputs("# rebound-trace 1\nF 0 4096 m.gguf\n", f);
        for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
            for (size_t n = 0; n <= strlen(lines[i]); n++)
                fprintf(f, "%.*s\n", (int)n, lines[i]);
        fclose(f);
        rb_trace t;
        rb_trace_init(&t);
        rb_trace_diag d;
        rb_strace_stats ss;
        rb_error err;
        rb_status st = as_trace ? rb_trace_read(path, &t, &d, &err)
                                : rb_trace_import_strace(path, NULL, &t, &d, &ss, &err);
        CHECK(st == RB_OK || st == RB_E_FORMAT);
        CHECK(d.n_bad > 0);
        rb_trace_free(&t);
    }
}

/* A real strace run of dd reading a file, when strace is installed. */
static void real_strace(void)
{
    if (system("command -v strace >/dev/null 2>&1") != 0) {
        fprintf(stderr, "note: strace is not installed: the real-log check is skipped\n");
        return;
    }
    char data[512], log[512], cmd[2048];
    snprintf(data, sizeof data, "%s/strace-data.bin", REBOUND_TEST_TMP);
    snprintf(log, sizeof log, "%s/strace-real.log", REBOUND_TEST_TMP);
    FILE *f = fopen(data, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    static char buf[300000];
    memset(buf, 7, sizeof buf);
    fwrite(buf, 1, sizeof buf, f);
    fclose(f);
    /* dd reads through a dup2'ed descriptor 0: dup2 in the list follows it */
    snprintf(cmd, sizeof cmd, "strace -f -tt -e trace=openat,read,pread64,lseek,mmap,close,dup2 "
             "-o '%s' dd if='%s' of=/dev/null bs=65536 2>/dev/null", log, data);
    if (system(cmd) != 0) {
        fprintf(stderr, "note: strace could not trace here (ptrace refused?): skipped\n");
        return;
    }
    rb_trace t;
    rb_trace_init(&t);
    rb_trace_diag d;
    rb_strace_stats ss;
    rb_error err;
    CHECK(rb_trace_import_strace(log, "strace-data.bin", &t, &d, &ss, &err) == RB_OK);
    CHECK_EQ_INT(d.n_bad, 0);
    uint64_t total = 0, expect_off = 0;
    for (size_t i = 0; i < t.n_recs; i++) {
        CHECK_EQ_U64(t.recs[i].offset, expect_off); /* dd reads sequentially */
        expect_off += t.recs[i].length;
        total += t.recs[i].length;
    }
    CHECK_EQ_U64(total, sizeof buf);
    rb_trace_free(&t);
}

/* rebound's own trace: the header, the load scan, then per batch the
 * embedding rows and every layer's tensors. */
static void model_trace(void)
{
    char model_path[512], path[512];
    snprintf(model_path, sizeof model_path, "%s/trace-tiny.gguf", REBOUND_TEST_TMP);
    snprintf(path, sizeof path, "%s/trace-tiny.trace", REBOUND_TEST_TMP);
    rb_error err;
    rb_synth_params sp = {*rb_synth_shape_find("tiny"), rb_file_kind_find("q8_0"), 1, 1};
    CHECK(rb_synth_write(model_path, &sp, NULL, &err) == RB_OK);
    rb_model *m = NULL;
    CHECK(rb_model_open(model_path, NULL, &m, &err) == RB_OK);
    if (!m)
        return;
    rb_trace_writer *w = NULL;
    CHECK(rb_trace_writer_open(path, &w, &err) == RB_OK);
    CHECK(rb_trace_writer_attach_model(w, m, model_path) == RB_OK);
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 64;
    p.n_threads = 1;
    rb_session *s = NULL;
    CHECK(rb_session_create(m, &p, &s, &err) == RB_OK);
    int32_t prompt[3] = {1, 20, 30}, next = 40;
    CHECK(rb_session_feed(s, prompt, 3, NULL) == RB_OK);
    CHECK(rb_session_feed(s, &next, 1, NULL) == RB_OK);
    CHECK(rb_session_feed(s, &next, 1, NULL) == RB_OK);
    rb_session_destroy(s);
    CHECK(rb_trace_writer_close(w, &err) == RB_OK);
    const rb_gguf *g = rb_model_gguf(m);
    uint64_t n_tensors = rb_gguf_n_tensors(g), tensor_bytes = 0;
    for (uint64_t i = 0; i < n_tensors; i++)
        tensor_bytes += rb_gguf_tensor_at(g, i)->n_bytes;

    rb_trace t;
    rb_trace_diag d;
    CHECK(rb_trace_read(path, &t, &d, &err) == RB_OK);
    CHECK_EQ_INT(d.n_bad, 0);
    CHECK_EQ_INT(t.n_files, 1);
    CHECK_EQ_U64(t.files[0].size, rb_gguf_file_size(g));
    /* record 0: the header; then one load record per tensor */
    CHECK_EQ_U64(t.recs[0].offset, 0);
    CHECK_EQ_U64(t.recs[0].length, rb_gguf_data_offset(g));
    uint64_t load_bytes = 0, n_load = 0;
    size_t i = 1;
    for (; i < t.n_recs && t.recs[i].phase == RB_PHASE_LOAD; i++, n_load++)
        load_bytes += t.recs[i].length;
    CHECK_EQ_U64(n_load, n_tensors);
    CHECK_EQ_U64(load_bytes, tensor_bytes);
    /* per batch: embedding rows, 2 layers x 9 tensors (llama: norm, q, k, v,
       o, norm, gate, up, down), output norm, output matrix */
    size_t n_prefill = 0, n_decode = 0;
    for (; i < t.n_recs; i++) {
        n_prefill += t.recs[i].phase == RB_PHASE_PREFILL;
        n_decode += t.recs[i].phase == RB_PHASE_DECODE;
    }
    CHECK_EQ_INT(n_prefill, 3 + 2 * 9 + 2);
    CHECK_EQ_INT(n_decode, 2 * (1 + 2 * 9 + 2));
    rb_block_stream bs;
    CHECK(rb_block_stream_build(&t, &bs, &err) == RB_OK);
    CHECK_EQ_INT(bs.n_tok, 3); /* the prefill batch and two decode steps */
    CHECK_EQ_INT(bs.tok_id[1], 3);
    CHECK_EQ_INT(bs.tok_phase[2], RB_PHASE_DECODE);
    rb_block_stream_free(&bs);
    rb_trace_free(&t);
    rb_model_close(m);
    remove(model_path);
}

int main(void)
{
    round_trip();
    malformed();
    strace_log();
    truncations();
    real_strace();
    model_trace();
    return check_report();
}
