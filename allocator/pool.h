/*
 * allocator/pool.h: the pool (pool.c): struct stow_pool, which holds each
 * layer's state, and pool.c's cross-file functions (the free indexes as the
 * pool chooses them, making a block free, the cached-block counts, the
 * planned layer's arena block).
 *
 * The layers' states are embedded by value, each defined in its own layer's
 * header (segment.h, vmm_allowance.h, vmm_epochs.h, vmm_step.h) and read only
 * by that layer's files. Included by every file that reads the pool's
 * fields; the headers of the layers whose inline fast paths read the pool
 * (vmm.h, recorder.h, planned_serve.h) include it.
 */
#ifndef STOWAGE_ALLOCATOR_POOL_H
#define STOWAGE_ALLOCATOR_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "accounting/accounting.h"
#include "allocator/assert.h"
#include "allocator/block_store.h"
#include "allocator/lock.h"
#include "allocator/ptr_map.h"
#include "allocator/segment.h"
#include "allocator/types.h"
#include "allocator/vmm_allowance.h"
#include "allocator/vmm_epochs.h"
#include "allocator/vmm_step.h"
#include "stowage/record.h"

struct stow_pool {
    stow_lock_t lock;                /* allocator/lock.h; each entry point takes it once */
    stow_config_t config;
    stow_tuning_t tuning;            /* the measured constants (stowage/tuning.h) */
    const stow_backend_t *backend;
    size_t granularity_bytes;
    unsigned granularity_shift;        /* log2(granularity_bytes) (a power of two) */
    bool has_events;                 /* backend orders streams with events */
    /* The backend's event_synchronize (NULL: none, or no events, or a version-1
     * backend): a remap waits on events instead of the device (vmm_epochs.c). */
    stow_status_t (*event_synchronize)(void *ctx, stow_event_t event);
    size_t capacity_bytes;           /* device total from mem_info */
    size_t limit_bytes;              /* memory_fraction x capacity */
    stow_ptr_map_t live;             /* addr -> ALLOCATED or PENDING block */
    stow_block_store_t blocks;
    stow_stream_state_t **streams;   /* per-stream free indexes */
    size_t stream_count, stream_capacity;
    stow_stream_state_t *last_stream; /* lookup cache: most recent stream */
    stow_stream_state_t *any;        /* blocks reusable by every stream */
    stow_segment_t *segments;        /* all segments, most recent first */
    stow_block_t *pending;           /* PENDING blocks, linked through ->right */
    stow_accounting_t acct;
    uint64_t op_count;               /* alloc + free calls, the GC clock */
    bool learn_step;                 /* vmm with vmm_learn_step: operations are noted */
    stow_vmm_step_t step;            /* the learned step (vmm_step.h) */
    uint64_t reserved_high_water_bytes; /* highest reserved ever (not reset by users) */
    stow_idle_keep_t idle_keep;      /* whether growth keeps idle segments (segment.h) */
    /* vmm policy (vmm.c); all zero for classic pools */
    bool vmm;
    stow_granule_t *run_head, *run_tail; /* runs of unused granules, oldest first */
    size_t unused_count;               /* granules in those runs */
    struct stow_free_handle *free_handles; /* unmapped physical handles kept for reuse (vmm.h) */
    size_t free_handle_count, free_handle_capacity;
    uint64_t free_handle_granules;     /* their granules */
    uint64_t phys_granules;            /* granules of the handles held (mapped + free) */
    uint64_t phys_granules_high_water; /* the most phys_granules held since creation or the
                                          last empty_cache: handles are created up to it
                                          before any remap (vmm.c, obtain_handle) */
    uint64_t mapped_count;             /* granules mapped */
    size_t vmm_small_bytes;            /* requests of at most this go to the small range;
                                          0: one range for all (config vmm_small_kb) */
    size_t small_kind_max_bytes;       /* requests of at most this go to the small pool
                                          kind: vmm_small_bytes in page-mapped pools,
                                          STOW_SMALL_REQUEST_BYTES in classic ones */
    uint64_t live_bytes;               /* bytes of the blocks holding granules (ALLOCATED,
                                          PENDING and QUICK) */
    uint64_t live_bytes_high_water;    /* since creation or the last empty_cache */
    uint64_t extra_granules_live;      /* sum of extra_granules over live blocks */
    size_t placed_extra;               /* extra_granules of the placement being made */
    stow_vmm_adapt_t adapt;            /* the slack in force and how it adapts (vmm_allowance.h) */
    stow_vmm_epochs_t epochs;          /* stream safety of remaps (vmm_epochs.h) */
    unsigned quick_depth;            /* blocks per quick list; 0: no quick lists (quick.c) */
    unsigned quick_mid_slots;        /* slots of each stream's mid ring used; 0: none (quick.c) */
    bool quick_on;                   /* either of the two: one load on every free, not two */
    uint64_t quick_blocks;           /* QUICK blocks of every stream */
    struct stow_planned *planned;    /* the planned layer (planned_steps), or NULL */
    uintptr_t planned_base;          /* its arena: [base, base + bytes); 0 bytes: none */
    size_t planned_bytes;
    bool fine_handles;               /* page-mapped: map a handle per granule (while the
                                        planned layer may plan, planned_serve.c) */
    uint64_t vmm_cap_bytes;          /* page-mapped: while the planned layer holds its arena,
                                        its budget, which caps the allowance (0: none) */
    uint64_t largest_free_cache;     /* valid unless largest_free_dirty */
    bool largest_free_dirty;
    char oom_message[768];
    struct stow_recorder *rec;       /* NULL: not recording (recorder.h) */
    stow_tag_stats_t tag_stats[STOW_TAG_MAX];
};

/* Inserts a FREE block into its owner's index (with accounting). */
void stow__pool_index_insert(stow_pool_t *pool, stow_block_t *b);
void stow__pool_index_remove(stow_pool_t *pool, stow_block_t *b);
/* Frees a block for good: coalesces and indexes it under `owner`. */
void stow__pool_make_free(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner);
/* A cached block (FREE in an index, or QUICK) counts in inactive_split while
 * it does not cover its whole segment: noted as it becomes cached (add), and
 * taken back as it stops being so. In a page-mapped pool such a block is
 * address space, not memory: it counts, but its bytes do not
 * (inactive_split_bytes is the physical memory beside live data there, kept
 * by vmm.c). */
static inline void stow__pool_count_split(stow_pool_t *pool, stow_block_t *b, bool add)
{
    if (add)
        b->counted_split_ = (b->prev || b->next) ? 1 : 0;
    if (b->counted_split_) {
        if (pool->vmm)
            stow__acct_inactive_split_count(&pool->acct, b->pool_kind, add);
        else
            stow__acct_inactive_split(&pool->acct, b->pool_kind, b->size_bytes, add);
    }
    if (!add)
        b->counted_split_ = 0;
}
/* A live (ALLOCATED or PENDING) block of seg stopped being live: a segment
 * left with none is idle from now (classic segments count in idle bytes).
 * Here, not in segment.h: the free paths (pool.c, quick.c) change the pool's
 * books with it, and segment.h includes no pool. */
static inline void stow__segment_block_left(stow_pool_t *pool, stow_segment_t *seg)
{
    if (--seg->live_blocks == 0) {
        if (!seg->granules)
            pool->acct.idle_segment_bytes += seg->size_bytes;
        seg->idle_since_op = pool->op_count;
    }
}
/* Recomputes the largest free block after an index lost it (slow path). */
void stow__pool_recompute_largest_free(stow_pool_t *pool);

/* Whether empty_cache and the out-of-memory retry synchronize the device
 * before they give memory back: with events, to hand every stream's frees to
 * all; without, when a block whose scrub was refused waits for one (the only
 * pending block there can be), and in page-mapped pools, whose unmapping is
 * not stream-ordered even on a single-stream backend. A classic pool without
 * events releases at once: release itself waits for queued work (backend.h). */
static inline bool stow__pool_release_needs_sync(const stow_pool_t *pool)
{
    return pool->has_events || pool->pending || pool->vmm;
}
/* The largest block one request could get from the cache. Inline: every
 * allocation and free reads it, and the cached value is almost always valid. */
static inline uint64_t stow__pool_largest_free(stow_pool_t *pool)
{
    if (STOW_UNLIKELY(pool->largest_free_dirty))
        stow__pool_recompute_largest_free(pool);
    if (pool->vmm) {
        /* Physical memory is fungible: one request can use every cached byte
         * (remapped as needed), within a free virtual block. */
        uint64_t s = pool->acct.s.reserved_bytes[STOW_POOL_ALL].current -
                     stow__acct_active_bytes(&pool->acct, STOW_POOL_ALL);
        return pool->largest_free_cache < s ? pool->largest_free_cache : s;
    }
    return pool->largest_free_cache;
}
stow_status_t stow__backend_status(stow_pool_t *pool, stow_status_t st);
/* Returns an event to the backend (a failure changes nothing the pool keeps:
 * the event is not the pool's after the call either way). */
static inline void stow__pool_destroy_event(stow_pool_t *pool, stow_event_t ev)
{
    (void)stow__backend_status(pool, pool->backend->event_destroy(pool->backend->ctx, ev));
}
/* Waits for all work queued on every stream (counted in
 * num_sync_all_streams); whether the backend did. */
static inline bool stow__pool_synchronize(stow_pool_t *pool)
{
    pool->acct.s.num_sync_all_streams++;
    if (stow__backend_status(pool, pool->backend->synchronize(pool->backend->ctx)) != STOW_OK)
        return false;
    if (pool->vmm)
        stow__vmm_synchronized(pool);
    return true;
}

/* Splits free indexed block b at b->addr + offset_bytes (0 < offset < size):
 * b keeps the lower part; returns the upper part, free and indexed. Needs a
 * reserved block record (stow__block_reserve). */
stow_block_t *stow__pool_split_free_at(stow_pool_t *pool, stow_block_t *b, size_t offset_bytes);
/* Merges free block b (in no index) with its free neighbours of the same
 * owner, which leave their index; returns the merged block (in no index). */
stow_block_t *stow__pool_coalesce(stow_pool_t *pool, stow_block_t *b);

/* A block of `bytes` (a multiple of 512) for the planned layer's arena, found,
 * grown and backed as an allocation on ss is, handed to no user: ARENA, in no
 * book but reserved memory. Errors as stow_pool_alloc's (nothing changes). */
stow_status_t stow__pool_take_arena(stow_pool_t *pool, stow_stream_state_t *ss, size_t bytes,
                                    stow_block_t **out);
/* Gives the arena's block back, freed on `owner` (the shared lists after a
 * synchronize). */
void stow__pool_release_arena(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner);
/* A plan took over the steps the pool served: its idle memory goes back to
 * the device (empty_cache's release, once). */
void stow__pool_trim_for_plan(stow_pool_t *pool);
/* A busy slot of the arena that becomes a block of the pool when the arena
 * is dissolved: its place in the arena and what its user asked for. */
typedef struct stow_arena_slot {
    size_t offset, bytes, requested_bytes;
    stow_stream_state_t *stream;  /* the allocation stream */
    stow_stream_uses_t *uses;     /* record_stream users (taken over), or NULL */
    uint8_t tag;
} stow_arena_slot_t;
/* Makes sure stow__pool_dissolve_arena can cut the arena around n slots:
 * block records and room in the live map; false without host memory. */
bool stow__pool_dissolve_reserve(stow_pool_t *pool, size_t n);
/* The arena's block b becomes pool blocks: each slot (sorted by offset,
 * disjoint, inside b) an ALLOCATED block with its user's figures (already in
 * the books, as the planned layer counted them), the rest free on `owner`
 * (merged and indexed). A page-mapped arena keeps its granules mapped: those
 * under no slot become unused, and the live high-water mark its allowance
 * follows drops to live_high_water (the user's, which the arena's idle bytes
 * inflated), or to what is live. Cannot fail after stow__pool_dissolve_reserve. */
void stow__pool_dissolve_arena(stow_pool_t *pool, stow_block_t *b, const stow_arena_slot_t *slots,
                               size_t n, stow_stream_state_t *owner, uint64_t live_high_water);

#endif /* STOWAGE_ALLOCATOR_POOL_H */
