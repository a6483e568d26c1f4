/*
 * allocator/stream.c: stream-ordered reuse.
 *
 * A block freed on stream S goes back to S's free lists and is reusable by S
 * at once (S's later work is ordered after its earlier work). Another stream T
 * may reuse it only once S's work up to the free completed: after a device
 * synchronize (the out-of-memory retry, empty_cache:
 * stow__stream_clear_all_synchronized) or, with reuse_other_streams_on_miss,
 * when T misses: the pool then records one "clearance" event per other
 * stream, covering every block freed there so far, and moves those blocks to
 * the shared `any` lists once the event is seen complete. One event per
 * stream per miss, not per free: the common single-stream case records none.
 * Why that is not the default: docs/design.md, streams.
 *
 * stow_record_stream adds users: at free, one event is recorded on each user
 * stream and the block stays PENDING (off every free list) until all of them
 * completed (stow__stream_process_pending, run at the next allocation).
 */
#include "allocator/assert.h"
#include "allocator/free_index.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/stream.h"
#include "allocator/types.h"

#include <string.h>

stow_status_t stow__stream_state_new(stow_pool_t *pool, stow_stream_t stream,
                                     stow_stream_state_t **out)
{
    (void)pool;
    stow_stream_state_t *ss = calloc(1, sizeof *ss);
    if (!ss)
        return STOW_EHOSTMEM;
    ss->stream = stream;
    *out = ss;
    return STOW_OK;
}

stow_stream_state_t *stow__stream_get(stow_pool_t *pool, stow_stream_t stream)
{
    if (STOW_LIKELY(pool->last_stream && pool->last_stream->stream == stream))
        return pool->last_stream;
    if (!pool->has_events)
        return pool->any; /* one ordering for all: every stream shares the lists */
    for (size_t i = 0; i < pool->stream_count; i++)
        if (pool->streams[i]->stream == stream)
            return pool->last_stream = pool->streams[i];
    if (pool->stream_count == pool->stream_capacity) {
        size_t cap = pool->stream_capacity ? pool->stream_capacity * 2 : 4;
        stow_stream_state_t **grown = realloc(pool->streams, cap * sizeof *grown);
        if (!grown)
            return NULL;
        pool->streams = grown;
        pool->stream_capacity = cap;
    }
    stow_stream_state_t *ss;
    if (stow__stream_state_new(pool, stream, &ss) != STOW_OK)
        return NULL;
    pool->streams[pool->stream_count++] = ss;
    ss->index = (uint16_t)(pool->stream_count < UINT16_MAX ? pool->stream_count : UINT16_MAX);
    return pool->last_stream = ss;
}

void stow__stream_states_destroy(stow_pool_t *pool)
{
    for (size_t i = 0; i < pool->stream_count; i++) {
        if (pool->streams[i]->clear_event)
            stow__pool_destroy_event(pool, pool->streams[i]->clear_event);
        free(pool->streams[i]);
    }
    free(pool->streams);
    pool->streams = NULL;
    pool->stream_count = pool->stream_capacity = 0;
}

void stow__stream_drop_pending(stow_pool_t *pool)
{
    for (stow_block_t *b = pool->pending; b; b = b->right) {
        for (uint32_t i = 0; b->uses && i < b->uses->count; i++)
            if (b->uses->item[i].event)
                stow__pool_destroy_event(pool, b->uses->item[i].event);
        free(b->uses);
        b->uses = NULL;
    }
    pool->pending = NULL;
}

/* Re-homes a FREE, indexed block under `any`, merging with free neighbours there. */
static void move_to_any(stow_pool_t *pool, stow_block_t *b)
{
    stow__pool_index_remove(pool, b);
    stow__pool_make_free(pool, b, pool->any);
}

/* Moves the blocks of ss freed at or before upto_seq (all when upto_seq is
 * UINT64_MAX). */
static void move_cleared(stow_pool_t *pool, stow_stream_state_t *ss, uint64_t upto_seq)
{
    for (unsigned k = STOW_POOL_SMALL; k <= STOW_POOL_LARGE; k++) {
        stow_free_index_t *idx = &ss->free[k];
        if (!idx->block_count)
            continue;
        stow_block_t **blocks = malloc(idx->block_count * sizeof *blocks);
        if (!blocks)
            continue; /* retried at the next miss */
        size_t n = stow__free_index_collect(idx, blocks);
        for (size_t i = 0; i < n; i++)
            if (blocks[i]->free_seq <= upto_seq)
                move_to_any(pool, blocks[i]);
        free(blocks);
    }
}

bool stow__stream_clear_others(stow_pool_t *pool, stow_stream_state_t *except)
{
    bool moved = false;
    for (size_t i = 0; i < pool->stream_count; i++) {
        stow_stream_state_t *ss = pool->streams[i];
        if (ss == except || !(ss->free[STOW_POOL_SMALL].block_count |
                              ss->free[STOW_POOL_LARGE].block_count))
            continue;
        if (!ss->clear_event) {
            stow_event_t ev;
            pool->acct.s.num_event_records++;
            if (stow__backend_status(pool, pool->backend->event_record(pool->backend->ctx,
                                                                       ss->stream, &ev)) !=
                STOW_OK)
                continue;
            ss->clear_event = ev;
            ss->clear_upto_seq = ss->free_seq;
        }
        bool done = false;
        pool->acct.s.num_event_queries++;
        if (stow__backend_status(pool, pool->backend->event_query(pool->backend->ctx,
                                                                  ss->clear_event, &done)) !=
                STOW_OK ||
            !done)
            continue;
        stow__pool_destroy_event(pool, ss->clear_event);
        ss->clear_event = NULL;
        move_cleared(pool, ss, ss->clear_upto_seq);
        moved = true;
    }
    return moved;
}

void stow__stream_clear_all_synchronized(stow_pool_t *pool)
{
    for (size_t i = 0; i < pool->stream_count; i++) {
        stow_stream_state_t *ss = pool->streams[i];
        if (ss->clear_event) {
            stow__pool_destroy_event(pool, ss->clear_event);
            ss->clear_event = NULL;
        }
        move_cleared(pool, ss, UINT64_MAX);
    }
    /* Every pending block's streams have finished too, including blocks that
     * could not record an event. */
    for (stow_block_t *b = pool->pending; b; b = b->right) {
        for (uint32_t i = 0; i < b->uses->count; i++)
            if (b->uses->item[i].event) {
                stow__pool_destroy_event(pool, b->uses->item[i].event);
                b->uses->item[i].event = NULL;
            }
        b->uses->events_outstanding = 0;
    }
    stow__stream_process_pending(pool);
}

stow_status_t stow__stream_add_use(stow_pool_t *pool, stow_block_t *b, stow_stream_t stream)
{
    (void)pool;
    stow_stream_uses_t *u = b->uses;
    for (uint32_t i = 0; u && i < u->count; i++)
        if (u->item[i].stream == stream)
            return STOW_OK;
    if (!u || u->count == u->capacity) {
        uint32_t cap = u ? u->capacity * 2 : 2;
        stow_stream_uses_t *grown =
            realloc(u, sizeof *u + cap * sizeof u->item[0]);
        if (!grown)
            return STOW_EHOSTMEM;
        if (!u)
            grown->count = grown->events_outstanding = 0;
        grown->capacity = cap;
        b->uses = u = grown;
    }
    u->item[u->count].stream = stream;
    u->item[u->count].event = NULL;
    u->count++;
    return STOW_OK;
}

static void pending_link(stow_pool_t *pool, stow_block_t *b)
{
    b->left = NULL;
    b->right = pool->pending;
    if (pool->pending)
        pool->pending->left = b;
    pool->pending = b;
}

void stow__stream_park_unscrubbed(stow_pool_t *pool, stow_block_t *b)
{
    /* Back in the live map (a second free of it is refused, as for any
     * PENDING block); the slot its removal just gave back is there. */
    stow__ptr_map_put(&pool->live, b->addr, b);
    b->state = BLOCK_PENDING;
    stow__acct_pending(&pool->acct, b->pool_kind, b->size_bytes, true);
    b->uses = calloc(1, sizeof *b->uses);
    if (!b->uses)
        return; /* no room to list it: it stays PENDING until the pool is destroyed */
    b->uses->events_outstanding = 1; /* what it waits for: a synchronize */
    pending_link(pool, b);
}

stow_status_t stow__stream_defer_free(stow_pool_t *pool, stow_block_t *b)
{
    stow_stream_uses_t *u = b->uses;
    bool need_sync = false;
    for (uint32_t i = 0; i < u->count; i++) {
        pool->acct.s.num_event_records++;
        stow_status_t st = stow__backend_status(
            pool, pool->backend->event_record(pool->backend->ctx, u->item[i].stream,
                                              &u->item[i].event));
        if (st == STOW_OK)
            u->events_outstanding++;
        else {
            u->item[i].event = NULL;
            need_sync = true;
        }
    }
    if (need_sync) {
        /* No event to wait for: only a full synchronize orders the reuse. */
        if (!stow__pool_synchronize(pool)) {
            /* Keep the block out of reach for good rather than risk a race;
             * empty_cache or destroy (which synchronize) recover it. */
            u->events_outstanding++;
        }
    }
    b->state = BLOCK_PENDING;
    stow__acct_pending(&pool->acct, b->pool_kind, b->size_bytes, true);
    pending_link(pool, b);
    if (u->events_outstanding == 0)
        stow__stream_process_pending(pool);
    return STOW_OK;
}

static void pending_unlink(stow_pool_t *pool, stow_block_t *b)
{
    if (b->left)
        b->left->right = b->right;
    else
        pool->pending = b->right;
    if (b->right)
        b->right->left = b->left;
    b->left = b->right = NULL;
}

void stow__stream_process_pending(stow_pool_t *pool)
{
    for (stow_block_t *b = pool->pending, *next; b; b = next) {
        next = b->right;
        stow_stream_uses_t *u = b->uses;
        for (uint32_t i = 0; i < u->count; i++) {
            if (!u->item[i].event)
                continue;
            bool done = false;
            pool->acct.s.num_event_queries++;
            if (stow__backend_status(pool, pool->backend->event_query(pool->backend->ctx,
                                                                      u->item[i].event, &done)) ==
                    STOW_OK &&
                done) {
                stow__pool_destroy_event(pool, u->item[i].event);
                u->item[i].event = NULL;
                u->events_outstanding--;
            }
        }
        if (u->events_outstanding)
            continue;
        pending_unlink(pool, b);
        stow__acct_pending(&pool->acct, b->pool_kind, b->size_bytes, false);
        free(b->uses);
        b->uses = NULL;
        stow__ptr_map_remove(&pool->live, b->addr);
        stow__pool_make_free(pool, b, b->owner);
    }
}
