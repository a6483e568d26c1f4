/*
 * allocator/pool.c: pool create/destroy and the alloc/free fast paths.
 *
 * Fast path of an allocation: round the size, find the stream's free lists,
 * take the best-fitting cached block (free_index.c), split off the remainder,
 * record it in the live map. A miss goes to segment.c (grow, release and
 * retry). A free looks the pointer up in the live map (a foreign pointer simply
 * misses), then coalesces with free neighbours owned by the same stream.
 */
#include "allocator/assert.h"
#include "allocator/block_store.h"
#include "allocator/check.h"
#include "allocator/free_index.h"
#include "allocator/lock.h"
#include "allocator/options.h"
#include "allocator/planned_serve.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/quick.h"
#include "allocator/recorder.h"
#include "allocator/segment.h"
#include "allocator/stream.h"
#include "allocator/types.h"
#include "allocator/vmm.h"
#include "allocator/vmm_allowance.h"
#include "allocator/vmm_epochs.h"
#include "allocator/vmm_step.h"

#include <string.h>
#include <time.h>

unsigned stow_version(void) { return STOW_VERSION_HEX; }

/* ---- free-index bookkeeping shared with segment.c and stream.c ---- */

/* Inlined into this file's hot paths (merges at free, splits at allocation),
 * where as calls their register saves and returns would cost more than their
 * work. The other files call the exported wrappers. */
static inline __attribute__((always_inline)) void index_insert(stow_pool_t *pool, stow_block_t *b)
{
    stow__free_index_insert(&b->owner->free[b->pool_kind], b);
    stow__pool_count_split(pool, b, true);
    if (!pool->largest_free_dirty && b->size_bytes > pool->largest_free_cache)
        pool->largest_free_cache = b->size_bytes;
}

static inline __attribute__((always_inline)) void index_remove(stow_pool_t *pool, stow_block_t *b)
{
    stow__free_index_remove(&b->owner->free[b->pool_kind], b);
    stow__pool_count_split(pool, b, false);
    if (b->size_bytes >= pool->largest_free_cache)
        pool->largest_free_dirty = true;
}

void stow__pool_index_insert(stow_pool_t *pool, stow_block_t *b) { index_insert(pool, b); }

void stow__pool_index_remove(stow_pool_t *pool, stow_block_t *b) { index_remove(pool, b); }

static void largest_of_state(stow_stream_state_t *ss, uint64_t *largest)
{
    for (unsigned k = STOW_POOL_SMALL; k <= STOW_POOL_LARGE; k++) {
        const stow_block_t *b = stow__free_index_largest(&ss->free[k]);
        if (b && b->size_bytes > *largest)
            *largest = b->size_bytes;
    }
}

void stow__pool_recompute_largest_free(stow_pool_t *pool)
{
    uint64_t largest = 0;
    largest_of_state(pool->any, &largest);
    for (size_t i = 0; i < pool->stream_count; i++)
        largest_of_state(pool->streams[i], &largest);
    pool->largest_free_cache = largest;
    pool->largest_free_dirty = false;
}

/* Merges `b` (FREE, not indexed) with free neighbours of the same owner. */
static stow_block_t *coalesce(stow_pool_t *pool, stow_block_t *b)
{
    stow_block_t *prev = b->prev;
    if (prev && prev->state == BLOCK_FREE && prev->owner == b->owner) {
        index_remove(pool, prev);
        prev->size_bytes += b->size_bytes;
        prev->next = b->next;
        if (b->next)
            b->next->prev = prev;
        if (b->free_seq > prev->free_seq)
            prev->free_seq = b->free_seq;
        stow__block_delete(&pool->blocks, b);
        b = prev;
    }
    stow_block_t *next = b->next;
    if (next && next->state == BLOCK_FREE && next->owner == b->owner) {
        index_remove(pool, next);
        b->size_bytes += next->size_bytes;
        b->next = next->next;
        if (next->next)
            next->next->prev = b;
        if (next->free_seq > b->free_seq)
            b->free_seq = next->free_seq;
        stow__block_delete(&pool->blocks, next);
    }
    return b;
}

stow_block_t *stow__pool_coalesce(stow_pool_t *pool, stow_block_t *b)
{
    return coalesce(pool, b);
}

void stow__pool_make_free(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner)
{
    stow_segment_t *seg = b->segment;
    if (b->state != BLOCK_FREE) {
        if (STOW_UNLIKELY(pool->config.scrub_on_free)) {
            /* Zeroed on its own stream before anyone can reuse it: the same
             * stream is ordered after the scrub, others wait for clearance. */
            pool->acct.s.num_scrubs++;
            if (stow__backend_status(pool, pool->backend->scrub(
                                               pool->backend->ctx, (void *)b->addr, b->size_bytes,
                                               b->owner->is_any ? NULL : b->owner->stream)) !=
                STOW_OK) {
                /* Still the last owner's data: reused, it would reach the
                 * next owner. It waits, unscrubbed and out of reach, for the
                 * next synchronize, where the scrub is tried again. */
                pool->acct.s.num_scrub_failures++;
                stow__stream_park_unscrubbed(pool, b);
                return;
            }
        }
        if (seg->granules)
            stow__vmm_unback(pool, b);
        stow__segment_block_left(pool, seg);
    }
    b->state = BLOCK_FREE;
    b->owner = pool->has_events ? owner : pool->any;
    b->free_seq = ++b->owner->free_seq;
    b = coalesce(pool, b);
    index_insert(pool, b);
}

/* ---- create / destroy ---- */

static size_t limit_for(double fraction, size_t capacity_bytes)
{
    return fraction >= 1.0 ? capacity_bytes : (size_t)(fraction * (double)capacity_bytes);
}

/* A backend's event methods come as a set: with none the pool treats every
 * stream as one and reuses a freed block on any stream at once, which on a
 * device with several streams would hand memory to one while another still
 * uses it. So a backend with some of them but not all is refused rather than
 * taken for a single-stream one. */
static bool backend_valid(const stow_backend_t *b)
{
    if (!b)
        return false;
    int event_methods = !!b->event_record + !!b->event_query + !!b->event_destroy;
    return (b->abi_version == 1 || b->abi_version == STOW_BACKEND_ABI) && b->reserve &&
           b->release && b->mem_info && b->synchronize &&
           b->granularity_bytes >= STOW_MIN_BLOCK_BYTES &&
           (b->granularity_bytes & (b->granularity_bytes - 1)) == 0 &&
           (event_methods == 0 || event_methods == 3);
}

stow_status_t stow__backend_status(stow_pool_t *pool, stow_status_t st)
{
    pool->acct.s.num_backend_calls++;
    return st;
}

static void pool_free_memory(stow_pool_t *pool)
{
    stow__planned_destroy(pool);
    stow__record_free(pool);
    free(pool->free_handles);
    stow__vmm_drop_closures(pool, true);
    stow__vmm_step_destroy(pool);
    stow__stream_states_destroy(pool);
    free(pool->any);
    stow__ptr_map_destroy(&pool->live);
    stow__block_store_destroy(&pool->blocks);
    free(pool);
}

/* Whether the backend has every page-mapping method a page-mapped pool needs
 * (the CUDA backend sets them only where the driver maps pages). */
static bool backend_maps_pages(const stow_backend_t *b)
{
    return b->va_reserve && b->va_release && b->phys_create && b->phys_release && b->map &&
           b->unmap;
}

stow_status_t stow_pool_create(const stow_config_t *config, const stow_backend_t *backend,
                               stow_pool_t **out)
{
    return stow_pool_create_tuned(config, NULL, backend, out);
}

stow_status_t stow_pool_create_tuned(const stow_config_t *config, const stow_tuning_t *tuning,
                                     const stow_backend_t *backend, stow_pool_t **out)
{
    if (!out || !backend_valid(backend))
        return STOW_EINVAL;
    stow_config_t cfg;
    if (config)
        cfg = *config;
    else
        stow_config_default(&cfg);
    stow_tuning_t tun;
    if (tuning)
        tun = *tuning;
    else
        stow_tuning_default(&tun);
    if (stow__config_validate(&cfg, NULL, 0) != STOW_OK ||
        stow__tuning_validate(&tun, NULL, 0) != STOW_OK)
        return STOW_EINVAL;
    if (cfg.scrub_on_free && !backend->scrub)
        return STOW_ENOSYS;
    if (cfg.policy == STOW_POLICY_AUTO)
        cfg.policy = backend_maps_pages(backend) ? STOW_POLICY_VMM : STOW_POLICY_CLASSIC;
    if (cfg.policy == STOW_POLICY_VMM && !backend_maps_pages(backend))
        return STOW_ENOSYS;
    size_t free_bytes = 0, total_bytes = 0;
    stow_status_t st = backend->mem_info(backend->ctx, &free_bytes, &total_bytes);
    if (st != STOW_OK)
        return st == STOW_ENODEV ? st : STOW_EBACKEND;

    /* A fraction that leaves less than one granule makes a pool that can never
     * allocate: refuse it now, clearly, rather than fail every allocation. */
    if (limit_for(cfg.memory_fraction, total_bytes) < backend->granularity_bytes)
        return STOW_EINVAL;
    stow_pool_t *pool = calloc(1, sizeof *pool);
    if (!pool)
        return STOW_EHOSTMEM;
    pool->config = cfg;
    pool->tuning = tun;
    pool->backend = backend;
    pool->granularity_bytes = backend->granularity_bytes;
    pool->granularity_shift = (unsigned)__builtin_ctzll(backend->granularity_bytes);
    pool->has_events = backend->event_record && backend->event_query && backend->event_destroy;
    /* A version-1 backend's struct ends before event_synchronize. */
    pool->event_synchronize = pool->has_events && backend->abi_version >= 2
                                  ? backend->event_synchronize
                                  : NULL;
    pool->vmm = cfg.policy == STOW_POLICY_VMM;
    pool->learn_step = pool->vmm && tun.vmm_learn_step;
    stow__vmm_adapt_init(&pool->adapt, &tun);
    stow__vmm_epochs_init(&pool->epochs);
    pool->vmm_small_bytes = pool->vmm ? (size_t)tun.vmm_small_kb << 10 : 0;
    pool->small_kind_max_bytes = pool->vmm ? pool->vmm_small_bytes : STOW_SMALL_REQUEST_BYTES;
    /* Quick lists need a small pool (a page-mapped pool's small range, when it
     * has one) and cannot hold blocks that must be scrubbed before reuse. In a
     * page-mapped pool a kept block holds its granules, so its lists are
     * shallower and it has no mid ring (docs/design.md, small range). */
    bool quick_pool = !cfg.scrub_on_free && (!pool->vmm || pool->vmm_small_bytes);
    unsigned depth_max = pool->vmm ? STOW_VMM_QUICK_DEPTH_MAX : STOW_QUICK_DEPTH_MAX;
    pool->quick_depth = quick_pool ? (tun.quick_depth < depth_max ? tun.quick_depth : depth_max) : 0;
    pool->quick_mid_slots = quick_pool && !pool->vmm ? tun.quick_mid_slots : 0;
    pool->quick_on = pool->quick_depth || pool->quick_mid_slots;
    pool->capacity_bytes = total_bytes;
    pool->limit_bytes = limit_for(cfg.memory_fraction, total_bytes);
    stow__acct_init(&pool->acct);
    pool->acct.s.num_backend_calls = 1; /* the mem_info above */
    pool->acct.s.max_split_size_bytes = cfg.max_split_size_bytes;
    pool->acct.s.capacity_bytes = total_bytes;
    pool->acct.s.limit_bytes = pool->limit_bytes;
    if (stow__ptr_map_init(&pool->live) != STOW_OK ||
        stow__stream_state_new(pool, NULL, &pool->any) != STOW_OK) {
        stow__ptr_map_destroy(&pool->live);
        free(pool);
        return STOW_EHOSTMEM;
    }
    pool->any->is_any = true;
    atomic_init(&pool->lock.state, 0);
    if ((cfg.record_events && stow_record_start(pool, cfg.record_events) != STOW_OK) ||
        ((cfg.planned_steps || tun.planned_auto) && !cfg.scrub_on_free &&
         stow__planned_create(pool) != STOW_OK)) {
        pool_free_memory(pool);
        return STOW_EHOSTMEM;
    }
    *out = pool;
    return STOW_OK;
}


stow_status_t stow_pool_destroy(stow_pool_t *pool)
{
    if (!pool)
        return STOW_OK;
    stow__lock(&pool->lock);
    if (pool->acct.s.allocation[STOW_POOL_ALL].current) {
        stow__unlock(&pool->lock);
        return STOW_EBUSY;
    }
    stow__segment_release_all(pool);
    stow__unlock(&pool->lock);
    pool_free_memory(pool);
    return STOW_OK;
}

void stow_pool_destroy_force(stow_pool_t *pool)
{
    if (!pool)
        return;
    stow__lock(&pool->lock);
    stow__segment_release_all(pool);
    stow__unlock(&pool->lock);
    pool_free_memory(pool);
}

/* ---- allocation ---- */

/* PyTorch's max_split_size rules: requests below it never take (and so never
 * strand) a block at or above it; requests above it accept only a block less
 * than max_non_split_rounding larger. Not for page-mapped pools: there a free
 * block is address space, which strands no memory, and the rule would keep
 * every request below the limit off the free end of the range, so that each
 * would take a range of its own. */
static bool block_acceptable(const stow_pool_t *pool, const stow_block_t *b, size_t rounded)
{
    const stow_config_t *c = &pool->config;
    if (STOW_LIKELY(c->max_split_size_bytes == SIZE_MAX) || pool->vmm)
        return true;
    if (rounded < c->max_split_size_bytes)
        return b->size_bytes < c->max_split_size_bytes;
    return b->size_bytes - rounded < c->max_non_split_rounding_bytes;
}

static stow_block_t *best_fit_in(stow_pool_t *pool, stow_stream_state_t *ss, unsigned slot,
                                 size_t rounded)
{
    stow_block_t *b = stow__free_index_best_fit(&ss->free[slot], rounded);
    if (ss != pool->any && pool->any->free[slot].block_count) {
        stow_block_t *a = stow__free_index_best_fit(&pool->any->free[slot], rounded);
        if (a && (!b || a->size_bytes < b->size_bytes ||
                  (a->size_bytes == b->size_bytes && a->addr < b->addr)))
            b = a;
    }
    return b;
}

/* Best fit over the stream's own free blocks and those every stream may use;
 * a large request takes a whole idle segment only when no split block fits. */
static stow_block_t *find_fit(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                              size_t rounded)
{
    /* PyTorch's order: the smallest block that fits, split or a wholly free
     * segment alike (docs/decisions.md, the classic fallback). */
    stow_block_t *b = best_fit_in(pool, ss, kind, rounded);
    return (b && block_acceptable(pool, b, rounded)) ? b : NULL;
}

static inline bool should_split(const stow_pool_t *pool, const stow_block_t *b, size_t rounded)
{
    size_t remaining = b->size_bytes - rounded;
    /* Page-mapped (every block lies in a range of granules; the pool's flag,
     * not the block's segment, says so: one load chain fewer on every
     * allocation there): a remainder is only address space, and keeping it
     * out of the block keeps granules it covers unmapped. */
    if (pool->vmm || b->pool_kind == STOW_POOL_SMALL)
        return remaining >= STOW_MIN_BLOCK_BYTES;
    /* A large-pool remainder of at most 1 MiB could only ever serve small
     * requests, which never come to the large pool: keep it in the block. */
    return b->size_bytes < pool->config.max_split_size_bytes &&
           remaining > STOW_SMALL_REQUEST_BYTES;
}

/* Cuts b at b->addr + offset_bytes: b keeps the lower part, the returned new
 * block (same segment, kind, state, owner) the rest. Neither is (re)indexed.
 * Uses a block record stow_pool_alloc reserved, so it cannot fail. */
static stow_block_t *cut_block(stow_pool_t *pool, stow_block_t *b, size_t offset_bytes)
{
    stow_block_t *upper = stow__block_new(&pool->blocks);
    stow_assert_internal(upper != NULL);
    upper->addr = b->addr + offset_bytes;
    upper->size_bytes = b->size_bytes - offset_bytes;
    upper->segment = b->segment;
    upper->pool_kind = b->pool_kind;
    upper->state = b->state;
    upper->owner = b->owner;
    upper->free_seq = b->free_seq;
    upper->prev = b;
    upper->next = b->next;
    if (b->next)
        b->next->prev = upper;
    b->next = upper;
    b->size_bytes = offset_bytes;
    return upper;
}

/* b (already out of the index) keeps `rounded` bytes; the rest is free. */
static void split_block(stow_pool_t *pool, stow_block_t *b, size_t rounded)
{
    stow_block_t *rem = cut_block(pool, b, rounded);
    rem->state = BLOCK_FREE;
    index_insert(pool, rem);
}

stow_block_t *stow__pool_split_free_at(stow_pool_t *pool, stow_block_t *b, size_t offset_bytes)
{
    stow_assert_internal(b->state == BLOCK_FREE && offset_bytes > 0 &&
                         offset_bytes < b->size_bytes);
    index_remove(pool, b);
    stow_block_t *upper = cut_block(pool, b, offset_bytes);
    index_insert(pool, b);
    index_insert(pool, upper);
    return upper;
}

/* Hands out b (FREE, in no index, cut to its final size, in the live map)
 * for a request; cannot fail. Inlined into both callers: a call's register
 * saves cost a fifth of it on the quick-list path. */
static inline __attribute__((always_inline)) void hand_out(stow_pool_t *pool, stow_block_t *b,
                                                           stow_stream_state_t *ss,
                                                           size_t requested, bool hit)
{
    stow_segment_t *seg = b->segment;
    if (seg->live_blocks++ == 0 && !seg->granules)
        pool->acct.idle_segment_bytes -= seg->size_bytes;
    b->state = BLOCK_ALLOCATED;
    b->owner = ss;
    b->requested_bytes = requested;
    b->size_class = (uint8_t)stow__size_class_of(requested);
    b->tag = stow__current_tag;
    stow__acct_alloc(&pool->acct, b->pool_kind, b->size_bytes, requested, b->size_class, hit);
    stow_tag_stats_t *t = &pool->tag_stats[b->tag];
    t->allocated_bytes += b->size_bytes;
    t->allocations++;
    if (t->allocated_bytes > t->allocated_bytes_peak)
        t->allocated_bytes_peak = t->allocated_bytes;
    stow__record(pool, STOW_REC_ALLOC, b->addr, requested, ss->index, b->tag);
}

/* Hands out free block b (indexed) for a request, cut to `rounded` bytes when
 * split (should_split); cannot fail. */
static void take_block(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *ss,
                       size_t rounded, size_t requested, bool hit, bool split)
{
    index_remove(pool, b);
    if (split)
        split_block(pool, b, rounded);
    stow__ptr_map_put(&pool->live, b->addr, b);
    hand_out(pool, b, ss, requested, hit);
}

/* No block in the index fits: merge what quick lists keep, clear other
 * streams' frees (with reuse_other_streams_on_miss), then grow. *cached: the
 * block came from cached memory (a cache hit in the books), not from the
 * backend. */
static stow_status_t alloc_slow(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                                size_t rounded, size_t requested, stow_block_t **out,
                                bool *cached)
{
    *cached = true;
    /* Before growing: blocks kept whole, merged, may fit. The mid rings go
     * first: at most a few blocks, and what most often stands in the way
     * (larger blocks); the quick lists, which the next small requests would
     * hit, stay as they are when that is enough. */
    if (stow__quick_flush_mid(pool) && (*out = find_fit(pool, ss, kind, rounded)) != NULL)
        return STOW_OK;
    if (pool->quick_blocks) {
        stow__quick_flush(pool);
        if ((*out = find_fit(pool, ss, kind, rounded)) != NULL)
            return STOW_OK;
    }
    /* Blocks freed on other streams, once their work completed, only with
     * reuse_other_streams_on_miss; otherwise the out-of-memory retry alone
     * hands them over. Taken on every miss, they go to the lists all streams
     * share, where best fit mixes one workload's blocks into the other's
     * (docs/decisions.md, reuse_other_streams_on_miss). */
    if (pool->tuning.reuse_other_streams_on_miss && pool->stream_count > 1 &&
        stow__stream_clear_others(pool, ss) && (*out = find_fit(pool, ss, kind, rounded)) != NULL)
        return STOW_OK;
    *cached = false;
    stow_status_t st = pool->vmm ? stow__vmm_grow(pool, ss, kind, rounded, out)
                                 : stow__segment_grow(pool, ss, kind, rounded, requested, out);
    if (st == STOW_ENOMEM && pool->vmm) {
        /* No virtual range for it (or more than the pool may ever hold):
         * segment_grow explains its own out-of-memory errors, vmm_grow not. */
        pool->acct.s.num_ooms++;
        stow__segment_explain_oom(pool, requested, rounded, false);
    }
    if (st != STOW_OK) {
        stow_size_class_stats_t *c = &pool->acct.s.size_class[stow__size_class_of(requested)];
        c->requests++;
        c->misses++;
    }
    return st;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Page-mapped pools: map physical granules under the chosen block. When the
 * device is full, synchronize, gather everything freed on every stream, and
 * try once more (the block may differ then). */
static stow_status_t vmm_back_or_retry(stow_pool_t *pool, stow_stream_state_t *ss,
                                       unsigned kind, size_t rounded, size_t requested,
                                       stow_block_t **b, bool *split)
{
    *split = should_split(pool, *b, rounded);
    stow_status_t st = stow__vmm_back(pool, *b, *split ? rounded : (*b)->size_bytes);
    if (st == STOW_OK)
        return st;
    /* The block stays free: merge it back with what placement may have carved
     * off it (free neighbours of the same owner); a block found on the retry
     * path was not moved, so it holds no extra granules. */
    index_remove(pool, *b);
    index_insert(pool, coalesce(pool, *b));
    pool->placed_extra = 0;
    if (st != STOW_ENOMEM)
        return st;
    uint64_t t0 = now_ns();
    pool->acct.s.num_alloc_retries++;
    stow__segment_release_cache_for_retry(pool);
    *b = find_fit(pool, ss, kind, rounded);
    st = *b ? STOW_OK : stow__vmm_grow(pool, ss, kind, rounded, b);
    if (st == STOW_OK) {
        *split = should_split(pool, *b, rounded);
        st = stow__vmm_back(pool, *b, *split ? rounded : (*b)->size_bytes);
    }
    pool->acct.s.retry_time_ns += now_ns() - t0;
    if (st == STOW_ENOMEM) {
        pool->acct.s.num_ooms++;
        stow__segment_explain_oom(pool, requested, rounded, true);
    }
    return st;
}

/* The pool kind a request is served from. Page-mapped pools: requests of at
 * most vmm_small_bytes go to a small range of their own, the rest share the
 * large one. Kept apart, the small blocks do not cut the large blocks' rooms,
 * so a training loop's large layout repeats from step to step, and they get
 * quick lists; shared, they would fill the partly used granules at the large
 * blocks' edges (docs/decisions.md, vmm_small_kb). */
static unsigned pool_kind_for(const stow_pool_t *pool, size_t rounded)
{
    return rounded <= pool->small_kind_max_bytes ? STOW_POOL_SMALL : STOW_POOL_LARGE;
}

/* Page-mapped small range: whether block b, best fit for `rounded` bytes,
 * lies inside one granule that a block holding granules already holds, so
 * that taking it maps nothing. */
static bool vmm_fits_held_granule(const stow_pool_t *pool, const stow_block_t *b, size_t rounded)
{
    const stow_segment_t *seg = b->segment;
    size_t first = stow__granule_of(pool, seg, b->addr);
    return first == stow__granule_of(pool, seg, b->addr + rounded - 1) &&
           seg->granules[first].edges != 0;
}

/* The layers of stow_pool_alloc below the pool (docs/design.md, the request
 * path). Each is inlined into it: the chain costs no call that the one body
 * did not make. */

/* Served a request with b: the loop learner logs it (vmm_step.h) and the
 * planned layer counts it (planned_serve.h). */
static inline __attribute__((always_inline)) void note_served(stow_pool_t *pool,
                                                              stow_stream_state_t *ss,
                                                              stow_block_t *b, size_t rounded)
{
    if (pool->learn_step)
        stow__vmm_step_note_alloc(&pool->step, pool, b, ss, rounded);
    if (STOW_UNLIKELY(pool->planned != NULL))
        stow__planned_pool_alloc(pool, ss, b->addr, rounded);
}

/* The quick lists (quick.h): a kept block of exactly `rounded` bytes on ss,
 * handed out; NULL if none. */
static inline __attribute__((always_inline)) stow_block_t *
take_quick(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded, size_t requested)
{
    /* A kept block is still in the live map and needs no new record. */
    stow_block_t *q = stow__quick_pop(pool, ss, rounded);
    if (q) {
        pool->acct.s.num_quick_hits++;
        /* Still in the live map. The free index and reserved memory are as
         * they were: neither the fragmentation peak (the largest free
         * block is the same, the free bytes fewer) nor the reserved peak
         * can have moved. */
        hand_out(pool, q, ss, requested, true);
        note_served(pool, ss, q, rounded);
    }
    return q;
}

/* The loop learner, then the fit: the free block a request of `rounded` bytes
 * takes on ss, or NULL (a miss). *planned: it is the learned step's planned
 * address (vmm_step.h), else the best fit (free_index.h through find_fit). */
static inline __attribute__((always_inline)) stow_block_t *
learned_or_fit(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind, size_t rounded,
               bool *planned)
{
    /* A loop's step learned (vmm_step.c): its planned address, when free. */
    stow_block_t *b = STOW_UNLIKELY(stow__vmm_step_active(&pool->step)) && kind == STOW_POOL_LARGE
                          ? stow__vmm_step_place(pool, ss, rounded)
                          : NULL;
    *planned = b != NULL;
    if (!*planned)
        b = find_fit(pool, ss, kind, rounded);
    if (pool->vmm && kind == STOW_POOL_SMALL && b && pool->quick_blocks &&
        !vmm_fits_held_granule(pool, b, rounded)) {
        /* Kept blocks hold granules: merge them before the small range maps
         * another, as a classic pool does before it grows. */
        stow__quick_flush(pool);
        b = find_fit(pool, ss, kind, rounded);
    }
    return b;
}

/* Growth and backing: a miss grows the pool (segment.h: a segment, or a
 * range's granules); a page-mapped pool moves a hit where fewer granules need
 * mapping (vmm_place.c) and backs the block (vmm.h). Then *b, cut to size, is
 * handed out. Errors as stow_pool_alloc's (nothing handed out). */
static inline __attribute__((always_inline)) stow_status_t
grow_back_and_take(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind, size_t rounded,
                   size_t requested, stow_block_t **b, bool planned)
{
    stow_status_t st;
    bool hit = *b != NULL, cached = hit;
    if (STOW_UNLIKELY(!hit)) {
        st = alloc_slow(pool, ss, kind, rounded, requested, b, &cached);
        if (st != STOW_OK)
            return st;
    }
    if (pool->vmm && hit && !planned)
        *b = stow__vmm_place(pool, ss, rounded, *b); /* where fewer granules need mapping */
    bool split = false; /* whether b is cut to `rounded`: vmm decides it where it backs b */
    if (pool->vmm &&
        (st = vmm_back_or_retry(pool, ss, kind, rounded, requested, b, &split)) != STOW_OK) {
        pool->placed_extra = 0;
        return st;
    }
    if (!pool->vmm)
        split = should_split(pool, *b, rounded);
    take_block(pool, *b, ss, rounded, requested, cached, split);
    if (pool->vmm) {
        (*b)->extra_granules = (uint32_t)pool->placed_extra;
        pool->extra_granules_live += pool->placed_extra;
        pool->placed_extra = 0;
    }
    return STOW_OK;
}

/* The books after a block left the cache: the fragmentation peak and, at a
 * new reserved peak, the waste breakdown. */
static inline __attribute__((always_inline)) void note_books(stow_pool_t *pool)
{
    uint64_t largest = stow__pool_largest_free(pool);
    stow__acct_note_fragmentation(&pool->acct, largest);
    if (STOW_UNLIKELY(pool->acct.reserved_peak_moved))
        stow__acct_note_waste_if_peak(&pool->acct, largest);
}

/* A request goes down the chain of layers, each tried when the one before
 * it has no block: the planned layer, the quick lists, the loop learner and
 * the fit, then growth and backing. */
stow_status_t stow_pool_alloc(stow_pool_t *pool, size_t size_bytes, stow_stream_t stream,
                              void **out)
{
    if (STOW_UNLIKELY(!pool || !out || size_bytes == 0))
        return STOW_EINVAL;
    size_t rounded;
    stow_status_t st = stow__round_size(&pool->config, size_bytes, &rounded);
    if (STOW_UNLIKELY(st != STOW_OK))
        return st;
    unsigned kind = pool_kind_for(pool, rounded);

    stow__lock(&pool->lock);
    pool->op_count++;
    if (STOW_UNLIKELY(pool->pending != NULL))
        stow__stream_process_pending(pool);
    stow_stream_state_t *ss = stow__stream_get(pool, stream);
    /* The planned step first (planned_serve.c): its slot, in O(1). */
    if (STOW_UNLIKELY(pool->planned != NULL) && STOW_LIKELY(ss != NULL) &&
        stow__planned_alloc(pool, ss, rounded, size_bytes, out)) {
        stow_assert_expensive(pool);
        stow__unlock(&pool->lock);
        return STOW_OK;
    }
    if (kind == STOW_POOL_SMALL && STOW_LIKELY(ss != NULL)) {
        stow_block_t *q = take_quick(pool, ss, rounded, size_bytes);
        if (q) {
            *out = (void *)q->addr;
            stow_assert_expensive(pool);
            stow__unlock(&pool->lock);
            return STOW_OK;
        }
    }
    /* Room in the live map and for block records first (at most three: a new
     * segment's, another on the retry path, a split remainder; or a placement
     * cut and a split remainder), so nothing can fail after the block is
     * taken: a page-mapped block is backed for exactly the size it has once
     * split. */
    if (STOW_UNLIKELY(!ss || stow__ptr_map_reserve_one(&pool->live) != STOW_OK ||
                      stow__block_reserve(&pool->blocks, 3) != STOW_OK)) {
        stow__unlock(&pool->lock);
        return STOW_EHOSTMEM;
    }
    bool planned;
    stow_block_t *b = learned_or_fit(pool, ss, kind, rounded, &planned);
    st = grow_back_and_take(pool, ss, kind, rounded, size_bytes, &b, planned);
    if (st != STOW_OK) {
        stow__unlock(&pool->lock);
        return st;
    }
    note_served(pool, ss, b, rounded);
    note_books(pool);
    *out = (void *)b->addr;
    stow_assert_expensive(pool);
    stow__unlock(&pool->lock);
    return STOW_OK;
}

/* The free block of the classic pool that holds [addr, addr + rounded) and
 * that ss may take (its own free lists' or those all streams share); NULL if
 * none. Walks the segments: a restore's path, not the allocation path. */
static stow_block_t *free_block_holding(stow_pool_t *pool, stow_stream_state_t *ss,
                                        uintptr_t addr, size_t rounded)
{
    for (stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (addr < seg->base || addr - seg->base >= seg->size_bytes)
            continue;
        for (stow_block_t *b = seg->first; b; b = b->next)
            if (addr >= b->addr && addr - b->addr < b->size_bytes)
                return b->state == BLOCK_FREE && (b->owner == ss || b->owner->is_any) &&
                               rounded <= b->size_bytes - (addr - b->addr)
                           ? b
                           : NULL;
        return NULL;
    }
    return NULL;
}

stow_status_t stow_pool_alloc_at(stow_pool_t *pool, void *addr, size_t size_bytes,
                                 stow_stream_t stream)
{
    if (!pool || !addr || size_bytes == 0 || ((uintptr_t)addr & (STOW_MIN_BLOCK_BYTES - 1)))
        return STOW_EINVAL;
    if (pool->vmm)
        return STOW_ENOSYS;
    size_t rounded;
    stow_status_t st = stow__round_size(&pool->config, size_bytes, &rounded);
    if (st != STOW_OK)
        return st;
    stow__lock(&pool->lock);
    pool->op_count++;
    if (pool->pending != NULL)
        stow__stream_process_pending(pool);
    stow_stream_state_t *ss = stow__stream_get(pool, stream);
    if (!ss || stow__ptr_map_reserve_one(&pool->live) != STOW_OK ||
        stow__block_reserve(&pool->blocks, 2) != STOW_OK) {
        stow__unlock(&pool->lock);
        return STOW_EHOSTMEM;
    }
    /* Blocks kept whole on quick lists and mid rings are free memory too. */
    stow__quick_flush(pool);
    stow_block_t *b = free_block_holding(pool, ss, (uintptr_t)addr, rounded);
    if (!b || b->pool_kind != pool_kind_for(pool, rounded)) {
        stow__unlock(&pool->lock);
        return STOW_ENOTOWNED;
    }
    if ((uintptr_t)addr > b->addr) {
        /* The bytes below stay free, in the same index. */
        index_remove(pool, b);
        stow_block_t *upper = cut_block(pool, b, (uintptr_t)addr - b->addr);
        index_insert(pool, b);
        index_insert(pool, upper);
        b = upper;
    }
    take_block(pool, b, ss, rounded, size_bytes, true, should_split(pool, b, rounded));
    if (STOW_UNLIKELY(pool->planned != NULL))
        stow__planned_pool_alloc(pool, ss, b->addr, rounded);
    stow__acct_note_fragmentation(&pool->acct, stow__pool_largest_free(pool));
    stow_assert_expensive(pool);
    stow__unlock(&pool->lock);
    return STOW_OK;
}

/* ---- the planned layer's arena (planned_serve.c) ---- */

stow_status_t stow__pool_take_arena(stow_pool_t *pool, stow_stream_state_t *ss, size_t bytes,
                                    stow_block_t **out)
{
    unsigned kind = pool_kind_for(pool, bytes);
    if (stow__block_reserve(&pool->blocks, 3) != STOW_OK)
        return STOW_EHOSTMEM;
    stow_block_t *b = find_fit(pool, ss, kind, bytes);
    bool cached = b != NULL;
    stow_status_t st = STOW_OK;
    if (!b && (st = alloc_slow(pool, ss, kind, bytes, bytes, &b, &cached)) != STOW_OK)
        return st;
    if (pool->vmm && cached)
        b = stow__vmm_place(pool, ss, bytes, b);
    bool split = false;
    if (pool->vmm &&
        (st = vmm_back_or_retry(pool, ss, kind, bytes, bytes, &b, &split)) != STOW_OK) {
        pool->placed_extra = 0;
        return st;
    }
    if (!pool->vmm)
        split = should_split(pool, b, bytes);
    index_remove(pool, b);
    if (split)
        split_block(pool, b, bytes);
    stow_segment_t *seg = b->segment;
    if (seg->live_blocks++ == 0 && !seg->granules)
        pool->acct.idle_segment_bytes -= seg->size_bytes;
    b->state = BLOCK_ARENA;
    b->owner = ss;
    b->requested_bytes = 0;
    if (pool->vmm) {
        b->extra_granules = (uint32_t)pool->placed_extra;
        pool->extra_granules_live += pool->placed_extra;
        pool->placed_extra = 0;
    }
    uint64_t largest = stow__pool_largest_free(pool);
    stow__acct_note_fragmentation(&pool->acct, largest);
    if (STOW_UNLIKELY(pool->acct.reserved_peak_moved))
        stow__acct_note_waste_if_peak(&pool->acct, largest);
    *out = b;
    return STOW_OK;
}

void stow__pool_release_arena(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner)
{
    stow_assert_internal(b->state == BLOCK_ARENA);
    stow__pool_make_free(pool, b, owner);
    stow__acct_note_fragmentation(&pool->acct, stow__pool_largest_free(pool));
}

void stow__pool_trim_for_plan(stow_pool_t *pool)
{
    stow__quick_flush(pool);
    if (!stow__segment_sync_for_release(pool))
        return;
    if (pool->vmm)
        stow__vmm_release_unused(pool);
    stow__segment_release_idle(pool, true, 0);
    stow__acct_note_fragmentation(&pool->acct, stow__pool_largest_free(pool));
}

bool stow__pool_dissolve_reserve(stow_pool_t *pool, size_t n)
{
    if (stow__block_reserve(&pool->blocks, 2 * n + 1) != STOW_OK)
        return false;
    while ((pool->live.count + n) * 4 > pool->live.capacity)
        if (stow__ptr_map_grow(&pool->live) != STOW_OK)
            return false;
    return true;
}

void stow__pool_dissolve_arena(stow_pool_t *pool, stow_block_t *b, const stow_arena_slot_t *slots,
                               size_t n, stow_stream_state_t *owner, uint64_t live_high_water)
{
    stow_assert_internal(b->state == BLOCK_ARENA && b->pool_kind == STOW_POOL_LARGE);
    stow_segment_t *seg = b->segment;
    uintptr_t base = b->addr;
    /* Every granule of a page-mapped arena is mapped: unused first, then the
     * slots take theirs back without a call. */
    if (seg->granules)
        stow__vmm_unback(pool, b);
    stow_block_t *rest = b; /* the part not cut yet, ARENA until the end */
    for (size_t i = 0; i < n; i++) {
        uintptr_t at = base + slots[i].offset;
        stow_assert_internal(rest && at >= rest->addr &&
                             at + slots[i].bytes <= rest->addr + rest->size_bytes);
        if (at > rest->addr) {
            stow_block_t *gap = rest;
            rest = cut_block(pool, gap, at - gap->addr);
            gap->state = BLOCK_FREE;
            stow__pool_make_free(pool, gap, owner);
        }
        stow_block_t *s = rest;
        rest = slots[i].bytes < s->size_bytes ? cut_block(pool, s, slots[i].bytes) : NULL;
        s->state = BLOCK_ALLOCATED;
        s->owner = slots[i].stream;
        s->requested_bytes = slots[i].requested_bytes;
        s->size_class = (uint8_t)stow__size_class_of(slots[i].requested_bytes);
        s->tag = slots[i].tag;
        s->uses = slots[i].uses;
        s->extra_granules = 0;
        /* As allocated now, for the learned step's log. */
        s->free_seq = stow__vmm_step_ops(&pool->step);
        stow__ptr_map_put(&pool->live, s->addr, s);
        seg->live_blocks++;
        if (seg->granules) {
            stow_status_t st = stow__vmm_back(pool, s, s->size_bytes);
            stow_assert(st == STOW_OK);
            (void)st;
        }
    }
    if (rest) {
        rest->state = BLOCK_FREE;
        stow__pool_make_free(pool, rest, owner);
    }
    stow__segment_block_left(pool, seg); /* the arena itself */
    if (seg->granules && pool->live_bytes_high_water > live_high_water)
        pool->live_bytes_high_water =
            live_high_water > pool->live_bytes ? live_high_water : pool->live_bytes;
    stow__acct_note_fragmentation(&pool->acct, stow__pool_largest_free(pool));
}

/* ---- free ---- */

stow_status_t stow_pool_free(stow_pool_t *pool, void *ptr)
{
    if (STOW_UNLIKELY(!pool || !ptr))
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    if (STOW_UNLIKELY(stow__planned_owns(pool, (uintptr_t)ptr))) {
        /* A slot of the planned arena (planned_serve.c): O(1). */
        stow_status_t pst = stow__planned_free(pool, (uintptr_t)ptr);
        if (pst == STOW_OK)
            stow__acct_note_fragmentation(&pool->acct, stow__pool_largest_free(pool));
        stow_assert_expensive(pool);
        stow__unlock(&pool->lock);
        return pst;
    }
    stow_ptr_slot_t *slot = stow__ptr_map_find(&pool->live, (uintptr_t)ptr);
    stow_block_t *b = slot ? slot->value : NULL;
    if (STOW_UNLIKELY(!b || b->state != BLOCK_ALLOCATED)) {
        pool->acct.s.num_invalid_frees++;
        stow__unlock(&pool->lock);
        return STOW_ENOTOWNED;
    }
    pool->op_count++;
    if (pool->learn_step)
        stow__vmm_step_note_free(&pool->step, pool, b);
    stow__acct_free(&pool->acct, b->pool_kind, b->size_bytes, b->requested_bytes, b->size_class);
    pool->tag_stats[b->tag].allocated_bytes -= b->size_bytes;
    pool->tag_stats[b->tag].allocations--;
    stow__record(pool, STOW_REC_FREE, b->addr, b->size_bytes, b->owner->index, b->tag);
    if (STOW_UNLIKELY(b->uses != NULL && pool->has_events)) {
        stow__stream_defer_free(pool, b);
    } else if (!pool->quick_on || !stow__quick_push(pool, b, b->owner)) {
        stow__ptr_map_remove_slot(&pool->live, slot);
        stow__pool_make_free(pool, b, b->owner);
    }
    if (STOW_UNLIKELY(pool->planned != NULL))
        stow__planned_pool_free(pool, (uintptr_t)ptr);
    stow__acct_note_fragmentation(&pool->acct, stow__pool_largest_free(pool));
    stow_assert_expensive(pool);
    stow__unlock(&pool->lock);
    return STOW_OK;
}

stow_status_t stow_record_stream(stow_pool_t *pool, void *ptr, stow_stream_t stream)
{
    if (!pool || !ptr)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    if (stow__planned_owns(pool, (uintptr_t)ptr)) {
        stow_status_t pst = stow__planned_record_stream(pool, (uintptr_t)ptr, stream);
        stow__unlock(&pool->lock);
        return pst;
    }
    stow_block_t *b = stow__ptr_map_get(&pool->live, (uintptr_t)ptr);
    stow_status_t st;
    if (!b || b->state != BLOCK_ALLOCATED)
        st = STOW_ENOTOWNED;
    else if (!pool->has_events || stream == b->owner->stream)
        st = STOW_OK; /* single-stream backend, or the allocation stream: nothing to order */
    else
        st = stow__stream_add_use(pool, b, stream);
    stow__unlock(&pool->lock);
    return st;
}

stow_status_t stow_empty_cache(stow_pool_t *pool)
{
    if (!pool)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    stow_status_t st = STOW_OK;
    /* First, so that the blocks merge under the streams they were freed on,
     * before those move to `any` together. */
    stow__quick_flush(pool);
    if (!stow__segment_sync_for_release(pool)) {
        st = STOW_EBACKEND; /* nothing unmapped: queued work may still use it */
    } else {
        if (pool->planned)
            stow__planned_release(pool); /* the arena, when no slot is busy */
        if (pool->vmm)
            stow__vmm_release_unused(pool);
    }
    if (pool->learn_step)
        stow__vmm_step_forget(pool);
    stow__segment_release_idle(pool, true, 0);
    stow__acct_note_fragmentation(&pool->acct, stow__pool_largest_free(pool));
    stow__unlock(&pool->lock);
    return st == STOW_OK ? STOW_OK : STOW_EBACKEND;
}

stow_status_t stow_pool_block_size(stow_pool_t *pool, const void *ptr, size_t *block_bytes,
                                   size_t *requested_bytes)
{
    if (!pool || !ptr)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    if (stow__planned_owns(pool, (uintptr_t)ptr)) {
        bool busy = stow__planned_block_size(pool, (uintptr_t)ptr, block_bytes, requested_bytes);
        stow__unlock(&pool->lock);
        return busy ? STOW_OK : STOW_ENOTOWNED;
    }
    stow_block_t *b = stow__ptr_map_get(&pool->live, (uintptr_t)ptr);
    stow_status_t st = (b && b->state == BLOCK_ALLOCATED) ? STOW_OK : STOW_ENOTOWNED;
    if (st == STOW_OK) {
        if (block_bytes)
            *block_bytes = b->size_bytes;
        if (requested_bytes)
            *requested_bytes = b->requested_bytes;
    }
    stow__unlock(&pool->lock);
    return st;
}

size_t stow_pool_oom_message(stow_pool_t *pool, char *buf, size_t buf_len)
{
    if (!pool)
        return 0;
    stow__lock(&pool->lock);
    size_t n = strlen(pool->oom_message);
    if (buf_len)
        snprintf(buf, buf_len, "%s", pool->oom_message);
    stow__unlock(&pool->lock);
    return n;
}

stow_status_t stow_pool_set_memory_fraction(stow_pool_t *pool, double fraction)
{
    if (!pool || !(fraction > 0.0 && fraction <= 1.0) ||
        limit_for(fraction, pool->capacity_bytes) < pool->granularity_bytes)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    pool->config.memory_fraction = fraction;
    pool->limit_bytes = limit_for(fraction, pool->capacity_bytes);
    pool->acct.s.limit_bytes = pool->limit_bytes;
    stow__unlock(&pool->lock);
    return STOW_OK;
}

void stow_pool_config(stow_pool_t *pool, stow_config_t *out)
{
    if (pool && out)
        *out = pool->config;
}

/* ---- accounting entry points ---- */

stow_status_t stow_pool_stats(stow_pool_t *pool, stow_stats_t *out)
{
    if (!pool || !out)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    stow__acct_snapshot(&pool->acct, stow__pool_largest_free(pool), out);
    stow__unlock(&pool->lock);
    return STOW_OK;
}

void stow_stats_reset_peak(stow_pool_t *pool)
{
    if (!pool)
        return;
    stow__lock(&pool->lock);
    stow__acct_reset_peak(&pool->acct, stow__pool_largest_free(pool));
    pool->acct.s.arena_peak_bytes = pool->planned ? stow__planned_live_bytes(pool) : 0;
    for (unsigned i = 0; i < STOW_TAG_MAX; i++)
        pool->tag_stats[i].allocated_bytes_peak = pool->tag_stats[i].allocated_bytes;
    stow__unlock(&pool->lock);
}

void stow_stats_reset_accumulated(stow_pool_t *pool)
{
    if (!pool)
        return;
    stow__lock(&pool->lock);
    stow__acct_reset_accumulated(&pool->acct);
    stow__unlock(&pool->lock);
}

stow_status_t stow_scope_push(stow_pool_t *pool, unsigned *depth_out)
{
    if (!pool)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    stow_status_t st = stow__acct_scope_push(&pool->acct, depth_out);
    stow__unlock(&pool->lock);
    return st;
}

stow_status_t stow_scope_pop(stow_pool_t *pool, stow_scope_result_t *out)
{
    if (!pool)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    stow_status_t st = stow__acct_scope_pop(&pool->acct, out);
    stow__unlock(&pool->lock);
    return st;
}

size_t stow_summary(stow_pool_t *pool, char *buf, size_t buf_len)
{
    stow_stats_t s;
    if (stow_pool_stats(pool, &s) != STOW_OK) {
        if (buf_len)
            buf[0] = '\0';
        return 0;
    }
    return stow_stats_summary(&s, buf, buf_len);
}

stow_status_t stow_pool_check(stow_pool_t *pool, char *why, size_t why_len)
{
    if (!pool)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    stow_status_t st = stow__pool_check_locked(pool, why, why_len);
    stow__unlock(&pool->lock);
    return st;
}
