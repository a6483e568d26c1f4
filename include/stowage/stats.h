/*
 * stowage/stats.h: the accounting snapshot of a pool (docs/stats.md defines
 * every figure).
 *
 * Names follow torch.cuda.memory_stats() where the meaning is the same:
 * allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes,
 * requested_bytes, num_alloc_retries, num_ooms... Each array-valued stat is
 * indexed by stow_pool_kind_t (all / small_pool / large_pool) and holds a
 * stow_stat_t {current, peak, allocated, freed}.
 *
 * Invariants at every quiescent point (checked by the tests after every event):
 *   requested_bytes.current <= allocated_bytes.current <= active_bytes.current
 *   active_bytes.current + free cached bytes == reserved_bytes.current
 *   stat.current == stat.allocated - stat.freed;  stat.current <= stat.peak
 */
#ifndef STOWAGE_STATS_H
#define STOWAGE_STATS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: num_quick_hits and num_quick_flushes added (the layout of stow_stats_t changed).
 * 3: num_vmm_allowance_raises added.
 * 4: num_idle_keeps added.
 * 5: num_event_waits added.
 * 6: num_vmm_step_plans and num_vmm_planned_allocations added.
 * 7: the planned layer's counters (num_planned_hits...) and arena_bytes,
 *    arena_peak_bytes added. */
#define STOW_STATS_VERSION 7u

/* One figure over time. allocated/freed are cumulative increases/decreases
 * (PyTorch's naming), so current == allocated - freed. */
typedef struct stow_stat {
    uint64_t current;
    uint64_t peak;      /* highest current since creation or the last reset */
    uint64_t allocated; /* cumulative increase */
    uint64_t freed;     /* cumulative decrease */
} stow_stat_t;

typedef enum {
    STOW_POOL_ALL = 0,   /* "all" */
    STOW_POOL_SMALL = 1, /* "small_pool": requests <= 1 MiB (policy vmm: requests of
                            at most vmm_small_kb, in their small ranges; none with
                            vmm_small_kb 0) */
    STOW_POOL_LARGE = 2, /* "large_pool": the rest; policy vmm: the requests above
                            vmm_small_kb (all of them with vmm_small_kb 0) */
    STOW_POOL_KINDS = 3
} stow_pool_kind_t;

/* X(name, summary row label): arrays of stow_stat_t [STOW_POOL_KINDS]. */
#define STOW_STAT_ARRAY_FIELDS(X)                                        \
    X(allocated_bytes, "Allocated memory")                               \
    X(active_bytes, "Active memory")                                     \
    X(requested_bytes, "Requested memory")                               \
    X(reserved_bytes, "Reserved memory")                                 \
    X(inactive_split_bytes, "Non-releasable memory")                     \
    X(allocation, "Allocations")                                         \
    X(active, "Active allocs")                                           \
    X(segment, "Reserved segments")                                      \
    X(inactive_split, "Non-releasable allocs")

/* X(name, description): plain cumulative counters (uint64_t). */
#define STOW_COUNTER_FIELDS(X)                                                    \
    X(num_alloc_retries, "allocations that released the cache and retried")       \
    X(num_ooms, "allocations that failed with STOW_ENOMEM")                       \
    X(num_sync_all_streams, "full device synchronizations")                       \
    X(num_device_alloc, "backend reserve calls that succeeded")                   \
    X(num_device_free, "backend release calls")                                   \
    X(num_backend_calls, "all backend calls, failed ones included")              \
    X(num_event_records, "events recorded for stream ordering")                   \
    X(num_event_queries, "event queries")                                         \
    X(num_map_calls, "page map calls (page-mapped pools)")                        \
    X(num_unmap_calls, "page unmap calls (page-mapped pools)")                    \
    X(num_cache_hits, "allocations served from cached memory")                    \
    X(num_cache_misses, "allocations that had to reserve memory")                 \
    X(num_invalid_frees, "frees rejected: foreign, interior or double")           \
    X(retry_time_ns, "host time spent releasing the cache and retrying")          \
    X(num_idle_releases, "cached segments released to make room (not by empty_cache)")   \
    X(num_scrubs, "blocks zeroed at free (scrub_on_free)")                                \
    X(num_scrub_failures, "scrubs the backend refused (block kept until one succeeds)") \
    X(num_quick_hits, "allocations served from a quick list or mid ring (small pool or range)") \
    X(num_quick_flushes, "quick lists (or mid rings alone) flushed before growing or releasing") \
    X(num_vmm_allowance_raises, "times a page-mapped pool that kept remapping raised its slack") \
    X(num_idle_keeps, "growths that kept idle segments a loop needs again (keep_idle_max)") \
    X(num_event_waits, "waits on one event before a remap, instead of a device synchronize") \
    X(num_vmm_step_plans, "layouts of a loop's step a page-mapped pool planned and took (vmm_learn_step)") \
    X(num_vmm_planned_allocations, "allocations placed at their planned address (vmm_learn_step)") \
    X(num_planned_hits, "allocations served from a planned slot of the arena (planned_steps)") \
    X(num_planned_misses, "requests of a planned step that matched no position (the pool served them)") \
    X(num_planned_realignments, "hits found by looking ahead of the expected position") \
    X(num_planned_fallbacks, "requests of a planned step the pool served (misses included)") \
    X(num_plans, "plans of a step taken (planned_steps)") \
    X(num_plans_dropped, "plans dropped (replaced, their key dropped or resting)") \
    X(num_plans_unsettled, "times a key whose steps did not settle stopped being planned") \
    X(num_plan_trims, "pools trimmed once a plan served its first step") \
    X(planning_ns, "host time spent making plans")

/* Where the reserved bytes went at the moment reserved_bytes reached its peak.
 * requested + rounding + split_remainder + idle_cached + pending == reserved. */
typedef struct stow_waste {
    uint64_t reserved_bytes;        /* the peak itself */
    uint64_t requested_bytes;       /* live requests, unrounded */
    uint64_t rounding_bytes;        /* live blocks minus their requests */
    uint64_t split_remainder_bytes; /* free blocks inside segments that hold live blocks */
    uint64_t idle_cached_bytes;     /* segments with no live block, kept cached */
    uint64_t pending_bytes;         /* freed blocks waiting for other streams' events */
    double fragmentation;           /* fragmentation at that moment */
} stow_waste_t;

/* Per-size-class counters. Class 0 holds requests <= 512 B; class k >= 1 holds
 * requests in (2^(k+8), 2^(k+9)] bytes; the last class is open-ended. */
#define STOW_SIZE_CLASS_COUNT 32
typedef struct stow_size_class_stats {
    uint64_t requests; /* allocation calls in this class */
    uint64_t hits;     /* served from cached memory */
    uint64_t misses;   /* needed new backend memory (or failed) */
    uint64_t live;     /* live allocations now */
    uint64_t live_peak;
} stow_size_class_stats_t;

typedef struct stow_stats {
    uint32_t size;    /* sizeof(stow_stats_t) as compiled into the library */
    uint32_t version; /* STOW_STATS_VERSION */
#define STOW_STATS_ARRAY_DECL_(name, label) stow_stat_t name[STOW_POOL_KINDS];
    STOW_STAT_ARRAY_FIELDS(STOW_STATS_ARRAY_DECL_)
#undef STOW_STATS_ARRAY_DECL_
#define STOW_STATS_COUNTER_DECL_(name, desc) uint64_t name;
    STOW_COUNTER_FIELDS(STOW_STATS_COUNTER_DECL_)
#undef STOW_STATS_COUNTER_DECL_
    uint64_t max_split_size_bytes;     /* SIZE_MAX when unlimited */
    uint64_t free_reserved_bytes;      /* reserved - active: cached, reusable later */
    uint64_t largest_free_block_bytes; /* largest block one request could get from cache */
    double fragmentation;              /* 1 - largest_free_block / free_reserved (0 if none) */
    double fragmentation_peak;         /* highest fragmentation since the last reset */
    stow_waste_t waste_at_peak;        /* at the reserved_bytes.all peak */
    uint64_t arena_bytes;              /* the planned layer's arena now (0: none) */
    uint64_t arena_peak_bytes;         /* the most bytes of it busy at once (a peak) */
    uint64_t capacity_bytes;           /* device total as the backend reports it */
    uint64_t limit_bytes;              /* what the pool may reserve (memory fraction) */
    stow_size_class_stats_t size_class[STOW_SIZE_CLASS_COUNT];
} stow_stats_t;

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_STATS_H */
