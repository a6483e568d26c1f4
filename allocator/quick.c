/*
 * allocator/quick.c: quick lists, small blocks kept whole between a free and
 * the next request of their size (docs/design.md, quick lists).
 *
 * Why: in inference most events are small requests freed and requested again
 * at the same size. Freed the normal way, such a block merges with its free
 * neighbours and the next request splits it off again. A quick list keeps it
 * as it is (in the live map, state QUICK), and the next request of that size
 * on that stream takes it back in a few pointer writes, as jemalloc's thread
 * cache and dlmalloc's fast bins do.
 *
 * Invariants: a QUICK block is a small-pool block on exactly one list (blocks
 * of at most STOW_QUICK_MAX_BYTES, at most quick_depth per size and stream)
 * or one mid-ring slot (larger small-pool blocks, the last quick_mid_slots
 * freed on the stream, whatever their sizes). Every kept block is flushed
 * (freed the normal way) before the pool takes memory from the device, and
 * before empty_cache and an out-of-memory retry: the pool never grows or
 * fails while a kept block could have served the request once merged. The
 * mid rings are flushed first, the lists only if that was not enough.
 *
 * Scope: the small pool of classic pools and the small range of page-mapped
 * ones, whose blocks are cut to exactly their rounded size. There a kept block
 * stays mapped, lists are at most STOW_VMM_QUICK_DEPTH_MAX deep, there is no
 * mid ring, and the lists are also flushed before the small range maps a
 * granule (pool.c). Not with scrub_on_free, nor for blocks with record_stream
 * users. A block freed on stream S is reused only on S, or by every stream
 * when the backend has no events.
 *
 * Accounting: a QUICK block is cached, not allocated or active; it counts in
 * inactive_split like a free block that does not cover its segment, and the
 * largest free block does not see it until it is flushed.
 */
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/quick.h"
#include "allocator/types.h"
#include "allocator/vmm.h"

static size_t quick_slot(size_t size_bytes) { return size_bytes / STOW_MIN_BLOCK_BYTES - 1; }

/* b, just off one of o's lists or ring slots, stops being QUICK: FREE, out
 * of the quick counts and of the split books (it is in no index yet). */
static inline __attribute__((always_inline)) stow_block_t *unquick(stow_pool_t *pool,
                                                                    stow_stream_state_t *o,
                                                                    stow_block_t *b)
{
    o->quick_blocks--;
    pool->quick_blocks--;
    b->right = NULL;
    b->state = BLOCK_FREE;
    stow__pool_count_split(pool, b, false);
    return b;
}

/* Frees a block just taken off a list or ring the normal way: out of the live
 * map, merged and indexed. */
static void flush_block(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *o)
{
    (void)stow__ptr_map_remove(&pool->live, b->addr);
    /* A page-mapped pool's kept block still holds its granules. */
    if (b->segment->granules)
        stow__vmm_unback(pool, b);
    /* Already not live (push dropped live_blocks): make_free only merges and
     * indexes a FREE block. */
    stow__pool_make_free(pool, b, o);
}

/* Ring slot j's block, taken out (the slot must hold one). */
static stow_block_t *mid_take_slot(stow_pool_t *pool, stow_stream_state_t *o, unsigned j)
{
    stow_block_t *b = o->mid[j];
    o->mid[j] = NULL;
    o->mid_size[j] = 0;
    return unquick(pool, o, b);
}

/* Keeps b (QUICK, still in the live map) in o's mid ring; the block it
 * replaces, the oldest, is freed the normal way. */
static void mid_push(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *o)
{
    unsigned j = o->mid_next;
    o->mid_next = j + 1 < pool->quick_mid_slots ? j + 1 : 0;
    if (o->mid[j])
        flush_block(pool, mid_take_slot(pool, o, j), o);
    o->mid[j] = b;
    o->mid_size[j] = b->size_bytes;
}

bool stow__quick_push(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner)
{
    if (b->pool_kind != STOW_POOL_SMALL)
        return false;
    stow_stream_state_t *o = pool->has_events ? owner : pool->any;
    bool mid = b->size_bytes > STOW_QUICK_MAX_BYTES;
    size_t i = mid ? 0 : quick_slot(b->size_bytes);
    if (mid ? !pool->quick_mid_slots : o->quick_count[i] >= pool->quick_depth)
        return false;
    stow__segment_block_left(pool, b->segment);
    b->state = BLOCK_QUICK;
    b->owner = o;
    o->quick_blocks++;
    pool->quick_blocks++;
    stow__pool_count_split(pool, b, true);
    if (mid) {
        b->right = NULL;
        mid_push(pool, b, o);
    } else {
        b->right = o->quick[i];
        o->quick[i] = b;
        o->quick_count[i]++;
    }
    return true;
}

static inline __attribute__((always_inline)) stow_block_t *take_from(stow_pool_t *pool,
                                                                      stow_stream_state_t *o,
                                                                      size_t i)
{
    stow_block_t *b = o->quick[i];
    o->quick[i] = b->right;
    o->quick_count[i]--;
    return unquick(pool, o, b);
}

/* The newest block of exactly `rounded` bytes in o's mid ring, taken out. */
static stow_block_t *mid_take(stow_pool_t *pool, stow_stream_state_t *o, size_t rounded)
{
    unsigned slots = pool->quick_mid_slots, j = o->mid_next;
    for (unsigned n = 0; n < slots; n++) {
        j = j ? j - 1 : slots - 1;
        if (o->mid_size[j] == rounded)
            return mid_take_slot(pool, o, j);
    }
    return NULL;
}

static stow_block_t *mid_pop(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded)
{
    stow_block_t *b = ss->quick_blocks ? mid_take(pool, ss, rounded) : NULL;
    if (!b && ss != pool->any && pool->any->quick_blocks)
        b = mid_take(pool, pool->any, rounded);
    return b;
}

stow_block_t *stow__quick_pop(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded)
{
    if (!pool->quick_blocks)
        return NULL;
    if (rounded > STOW_QUICK_MAX_BYTES)
        return mid_pop(pool, ss, rounded);
    size_t i = quick_slot(rounded);
    if (ss->quick[i])
        return take_from(pool, ss, i);
    if (ss != pool->any && pool->any->quick[i])
        return take_from(pool, pool->any, i);
    return NULL;
}

/* Slot by slot, and for each size the newest block first (the order in
 * which blocks merge decides which equal-sized block best fit finds first). */
static size_t flush_mid_state(stow_pool_t *pool, stow_stream_state_t *o)
{
    size_t flushed = 0;
    for (unsigned j = 0; o->quick_blocks && j < pool->quick_mid_slots; j++)
        for (; o->mid_size[j]; flushed++)
            flush_block(pool, mid_take(pool, o, o->mid_size[j]), o);
    return flushed;
}

static void flush_state(stow_pool_t *pool, stow_stream_state_t *o)
{
    for (size_t i = 0; o->quick_blocks && i < STOW_QUICK_LISTS; i++)
        while (o->quick[i])
            flush_block(pool, take_from(pool, o, i), o);
    (void)flush_mid_state(pool, o);
}

bool stow__quick_flush_mid(stow_pool_t *pool)
{
    if (!pool->quick_blocks || !pool->quick_mid_slots)
        return false;
    size_t flushed = flush_mid_state(pool, pool->any);
    for (size_t i = 0; i < pool->stream_count; i++)
        flushed += flush_mid_state(pool, pool->streams[i]);
    if (flushed)
        pool->acct.s.num_quick_flushes++;
    return flushed != 0;
}

void stow__quick_flush(stow_pool_t *pool)
{
    if (!pool->quick_blocks)
        return;
    pool->acct.s.num_quick_flushes++;
    flush_state(pool, pool->any);
    for (size_t i = 0; i < pool->stream_count; i++)
        flush_state(pool, pool->streams[i]);
}
