/*
 * allocator/recorder.h: the event recorder (record.c): a ring of the pool's
 * allocations, frees, mappings and step markers, dumped by stow_record_dump.
 * stow__record is inline (every allocation and free calls it, and it costs
 * one test when not recording). Included by the files that record events.
 */
#ifndef STOWAGE_ALLOCATOR_RECORDER_H
#define STOWAGE_ALLOCATOR_RECORDER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "allocator/assert.h"
#include "allocator/pool.h"

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

#endif /* STOWAGE_ALLOCATOR_RECORDER_H */
