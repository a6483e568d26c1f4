/*
 * stowage/backend.h: the backend vtable, for backend implementers only.
 *
 * The backend is the only code that touches device memory and the only vtable
 * in Stowage. A pool calls it to reserve and release device memory, to order
 * block reuse across streams with events, and (page-mapped pools) to map
 * physical granules into virtual ranges, with events again to know that no
 * queued work still uses a granule it unmaps (else it synchronizes). The pool
 * never dereferences device memory: every piece of allocator metadata lives
 * on the host, which is what makes the simulated backend (stowage/sim.h)
 * exact.
 *
 * Locking: a pool calls every method with its own pool lock held, one call at a
 * time per pool. A backend shared by several pools must lock internally.
 */
#ifndef STOWAGE_BACKEND_H
#define STOWAGE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2: event_synchronize added at the end. A pool still takes a backend of
 * version 1 (whose struct ends at scrub) and never reads the field there. */
#define STOW_BACKEND_ABI 2u

/* A stream: CUstream/cudaStream_t for CUDA (NULL = the legacy default stream);
 * any distinct value for the simulated device. */
typedef void *stow_stream_t;
/* An event handle produced by event_record; opaque to the pool. */
typedef void *stow_event_t;
/* A physical memory handle (CUmemGenericAllocationHandle for CUDA). */
typedef uint64_t stow_phys_t;

typedef struct stow_backend stow_backend_t;

struct stow_backend {
    uint32_t abi_version;     /* STOW_BACKEND_ABI (or 1), else stow_pool_create -> STOW_EINVAL */
    const char *name;         /* "sim", "sim-host", "cuda" */
    void *ctx;                /* first argument of every method */
    size_t granularity_bytes; /* reserve/map unit, a power of two (2 MiB on CUDA) */

    /* pre: size_bytes > 0 && size_bytes % granularity_bytes == 0.
     * STOW_OK with *out != NULL, or STOW_ENOMEM (device full), or STOW_EBACKEND. */
    stow_status_t (*reserve)(void *ctx, size_t size_bytes, stow_stream_t stream, void **out);
    /* pre: (ptr, size_bytes) is exactly a pair that reserve returned, not yet released.
     * Work queued before its blocks were freed may still use the range: release must
     * wait for it (cuMemFree does); a classic pool does not synchronize first. */
    stow_status_t (*release)(void *ctx, void *ptr, size_t size_bytes);
    /* Free and total device bytes as the device sees them. */
    stow_status_t (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    /* Waits until all work queued on all streams has completed. */
    stow_status_t (*synchronize)(void *ctx);

    /* Stream ordering: all three or none (stow_pool_create refuses a backend with
     * some: STOW_EINVAL). None: a single stream, whose work runs in order, and every
     * free is reusable at once by any stream. */
    /* Records a new event after the work queued so far on `stream`. */
    stow_status_t (*event_record)(void *ctx, stow_stream_t stream, stow_event_t *out);
    /* *done = whether all work before the event has completed. Never blocks. */
    stow_status_t (*event_query)(void *ctx, stow_event_t event, bool *done);
    /* Returns the event to the backend (pooled there). */
    stow_status_t (*event_destroy)(void *ctx, stow_event_t event);

    /* Page mapping (CUDA virtual memory management): all NULL when unsupported. */
    /* A virtual range of size_bytes (a multiple of the granularity), nothing behind it. */
    stow_status_t (*va_reserve)(void *ctx, size_t size_bytes, void **out);
    stow_status_t (*va_release)(void *ctx, void *va, size_t size_bytes);
    /* A physical handle of size_bytes, counted against the capacity (STOW_ENOMEM when full). */
    stow_status_t (*phys_create)(void *ctx, size_t size_bytes, stow_phys_t *out);
    stow_status_t (*phys_release)(void *ctx, stow_phys_t handle, size_t size_bytes);
    /* Maps the whole handle at va and grants access. */
    stow_status_t (*map)(void *ctx, void *va, size_t size_bytes, stow_phys_t handle);
    /* Unmaps [va, va+size_bytes) without waiting: the pool knows from events (or a
     * synchronize) that no queued work still uses the range. */
    stow_status_t (*unmap)(void *ctx, void *va, size_t size_bytes);

    /* Optional (NULL: scrub_on_free unavailable). Zeroes [ptr, ptr+size_bytes),
     * ordered after the work queued on `stream` and before later work there. */
    stow_status_t (*scrub)(void *ctx, void *ptr, size_t size_bytes, stow_stream_t stream);

    /* Optional, ABI 2 (NULL: page-mapped pools synchronize instead): blocks until the work
     * queued before `event` completed, while later work keeps running (cuEventSynchronize).
     * Ignored without the event methods; the event stays the pool's, to destroy. */
    stow_status_t (*event_synchronize)(void *ctx, stow_event_t event);
};

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_BACKEND_H */
