/*
 * stowage/sim.h: control of the simulated device, for tests and the replay tool.
 *
 * The simulated device (allocator/backend/sim.c) hands out fake, never
 * dereferenced addresses (or real host memory in host-backed mode), each
 * reservation below the last, as cudaMalloc's mostly come (best fit breaks
 * ties between blocks of one size by address), enforces a capacity so that out-of-memory paths run on a
 * CPU, counts every call, fails the Nth call of a chosen kind on request, and
 * lets a test decide when stream events complete. It is deterministic.
 *
 * Page mapping (va_reserve, phys_create, map, unmap) keeps the CUDA driver's
 * rules in both modes: a handle maps whole, at a granule boundary inside a
 * reserved range, over nothing mapped; an unmap covers whole mappings; a range
 * is released with nothing mapped in it; a handle released while mapped lives
 * until its last unmap. A call that breaks a rule returns STOW_EINVAL and
 * changes nothing. Host-backed mode gives the calls the GPU's semantics on
 * host memory:
 * - a reservation (reserve) is zeroed host memory, unmapped at release, at the
 *   address the fake mode would give where the host has it free;
 * - a reserved range (va_reserve) is inaccessible address space;
 * - a physical handle (phys_create, any multiple of the granularity) is zeroed
 *   memory of its own, a piece of one memfd per device; its pages go back to
 *   the host at release (after its last unmap);
 * - map makes the handle's memory appear at the address: the same bytes
 *   wherever and however often it is mapped, and kept while it is unmapped;
 * - unmap makes the range inaccessible again (not stream-ordered): a touch of
 *   an unmapped granule faults (SIGSEGV), as on a GPU.
 * Reservations, capacity, counters, fault injection and modelled costs are
 * those of the fake mode. The granularity must be a multiple of the host page.
 *
 * Queued work: stow_sim_launch queues a test's function on a stream, and with
 * manual events a host-backed scrub is queued too (a memset on the stream).
 * Work runs in stream order, when its stream's work completes: at
 * stow_sim_complete_stream, synchronize, an event_synchronize of an event
 * recorded after it on its stream; an event recorded after work completes
 * only once that work ran. release waits for all queued work (it runs, as
 * cuMemFree waits for the device) and leaves the events as they were. So
 * memory that a pool unmaps or hands out again while work queued on it may
 * still run is touched late, where the work lands then: a pattern check or a
 * fault catches it.
 */
#ifndef STOWAGE_SIM_H
#define STOWAGE_SIM_H

#include "stowage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STOW_SIM_CALL_MAP(X)                         \
    X(RESERVE, reserve)                              \
    X(RELEASE, release)                              \
    X(MEM_INFO, mem_info)                            \
    X(SYNCHRONIZE, synchronize)                      \
    X(EVENT_RECORD, event_record)                    \
    X(EVENT_QUERY, event_query)                      \
    X(EVENT_DESTROY, event_destroy)                  \
    X(VA_RESERVE, va_reserve)                        \
    X(VA_RELEASE, va_release)                        \
    X(PHYS_CREATE, phys_create)                      \
    X(PHYS_RELEASE, phys_release)                    \
    X(MAP, map)                                      \
    X(UNMAP, unmap)                                  \
    X(SCRUB, scrub)                                  \
    X(EVENT_SYNCHRONIZE, event_synchronize)

typedef enum {
#define STOW_SIM_CALL_ENUM_(up, low) STOW_SIM_##up,
    STOW_SIM_CALL_MAP(STOW_SIM_CALL_ENUM_)
#undef STOW_SIM_CALL_ENUM_
    STOW_SIM_CALL_KINDS
} stow_sim_call_t;

typedef struct stow_sim_counters {
    uint64_t calls[STOW_SIM_CALL_KINDS];  /* every call, failed ones included */
    uint64_t failures[STOW_SIM_CALL_KINDS];
    uint64_t reserved_bytes;      /* live reservations + created physical handles */
    uint64_t reserved_bytes_peak;
    uint64_t live_reservations;
    uint64_t pending_events;      /* recorded, not yet complete */
    uint64_t modelled_ns;         /* sum of the modelled cost of every call (below) */
    uint64_t queued_work;         /* launched work and queued scrubs not yet run */
} stow_sim_counters_t;

/* Modelled host cost of one call of each kind, in nanoseconds, added to
 * counters.modelled_ns. Defaults: what the call costs on an H200 with driver
 * 580 (../shared/notes/h200-costs.md) over at most 2 MiB: reserve 55000
 * (cudaMalloc), release 50000 (cudaFree), mem_info 3900, synchronize 10000 (an
 * idle device; not measured), event_record 157, event_query 130, event_destroy
 * 126, va_reserve 16000, va_release 16000, phys_create 9800, phys_release
 * 9400, map 24000 (cuMemMap + cuMemSetAccess), unmap 15000, scrub 2000 (a
 * memset kernel launch; not measured), event_synchronize 10000 (a wait, as
 * synchronize; not measured); and for each MiB beyond 2, fitted to the same
 * notes' figures at 256 MiB to 1 GiB: reserve 183, release 548, phys_create 14,
 * phys_release 332, map 33, unmap 16. This sets the cost of a call of `kind`
 * to cost_ns whatever its size. */
STOW_API void stow_sim_set_call_cost(stow_backend_t *sim, stow_sim_call_t kind, uint64_t cost_ns);

/* The modelled cost of one call of `kind` over size_bytes (0 for the calls
 * without a size), as counters.modelled_ns adds it. */
STOW_API uint64_t stow_sim_call_cost(stow_backend_t *sim, stow_sim_call_t kind, size_t size_bytes);

/* Name of a call kind ("reserve"...); static. */
STOW_API const char *stow_sim_call_name(stow_sim_call_t kind);

/* Snapshot of the counters. */
STOW_API void stow_sim_counters(stow_backend_t *sim, stow_sim_counters_t *out);

/* Makes the nth (1-based, counted from now) future call of `kind` fail with
 * `status` (STOW_ENOMEM for reserve/phys_create, STOW_EBACKEND otherwise if
 * given STOW_OK). n = 0 cancels. One pending injection per kind. */
STOW_API void stow_sim_fail_nth(stow_backend_t *sim, stow_sim_call_t kind, uint64_t n,
                                stow_status_t status);

/* Makes every call of `kind` fail with probability 1/one_in (0 = never), from a
 * deterministic generator seeded by `seed`. */
STOW_API void stow_sim_fail_random(stow_backend_t *sim, stow_sim_call_t kind, uint32_t one_in,
                                   uint64_t seed);

/* Manual-event mode: completes every event recorded so far on `stream`
 * (the stream's queued work finished). The backend's event_synchronize
 * completes an event and those recorded before it on its stream. */
STOW_API void stow_sim_complete_stream(stow_backend_t *sim, stow_stream_t stream);

/* Changes the capacity (the OOM threshold) of a live device. */
STOW_API void stow_sim_set_capacity(stow_backend_t *sim, size_t capacity_bytes);

/* Device work for tests: fn(arg), queued on `stream`. With automatic events
 * it runs at once; with manual events it runs when the stream's work up to it
 * completes (above: complete_stream, synchronize, a wait on a later event of
 * its stream) or a release waits for it, in stream order, in whichever thread
 * gets there.
 * fn runs once, or never when the device is destroyed first. It runs with the
 * device's lock held: it must not call the device, nor a pool on it. A fault
 * in fn (a touch of unmapped memory) is raised in the thread running it.
 * Ownership: arg stays the caller's. Thread safety: safe.
 * Errors: STOW_EINVAL (no device or no fn), STOW_EHOSTMEM (nothing queued). */
typedef void (*stow_sim_work_fn_t)(void *arg);
STOW_API stow_status_t stow_sim_launch(stow_backend_t *sim, stow_stream_t stream,
                                       stow_sim_work_fn_t fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_SIM_H */
