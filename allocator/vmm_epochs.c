/*
 * allocator/vmm_epochs.c: stream safety of remaps (policy vmm; docs/design.md,
 * remaps without a synchronize).
 *
 * Unmapping is not stream-ordered: a granule may be unmapped only once no work
 * queued before its blocks were freed can still use it, on whatever stream
 * they lived. Rather than synchronize the device at every remap, the pool
 * counts unmap epochs. A granule that becomes unused is tagged with the epoch
 * in force (its run keeps the newest tag). An epoch is closed by recording one
 * event on each stream that freed a block since its own last closure: every
 * block that stops holding granules goes through stow__pool_make_free, which
 * counts it in its stream's free_seq, so a free_seq that moved since the
 * stream's closure (vmm_closed_seq) says so at no cost to the free itself.
 * Once the events of a closed epoch and of every epoch before it completed,
 * granules tagged with it are safe (unmap_safe_epoch); a synchronize makes
 * every granule unused so far safe at once. A remap waits only when the
 * oldest unused granule, the one it takes, is not yet known safe after
 * querying the closed epochs' events, and then on those events alone
 * (event_synchronize), closing the open epoch first when the granule is in
 * it; it synchronizes the device only when it cannot.
 *
 * Epochs are closed only while the pool remaps (for CLOSE_AFTER_REMAP_OPS
 * operations after a remap): every CLOSE_EVERY_FREES frees that leave
 * granules unused, at most STOW_VMM_CLOSURES epochs in flight (the oldest is
 * queried when the ring is full). So a steady state makes no backend call.
 * On a backend without events nothing is closed: every remap that needs a
 * granule not yet known safe synchronizes.
 *
 * Owns the unmap epochs (unmap_epoch, unmap_safe_epoch, the closure ring) and
 * their events; reads the oldest run's tag (pool->run_head, vmm.c) and never
 * moves a granule. Called with the pool lock held.
 */
#include "allocator/internal.h"

#define CLOSE_EVERY_FREES 8
#define CLOSE_AFTER_REMAP_OPS 8192

void stow__vmm_drop_closures(stow_pool_t *pool, bool free_arrays)
{
    for (unsigned i = 0; i < STOW_VMM_CLOSURES; i++) {
        stow_vmm_closure_t *c = &pool->closures[i];
        for (uint32_t j = 0; j < c->count; j++)
            stow__pool_destroy_event(pool, c->events[j]);
        c->count = 0;
        if (free_arrays) {
            free(c->events);
            c->events = NULL;
            c->capacity = 0;
        }
    }
    pool->closure_first = pool->closure_count = 0;
}

void stow__vmm_synchronized(stow_pool_t *pool)
{
    /* Every granule unused so far is safe; those freed from now on are not. */
    pool->unmap_safe_epoch = pool->unmap_epoch++;
    pool->pushes_since_closure = 0;
    stow__vmm_drop_closures(pool, false);
}

/* The oldest closed epoch, whose events all completed, leaves the ring: its
 * granules (and every earlier epoch's) are safe. */
static void retire_oldest_closure(stow_pool_t *pool)
{
    pool->unmap_safe_epoch = pool->closures[pool->closure_first].epoch;
    pool->closure_first = (pool->closure_first + 1) % STOW_VMM_CLOSURES;
    pool->closure_count--;
}

/* Queries the events of the oldest closed epochs, and retires those whose
 * events all completed (in order: an epoch is safe only after every earlier
 * one). A query that fails counts as not complete. */
static void retire_closures(stow_pool_t *pool)
{
    while (pool->closure_count) {
        stow_vmm_closure_t *c = &pool->closures[pool->closure_first];
        for (uint32_t j = 0; j < c->count;) {
            bool done = false;
            pool->acct.s.num_event_queries++;
            if (stow__backend_status(pool, pool->backend->event_query(pool->backend->ctx,
                                                                      c->events[j], &done)) !=
                    STOW_OK ||
                !done) {
                j++;
                continue;
            }
            stow__pool_destroy_event(pool, c->events[j]);
            c->events[j] = c->events[--c->count];
        }
        if (c->count)
            return;
        retire_oldest_closure(pool);
    }
}

/* Records one event on each stream that freed a block since its last
 * closure, and on `freeing`, whose free is being made (stow__pool_make_free
 * counts it in free_seq only after the block left its granules), and starts
 * the next epoch; nothing changes when an event cannot be recorded (the epoch
 * stays open, and a remap of its granules synchronizes). */
static __attribute__((noinline)) void close_epoch(stow_pool_t *pool,
                                                  const stow_stream_state_t *freeing)
{
    if (pool->closure_count == STOW_VMM_CLOSURES) {
        retire_closures(pool);
        if (pool->closure_count == STOW_VMM_CLOSURES)
            return;
    }
    /* (Blocks are freed under `any` only without events, where nothing is
     * closed; with events `any` only receives blocks already free.) */
    unsigned slot = (pool->closure_first + pool->closure_count) % STOW_VMM_CLOSURES;
    stow_vmm_closure_t *c = &pool->closures[slot];
    if (c->capacity < pool->stream_count) {
        stow_event_t *grown = realloc(c->events, pool->stream_count * sizeof *grown);
        if (!grown)
            return;
        c->events = grown;
        c->capacity = (uint32_t)pool->stream_count;
    }
    c->count = 0;
    for (size_t i = 0; i < pool->stream_count; i++) {
        stow_stream_state_t *ss = pool->streams[i];
        if (ss->free_seq == ss->vmm_closed_seq && ss != freeing)
            continue;
        pool->acct.s.num_event_records++;
        if (stow__backend_status(pool, pool->backend->event_record(pool->backend->ctx,
                                                                   ss->stream,
                                                                   &c->events[c->count])) !=
            STOW_OK) {
            while (c->count)
                stow__pool_destroy_event(pool, c->events[--c->count]);
            return;
        }
        c->count++;
    }
    for (size_t i = 0; i < pool->stream_count; i++)
        pool->streams[i]->vmm_closed_seq = pool->streams[i]->free_seq;
    c->epoch = pool->unmap_epoch++;
    pool->closure_count++;
    pool->pushes_since_closure = 0;
}

/* A free on `freeing` just left granules unused (tagged with the current
 * epoch): outside a remapping stretch, one comparison. */
void stow__vmm_note_unused_pushed(stow_pool_t *pool, const stow_stream_state_t *freeing)
{
    if (STOW_UNLIKELY(pool->op_count < pool->closing_until_op) &&
        ++pool->pushes_since_closure >= CLOSE_EVERY_FREES && pool->has_events)
        close_epoch(pool, freeing);
}

/* Whether the oldest unused granule, the next a remap takes, has no queued
 * work left on it. Tags never decrease along the run list, so when it has
 * some, every unused granule may. */
static bool oldest_unused_is_safe(stow_pool_t *pool)
{
    if (pool->run_head->unused_epoch <= pool->unmap_safe_epoch)
        return true;
    retire_closures(pool);
    return pool->run_head->unused_epoch <= pool->unmap_safe_epoch;
}

/* Waits on the events left in the oldest closed epoch (retire_closures
 * destroys those it saw complete) and retires it; false when a wait failed
 * (the epoch stays, holding the events not yet waited on). */
static bool wait_oldest_closure(stow_pool_t *pool)
{
    stow_vmm_closure_t *c = &pool->closures[pool->closure_first];
    while (c->count) {
        pool->acct.s.num_event_waits++;
        if (stow__backend_status(pool, pool->event_synchronize(pool->backend->ctx,
                                                               c->events[c->count - 1])) !=
            STOW_OK)
            return false;
        stow__pool_destroy_event(pool, c->events[--c->count]);
    }
    retire_oldest_closure(pool);
    return true;
}

/* Makes the oldest unused granule safe to unmap by waiting on events alone,
 * where the backend can (event_synchronize): a granule of the open epoch first
 * closes it (an event on each stream that freed since its last closure), then
 * the closed epochs' events are waited on, oldest first, up to the granule's.
 * Work queued after those events keeps running, on every stream, where a
 * synchronize would wait for all of it: on a GPU whose queue runs ahead of the
 * host, the remap does not drain the queue. False when it cannot (no such
 * method, an event that could not be recorded, a wait that failed): the caller
 * synchronizes. */
static bool wait_for_oldest_unused(stow_pool_t *pool)
{
    if (!pool->event_synchronize)
        return false;
    uint64_t epoch = pool->run_head->unused_epoch;
    if (epoch == pool->unmap_epoch) {
        if (pool->closure_count == STOW_VMM_CLOSURES && !wait_oldest_closure(pool))
            return false;
        close_epoch(pool, NULL);
        if (epoch == pool->unmap_epoch)
            return false;
    }
    while (epoch > pool->unmap_safe_epoch)
        if (!pool->closure_count || !wait_oldest_closure(pool))
            return false;
    return true;
}

bool stow__vmm_oldest_unused_ready(stow_pool_t *pool, bool synced)
{
    pool->closing_until_op = pool->op_count + CLOSE_AFTER_REMAP_OPS;
    return synced || oldest_unused_is_safe(pool) || wait_for_oldest_unused(pool);
}
