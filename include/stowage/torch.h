/*
 * stowage/torch.h: entry points for PyTorch's CUDAPluggableAllocator
 * (python/csrc/torch_entry.c; docs/torch.md), for two routes: the global swap
 * (every CUDA tensor through Stowage) and the MemPool route (below: Stowage
 * behind a torch.cuda.MemPool, PyTorch's allocator in charge).
 *
 * For the global swap python/stowage/torch.py installs them with
 *     torch.cuda.memory.CUDAPluggableAllocator(libstowage.so,
 *                                              "stow_torch_malloc", "stow_torch_free")
 * and wires the optional hooks (set_reset_fn = stow_torch_empty_cache,
 * set_record_stream_fn = stow_torch_record_stream, set_memory_fraction_fn =
 * stow_torch_memory_fraction). The signatures are exactly those PyTorch calls.
 *
 * One pool per device, created on first use (thread-safe lazy init) with the
 * configuration in STOWAGE_CONF (PYTORCH_CUDA_ALLOC_CONF syntax; a bad value is
 * reported on stderr and the defaults are used), on the CUDA backend of that
 * device. Test hook: with STOWAGE_BACKEND=sim in the environment when a pool is
 * created, it sits on a simulated device instead (capacity STOWAGE_SIM_CAPACITY
 * bytes, K/M/G suffixes accepted; default unlimited), so everything but CUDA
 * itself runs in CI without a GPU.
 *
 * Diagnostics go to stderr, each kind once per device ("stowage: ..."): pool
 * creation failure, the first out-of-memory (with stow_pool_oom_message), a
 * free or record_stream of a pointer Stowage did not hand out.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef STOWAGE_TORCH_H
#define STOWAGE_TORCH_H

#include <stddef.h>
#include <sys/types.h> /* ssize_t */

#include "stowage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Devices 0 .. STOW_TORCH_MAX_DEVICES-1 are served. */
#define STOW_TORCH_MAX_DEVICES 64

/* ---- the hooks PyTorch calls (stream = cudaStream_t) ---- */

/*
 * alloc_fn. Returns size bytes on `device`, usable on `stream`, or NULL:
 * - size <= 0: NULL, nothing logged (PyTorch's native allocator also hands out
 *   a null pointer for empty tensors; the pluggable wrapper stores it and later
 *   passes it back to stow_torch_free, which ignores it);
 * - out of memory (after the pool released its cache and retried): NULL; the
 *   first time per device the explanation goes to stderr. NOTE: the PyTorch
 *   wrapper read for this (torch/csrc/cuda/CUDAPluggableAllocator.cpp) does not
 *   check the result, so a NULL becomes a tensor with a null data pointer
 *   rather than torch.OutOfMemoryError (docs/torch.md);
 * - device out of range, or no pool could be created: NULL, logged once.
 */
STOW_API void *stow_torch_malloc(ssize_t size, int device, stow_stream_t stream);

/*
 * The allocation of stow_torch_malloc with its status, for a caller that
 * raises its own error (the C++ adapter, python/csrc/torch_allocator.cpp):
 * size bytes on `device` into *out (untouched on error). Nothing goes to
 * stderr; a failure's explanation is kept for stow_torch_last_error (for an
 * out-of-memory, stow_pool_oom_message's). The site hook applies as to
 * stow_torch_malloc.
 * Errors: STOW_EINVAL (size 0, NULL out, device out of range), STOW_ENOMEM,
 * STOW_EOVERFLOW, STOW_ENODEV or STOW_EBACKEND (no pool could be created, or
 * the backend failed), STOW_EHOSTMEM.
 */
STOW_API stow_status_t stow_torch_alloc(size_t size, int device, stow_stream_t stream, void **out);

/* free_fn. `size` and `stream` (the allocation stream, as PyTorch passes it)
 * are not needed. NULL is ignored; a pointer Stowage did not hand out is
 * logged once per device and otherwise ignored. */
STOW_API void stow_torch_free(void *ptr, ssize_t size, int device, stow_stream_t stream);

/* reset_fn (torch.cuda.empty_cache): stow_empty_cache on every pool. */
STOW_API void stow_torch_empty_cache(void);

/* record_stream_fn (Tensor.record_stream): the block at ptr is not reused
 * until the work queued on `stream` so far has completed. A foreign pointer is
 * ignored (logged once). */
STOW_API void stow_torch_record_stream(void *ptr, stow_stream_t stream);

/* memory_fraction_fn (torch.cuda.set_per_process_memory_fraction). The
 * fraction (0, 1] is stored for the device and applied when its pool is
 * created; it overrides per_process_memory_fraction from STOWAGE_CONF. Once
 * the pool exists it applies at once (stow_pool_set_memory_fraction: reserved
 * memory is kept, new reservations respect it). Out-of-range values are logged
 * and ignored. */
STOW_API void stow_torch_memory_fraction(double fraction, int device);

/* ---- for the Python package (ctypes) and tests ---- */

/* The device's pool, or NULL if none was created yet (this never creates one).
 * Ownership: borrowed; valid until stow_torch_shutdown. */
STOW_API stow_pool_t *stow_torch_pool(int device);

/* Creates the device's pool now if needed. Returns its status (STOW_OK when it
 * exists); the reason of a failure goes into why. */
STOW_API stow_status_t stow_torch_pool_init(int device, char *why, size_t why_len);

/*
 * Recording for Python: starts (capacity_events > 0) or stops (0) the device
 * pool's event ring (stowage/record.h), and dumps it as a .rep trace (plus
 * PATH.tags). Errors: STOW_EINVAL (no pool for the device, or not recording),
 * STOW_EIO, STOW_EHOSTMEM.
 */
STOW_API stow_status_t stow_torch_record(int device, size_t capacity_events);
STOW_API stow_status_t stow_torch_dump_trace(int device, const char *path);

/*
 * The site hook of recordings (stowage.record: the user's line of each
 * allocation). While one is set, stow_torch_malloc and stow_torch_alloc call
 * it before each allocation, on the allocating thread and outside every lock
 * of the library, and makes its result the thread's site for that allocation
 * (stow_record_site_set; 0 or an unknown id: none), then restores the
 * thread's site. NULL removes it. Only the global swap's entry points call
 * it, not the MemPool route's (those requests are whole segments).
 * Ownership: the caller keeps the function alive while it is set.
 * Thread safety: safe; the hook runs on every allocating thread at once.
 */
typedef uint32_t (*stow_torch_site_fn)(void);
STOW_API void stow_torch_set_site_hook(stow_torch_site_fn hook);

/*
 * Step markers for Python (stowage.torch.step and stowage.torch.planned):
 * stow_pool_step on the device's pool; key NULL ends the step in progress. A
 * device without a pool yet has no step to mark: STOW_OK, nothing done (the
 * pool is created by the device's first allocation).
 * Errors: STOW_EINVAL (device out of range, a key that breaks the rule of
 * stowage/step_key.h).
 */
STOW_API stow_status_t stow_torch_step(int device, const char *key);

/* stow_stats_json of the device's pool; a device without a pool gets the JSON
 * of an all-zero snapshot (same keys), like torch.cuda.memory_stats before any
 * allocation. snprintf semantics: returns the full length. */
STOW_API size_t stow_torch_stats_json(int device, char *buf, size_t buf_len);

/* stow_summary of the device's pool, or a one-line note when it has none. */
STOW_API size_t stow_torch_summary(int device, char *buf, size_t buf_len);

/* stow_stats_reset_peak / stow_stats_reset_accumulated; no-ops without a pool. */
STOW_API void stow_torch_reset_peak(int device);
STOW_API void stow_torch_reset_accumulated(int device);

/* The explanation of the device's last out-of-memory, or of its last failure to
 * create a pool ("" if none). snprintf semantics. */
STOW_API size_t stow_torch_last_error(int device, char *buf, size_t buf_len);

/* The backend kind the pools use or will use: "cuda" or "sim". */
STOW_API const char *stow_torch_backend_name(void);

/*
 * DESTRUCTOR of all state: destroys every pool (live blocks included) and
 * backend, closes every MemPool slot, and forgets stored fractions,
 * logged-once flags and the site hook. Only for tests and process exit: a
 * pointer handed to PyTorch must not be used afterwards.
 * Thread safety: no other call may run concurrently.
 */
STOW_API void stow_torch_shutdown(void);

/* ---- the MemPool route ----
 *
 * torch.cuda.MemPool(CUDAPluggableAllocator(libstowage.so,
 * "stow_torch_mempool_malloc_K", "stow_torch_mempool_free_K").allocator())
 * keeps PyTorch's caching allocator in charge: inside
 * torch.cuda.use_mem_pool(pool), or while a CUDA graph captures into the pool,
 * it asks these entry points for whole segments (2 MiB, 20 MiB, or large
 * requests rounded to 2 MiB) and gives them back only to return them to the
 * device. PyTorch names no pool in these calls, so each open slot K has its own
 * exported pair, and its own pools (one per device, created at the device's
 * first segment) with its own configuration.
 *
 * A slot's pools differ from the global swap's in two ways: a segment given
 * back is returned to the device at once (stow_empty_cache, which waits for
 * the device as cudaFree does; not while the stream captures a graph), and
 * they never release memory while they grow (release_idle_on_grow is off): a
 * capture may ask for segments, and nothing may be freed then. PyTorch keeps
 * its own statistics, snapshot and out-of-memory error for these segments;
 * the slot's pools count them as Stowage sees them.
 */
#define STOW_TORCH_MAX_MEMPOOLS 8

/* Opens a free slot: *slot_out gets K in [0, STOW_TORCH_MAX_MEMPOOLS). conf is
 * its STOWAGE_CONF text (NULL: the STOWAGE_CONF of the environment when each
 * pool is created), checked now.
 * Errors: STOW_EINVAL (bad conf, its reason in why; NULL slot_out), STOW_EBUSY
 * (every slot open), STOW_EHOSTMEM. */
STOW_API stow_status_t stow_torch_mempool_open(const char *conf, int *slot_out, char *why,
                                               size_t why_len);

/* DESTRUCTOR of slot's pools and backends, when none holds a live or pending
 * block; the slot can then be opened again. Call it once PyTorch has stopped
 * allocating from the slot (its MemPool is gone); no entry point of the slot
 * may run concurrently.
 * Errors: STOW_EINVAL (not open), STOW_EBUSY (blocks live: nothing changed). */
STOW_API stow_status_t stow_torch_mempool_close(int slot);

/* The slot's pool for device, or NULL (none created yet, or bad arguments).
 * Ownership: borrowed; valid until the slot is closed. */
STOW_API stow_pool_t *stow_torch_mempool_pool(int slot, int device);

/* stow_torch_stats_json and stow_torch_last_error for a slot's pool. */
STOW_API size_t stow_torch_mempool_stats_json(int slot, int device, char *buf, size_t buf_len);
STOW_API size_t stow_torch_mempool_last_error(int slot, int device, char *buf, size_t buf_len);

/* alloc_fn and free_fn of slot K, as stow_torch_malloc and stow_torch_free but
 * on the slot's pools. A closed slot refuses allocations (NULL, logged once). */
STOW_API void *stow_torch_mempool_malloc_0(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_0(void *ptr, ssize_t size, int device, stow_stream_t stream);
STOW_API void *stow_torch_mempool_malloc_1(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_1(void *ptr, ssize_t size, int device, stow_stream_t stream);
STOW_API void *stow_torch_mempool_malloc_2(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_2(void *ptr, ssize_t size, int device, stow_stream_t stream);
STOW_API void *stow_torch_mempool_malloc_3(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_3(void *ptr, ssize_t size, int device, stow_stream_t stream);
STOW_API void *stow_torch_mempool_malloc_4(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_4(void *ptr, ssize_t size, int device, stow_stream_t stream);
STOW_API void *stow_torch_mempool_malloc_5(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_5(void *ptr, ssize_t size, int device, stow_stream_t stream);
STOW_API void *stow_torch_mempool_malloc_6(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_6(void *ptr, ssize_t size, int device, stow_stream_t stream);
STOW_API void *stow_torch_mempool_malloc_7(ssize_t size, int device, stow_stream_t stream);
STOW_API void stow_torch_mempool_free_7(void *ptr, ssize_t size, int device, stow_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_TORCH_H */
