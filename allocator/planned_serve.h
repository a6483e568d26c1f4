/*
 * allocator/planned_serve.h: the planned layer as the pool sees it
 * (planned_serve.c, planned_check.c; the layer's own data is planned.h,
 * which only planned_*.c include): the entry points that serve a planned
 * step in front of the pool's layers, and what the layer adds to the books.
 */
#ifndef STOWAGE_ALLOCATOR_PLANNED_SERVE_H
#define STOWAGE_ALLOCATOR_PLANNED_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/pool.h"
#include "allocator/types.h"

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

#endif /* STOWAGE_ALLOCATOR_PLANNED_SERVE_H */
