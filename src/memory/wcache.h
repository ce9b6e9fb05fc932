/*
 * wcache.h - the weight cache: owns the release and reload of a model's
 * weight bytes, layer by layer.
 *
 * It works on the weight buffer rb_model_load_weights
 * filled: releasing layer L gives the pages of blk.L.*'s byte range back to
 * the OS (madvise MADV_DONTNEED: RSS drops, the addresses stay valid), and
 * reloading reads that range from the model file into the same addresses,
 * so the forward pass's weight pointers never change and a reload is no
 * extra copy. Reads bypass the page cache (O_DIRECT: the model buffer is
 * placed so that its pages line up with the file's 4 KiB blocks, see
 * model.c) and go through the storage throttle, so a reload costs what the
 * device profile says. The block cache with pinning and streaming is
 * wcache_stream.h; the residency manager decides what to release.
 *
 * Only whole 4 KiB pages inside a layer's range are released: the pages a
 * layer shares with its neighbours at either end stay (at most 8 KiB per
 * layer).
 *
 * One per model, shared by all its sessions (rb_wcache_shared): the
 * weights belong to the model, and a session's residency manager, its
 * layer gate and the memory pool all work on the same layer states.
 * The cache is the one owner of the weight buffer's read state: which
 * layers are in RAM and whether the bytes outside the layers were read.
 * model.c allocates and loads the buffer and records only what its load
 * read (rb_model_weights_load); the cache takes that at creation and
 * never writes the model.
 *
 * Threads: every call may come from any thread (restore workers of
 * several sessions, their forward passes, a trimming thread). A layer's
 * state changes under the cache's mutex: a reload of a layer that another
 * thread is reading waits for that read instead of reading it twice; a
 * release skips a layer a forward pass uses (rb_wcache_use .. _unuse) or
 * one being read. The reads themselves run without the mutex.
 */
#ifndef RB_WCACHE_H
#define RB_WCACHE_H

#include <stdint.h>

#include "model.h"
#include "os.h"
#include "rebound.h"
#include "throttle.h"

typedef struct rb_wcache rb_wcache;

/*
 * Over a model whose weights are loaded into RAM (not mapped: a mapped
 * model's pages belong to the page cache; RB_E_UNSUPPORTED then).
 * path: the model file (reopened for reloads). os: NULL for the default.
 * Reads go through the throttle the caller passes (the device a session
 * emulates; NULL: the host as it is).
 */
rb_status rb_wcache_create(const rb_model *model, const char *path, const rb_os *os,
                           rb_wcache **out, rb_error *err);
/* The model's weight cache: the one it holds (rb_model_weights_owner), or
 * a new one it then holds until it closes. Caller holds the model's lock
 * and the weights are loaded (or reserved lazily). */
rb_status rb_wcache_shared(rb_model *model, rb_wcache **out, rb_error *err);
void rb_wcache_destroy(rb_wcache *w);

uint32_t rb_wcache_n_layers(const rb_wcache *w);
/* Bytes that releasing the layer gives back (whole pages). */
uint64_t rb_wcache_layer_bytes(const rb_wcache *w, uint32_t layer);
int rb_wcache_is_resident(const rb_wcache *w, uint32_t layer);
/* Resident bytes of all weights (layers and the rest). */
uint64_t rb_wcache_resident_bytes(const rb_wcache *w);
uint64_t rb_wcache_total_bytes(const rb_wcache *w);

/* A lazily loaded model (rb_model_load_weights_lazy): reads the few bytes
 * of each layer outside its whole pages now, and marks the layers released,
 * to be read by rb_wcache_reload. RB_E_IO / RB_E_SHORT_READ name the file. */
/* Once per cache: a second cold start on the model finds the layers as the
 * first one's restore left them (released ones are read by its own). */
rb_status rb_wcache_mark_unread(rb_wcache *w, rb_error *err);

/* The weights outside the layers of a lazily loaded model (RB_WEIGHTS_LAZY
 * when the cache was made), if this cache has not read them: read now, from storage like a layer (O_DIRECT where
 * the pages line up, or the mapping populated; through the throttle), and
 * marked read. Separate from rb_wcache_mark_unread so that a cold start can
 * begin the layers' restore first and read these beside it. */
rb_status rb_wcache_read_rest(rb_wcache *w, rb_throttle *throttle, rb_error *err);

/* Releases a resident layer that no forward pass uses and nobody reads:
 * 1; 0 when it stays (in use, being read, released already, or a layer
 * that cannot be released). */
int rb_wcache_release(rb_wcache *w, uint32_t layer);
/* The one loop that releases weights (the pool's budget and a session's
 * trim both come here): layers from the last one down, skipping those
 * rb_wcache_release keeps, until `need` bytes went (UINT64_MAX: every
 * layer that can go). Returns the bytes released. */
uint64_t rb_wcache_release_last(rb_wcache *w, uint64_t need);
/* Reads a released layer back (no-op if resident; waits when another
 * thread reads it). RB_E_IO / RB_E_SHORT_READ name the file and offset;
 * the layer then stays released. */
rb_status rb_wcache_reload(rb_wcache *w, uint32_t layer, rb_throttle *throttle,
                           rb_error *err);
/* A forward pass computes the layer: it is made resident (read now if a
 * release came after the pass's restore planned it) and no release takes
 * it until rb_wcache_unuse. */
rb_status rb_wcache_use(rb_wcache *w, uint32_t layer, rb_throttle *throttle, rb_error *err);
void rb_wcache_unuse(rb_wcache *w, uint32_t layer);

#endif
