/*
 * rebound_jni.c - the JNI half of the Java binding (org.rebound.Native):
 * each native method is one call, or a few, of the public C API
 * (<rebound.h>); nothing here reaches the library's internals. The same
 * shared library (librebound_jni.so) is what an Android app loads with
 * System.loadLibrary("rebound_jni").
 *
 * Handles cross the boundary as jlong (the C pointer); the Java classes
 * own them (Model, Session, Pool close them once) and check for use after
 * close, so a handle that reaches this file is live. A failed call throws
 * org.rebound.ReboundException(status name, message) and returns a zero
 * value the Java side never looks at.
 *
 * Text crosses as byte[] holding UTF-8 (Java's String.getBytes(UTF_8)),
 * never through GetStringUTFChars, whose "modified UTF-8" differs for NUL
 * and for characters beyond the BMP.
 *
 * Structs are built by name from the library's defaults
 * (rb_session_default_params, rb_sampler_default_params): a field the
 * library adds later keeps its default here.
 *
 * Memory: arrays are copied in and out per call (GetIntArrayRegion and
 * friends); generate allocates a sampler, a detokenizer and a piece buffer
 * per call and frees them before it returns.
 *
 * Threads: as rb_session_*'s rule; the methods that the C API allows from
 * any thread (trim, abort, set_priority, every pool call) are what Java's
 * AndroidMemory calls from the main thread while the model thread feeds.
 */
#include <jni.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rebound.h>

#define JNI_FN(name) Java_org_rebound_Native_##name

/* Throws ReboundException(status, message); returns nothing useful. */
static void throw_rb(JNIEnv *env, rb_status st, const char *msg)
{
    jclass cls = (*env)->FindClass(env, "org/rebound/ReboundException");
    if (!cls)
        return; /* NoClassDefFoundError pending */
    jmethodID ctor = (*env)->GetMethodID(env, cls, "<init>", "(Ljava/lang/String;Ljava/lang/String;)V");
    if (!ctor)
        return;
    jstring js = (*env)->NewStringUTF(env, rb_status_name(st));
    jstring jm = (*env)->NewStringUTF(env, msg ? msg : "");
    if (!js || !jm)
        return;
    jobject ex = (*env)->NewObject(env, cls, ctor, js, jm);
    if (ex)
        (*env)->Throw(env, (jthrowable)ex);
}

static void throw_oom(JNIEnv *env, const char *what)
{
    throw_rb(env, RB_E_NOMEM, what);
}

/* A NUL-terminated copy of a byte[] (UTF-8 text or a path); NULL with an
 * exception pending on failure. Free with free(). */
static char *bytes_to_cstr(JNIEnv *env, jbyteArray a, size_t *len_out)
{
    if (!a) {
        throw_rb(env, RB_E_INVALID_ARG, "null text");
        return NULL;
    }
    jsize n = (*env)->GetArrayLength(env, a);
    char *s = malloc((size_t)n + 1);
    if (!s) {
        throw_oom(env, "out of memory copying a string");
        return NULL;
    }
    (*env)->GetByteArrayRegion(env, a, 0, n, (jbyte *)s);
    s[n] = '\0';
    if (len_out)
        *len_out = (size_t)n;
    return s;
}

static jbyteArray new_bytes(JNIEnv *env, const char *p, size_t n)
{
    if (n > (size_t)INT32_MAX) {
        throw_rb(env, RB_E_INVALID_ARG, "text longer than a Java array");
        return NULL;
    }
    jbyteArray a = (*env)->NewByteArray(env, (jsize)n);
    if (a && n)
        (*env)->SetByteArrayRegion(env, a, 0, (jsize)n, (const jbyte *)p);
    return a;
}

static jlongArray new_longs(JNIEnv *env, const jlong *v, jsize n)
{
    jlongArray a = (*env)->NewLongArray(env, n);
    if (a)
        (*env)->SetLongArrayRegion(env, a, 0, n, v);
    return a;
}

/* ---- library ------------------------------------------------------------ */

JNIEXPORT jstring JNICALL JNI_FN(version)(JNIEnv *env, jclass cls)
{
    (void)cls;
    return (*env)->NewStringUTF(env, rb_version());
}

/* ---- model -------------------------------------------------------------- */

JNIEXPORT jlong JNICALL JNI_FN(modelOpen)(JNIEnv *env, jclass cls, jbyteArray path,
                                          jboolean use_mmap)
{
    (void)cls;
    char *p = bytes_to_cstr(env, path, NULL);
    if (!p)
        return 0;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = use_mmap ? 1 : 0;
    rb_model *m = NULL;
    rb_error err;
    rb_status st = rb_model_open(p, &mp, &m, &err);
    free(p);
    if (st != RB_OK) {
        throw_rb(env, err.status, err.message);
        return 0;
    }
    return (jlong)(intptr_t)m;
}

JNIEXPORT void JNICALL JNI_FN(modelClose)(JNIEnv *env, jclass cls, jlong h)
{
    (void)env, (void)cls;
    rb_model_close((rb_model *)(intptr_t)h);
}

/* {n_layers, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab,
 *  n_ctx_train, file_bytes, tensor_data_bytes, kv_bytes_per_token}
 * (Model.Info's order). */
JNIEXPORT jlongArray JNICALL JNI_FN(modelInfo)(JNIEnv *env, jclass cls, jlong h)
{
    (void)cls;
    rb_model *m = (rb_model *)(intptr_t)h;
    rb_model_info in;
    if (rb_model_get_info(m, &in) != RB_OK) {
        throw_rb(env, RB_E_INVALID_ARG, rb_model_errmsg(m));
        return NULL;
    }
    jlong v[] = {in.n_layers, in.n_embd, in.n_head, in.n_head_kv, in.head_dim, in.n_ff,
                 in.n_vocab, in.n_ctx_train, (jlong)in.file_bytes, (jlong)in.tensor_data_bytes,
                 (jlong)in.kv_bytes_per_token};
    return new_longs(env, v, (jsize)(sizeof v / sizeof v[0]));
}

/* {architecture, name} as UTF-8 */
JNIEXPORT jobjectArray JNICALL JNI_FN(modelNames)(JNIEnv *env, jclass cls, jlong h)
{
    (void)cls;
    rb_model *m = (rb_model *)(intptr_t)h;
    rb_model_info in;
    if (rb_model_get_info(m, &in) != RB_OK) {
        throw_rb(env, RB_E_INVALID_ARG, rb_model_errmsg(m));
        return NULL;
    }
    jclass bcls = (*env)->FindClass(env, "[B");
    if (!bcls)
        return NULL;
    jobjectArray out = (*env)->NewObjectArray(env, 2, bcls, NULL);
    if (!out)
        return NULL;
    const char *s[2] = {in.architecture ? in.architecture : "", in.name ? in.name : ""};
    for (jsize i = 0; i < 2; i++) {
        jbyteArray b = new_bytes(env, s[i], strlen(s[i]));
        if (!b)
            return NULL;
        (*env)->SetObjectArrayElement(env, out, i, b);
    }
    return out;
}

JNIEXPORT jintArray JNICALL JNI_FN(tokenize)(JNIEnv *env, jclass cls, jlong h, jbyteArray text,
                                             jboolean add_special, jboolean parse_special)
{
    (void)cls;
    rb_model *m = (rb_model *)(intptr_t)h;
    size_t len = 0;
    char *t = bytes_to_cstr(env, text, &len);
    if (!t)
        return NULL;
    size_t n = 0;
    /* ask for the count first, then fill */
    rb_status st = rb_model_tokenize(m, t, len, add_special, parse_special, NULL, 0, &n);
    if (st != RB_OK && st != RB_E_INVALID_ARG) {
        free(t);
        throw_rb(env, st, rb_model_errmsg(m));
        return NULL;
    }
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        free(t);
        throw_oom(env, "out of memory for the token ids");
        return NULL;
    }
    st = rb_model_tokenize(m, t, len, add_special, parse_special, ids, n, &n);
    free(t);
    if (st != RB_OK) {
        free(ids);
        throw_rb(env, st, rb_model_errmsg(m));
        return NULL;
    }
    jintArray out = NULL;
    if (n > (size_t)INT32_MAX)
        throw_rb(env, RB_E_INVALID_ARG, "more tokens than a Java array holds");
    else if ((out = (*env)->NewIntArray(env, (jsize)n)) != NULL)
        (*env)->SetIntArrayRegion(env, out, 0, (jsize)n, (const jint *)ids);
    free(ids);
    return out;
}

/* The text of tokens through a streaming detokenizer (flags: 1 keeps the
 * first piece's leading space, as text that continues earlier text). */
JNIEXPORT jbyteArray JNICALL JNI_FN(detokenize)(JNIEnv *env, jclass cls, jlong h,
                                                jintArray tokens, jint flags)
{
    (void)cls;
    rb_model *m = (rb_model *)(intptr_t)h;
    rb_detokenizer *d = NULL;
    rb_error err;
    if (rb_detokenizer_create_flags(m, (unsigned)flags, &d, &err) != RB_OK) {
        throw_rb(env, err.status, err.message);
        return NULL;
    }
    jsize n = (*env)->GetArrayLength(env, tokens);
    size_t cap = rb_detokenizer_max_bytes(d);
    size_t out_cap = ((size_t)n + 1) * cap;
    char *out = malloc(out_cap);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    jbyteArray res = NULL;
    size_t used = 0, k = 0;
    if (!out || !ids) {
        throw_oom(env, "out of memory for the text");
        goto done;
    }
    (*env)->GetIntArrayRegion(env, tokens, 0, n, (jint *)ids);
    for (jsize i = 0; i < n; i++) {
        if (rb_detokenizer_push(d, ids[i], out + used, cap, &k) != RB_OK) {
            throw_rb(env, RB_E_INVALID_ARG, rb_detokenizer_errmsg(d));
            goto done;
        }
        used += k;
    }
    if (rb_detokenizer_flush(d, out + used, cap, &k) != RB_OK) {
        throw_rb(env, RB_E_INVALID_ARG, rb_detokenizer_errmsg(d));
        goto done;
    }
    used += k;
    res = new_bytes(env, out, used);
done:
    free(ids);
    free(out);
    rb_detokenizer_destroy(d);
    return res;
}

/* which: 0 BOS, 1 EOS; -1 when the model has none */
JNIEXPORT jint JNICALL JNI_FN(tokenSpecial)(JNIEnv *env, jclass cls, jlong h, jint which)
{
    (void)env, (void)cls;
    rb_model *m = (rb_model *)(intptr_t)h;
    return which == 0 ? rb_model_token_bos(m) : rb_model_token_eos(m);
}

JNIEXPORT jboolean JNICALL JNI_FN(tokenIsEog)(JNIEnv *env, jclass cls, jlong h, jint token)
{
    (void)env, (void)cls;
    return rb_model_token_is_eog((rb_model *)(intptr_t)h, token) ? JNI_TRUE : JNI_FALSE;
}

/* ---- pool --------------------------------------------------------------- */

JNIEXPORT jlong JNICALL JNI_FN(poolCreate)(JNIEnv *env, jclass cls, jlong model, jlong budget)
{
    (void)cls;
    rb_pool *p = NULL;
    rb_error err;
    if (budget < 0) {
        throw_rb(env, RB_E_INVALID_ARG, "pool budget_bytes is negative");
        return 0;
    }
    if (rb_pool_create((rb_model *)(intptr_t)model, (uint64_t)budget, &p, &err) != RB_OK) {
        throw_rb(env, err.status, err.message);
        return 0;
    }
    return (jlong)(intptr_t)p;
}

JNIEXPORT void JNICALL JNI_FN(poolDestroy)(JNIEnv *env, jclass cls, jlong h)
{
    (void)env, (void)cls;
    rb_pool_destroy((rb_pool *)(intptr_t)h);
}

JNIEXPORT void JNICALL JNI_FN(poolSetBudget)(JNIEnv *env, jclass cls, jlong h, jlong budget)
{
    (void)cls;
    if (budget < 0) {
        throw_rb(env, RB_E_INVALID_ARG, "pool budget_bytes is negative");
        return;
    }
    rb_status st = rb_pool_set_budget((rb_pool *)(intptr_t)h, (uint64_t)budget);
    if (st != RB_OK)
        throw_rb(env, st, "rb_pool_set_budget failed");
}

/* The pool has no message of its own: the status names the error. */
JNIEXPORT jlong JNICALL JNI_FN(poolTrim)(JNIEnv *env, jclass cls, jlong h, jlong bytes,
                                         jint level)
{
    (void)cls;
    uint64_t freed = 0;
    if (bytes < 0) {
        throw_rb(env, RB_E_INVALID_ARG, "trim bytes is negative");
        return 0;
    }
    rb_status st = rb_pool_trim((rb_pool *)(intptr_t)h, (uint64_t)bytes, (rb_trim_level)level,
                                &freed);
    if (st != RB_OK) {
        throw_rb(env, st, "rb_pool_trim failed");
        return 0;
    }
    return (jlong)freed;
}

/* The library judges memory pressure itself (PSI, cgroup v1 levels) and
 * trims the pool: what Android no longer tells apps since API 34. */
JNIEXPORT void JNICALL JNI_FN(poolWatchPressure)(JNIEnv *env, jclass cls, jlong h,
                                                  jboolean system_wide)
{
    (void)cls;
    rb_pool_pressure_params p;
    memset(&p, 0, sizeof p);
    p.is_system_wide = system_wide ? 1 : 0;
    rb_error err;
    if (rb_pool_watch_pressure((rb_pool *)(intptr_t)h, &p, &err) != RB_OK)
        throw_rb(env, err.status, err.message);
}

JNIEXPORT void JNICALL JNI_FN(poolUnwatchPressure)(JNIEnv *env, jclass cls, jlong h)
{
    (void)env, (void)cls;
    rb_pool_unwatch_pressure((rb_pool *)(intptr_t)h);
}

/* PoolStats' order */
JNIEXPORT jlongArray JNICALL JNI_FN(poolStats)(JNIEnv *env, jclass cls, jlong h)
{
    (void)cls;
    rb_pool_stats s;
    rb_status st = rb_pool_get_stats((rb_pool *)(intptr_t)h, &s);
    if (st != RB_OK) {
        throw_rb(env, st, "rb_pool_get_stats failed");
        return NULL;
    }
    jlong v[] = {(jlong)s.budget_bytes, (jlong)s.total_bytes, (jlong)s.weights_bytes,
                 (jlong)s.weights_total_bytes, (jlong)s.sessions_bytes, (jlong)s.over_bytes,
                 s.n_sessions, s.n_background, (jlong)s.n_enforcements,
                 (jlong)s.trimmed_bytes, (jlong)s.weights_released_bytes};
    return new_longs(env, v, (jsize)(sizeof v / sizeof v[0]));
}

/* ---- session ------------------------------------------------------------ */

/* cfg: Session.Config's ints {n_ctx, n_batch, n_threads, priority,
 * kv_type_k, kv_type_v, restore, ram_codec}; budget: budget_bytes. */
static int session_params(JNIEnv *env, jintArray cfg, jlong budget, jlong pool,
                          rb_session_params *p)
{
    jint c[8];
    if ((*env)->GetArrayLength(env, cfg) != 8) {
        throw_rb(env, RB_E_INVALID_ARG, "session config: 8 values expected");
        return -1;
    }
    (*env)->GetIntArrayRegion(env, cfg, 0, 8, c);
    if (c[0] < 0 || c[1] < 0 || c[2] < 0 || budget < 0) {
        throw_rb(env, RB_E_INVALID_ARG, c[0] < 0 ? "session n_ctx is negative"
                                        : c[1] < 0 ? "session n_batch is negative"
                                        : c[2] < 0 ? "session n_threads is negative"
                                                   : "session budget_bytes is negative");
        return -1;
    }
    *p = rb_session_default_params();
    p->n_ctx = (uint32_t)c[0];
    if (c[1] > 0)
        p->n_batch = (uint32_t)c[1];
    p->n_threads = c[2];
    p->priority = (rb_priority)c[3];
    p->kv_type_k = (rb_kv_type)c[4];
    p->kv_type_v = (rb_kv_type)c[5];
    p->restore = (rb_restore_mode)c[6];
    p->ram_codec = (rb_ram_codec)c[7];
    p->budget_bytes = (uint64_t)budget;
    p->pool = (rb_pool *)(intptr_t)pool;
    return 0;
}

JNIEXPORT jlong JNICALL JNI_FN(sessionCreate)(JNIEnv *env, jclass cls, jlong model, jlong pool,
                                              jintArray cfg, jlong budget)
{
    (void)cls;
    rb_session_params p;
    if (session_params(env, cfg, budget, pool, &p) != 0)
        return 0;
    rb_session *s = NULL;
    rb_error err;
    if (rb_session_create((rb_model *)(intptr_t)model, &p, &s, &err) != RB_OK) {
        throw_rb(env, err.status, err.message);
        return 0;
    }
    return (jlong)(intptr_t)s;
}

JNIEXPORT jlong JNICALL JNI_FN(sessionOpenSaved)(JNIEnv *env, jclass cls, jlong model,
                                                 jlong pool, jintArray cfg, jlong budget,
                                                 jbyteArray path)
{
    (void)cls;
    rb_session_params p;
    if (session_params(env, cfg, budget, pool, &p) != 0)
        return 0;
    char *fp = bytes_to_cstr(env, path, NULL);
    if (!fp)
        return 0;
    rb_session *s = NULL;
    rb_error err;
    rb_status st = rb_session_open_saved((rb_model *)(intptr_t)model, &p, fp, &s, &err);
    free(fp);
    if (st != RB_OK) {
        throw_rb(env, err.status, err.message);
        return 0;
    }
    return (jlong)(intptr_t)s;
}

JNIEXPORT void JNICALL JNI_FN(sessionDestroy)(JNIEnv *env, jclass cls, jlong h)
{
    (void)env, (void)cls;
    rb_session_destroy((rb_session *)(intptr_t)h);
}

JNIEXPORT void JNICALL JNI_FN(sessionFeed)(JNIEnv *env, jclass cls, jlong h, jintArray tokens)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    jsize n = (*env)->GetArrayLength(env, tokens);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) {
        throw_oom(env, "out of memory for the tokens");
        return;
    }
    (*env)->GetIntArrayRegion(env, tokens, 0, n, (jint *)ids);
    rb_status st = rb_session_feed(s, ids, (size_t)n, NULL);
    free(ids);
    if (st != RB_OK)
        throw_rb(env, st, rb_session_errmsg(s));
}

JNIEXPORT jintArray JNICALL JNI_FN(sessionTokens)(JNIEnv *env, jclass cls, jlong h)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    size_t n = rb_session_n_tokens(s);
    jintArray a = (*env)->NewIntArray(env, (jsize)n);
    if (a && n)
        (*env)->SetIntArrayRegion(env, a, 0, (jsize)n, (const jint *)rb_session_get_tokens(s));
    return a;
}

/* The last token's logits, or null before any (or after an open, an
 * abort with no batch done, a rewind). */
JNIEXPORT jfloatArray JNICALL JNI_FN(sessionLogits)(JNIEnv *env, jclass cls, jlong h)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    const float *l = rb_session_get_logits(s);
    if (!l)
        return NULL;
    jsize n = (jsize)rb_session_n_vocab(s);
    jfloatArray a = (*env)->NewFloatArray(env, n);
    if (a)
        (*env)->SetFloatArrayRegion(env, a, 0, n, l);
    return a;
}

JNIEXPORT jint JNICALL JNI_FN(sessionNCtx)(JNIEnv *env, jclass cls, jlong h)
{
    (void)env, (void)cls;
    return (jint)rb_session_n_ctx((rb_session *)(intptr_t)h);
}

JNIEXPORT void JNICALL JNI_FN(sessionRewind)(JNIEnv *env, jclass cls, jlong h, jint n)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    if (n < 0) {
        throw_rb(env, RB_E_INVALID_ARG, "rewind n_tokens is negative");
        return;
    }
    rb_status st = rb_session_rewind(s, (size_t)n);
    if (st != RB_OK)
        throw_rb(env, st, rb_session_errmsg(s));
}

JNIEXPORT void JNICALL JNI_FN(sessionSave)(JNIEnv *env, jclass cls, jlong h, jbyteArray path,
                                           jint flags)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    char *p = bytes_to_cstr(env, path, NULL);
    if (!p)
        return;
    rb_status st = rb_session_save(s, p, (unsigned)flags);
    free(p);
    if (st != RB_OK)
        throw_rb(env, st, rb_session_errmsg(s));
}

JNIEXPORT jlong JNICALL JNI_FN(sessionTrim)(JNIEnv *env, jclass cls, jlong h, jlong bytes,
                                            jint level)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    uint64_t freed = 0;
    if (bytes < 0) {
        throw_rb(env, RB_E_INVALID_ARG, "trim bytes is negative");
        return 0;
    }
    rb_status st = rb_session_trim(s, (uint64_t)bytes, (rb_trim_level)level, &freed);
    if (st != RB_OK) {
        /* another thread may be feeding: the status is the reliable part */
        throw_rb(env, st, "rb_session_trim failed");
        return 0;
    }
    return (jlong)freed;
}

JNIEXPORT void JNICALL JNI_FN(sessionSetPriority)(JNIEnv *env, jclass cls, jlong h, jint prio)
{
    (void)cls;
    rb_status st = rb_session_set_priority((rb_session *)(intptr_t)h, (rb_priority)prio);
    if (st != RB_OK)
        throw_rb(env, st, "rb_session_set_priority: priority must be 0 (foreground) or 1 (background)");
}

JNIEXPORT void JNICALL JNI_FN(sessionAbort)(JNIEnv *env, jclass cls, jlong h)
{
    (void)env, (void)cls;
    rb_session_abort((rb_session *)(intptr_t)h);
}

/* SessionStats' order */
JNIEXPORT jlongArray JNICALL JNI_FN(sessionStats)(JNIEnv *env, jclass cls, jlong h)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    rb_session_stats st;
    if (rb_session_get_stats(s, &st) != RB_OK) {
        throw_rb(env, RB_E_INVALID_ARG, rb_session_errmsg(s));
        return NULL;
    }
    jlong v[] = {(jlong)st.total_bytes, (jlong)st.weights_bytes,
                 (jlong)st.weights_evicted_bytes, (jlong)st.kv_raw_bytes,
                 (jlong)st.kv_compressed_bytes, (jlong)st.kv_stored_bytes,
                 (jlong)st.kv_dropped_bytes, (jlong)st.scratch_bytes, (jlong)st.other_bytes,
                 (jlong)st.budget_bytes, st.n_kv_pages[RB_TIER_RESIDENT],
                 st.n_kv_pages[RB_TIER_COMPRESSED], st.n_kv_pages[RB_TIER_STORED],
                 st.n_kv_pages[RB_TIER_DROPPED], st.n_layers_weights_evicted,
                 (jlong)st.file_commits};
    return new_longs(env, v, (jsize)(sizeof v / sizeof v[0]));
}

/* ---- generate ----------------------------------------------------------- */

/*
 * Feeds the prompt (BOS added when the session is empty, special-token text
 * parsed: as `rebound run`), then samples up to max_tokens tokens, feeding
 * each (so the session holds prompt and reply), and stops at an
 * end-of-generation token (not fed), a full context, or when the callback
 * returns false. An empty prompt continues the session; a session whose
 * logits are gone (just opened, rewound) gets them by feeding its last
 * token again. samp: {temp, top_p, min_p, repeat_penalty} and
 * isamp: {top_k, repeat_last_n}; seed as is. cb: null, or an object with
 * boolean onToken(int, byte[]) that receives each token and the text it
 * completes (at the end, token -1 with the rest of an unfinished
 * character, when there is one). Returns the reply's UTF-8 text.
 */
JNIEXPORT jbyteArray JNICALL JNI_FN(sessionGenerate)(JNIEnv *env, jclass cls, jlong h,
                                                     jlong model, jbyteArray prompt,
                                                     jint max_tokens, jfloatArray samp,
                                                     jintArray isamp, jlong seed, jobject cb)
{
    (void)cls;
    rb_session *s = (rb_session *)(intptr_t)h;
    rb_model *m = (rb_model *)(intptr_t)model;
    jbyteArray res = NULL;
    rb_sampler *sampler = NULL;
    rb_detokenizer *detok = NULL;
    int32_t *ids = NULL;
    char *text = NULL, *piece = NULL;
    size_t text_len = 0, text_cap = 0;
    jmethodID on_token = NULL;
    rb_error err;
    rb_status st;

    if (max_tokens < 0) {
        throw_rb(env, RB_E_INVALID_ARG, "max_tokens is negative");
        return NULL;
    }
    if (cb) {
        jclass ccls = (*env)->GetObjectClass(env, cb);
        on_token = (*env)->GetMethodID(env, ccls, "onToken", "(I[B)Z");
        if (!on_token)
            return NULL;
    }
    rb_sampler_params sp = rb_sampler_default_params();
    jfloat f[4];
    jint iv[2];
    (*env)->GetFloatArrayRegion(env, samp, 0, 4, f);
    (*env)->GetIntArrayRegion(env, isamp, 0, 2, iv);
    if ((*env)->ExceptionCheck(env))
        return NULL;
    sp.temp = f[0];
    sp.top_p = f[1];
    sp.min_p = f[2];
    sp.repeat_penalty = f[3];
    sp.top_k = iv[0];
    sp.repeat_last_n = iv[1];
    sp.seed = (uint64_t)seed;
    if (rb_sampler_create(&sp, rb_session_n_vocab(s), &sampler, &err) != RB_OK) {
        throw_rb(env, err.status, err.message);
        return NULL;
    }
    if (rb_detokenizer_create_flags(m, RB_DETOKENIZER_CONTINUATION, &detok, &err) != RB_OK) {
        throw_rb(env, err.status, err.message);
        goto done;
    }
    size_t cap = rb_detokenizer_max_bytes(detok);
    piece = malloc(cap);
    if (!piece) {
        throw_oom(env, "out of memory");
        goto done;
    }

    /* the prompt */
    size_t len = 0, n = 0;
    char *p = bytes_to_cstr(env, prompt, &len);
    if (!p)
        goto done;
    int add_bos = rb_session_n_tokens(s) == 0;
    st = rb_model_tokenize(m, p, len, add_bos, 1, NULL, 0, &n);
    if (st == RB_OK || st == RB_E_INVALID_ARG)
        ids = malloc((n + 1) * sizeof *ids);
    if (!ids || (st = rb_model_tokenize(m, p, len, add_bos, 1, ids, n, &n)) != RB_OK) {
        free(p);
        if (!ids)
            throw_oom(env, "out of memory for the prompt's tokens");
        else
            throw_rb(env, st, rb_model_errmsg(m));
        goto done;
    }
    free(p);
    if (n == 0 && rb_session_n_tokens(s) == 0) {
        throw_rb(env, RB_E_INVALID_ARG, "the prompt has no tokens and the session is empty");
        goto done;
    }
    if (n == 0 && !rb_session_get_logits(s)) {
        /* no logits (an opened or rewound session): feed the last token again */
        size_t nt = rb_session_n_tokens(s);
        ids[0] = rb_session_get_tokens(s)[nt - 1];
        n = 1;
        if ((st = rb_session_rewind(s, nt - 1)) != RB_OK) {
            throw_rb(env, st, rb_session_errmsg(s));
            goto done;
        }
    }
    if (n > 0 && (st = rb_session_feed(s, ids, n, NULL)) != RB_OK) {
        throw_rb(env, st, rb_session_errmsg(s));
        goto done;
    }

    /* the reply */
    for (jint i = 0; i < max_tokens; i++) {
        if (rb_session_n_tokens(s) >= rb_session_n_ctx(s))
            break; /* context full */
        int32_t next;
        if (rb_sampler_sample(sampler, rb_session_get_logits(s), rb_session_get_tokens(s),
                              rb_session_n_tokens(s), &next) != RB_OK) {
            throw_rb(env, RB_E_INVALID_ARG, rb_sampler_errmsg(sampler));
            goto done;
        }
        if (rb_model_token_is_eog(m, next))
            break;
        size_t k = 0;
        if (rb_detokenizer_push(detok, next, piece, cap, &k) != RB_OK) {
            throw_rb(env, RB_E_INVALID_ARG, rb_detokenizer_errmsg(detok));
            goto done;
        }
        if (text_len + k + 1 > text_cap) {
            size_t nc = text_cap ? text_cap * 2 : 256;
            while (nc < text_len + k + 1)
                nc *= 2;
            char *t = realloc(text, nc);
            if (!t) {
                throw_oom(env, "out of memory for the reply");
                goto done;
            }
            text = t, text_cap = nc;
        }
        memcpy(text + text_len, piece, k);
        text_len += k;
        if ((st = rb_session_feed(s, &next, 1, NULL)) != RB_OK) {
            throw_rb(env, st, rb_session_errmsg(s));
            goto done;
        }
        if (on_token) {
            jbyteArray jp = new_bytes(env, piece, k);
            if (!jp)
                goto done;
            jboolean go_on = (*env)->CallBooleanMethod(env, cb, on_token, (jint)next, jp);
            (*env)->DeleteLocalRef(env, jp);
            if ((*env)->ExceptionCheck(env))
                goto done; /* the callback threw: it propagates */
            if (!go_on)
                break;
        }
    }
    size_t k = 0;
    if (rb_detokenizer_flush(detok, piece, cap, &k) == RB_OK && k > 0) {
        /* an unfinished character at the end (U+FFFD): to the callback as token -1 */
        char *t = realloc(text, text_len + k + 1);
        if (!t) {
            throw_oom(env, "out of memory for the reply");
            goto done;
        }
        text = t;
        memcpy(text + text_len, piece, k);
        text_len += k;
        if (on_token) {
            jbyteArray jp = new_bytes(env, piece, k);
            if (!jp)
                goto done;
            (*env)->CallBooleanMethod(env, cb, on_token, (jint)-1, jp);
            if ((*env)->ExceptionCheck(env))
                goto done;
        }
    }
    res = new_bytes(env, text ? text : "", text_len);
done:
    free(text);
    free(piece);
    free(ids);
    rb_detokenizer_destroy(detok);
    rb_sampler_destroy(sampler);
    return res;
}
