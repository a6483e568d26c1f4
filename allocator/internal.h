/*
 * allocator/internal.h: cross-file functions of the allocator, grouped by the
 * file that defines them, and the assertion levels.
 */
#ifndef STOWAGE_ALLOCATOR_INTERNAL_H
#define STOWAGE_ALLOCATOR_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>

#include "accounting/accounting.h"
#include "allocator/lock.h"
#include "allocator/types.h"
#include "stowage/record.h"

/* Assertion levels (STOW_DEBUG): 1 caller contracts, 2 internal, 3 expensive
 * whole-pool checks. Release builds (0) compile them out. A failed assertion is
 * an allocator bug, never bad user input (which gets a status code). */
#ifndef STOW_DEBUG
#define STOW_DEBUG 0
#endif
#define STOW_ASSERT_FAIL_(expr) \
    (fprintf(stderr, "stowage: %s:%d: assertion failed: %s\n", __FILE__, __LINE__, #expr), abort())
#if STOW_DEBUG >= 1
#define stow_assert(expr) ((expr) ? (void)0 : STOW_ASSERT_FAIL_(expr))
#else
#define stow_assert(expr) ((void)0)
#endif
#if STOW_DEBUG >= 2
#define stow_assert_internal(expr) ((expr) ? (void)0 : STOW_ASSERT_FAIL_(expr))
#else
#define stow_assert_internal(expr) ((void)0)
#endif

/* Level 3: the whole-pool check after every state change (O(blocks)). */
#if STOW_DEBUG >= 3
#define stow_assert_expensive(pool)                                            \
    do {                                                                       \
        char why_[256];                                                        \
        if (stow__pool_check_locked((pool), why_, sizeof why_) != STOW_OK) {   \
            fprintf(stderr, "stowage: %s:%d: pool check failed: %s\n", __FILE__, \
                    __LINE__, why_);                                           \
            abort();                                                           \
        }                                                                      \
    } while (0)
#else
#define stow_assert_expensive(pool) ((void)0)
#endif

#define STOW_LIKELY(x) __builtin_expect(!!(x), 1)
#define STOW_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- ptr_map.c ---- */
stow_status_t stow__ptr_map_init(stow_ptr_map_t *map);
void stow__ptr_map_destroy(stow_ptr_map_t *map);
void *stow__ptr_map_get(const stow_ptr_map_t *map, uintptr_t key);
stow_status_t stow__ptr_map_grow(stow_ptr_map_t *map);
/* Makes room for one more key; call before put, which cannot fail. The load
 * stays at most 1/4: most lookups then end at their home slot, which makes
 * the probe loops predictable. */
static inline stow_status_t stow__ptr_map_reserve_one(stow_ptr_map_t *map)
{
    return STOW_LIKELY((map->count + 1) * 4 <= map->capacity) ? STOW_OK : stow__ptr_map_grow(map);
}
void stow__ptr_map_put(stow_ptr_map_t *map, uintptr_t key, void *value);
void *stow__ptr_map_remove(stow_ptr_map_t *map, uintptr_t key);
/* The slot holding key, or NULL; stow__ptr_map_remove_slot removes it without
 * probing again (the free path looks a pointer up, then drops it). */
stow_ptr_slot_t *stow__ptr_map_find(const stow_ptr_map_t *map, uintptr_t key);
void stow__ptr_map_remove_slot(stow_ptr_map_t *map, stow_ptr_slot_t *slot);

/* ---- quick.c ---- */
/* Keeps b (ALLOCATED, just freed by the user: its allocation figures already
 * dropped) whole on a quick list of `owner` (over 64 KiB: in its mid ring,
 * whose oldest block is then freed the normal way), and in the live map, so
 * that a second free of it is refused and its reuse needs no map insertion;
 * false, with nothing changed, when b is not a candidate or the list is full
 * (or there is no ring). */
bool stow__quick_push(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner);
/* A QUICK block of exactly `rounded` bytes usable on ss (ss's own list or
 * ring, then `any`'s), off it, FREE, in no index but still in the live map;
 * NULL if none. */
stow_block_t *stow__quick_pop(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded);
/* Frees every QUICK block the normal way (out of the live map, coalesced,
 * indexed): before the pool grows, releases memory, or retries after
 * out-of-memory. */
void stow__quick_flush(stow_pool_t *pool);
/* Frees the mid rings' blocks the normal way (merged and indexed), and only
 * those; true when there were any. Counted in num_quick_flushes. */
bool stow__quick_flush_mid(stow_pool_t *pool);

/* ---- size_class.c ---- */
/* Rounds a request to its block size; STOW_EOVERFLOW near SIZE_MAX. */
stow_status_t stow__round_size(const stow_config_t *config, size_t size_bytes, size_t *out);
/* Free-index bin of a block size: exact below 8 KiB (16 bins of 512 B), then
 * 8 bins per power of two. Inline: every index operation needs it. */
static inline unsigned stow__free_bin_of(size_t size_bytes)
{
    size_t x = size_bytes / STOW_MIN_BLOCK_BYTES;
    if (x < 16)
        return (unsigned)x;
    unsigned lg = 63u - (unsigned)__builtin_clzll((unsigned long long)x); /* >= 4 */
    unsigned sub = (unsigned)(x >> (lg - 3)) & 7u;
    unsigned bin = 16u + (lg - 4u) * 8u + sub;
    return bin < STOW_FREE_BINS ? bin : STOW_FREE_BINS - 1;
}

/* ---- free_index.c ---- */
void stow__free_index_insert(stow_free_index_t *idx, stow_block_t *b);
void stow__free_index_remove(stow_free_index_t *idx, stow_block_t *b);
/* Smallest block with size >= size_bytes (most recently freed first among
 * equal sizes up to 2 MiB, lowest address above); NULL if none. Not const: a
 * bin found longer than STOW_BIN_LIST_MAX becomes a treap on the way, which
 * holds the same blocks. */
stow_block_t *stow__free_index_best_fit(stow_free_index_t *idx, size_t size_bytes);
/* Largest block (any of them among equal sizes), NULL if none; may turn a
 * long bin into a treap, as best_fit does. */
stow_block_t *stow__free_index_largest(stow_free_index_t *idx);
/* Whether a bin is held as a treap (tests; free_index.c). */
bool stow__free_index_bin_is_treap(const stow_free_index_t *idx, unsigned bin);
/* Calls visit(arg, b) for each block of at least size_bytes in increasing size
 * order (among equal sizes: most recently freed first up to 2 MiB, lowest
 * address first above) while it returns true. visit must not change idx; this
 * may, as best_fit does, turn a long bin into a treap before visiting it. */
void stow__free_index_visit_fitting(stow_free_index_t *idx, size_t size_bytes,
                                    bool (*visit)(void *arg, stow_block_t *b), void *arg);
/* Appends every block of idx to out[] (capacity idx->block_count), in no order. */
size_t stow__free_index_collect(const stow_free_index_t *idx, stow_block_t **out);

/* ---- block_store.c ---- */
stow_block_t *stow__block_new(stow_block_store_t *store);
stow_status_t stow__block_store_grow(stow_block_store_t *store, size_t count);
/* Makes sure the next `count` stow__block_new calls cannot fail. */
static inline stow_status_t stow__block_reserve(stow_block_store_t *store, size_t count)
{
    return STOW_LIKELY(store->free_count >= count) ? STOW_OK : stow__block_store_grow(store, count);
}
void stow__block_delete(stow_block_store_t *store, stow_block_t *b);
void stow__block_store_destroy(stow_block_store_t *store);

/* ---- options.c ---- */
/* Checks a configuration; on error writes the offending key into err. */
stow_status_t stow__config_validate(const stow_config_t *config, char *err, size_t err_len);
/* Checks the measured constants (stowage/tuning.h) against their bounds. */
stow_status_t stow__tuning_validate(const stow_tuning_t *tuning, char *err, size_t err_len);

typedef struct stow_free_handle {
    stow_phys_t phys;
    uint32_t granules; /* its size */
    uint8_t kind;      /* pool kind its reserved bytes are counted under */
} stow_free_handle_t;

/* ---- record.c ---- */
typedef enum {
    STOW_REC_ALLOC,
    STOW_REC_FREE,
    STOW_REC_SEGMENT_RESERVE,
    STOW_REC_SEGMENT_RELEASE,
    STOW_REC_MAP,
    STOW_REC_UNMAP,
    STOW_REC_OOM,
    STOW_REC_STEP     /* a step marker: addr = 1 + the key's index in keys[], 0 = step end */
} stow_rec_kind_t;

typedef struct stow_rec_event {
    uint64_t ticks;  /* stow__record_clock(), sampled every 64th event (record.c) */
    uint64_t addr;
    uint64_t size;   /* ALLOC: requested bytes; others: bytes concerned */
    uint16_t stream; /* index of the stream state (0 = shared lists) */
    uint8_t kind;    /* stow_rec_kind_t */
    uint8_t tag;
    uint32_t site;   /* ALLOC: the thread's site (stow_record_site_set); 0: none */
} stow_rec_event_t;

typedef struct stow_recorder {
    stow_rec_event_t *events; /* ring of `capacity`, `allocated` of them so far */
    size_t capacity;
    size_t allocated;         /* events allocated: the ring grows to capacity as it fills
                                 (record.c, stow__record_ring_end) */
    uint64_t count;           /* events recorded, overwritten ones included */
    size_t next;              /* slot the next event goes to: count % capacity */
    uint64_t last_ticks;      /* the clock at the last sampled event */
    uint64_t start_ticks, start_ns;
    char **keys;              /* the step keys recorded, in order of first use (record.c) */
    uint32_t key_count, key_capacity;
} stow_recorder_t;

extern _Thread_local unsigned char stow__current_tag;
extern _Thread_local uint32_t stow__current_site;
extern _Atomic bool stow__sites_used; /* a site was interned: recordings read the thread's */
uint64_t stow__record_clock(void);
void stow__record_free(stow_pool_t *pool);
/* The write position reached the events allocated: grows the ring towards its
 * capacity, or wraps it (at capacity, or without host memory to grow). */
void stow__record_ring_end(stow_recorder_t *r);
/* Records a step marker (key NULL: the step ends) when recording; a key that
 * cannot be kept for lack of host memory is left out. Lock held. */
void stow__record_step(stow_pool_t *pool, const char *key);

/* ---- pool.c: the pool struct is shared by pool.c, segment.c, stream.c, check.c ---- */
/* The adaptive allowance of a page-mapped pool (vmm_allowance.c): remaps
 * counted by windows of pool operations. */
typedef struct stow_vmm_adapt {
    double slack;                /* in force: tuning.vmm_slack, raised up to vmm_slack_max */
    uint64_t window_start_op;    /* op_count when the current window began */
    uint64_t window_remaps;      /* granules remapped in it so far */
    uint64_t hot_ops, hot_remaps; /* over the run of consecutive hot windows */
    unsigned hot_windows;        /* that run's length */
    unsigned warm_windows;       /* consecutive warm windows (hot ones included) */
    double rate_at_last_raise;   /* remaps per operation of the run that raised it; 0: none */
    bool settled;                /* no more raises: at the cap, or one that did not help */
} stow_vmm_adapt_t;

/* A layout learned from a loop's step (vmm_step.c, config vmm_learn_step):
 * while looking, a log of operation signatures; once the step repeats, the
 * plan: per phase of its cycle, the expected signature and, for a planned
 * allocation, its address. Owned by the pool; the arrays are freed when the
 * log or the plan is dropped. */
typedef struct stow_vmm_step {
    bool looking, active;
    bool placing;                /* active: from start_phase on, requests take their addresses */
    uint64_t *log_sigs;          /* looking: signature of each logged operation */
    uint32_t *log_lives;         /* looking: allocations: operations until freed, 0 while live */
    size_t log_count;
    uint64_t log_first_op;       /* step_ops of log_sigs[0] */
    uint64_t look_after_op;      /* no looking before this operation (back-off) */
    uint64_t last_remap_op;      /* step_ops at the last remap */
    uint64_t backoff_ops;        /* the next back-off, doubled after each refusal */
    size_t cycle, phase;         /* active: operations per cycle; phase of the next one */
    size_t start_phase;          /* active: where the planned blocks hold the fewest bytes */
    size_t cycle_misses;         /* active: planned requests this cycle whose address was taken */
    unsigned missed_cycles;      /* active: cycles in a row with such misses */
    uint64_t *plan_sigs;         /* active: expected signature per phase */
    uintptr_t *plan_addrs;       /* active: planned address per phase; 0: not planned */
    uintptr_t *plan_anchors;     /* active: per phase, a block below the planned address
                                    that is live then (the search starts there); 0: none */
    struct stow_stream_state *stream; /* active: the stream whose large range holds the plan */
    struct stow_segment *range;  /* active: that range */
    uintptr_t plan_top;          /* active: above every planned block and block that stays,
                                    on a granule: where a request whose address is taken goes */
} stow_vmm_step_t;

/* Epochs closed by events, not yet seen complete (vmm_epochs.c): a
 * ring of at most STOW_VMM_CLOSURES; events[] holds one event per stream
 * that freed a block since that stream's previous closure. */
#define STOW_VMM_CLOSURES 8
typedef struct stow_vmm_closure {
    uint64_t epoch;
    stow_event_t *events;
    uint32_t count, capacity;
} stow_vmm_closure_t;

/* Segments that growth past the high-water mark released, the most recent
 * STOW_REGRET_SEGMENTS (segment.c, regretted releases). */
#define STOW_REGRET_SEGMENTS 64

/* Growth that keeps releasing idle segments (classic pools, segment.c,
 * keep_idle): growths past the high-water mark that released idle segments,
 * counted by windows of pool operations. */
typedef struct stow_idle_keep {
    size_t released_bytes[STOW_REGRET_SEGMENTS]; /* 0: an empty or matched entry */
    uint8_t released_kind[STOW_REGRET_SEGMENTS];
    unsigned released_next;      /* the entry the next release overwrites */
    uint64_t window_start_op;    /* op_count when the current window began */
    uint64_t window_releases;    /* growths in it that released idle segments */
    unsigned hot_windows;        /* consecutive windows with one per 1,024 operations or more */
    bool keeping;                /* after such a run: idle segments are kept, within the cap */
} stow_idle_keep_t;

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
    uint64_t step_ops;               /* operations noted (successful allocations and frees) */
    stow_vmm_step_t step;            /* vmm_step.c */
    uint64_t reserved_high_water_bytes; /* highest reserved ever (not reset by users) */
    stow_idle_keep_t idle_keep;      /* whether growth keeps idle segments (segment.c) */
    /* vmm policy (vmm.c); all zero for classic pools */
    bool vmm;
    stow_granule_t *run_head, *run_tail; /* runs of unused granules, oldest first */
    size_t unused_count;               /* granules in those runs */
    stow_free_handle_t *free_handles;  /* unmapped physical handles kept for reuse */
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
    stow_vmm_adapt_t adapt;            /* the slack in force and how it adapts (vmm_allowance.c) */
    /* Stream safety of remaps (vmm_epochs.c): granules that become unused are tagged
     * with unmap_epoch; those tagged at or below unmap_safe_epoch have no
     * queued work left on them (a synchronize, or events, showed it). */
    uint64_t unmap_epoch;              /* starts at 1 */
    uint64_t unmap_safe_epoch;
    stow_vmm_closure_t closures[STOW_VMM_CLOSURES]; /* ring, oldest at closure_first */
    unsigned closure_first, closure_count;
    unsigned pushes_since_closure;     /* frees that left granules unused since the last */
    uint64_t closing_until_op;         /* epochs are closed while op_count is below it */
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
    stow_recorder_t *rec;            /* NULL: not recording */
    stow_tag_stats_t tag_stats[STOW_TAG_MAX];
};

/* Appends one event when recording (lock held). */
static inline void stow__record(stow_pool_t *pool, stow_rec_kind_t kind, uint64_t addr,
                                uint64_t size, unsigned stream, unsigned tag)
{
    stow_recorder_t *r = pool->rec;
    if (STOW_LIKELY(!r))
        return;
    /* The clock costs more than the rest of an event (a VM's TSC read is
     * ~12 ns): it is read every 64th event and at every rare event, and the
     * dump interpolates the times in between. */
    if ((r->count & 63) == 0 || kind > STOW_REC_FREE)
        r->last_ticks = stow__record_clock();
    stow_rec_event_t *e = &r->events[r->next]; /* no division on the fast path */
    e->ticks = r->last_ticks;
    e->addr = addr;
    e->size = size;
    e->stream = (uint16_t)stream;
    e->kind = (uint8_t)kind;
    e->tag = (uint8_t)tag;
    /* A thread-local read costs a call in a shared library: none until sites exist. */
    e->site = kind == STOW_REC_ALLOC &&
                      atomic_load_explicit(&stow__sites_used, memory_order_relaxed)
                  ? stow__current_site
                  : 0;
    /* After the event is written: growing the ring may move it. */
    r->count++;
    if (STOW_UNLIKELY(++r->next == r->allocated))
        stow__record_ring_end(r);
}

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
 * left with none is idle from now (classic segments count in idle bytes). */
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
/* A page-mapped pool's granules unused so far have no queued work left
 * (vmm_epochs.c, stream safety of remaps). */
void stow__vmm_synchronized(stow_pool_t *pool);
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

/* ---- segment.c ---- */
/* Slow path: reserves a segment for a request of `rounded` bytes on `ss` and
 * returns its single free block (already indexed under ss), or an error after
 * the release-and-retry path. */
stow_status_t stow__segment_grow(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                                 size_t rounded, size_t requested, stow_block_t **out);
/* Releases segments whose only block is free; all = every such segment,
 * else only until `want_bytes` were released (oldest idle first). */
size_t stow__segment_release_idle(stow_pool_t *pool, bool all, size_t want_bytes);
void stow__segment_release_all(stow_pool_t *pool);
/* Links a new segment [base, base+size) into the pool with `b` as its single
 * free block, indexed under ss (or the shared lists). */
void stow__segment_install(stow_pool_t *pool, stow_segment_t *seg, stow_block_t *b,
                           stow_stream_state_t *ss, uintptr_t base, size_t size, unsigned kind);

/* ---- vmm.c ---- */
/* The granule of a page-mapped range holding addr (the granularity is a power
 * of two, backend_valid checks it: a shift). */
static inline size_t stow__granule_of(const stow_pool_t *pool, const stow_segment_t *seg,
                                      uintptr_t addr)
{
    return (size_t)(addr - seg->base) >> pool->granularity_shift;
}
/* stow__vmm_back and _unback beyond their fast paths; the block's span of
 * granules [first, end) comes from them. */
stow_status_t stow__vmm_back_span(stow_pool_t *pool, stow_block_t *b, size_t size_bytes,
                                  size_t first, size_t end);
void stow__vmm_unback_span(stow_pool_t *pool, stow_block_t *b, size_t first, size_t end);
/* Maps physical granules under [b->addr, b->addr + size_bytes) (b is a FREE
 * block about to be handed out with that size). STOW_ENOMEM when the device and
 * the unused granules cannot provide them; nothing changes on error. Inline
 * fast path: most small blocks lie inside one granule that a live block
 * already holds (an edge count above 0 means mapped and not unused), and a
 * call into the general function cost more than the work. Always inlined:
 * left to GCC, it becomes a function of its own with the general one inlined
 * into it, and the fast path pays that one's register saves. */
static inline __attribute__((always_inline)) stow_status_t
stow__vmm_back(stow_pool_t *pool, stow_block_t *b, size_t size_bytes)
{
    stow_segment_t *seg = b->segment;
    size_t first = stow__granule_of(pool, seg, b->addr);
    size_t last = stow__granule_of(pool, seg, b->addr + size_bytes - 1);
    if (first == last && seg->granules[first].edges) {
        seg->granules[first].edges++;
        pool->live_bytes += size_bytes;
        if (pool->live_bytes > pool->live_bytes_high_water)
            pool->live_bytes_high_water = pool->live_bytes;
        /* Held memory beside live data shrinks by what the block now covers. */
        stow__stat2_sub(pool->acct.s.inactive_split_bytes, seg->pool_kind, size_bytes);
        return STOW_OK;
    }
    return stow__vmm_back_span(pool, b, size_bytes, first, last + 1);
}
/* The block (ALLOCATED or PENDING) stops holding its granules. Inline fast
 * path: a block inside one granule that another live block still holds (its
 * edge count stays above 0) changes no run and no idle figure. Always inlined,
 * as stow__vmm_back is. */
static inline __attribute__((always_inline)) void stow__vmm_unback(stow_pool_t *pool,
                                                                  stow_block_t *b)
{
    stow_segment_t *seg = b->segment;
    size_t first = stow__granule_of(pool, seg, b->addr);
    size_t last = stow__granule_of(pool, seg, b->addr + b->size_bytes - 1);
    if (first == last && seg->granules[first].edges > 1) {
        stow_assert_internal(pool->live_bytes >= b->size_bytes);
        seg->granules[first].edges--;
        pool->live_bytes -= b->size_bytes;
        stow__stat2_add(pool->acct.s.inactive_split_bytes, seg->pool_kind, b->size_bytes);
        pool->extra_granules_live -= b->extra_granules;
        b->extra_granules = 0;
        return;
    }
    stow__vmm_unback_span(pool, b, first, last + 1);
}
stow_status_t stow__vmm_grow(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                             size_t rounded, stow_block_t **out);
/* Unmaps unused granules and releases free handles (caller synchronized). */
void stow__vmm_release_unused(stow_pool_t *pool);
/* What stow__vmm_release_unused would give back now: free handles and the
 * mappings all of whose granules are unused. */
uint64_t stow__vmm_releasable_bytes(const stow_pool_t *pool);
void stow__vmm_release_segment(stow_pool_t *pool, stow_segment_t *seg);
void stow__vmm_release_all_handles(stow_pool_t *pool);

/* ---- vmm_allowance.c ---- */
/* The granules the pool may hold for `live_bytes_high_water` (its limit is the
 * caller's to check). */
uint64_t stow__vmm_allowance_for(const stow_pool_t *pool, uint64_t live_bytes_high_water);
/* The granules the pool may hold while some mapped granule sits unused, now. */
uint64_t stow__vmm_allowed_granules(const stow_pool_t *pool);
/* Counts a remap of `granules` for the adaptive allowance (may raise the slack). */
void stow__vmm_note_remap(stow_pool_t *pool, size_t granules);

/* ---- vmm_epochs.c ---- */
/* Destroys the events of epochs not yet seen complete, and their arrays. */
void stow__vmm_drop_closures(stow_pool_t *pool, bool free_arrays);
/* A free on `freeing` just left granules unused: while the pool remaps, may
 * close the epoch (an event on each stream that freed). */
void stow__vmm_note_unused_pushed(stow_pool_t *pool, const stow_stream_state_t *freeing);
/* Before a remap unmaps unused granules whose runs' newest tag is `epoch`:
 * epochs are closed for a window of operations from now, and the granules are
 * made safe to unmap without a synchronize where they can be (known safe
 * already, or after waiting on events alone). True when they are, or when
 * `synced` (the caller synchronized since they were freed); false: the caller
 * must synchronize. */
bool stow__vmm_unused_ready(stow_pool_t *pool, uint64_t epoch, bool synced);

/* ---- vmm_step.c: a layout learned from a loop's step (vmm_learn_step) ---- */
void stow__vmm_step_destroy(stow_pool_t *pool);
/* empty_cache: the free blocks change hands (to the streams' shared index),
 * so the plan and the log go; the pool looks again at its next remap. */
void stow__vmm_step_forget(stow_pool_t *pool);
/* A remap: start looking for the step, unless looking, planned or backing off. */
void stow__vmm_step_note_remap(stow_pool_t *pool);
void stow__vmm_step_note_alloc(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *ss,
                               size_t rounded);
void stow__vmm_step_note_free(stow_pool_t *pool, stow_block_t *b);
/* The free block cut at the planned address of this request, or NULL (no plan,
 * not the expected request, or the address is not free). Needs one reserved
 * block record. */
stow_block_t *stow__vmm_step_place(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded);

/* ---- vmm_place.c ---- */
/* Where a page-mapped pool puts a request of `rounded` bytes that best fit
 * placed at free block b (indexed, usable by ss). Big requests whose best-fit
 * span needs granules mapped go where the fewest need mapping instead: any
 * usable free block, at its start, its end or the start of a run of mapped
 * granules inside it, carved out and indexed; b when nothing is cheaper.
 * Sets pool->placed_extra. Needs two reserved block records. */
stow_block_t *stow__vmm_place(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded,
                              stow_block_t *b);

/* ---- vmm_check.c ---- */
/* A page-mapped pool's physical memory per pool kind, recounted from its
 * granules, blocks and free handles (not from the books). */
typedef struct stow_vmm_recount {
    uint64_t reserved_bytes[STOW_POOL_KINDS];    /* mapped granules and free handles */
    uint64_t beside_live_bytes[STOW_POOL_KINDS]; /* live granules' bytes less live bytes */
} stow_vmm_recount_t;
/* The invariants of a page-mapped pool; *phys gets the recount for the
 * books' check (check.c). */
stow_status_t stow__vmm_check(stow_pool_t *pool, stow_vmm_recount_t *phys, char *why,
                             size_t why_len);

/* ---- pool.c (continued) ---- */
/* Splits free indexed block b at b->addr + offset_bytes (0 < offset < size):
 * b keeps the lower part; returns the upper part, free and indexed. Needs a
 * reserved block record (stow__block_reserve). */
stow_block_t *stow__pool_split_free_at(stow_pool_t *pool, stow_block_t *b, size_t offset_bytes);
/* Merges free block b (in no index) with its free neighbours of the same
 * owner, which leave their index; returns the merged block (in no index). */
stow_block_t *stow__pool_coalesce(stow_pool_t *pool, stow_block_t *b);

/* ---- segment.c (continued) ---- */
/* Fills the out-of-memory message; `retried`: after the release-and-retry
 * (a page-mapped pool whose request no range can hold fails before it). */
void stow__segment_explain_oom(stow_pool_t *pool, size_t requested, size_t segment_bytes,
                               bool retried);
/* Before a retry: synchronize, make every free block reusable by all streams,
 * complete pending blocks, release idle memory (unused granules only once
 * stow__segment_sync_for_release succeeded). */
void stow__segment_release_cache_for_retry(stow_pool_t *pool);
/* Before empty_cache or the retry gives memory back: synchronizes the device
 * (when stow__pool_release_needs_sync) and hands every stream's frees to all,
 * completing pending blocks. Returns whether unused granules may be unmapped
 * now: false when a synchronize failed. */
bool stow__segment_sync_for_release(stow_pool_t *pool);

/* ---- stream.c ---- */
stow_stream_state_t *stow__stream_get(stow_pool_t *pool, stow_stream_t stream);
stow_status_t stow__stream_state_new(stow_pool_t *pool, stow_stream_t stream,
                                     stow_stream_state_t **out);
void stow__stream_states_destroy(stow_pool_t *pool);
/* Destroy path: forgets PENDING blocks, returning their events. */
void stow__stream_drop_pending(stow_pool_t *pool);
/* Frees a block with record_stream users: records events, makes it PENDING. */
stow_status_t stow__stream_defer_free(stow_pool_t *pool, stow_block_t *b);
/* Turns PENDING blocks whose events completed into FREE blocks. */
void stow__stream_process_pending(stow_pool_t *pool);
/* Keeps b (out of the live map, its scrub refused) PENDING with no event to
 * wait for: a synchronize (stow__stream_clear_all_synchronized) releases it,
 * and making it free scrubs it again. */
void stow__stream_park_unscrubbed(stow_pool_t *pool, stow_block_t *b);
/* Moves blocks freed on other streams into `any` once a clearance event
 * recorded after their free completed; returns whether any moved. Used on a
 * miss only with reuse_other_streams_on_miss. */
bool stow__stream_clear_others(stow_pool_t *pool, stow_stream_state_t *except);
/* After a device synchronize: everything free is clear for every stream. */
void stow__stream_clear_all_synchronized(stow_pool_t *pool);
stow_status_t stow__stream_add_use(stow_pool_t *pool, stow_block_t *b, stow_stream_t stream);

/* ---- planned_serve.c: the planned layer (planned_steps; allocator/planned.h) ---- */
stow_status_t stow__planned_create(stow_pool_t *pool);
void stow__planned_destroy(stow_pool_t *pool);
/* A step marker (key NULL: the step in progress ends). */
void stow__planned_step(stow_pool_t *pool, const char *key);
/* Serves the request from its planned slot (true, *out set), or leaves it to
 * the pool (false). */
bool stow__planned_alloc(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded,
                         size_t requested, void **out);
/* The pool served a request (the step's count and its recording). */
void stow__planned_pool_alloc(stow_pool_t *pool, stow_stream_state_t *ss, uintptr_t addr,
                              size_t rounded);
/* The pool freed the block at addr (recordings follow lives). */
void stow__planned_pool_free(stow_pool_t *pool, uintptr_t addr);
/* A free of an address in the arena: STOW_OK, or STOW_ENOTOWNED (counted). */
stow_status_t stow__planned_free(stow_pool_t *pool, uintptr_t addr);
bool stow__planned_block_size(stow_pool_t *pool, uintptr_t addr, size_t *block_bytes,
                              size_t *requested_bytes);
stow_status_t stow__planned_record_stream(stow_pool_t *pool, uintptr_t addr,
                                          stow_stream_t stream);
/* After a synchronize (empty_cache, the out-of-memory retry): slots waiting for
 * events are free; the arena goes back to the pool when no slot is busy. */
void stow__planned_release(stow_pool_t *pool);
/* Bytes of the arena's busy slots now. */
size_t stow__planned_live_bytes(const stow_pool_t *pool);
/* Whether addr lies in the arena (0 bytes when there is none: never). */
static inline bool stow__planned_owns(const stow_pool_t *pool, uintptr_t addr)
{
    return addr - pool->planned_base < pool->planned_bytes;
}

/* ---- planned_check.c ---- */
/* The planned layer's invariants (allocator/planned.h), and what its busy
 * slots add to the books (large pool kind). */
typedef struct stow_planned_books {
    uint64_t allocated_bytes, requested_bytes, allocations, pending_bytes, pending_blocks;
} stow_planned_books_t;
stow_status_t stow__planned_check(stow_pool_t *pool, stow_planned_books_t *books, char *why,
                                  size_t why_len);

/* ---- pool.c: the arena's block ---- */
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

/* ---- check.c ---- */
/* Walks every structure and checks the invariants of types.h and the books.
 * Returns STOW_OK or writes the first violation into why. Lock held. */
stow_status_t stow__pool_check_locked(stow_pool_t *pool, char *why, size_t why_len);
/* Writes a violation, printf-style, into why (if any) and returns STOW_EINVAL:
 * the checkers' (check.c, planned_check.c) one way to fail. */
stow_status_t stow__violation(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* STOWAGE_ALLOCATOR_INTERNAL_H */
