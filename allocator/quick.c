/*
 * allocator/quick.c: quick lists, small blocks kept whole between a free and
 * the next request of their size (docs/design.md, quick lists).
 *
 * Why: on the real traces most events are small requests whose blocks are
 * freed and requested again at the same size, over and over (an inference
 * loop: 92% of gpt2_generate's 395,180 events are requests of at most 1 MiB).
 * Freeing such a block the normal way merges it with its free neighbours, and
 * the next request of the same size splits it off again: two index removals,
 * an insertion, a block record deleted and one made, a live map deletion and
 * insertion, for the same bytes at the same address. A quick list keeps the
 * block as it is instead (in the live map, state QUICK), and the next request
 * of that size on that stream takes it back in a few pointer writes.
 * jemalloc's thread cache and dlmalloc's fast bins do the same for the same
 * reason.
 *
 * What it costs: a QUICK block is cached memory that is not merged with its
 * neighbours, so a request of another size cannot use it. Hence the lists
 * hold at most quick_depth blocks per size and stream
 * (STOW_QUICK_DEPTH_DEFAULT by default, 0 = off), only blocks of at most
 * STOW_QUICK_MAX_BYTES (types.h says why), and are flushed (every block freed
 * the normal way) before the pool would take more memory from the device, and
 * before empty_cache and an out-of-memory retry release memory: the pool never
 * grows, and never reports out of memory, while a QUICK block could have
 * served the request once merged.
 *
 * Scope: the small pool of classic pools only (its blocks are always cut to
 * exactly their rounded size, so a list per size is an exact fit); not with
 * scrub_on_free (a freed block must be scrubbed before reuse) and not for
 * blocks with record_stream users (they wait for events: PENDING). Stream
 * safety is the free index's: a block freed on stream S is reused only on S,
 * or by every stream when the backend has no events (owner `any`).
 *
 * Accounting: a QUICK block is cached, not allocated or active; it counts in
 * inactive_split like a free block that does not cover its segment. It is in
 * no free index, so the largest free block (and the fragmentation figure)
 * does not see it until it is flushed.
 */
#include "allocator/internal.h"

static size_t quick_slot(size_t size_bytes) { return size_bytes / STOW_MIN_BLOCK_BYTES - 1; }

bool stow__quick_push(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner)
{
    if (b->pool_kind != STOW_POOL_SMALL || b->size_bytes > STOW_QUICK_MAX_BYTES)
        return false;
    stow_stream_state_t *o = pool->has_events ? owner : pool->any;
    size_t i = quick_slot(b->size_bytes);
    if (o->quick_count[i] >= pool->quick_depth)
        return false;
    stow__segment_block_left(pool, b->segment);
    b->state = BLOCK_QUICK;
    b->owner = o;
    b->right = o->quick[i];
    o->quick[i] = b;
    o->quick_count[i]++;
    o->quick_blocks++;
    pool->quick_blocks++;
    stow__pool_count_split(pool, b, true);
    return true;
}

static inline __attribute__((always_inline)) stow_block_t *take_from(stow_pool_t *pool,
                                                                      stow_stream_state_t *o,
                                                                      size_t i)
{
    stow_block_t *b = o->quick[i];
    o->quick[i] = b->right;
    o->quick_count[i]--;
    o->quick_blocks--;
    pool->quick_blocks--;
    b->right = NULL;
    b->state = BLOCK_FREE;
    stow__pool_count_split(pool, b, false);
    return b;
}

stow_block_t *stow__quick_pop(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded)
{
    if (!pool->quick_blocks || rounded > STOW_QUICK_MAX_BYTES)
        return NULL;
    size_t i = quick_slot(rounded);
    if (ss->quick[i])
        return take_from(pool, ss, i);
    if (ss != pool->any && pool->any->quick[i])
        return take_from(pool, pool->any, i);
    return NULL;
}

static void flush_state(stow_pool_t *pool, stow_stream_state_t *o)
{
    for (size_t i = 0; o->quick_blocks && i < STOW_QUICK_LISTS; i++)
        while (o->quick[i]) {
            stow_block_t *b = take_from(pool, o, i);
            (void)stow__ptr_map_remove(&pool->live, b->addr);
            /* Already not live (push dropped live_blocks): make_free only
             * merges and indexes a FREE block. */
            stow__pool_make_free(pool, b, o);
        }
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
