/*
 * allocator/vmm_epochs.c: stream safety of remaps (policy vmm; docs/design.md,
 * remaps without a synchronize).
 *
 * Unmapping is not stream-ordered: a granule may be unmapped only once no work
 * queued before its blocks were freed can still use it, on whatever stream
 * they lived. Rather than synchronize the device at every remap, the pool
 * counts unmap epochs: a granule that becomes unused is tagged with the epoch
 * in force (its run keeps the newest tag). An epoch is closed by recording
 * one event on each stream that freed a block since its own last closure:
 * every block that stops holding granules (freed, flushed from a quick list,
 * completed after record_stream) goes through stow__pool_make_free, which
 * counts it in its stream's free_seq, so a free_seq that moved since the
 * stream's closure (vmm_closed_seq) says so at no cost to the free itself.
 * Once the events of a closed epoch and of every epoch before it completed,
 * granules tagged with it are safe (unmap_safe_epoch). A synchronize makes
 * every granule unused so far safe at once. A remap then waits only when the
 * granules it unmaps (the oldest idle mapping's: the oldest runs were freed
 * longest ago) are not yet known safe after querying the closed epochs'
 * events, and then, on a backend that can (event_synchronize), on those
 * events alone, closing the open epoch first when they are in it; it
 * synchronizes the device only without one.
 *
 * Epochs are closed only while the pool remaps (for CLOSE_AFTER_REMAP_OPS
 * operations after a remap, or until the learned step says the loop holds:
 * vmm_step.c): every CLOSE_EVERY_FREES frees that leave
 * granules unused, at most STOW_VMM_CLOSURES epochs in flight (the oldest is
 * queried when the ring is full). So a steady state makes no backend call.
 * On a backend without events nothing is closed: every remap that needs a
 * granule not yet known safe synchronizes.
 *
 * Owns the unmap epochs (pool->epochs, vmm_epochs.h: the open and the safe
 * epoch, the closure ring) and their events; is told the tag of the granules
 * a remap unmaps (vmm.c) and never moves a granule. Called with the pool lock
 * held.
 */
#include "allocator/assert.h"
#include "allocator/pool.h"
#include "allocator/types.h"
#include "allocator/vmm_epochs.h"

#define CLOSE_EVERY_FREES 8
#define CLOSE_AFTER_REMAP_OPS 8192

void stow__vmm_drop_closures(stow_pool_t *pool, bool free_arrays)
{
    for (unsigned i = 0; i < STOW_VMM_CLOSURES; i++) {
        stow_vmm_closure_t *c = &pool->epochs.closures[i];
        for (uint32_t j = 0; j < c->count; j++)
            stow__pool_destroy_event(pool, c->events[j]);
        c->count = 0;
        if (free_arrays) {
            free(c->events);
            c->events = NULL;
            c->capacity = 0;
        }
    }
    pool->epochs.closure_first = pool->epochs.closure_count = 0;
}

void stow__vmm_synchronized(stow_pool_t *pool)
{
    /* Every granule unused so far is safe; those freed from now on are not. */
    pool->epochs.unmap_safe_epoch = pool->epochs.unmap_epoch++;
    pool->epochs.pushes_since_closure = 0;
    stow__vmm_drop_closures(pool, false);
}

/* The oldest closed epoch, whose events all completed, leaves the ring: its
 * granules (and every earlier epoch's) are safe. */
static void retire_oldest_closure(stow_pool_t *pool)
{
    pool->epochs.unmap_safe_epoch = pool->epochs.closures[pool->epochs.closure_first].epoch;
    pool->epochs.closure_first = (pool->epochs.closure_first + 1) % STOW_VMM_CLOSURES;
    pool->epochs.closure_count--;
}

/* Queries the events of the oldest closed epochs, and retires those whose
 * events all completed (in order: an epoch is safe only after every earlier
 * one). A query that fails counts as not complete. */
static void retire_closures(stow_pool_t *pool)
{
    while (pool->epochs.closure_count) {
        stow_vmm_closure_t *c = &pool->epochs.closures[pool->epochs.closure_first];
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
    if (pool->epochs.closure_count == STOW_VMM_CLOSURES) {
        retire_closures(pool);
        if (pool->epochs.closure_count == STOW_VMM_CLOSURES)
            return;
    }
    /* (Blocks are freed under `any` only without events, where nothing is
     * closed; with events `any` only receives blocks already free.) */
    unsigned slot = (pool->epochs.closure_first + pool->epochs.closure_count) % STOW_VMM_CLOSURES;
    stow_vmm_closure_t *c = &pool->epochs.closures[slot];
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
    c->epoch = pool->epochs.unmap_epoch++;
    pool->epochs.closure_count++;
    pool->epochs.pushes_since_closure = 0;
}

/* A free on `freeing` just left granules unused (tagged with the current
 * epoch): outside a remapping stretch, one comparison. */
void stow__vmm_note_unused_pushed(stow_pool_t *pool, const stow_stream_state_t *freeing)
{
    if (STOW_UNLIKELY(pool->op_count < pool->epochs.closing_until_op) &&
        ++pool->epochs.pushes_since_closure >= CLOSE_EVERY_FREES && pool->has_events)
        close_epoch(pool, freeing);
}

/* Whether granules tagged with `epoch` have no queued work left on them. */
static bool epoch_is_safe(stow_pool_t *pool, uint64_t epoch)
{
    if (epoch <= pool->epochs.unmap_safe_epoch)
        return true;
    retire_closures(pool);
    return epoch <= pool->epochs.unmap_safe_epoch;
}

/* Waits on the events left in the oldest closed epoch (retire_closures
 * destroys those it saw complete) and retires it; false when a wait failed
 * (the epoch stays, holding the events not yet waited on). */
static bool wait_oldest_closure(stow_pool_t *pool)
{
    stow_vmm_closure_t *c = &pool->epochs.closures[pool->epochs.closure_first];
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

/* Makes granules tagged with `epoch` safe to unmap by waiting on events alone,
 * where the backend can (event_synchronize): a granule of the open epoch first
 * closes it (an event on each stream that freed since its last closure), then
 * the closed epochs' events are waited on, oldest first, up to the granule's.
 * Work queued after those events keeps running, on every stream, where a
 * synchronize would wait for all of it: on a GPU whose queue runs ahead of the
 * host, the remap does not drain the queue. False when it cannot (no such
 * method, an event that could not be recorded, a wait that failed): the caller
 * synchronizes. */
static bool wait_for_epoch(stow_pool_t *pool, uint64_t epoch)
{
    if (!pool->event_synchronize)
        return false;
    if (epoch == pool->epochs.unmap_epoch) {
        if (pool->epochs.closure_count == STOW_VMM_CLOSURES && !wait_oldest_closure(pool))
            return false;
        close_epoch(pool, NULL);
        if (epoch == pool->epochs.unmap_epoch)
            return false;
    }
    while (epoch > pool->epochs.unmap_safe_epoch)
        if (!pool->epochs.closure_count || !wait_oldest_closure(pool))
            return false;
    return true;
}

bool stow__vmm_unused_ready(stow_pool_t *pool, uint64_t epoch, bool synced)
{
    pool->epochs.closing_until_op = pool->op_count + CLOSE_AFTER_REMAP_OPS;
    return synced || epoch_is_safe(pool, epoch) || wait_for_epoch(pool, epoch);
}

/* The unmap epochs: the safe one below the open one, closed epochs in flight
 * between them in increasing order, each with its events (none on a pool
 * without events). */
stow_status_t stow__vmm_epochs_check(const stow_pool_t *pool, char *why, size_t why_len)
{
    bool ok = pool->epochs.unmap_safe_epoch < pool->epochs.unmap_epoch &&
              pool->epochs.closure_count <= STOW_VMM_CLOSURES &&
              pool->epochs.closure_first < STOW_VMM_CLOSURES &&
              (pool->has_events || pool->epochs.closure_count == 0);
    uint64_t last = pool->epochs.unmap_safe_epoch;
    for (unsigned k = 0; ok && k < pool->epochs.closure_count; k++) {
        unsigned slot = (pool->epochs.closure_first + k) % STOW_VMM_CLOSURES;
        const stow_vmm_closure_t *c = &pool->epochs.closures[slot];
        ok = c->epoch > last && c->epoch < pool->epochs.unmap_epoch && c->count <= c->capacity;
        last = c->epoch;
    }
    if (!ok) {
        snprintf(why, why_len, "vmm: unmap epochs: safe %llu, open %llu, %u closed in flight",
                 (unsigned long long)pool->epochs.unmap_safe_epoch,
                 (unsigned long long)pool->epochs.unmap_epoch, pool->epochs.closure_count);
        return STOW_EINVAL;
    }
    return STOW_OK;
}
