/*
 * stowage/sim.h: control of the simulated device, for tests and the replay tool.
 *
 * The simulated device (allocator/backend/sim.c) hands out fake, never
 * dereferenced addresses from a non-zero base (or real host memory in
 * host-backed mode), enforces a capacity so that out-of-memory paths run on a
 * CPU, counts every call, fails the Nth call of a chosen kind on request, and
 * lets a test decide when stream events complete. It is deterministic.
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

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_SIM_H */
