/*
 * stowage.h: the Stowage public API.
 *
 * Stowage is a caching allocator for GPU device memory with built-in
 * accounting. A pool (stow_pool_t) sits on one backend (one device): the CUDA
 * driver, or the simulated device used by tests and the replay tool.
 *
 * Conventions
 * - Every fallible call returns stow_status_t and writes its result through a
 *   trailing `out` argument, which is left untouched on error.
 * - Bad input never aborts the process: it returns STOW_EINVAL, STOW_ENOTOWNED,
 *   STOW_EOVERFLOW... and changes nothing (accounting stays exact).
 * - Handles are opaque; each has one create and one destroy.
 * - Thread safety: a pool may be used from any number of threads; one lock per
 *   pool (a futex mutex) serializes its calls (see docs/design.md, "Locking").
 */
#ifndef STOWAGE_H
#define STOWAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage/backend.h"
#include "stowage/stats.h"
#include "stowage/status.h"
#include "stowage/step_key.h"
#include "stowage/tuning.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Version: same MAJOR => ABI stable.
 * ====================================================================== */
#define STOW_VERSION_MAJOR 0
#define STOW_VERSION_MINOR 1
#define STOW_VERSION_PATCH 0
#define STOW_VERSION_HEX \
    ((STOW_VERSION_MAJOR << 16) | (STOW_VERSION_MINOR << 8) | STOW_VERSION_PATCH)
/* The library's STOW_VERSION_HEX, to compare with the header's. */
STOW_API unsigned stow_version(void);

#if defined(__GNUC__)
#define STOW_NODISCARD __attribute__((warn_unused_result))
#else
#define STOW_NODISCARD
#endif

/* ======================================================================
 * Configuration
 * ====================================================================== */
typedef enum {
    STOW_POLICY_CLASSIC = 0, /* caching pool of backend segments (docs/design.md) */
    STOW_POLICY_VMM = 1,     /* page-mapped segments: physical memory only under live blocks
                                (docs/design.md, "Page-mapped segments"); needs a backend
                                with the page-mapping methods, else STOW_ENOSYS */
    STOW_POLICY_AUTO = 2     /* the default: STOW_POLICY_VMM where the backend maps pages
                                (the CUDA driver with virtual memory management, the
                                simulated device), STOW_POLICY_CLASSIC where it cannot;
                                stow_pool_config() reports the one the pool took */
} stow_policy_t;

/* roundup_power2_divisions applies per power-of-two interval of the request
 * size: interval i covers [2^(20+i), 2^(21+i)) bytes; sizes below 1 MiB use
 * interval 0 and sizes above 64 GiB the last one (PyTorch's convention). */
#define STOW_ROUNDUP_INTERVALS 16

/* One field per STOWAGE_CONF key (and release_idle_on_grow, for the C API).
 * docs/design.md describes what each does; docs/decisions.md says why each
 * default is what it is. The pool's other numbers are constants
 * (stowage/tuning.h). */
typedef struct stow_config {
    stow_policy_t policy;          /* default STOW_POLICY_AUTO; key "policy" */
    size_t max_split_size_bytes;   /* SIZE_MAX = unlimited (default), else at least 20 MiB: cached
                                      blocks this large are never split, and smaller requests never
                                      take them; key "max_split_size_mb" */
    size_t max_non_split_rounding_bytes; /* 20 MiB: how much larger than the request an
                                            unsplittable block may be; "max_non_split_rounding_mb" */
    unsigned roundup_power2_divisions[STOW_ROUNDUP_INTERVALS]; /* 0 = off (default); each 0 or a
                                            power of two; key "roundup_power2_divisions",
                                            "4" or "[256:1,512:2,>:8]" (interval sizes in MiB) */
    double garbage_collection_threshold; /* in (0,1); 0 = off (default): idle segments are
                                            released, oldest first, before reserved memory would
                                            pass threshold x limit */
    double memory_fraction;        /* (0,1], default 1: the share of the device's memory the pool
                                      may reserve; key "per_process_memory_fraction" */
    bool release_idle_on_grow;     /* C API only, default false (PyTorch's rule: idle segments
                                      go back at out-of-memory and empty_cache): true releases
                                      idle segments, oldest first, rather than lift reserved
                                      memory above its high-water mark; leave it false for a pool
                                      that a CUDA-graph capture may grow (nothing may be freed
                                      then) */
    bool scrub_on_free;            /* default false: zero every block at free before any stream can
                                      get it again (the backend needs scrub); key "scrub_on_free" */
    size_t record_events;          /* 0 (default): no recording; else the size of the pool's event
                                      ring, at most STOW_RECORD_EVENTS_MAX; key "record_events" */
    bool planned_steps;            /* default false: each key's steps (stow_pool_step) are
                                      recorded, planned and served from one arena taken from
                                      this pool (docs/planned.md); off with scrub_on_free */
    bool planned_async;            /* default true: plans made on a helper thread; false: inline
                                      at the marker that completes a recording (deterministic) */
} stow_config_t;

/* The largest event ring a pool records into: 2^24 events, 512 MiB of host memory. */
#define STOW_RECORD_EVENTS_MAX ((size_t)1 << 24)

/* The built-in defaults above. Thread safety: pure. */
STOW_API void stow_config_default(stow_config_t *config);

/*
 * Applies `text` in PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax ("key:value,key:value")
 * on top of *config. Keys: policy (auto|classic|vmm), max_split_size_mb,
 * max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold,
 * per_process_memory_fraction, expandable_segments (True selects policy vmm, False
 * policy classic): PyTorch's, with PyTorch's meaning. Stowage's own: policy
 * (auto|classic|vmm), scrub_on_free, record_events, planned_steps,
 * planned_async (each true|false but record_events, a count). An unknown key or a bad
 * value returns STOW_EINVAL, writes "key 'K': reason" into err and leaves *config
 * unchanged; a key that is one of the pool's constants (stowage/tuning.h) says so and
 * where docs/decisions.md measures it.
 * Thread safety: reentrant. Errors: STOW_EINVAL.
 */
STOW_API stow_status_t stow_config_parse(stow_config_t *config, const char *text, char *err,
                                         size_t err_len);

/* stow_config_parse of the environment variable STOWAGE_CONF (no-op when unset). */
STOW_API stow_status_t stow_config_from_env(stow_config_t *config, char *err, size_t err_len);

/* ======================================================================
 * Pool
 * ====================================================================== */
typedef struct stow_pool stow_pool_t; /* opaque */

/*
 * Creates a pool on `backend` with `config` (NULL: defaults, then STOWAGE_CONF is
 * NOT read; call stow_config_from_env yourself to honour it).
 * Ownership: the pool borrows `backend`, which must outlive it.
 * Thread safety: safe. Errors: STOW_EINVAL (bad config, a backend of another
 * ABI or missing a required method, some but not all of its event methods, or a
 * memory fraction that leaves the pool less than one backend granule),
 * STOW_ENOSYS (policy not available), STOW_EHOSTMEM.
 */
STOW_API STOW_NODISCARD stow_status_t stow_pool_create(const stow_config_t *config,
                                                       const stow_backend_t *backend,
                                                       stow_pool_t **out);

/*
 * DESTRUCTOR. Releases every cached segment and frees the pool. With live
 * allocations it returns STOW_EBUSY and destroys nothing (call
 * stow_pool_destroy_force to drop them). NULL is a harmless no-op.
 * Thread safety: no other call on this pool may be running or follow.
 */
STOW_API stow_status_t stow_pool_destroy(stow_pool_t *pool);
/* DESTRUCTOR that also releases segments holding live allocations. */
STOW_API void stow_pool_destroy_force(stow_pool_t *pool);

/*
 * Allocates size_bytes (> 0) of device memory usable on `stream`. The address
 * is 512-byte aligned. On out-of-memory the pool releases its cache and
 * retries; if that fails it returns STOW_ENOMEM and stow_pool_oom_message()
 * explains why.
 * Ownership: the caller owns the block until stow_pool_free.
 * Thread safety: safe. Errors: STOW_EINVAL (size 0, NULL out), STOW_EOVERFLOW
 * (size near SIZE_MAX), STOW_ENOMEM, STOW_EBACKEND, STOW_EHOSTMEM.
 */
STOW_API STOW_NODISCARD stow_status_t stow_pool_alloc(stow_pool_t *pool, size_t size_bytes,
                                                      stow_stream_t stream, void **out);

/*
 * Allocates size_bytes (> 0, rounded as stow_pool_alloc rounds) at `addr`
 * exactly, for `stream`, when those bytes lie inside one free block of the
 * pool that the stream may take: a block freed earlier, allocated again where
 * it was (PyTorch restores a CUDA-graph tree's checkpoint so). Blocks kept
 * whole on quick lists count as free. Classic pools only.
 * Ownership: as stow_pool_alloc. Thread safety: safe.
 * Errors: STOW_EINVAL (NULL or unaligned addr, size 0), STOW_EOVERFLOW,
 * STOW_ENOTOWNED (the bytes are not inside one free block of this pool that
 * the stream may take, or the block is of the other size class), STOW_ENOSYS
 * (a page-mapped pool), STOW_EHOSTMEM.
 */
STOW_API STOW_NODISCARD stow_status_t stow_pool_alloc_at(stow_pool_t *pool, void *addr,
                                                         size_t size_bytes, stow_stream_t stream);

/*
 * Frees a block returned by stow_pool_alloc. It is reusable at once on the
 * stream it was allocated on; by other streams only once the device has done
 * everything queued before this free (on every stream named by
 * stow_record_stream too): when memory is short (the out-of-memory retry
 * synchronizes), at stow_empty_cache, or with reuse_other_streams_on_miss after
 * an event recorded past this free has completed.
 * A pointer this pool did not hand out, an interior pointer, or a second free
 * returns STOW_ENOTOWNED and changes nothing.
 * Thread safety: safe. Errors: STOW_ENOTOWNED, STOW_EINVAL (NULL), STOW_EBACKEND.
 */
STOW_API stow_status_t stow_pool_free(stow_pool_t *pool, void *ptr);

/*
 * Says where a step of the program begins: a step with this key begins now,
 * and the step in progress (if any) ends. NULL ends the step in progress
 * without beginning another (around an inference call: a step whose end is
 * known). A key names what repeats (stowage/step_key.h: 1 to
 * STOW_STEP_KEY_MAX characters of [A-Za-z0-9_.:/-]); steps with the same key
 * are expected to make the same requests in the same order.
 * Markers are recorded with the pool's events (stowage/record.h: 'm KEY' and
 * 'e' lines of a trace). With planned_steps on, a key's steps are recorded,
 * planned, and served from a planned arena (docs/planned.md); without it, a
 * marker changes no allocation.
 * A step is the pool's, not a thread's: markers from several threads
 * interleave into one sequence of steps.
 * Thread safety: safe. Errors: STOW_EINVAL (NULL pool, a key that breaks the
 * rule; nothing changes).
 */
STOW_API stow_status_t stow_pool_step(stow_pool_t *pool, const char *key);

/*
 * Marks `stream` as a user of the live block at `ptr`: after the free, the
 * block is reused only once an event recorded on each such stream completed.
 * Naming the allocation stream is a no-op.
 * Thread safety: safe. Errors: STOW_ENOTOWNED, STOW_EINVAL, STOW_EHOSTMEM.
 */
STOW_API stow_status_t stow_record_stream(stow_pool_t *pool, void *ptr, stow_stream_t stream);

/*
 * Returns every fully free cached segment to the backend (waiting for the
 * streams first) and processes completed events. Live blocks are untouched.
 * Thread safety: safe. Errors: STOW_EBACKEND.
 */
STOW_API stow_status_t stow_empty_cache(stow_pool_t *pool);

/*
 * Size (bytes) of the block behind a live pointer, and its requested size.
 * Errors: STOW_ENOTOWNED.
 */
STOW_API stow_status_t stow_pool_block_size(stow_pool_t *pool, const void *ptr, size_t *block_bytes,
                                            size_t *requested_bytes);

/*
 * The explanation of the last STOW_ENOMEM ("" if none): requested size,
 * reserved, allocated, free-but-cached, largest free block, device capacity.
 * Writes at most buf_len bytes, NUL-terminated; returns the full length.
 * Thread safety: safe.
 */
STOW_API size_t stow_pool_oom_message(stow_pool_t *pool, char *buf, size_t buf_len);

/*
 * Changes the share of the device's total memory the pool may reserve, as
 * torch.cuda.set_per_process_memory_fraction does. Memory already reserved is
 * kept (a lower limit takes effect as cached memory is released and new
 * reservations are refused). Errors: STOW_EINVAL outside (0, 1], or when the
 * limit would be less than one backend granule.
 * Thread safety: safe.
 */
STOW_API stow_status_t stow_pool_set_memory_fraction(stow_pool_t *pool, double fraction);

/* The pool's configuration as created. */
STOW_API void stow_pool_config(stow_pool_t *pool, stow_config_t *out);

/*
 * Walks every block, segment and free list and checks the pool's invariants
 * and books (docs/design.md, "Invariants"). STOW_OK, or STOW_EINVAL with the
 * first violation written into why. O(blocks): for tests and debugging.
 * Thread safety: safe.
 */
STOW_API stow_status_t stow_pool_check(stow_pool_t *pool, char *why, size_t why_len);

/* ======================================================================
 * Accounting (stowage/stats.h; docs/stats.md)
 * ====================================================================== */

/* A consistent snapshot of every figure. Thread safety: safe. Errors: STOW_EINVAL. */
STOW_API stow_status_t stow_pool_stats(stow_pool_t *pool, stow_stats_t *out);

/* Sets every peak to its current value (fragmentation_peak and waste_at_peak too).
 * Open scopes are not affected. Thread safety: safe. */
STOW_API void stow_stats_reset_peak(stow_pool_t *pool);

/* Zeroes the cumulative counters (allocated/freed totals, num_*, size classes). */
STOW_API void stow_stats_reset_accumulated(stow_pool_t *pool);

/* Nestable high-water-mark scopes: the peaks reached between push and the
 * matching pop, whatever happens to the global peaks or to inner scopes. */
#define STOW_SCOPE_MAX_DEPTH 32
typedef struct stow_scope_result {
    uint64_t allocated_bytes_at_push;
    uint64_t allocated_bytes_peak; /* highest allocated_bytes.all inside the scope */
    uint64_t reserved_bytes_at_push;
    uint64_t reserved_bytes_peak;
    uint64_t allocated_bytes_at_pop;
    uint64_t reserved_bytes_at_pop;
} stow_scope_result_t;
/* Errors: STOW_EBUSY when STOW_SCOPE_MAX_DEPTH scopes are open. *depth_out (optional) = new depth. */
STOW_API stow_status_t stow_scope_push(stow_pool_t *pool, unsigned *depth_out);
/* Errors: STOW_EINVAL when no scope is open. */
STOW_API stow_status_t stow_scope_pop(stow_pool_t *pool, stow_scope_result_t *out);

/*
 * A text table in the spirit of torch.cuda.memory_summary(), or one JSON
 * object (keys follow torch.cuda.memory_stats(): "allocated_bytes.all.current"...).
 * Both write at most buf_len bytes, NUL-terminated, and return the full length
 * (snprintf semantics: call with buf_len 0 to size the buffer).
 * Thread safety: pure functions of the snapshot.
 */
STOW_API size_t stow_stats_summary(const stow_stats_t *stats, char *buf, size_t buf_len);
STOW_API size_t stow_stats_json(const stow_stats_t *stats, char *buf, size_t buf_len);

/* Convenience: snapshot + summary of a pool, written to buf as above. */
STOW_API size_t stow_summary(stow_pool_t *pool, char *buf, size_t buf_len);

/* ======================================================================
 * The simulated device (stowage/sim.h has the full control API)
 * ====================================================================== */
typedef struct stow_sim_config {
    size_t capacity_bytes;    /* device memory; 0 = 2^46 bytes (effectively unlimited) */
    size_t granularity_bytes; /* 0 = 2 MiB */
    bool manual_events;       /* false: events complete when recorded; true: only when
                                 stow_sim_complete_stream() says so */
    bool host_backed;         /* real host memory: reservations writable, page mapping with
                                 the GPU's semantics (stowage/sim.h) */
    /* Reservations' memory in host_backed mode (NULL: anonymous mappings). Tests pass
     * jemalloc's mallocx/sdallocx here; the library never links jemalloc. */
    void *(*host_alloc)(size_t size_bytes, size_t alignment_bytes, void *arg);
    void (*host_free)(void *ptr, size_t size_bytes, void *arg);
    void *host_arg;
} stow_sim_config_t;

STOW_API void stow_sim_config_default(stow_sim_config_t *config);

/* Creates a simulated device. Ownership: destroy it with stow_sim_destroy after
 * every pool on it. Thread safety: the backend locks internally. */
STOW_API STOW_NODISCARD stow_status_t stow_sim_create(const stow_sim_config_t *config,
                                                      stow_backend_t **out);
/* DESTRUCTOR. Returns STOW_EBUSY (and frees anyway) if reservations are still live. */
STOW_API stow_status_t stow_sim_destroy(stow_backend_t *backend);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_H */
