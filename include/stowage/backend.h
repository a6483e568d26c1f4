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
     * Work queued before the blocks in it were freed may still use the range: release
     * must wait for it (cuMemFree does), since a classic pool does not synchronize
     * first. */
    stow_status_t (*release)(void *ctx, void *ptr, size_t size_bytes);
    /* Free and total device bytes as the device sees them. */
    stow_status_t (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    /* Waits until all work queued on all streams has completed. */
    stow_status_t (*synchronize)(void *ctx);

    /* Stream ordering. All three NULL: the backend has a single stream (its work
     * runs in order, maybe after the call that queued it) and every free is
     * reusable at once by any stream; page-mapped pools still synchronize before
     * they unmap. Some but not all of them: stow_pool_create refuses the backend
     * (STOW_EINVAL). */
    /* Records a new event after the work queued so far on `stream`. */
    stow_status_t (*event_record)(void *ctx, stow_stream_t stream, stow_event_t *out);
    /* *done = whether all work before the event has completed. Never blocks. */
    stow_status_t (*event_query)(void *ctx, stow_event_t event, bool *done);
    /* Returns the event to the backend (pooled there). */
    stow_status_t (*event_destroy)(void *ctx, stow_event_t event);

    /* Page mapping (CUDA virtual memory management). All NULL when unsupported.
     * Every size is a multiple of granularity_bytes. va_reserve: a virtual range
     * of size_bytes, no physical memory behind it. phys_create: a physical handle
     * of size_bytes (one or many granules), counted against the device capacity
     * (STOW_ENOMEM when full); phys_release gets the same size. map: maps the
     * whole handle (size_bytes is its size) at va, from its start (cuMemMap's
     * offset must be 0), and grants access. unmap: exactly one mapping that map
     * made, whole (cuMemUnmap cannot unmap part of one); it need not wait for
     * queued work: before it unmaps, the pool knows from events (or a
     * synchronize) that no queued work still uses the range. */
    stow_status_t (*va_reserve)(void *ctx, size_t size_bytes, void **out);
    stow_status_t (*va_release)(void *ctx, void *va, size_t size_bytes);
    stow_status_t (*phys_create)(void *ctx, size_t size_bytes, stow_phys_t *out);
    stow_status_t (*phys_release)(void *ctx, stow_phys_t handle, size_t size_bytes);
    stow_status_t (*map)(void *ctx, void *va, size_t size_bytes, stow_phys_t handle);
    stow_status_t (*unmap)(void *ctx, void *va, size_t size_bytes);

    /* Optional (NULL: scrub_on_free unavailable). Zeroes [ptr, ptr+size_bytes),
     * ordered after the work queued on `stream` and before later work there. */
    stow_status_t (*scrub)(void *ctx, void *ptr, size_t size_bytes, stow_stream_t stream);

    /* Optional, ABI 2 (NULL: a page-mapped pool synchronizes the device instead;
     * ignored without the three event methods). Blocks until all work queued
     * before `event` (from event_record) has completed, and no longer: work
     * queued after it on its stream or on others keeps running
     * (cuEventSynchronize). The event stays the pool's, to destroy. */
    stow_status_t (*event_synchronize)(void *ctx, stow_event_t event);
};

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_BACKEND_H */
