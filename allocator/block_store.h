/*
 * allocator/block_store.h: the block records (block_store.c), taken from
 * chunks so that a split costs no malloc. Knows a block's size and nothing of
 * its state; included by the files that create or delete blocks.
 */
#ifndef STOWAGE_ALLOCATOR_BLOCK_STORE_H
#define STOWAGE_ALLOCATOR_BLOCK_STORE_H

#include <stddef.h>

#include "allocator/assert.h"
#include "allocator/types.h"

/* Block metadata comes from chunks so that a split costs no malloc. */
typedef struct stow_block_chunk stow_block_chunk_t;
typedef struct stow_block_store {
    stow_block_t *free_list; /* linked through ->next */
    size_t free_count;       /* blocks on free_list */
    stow_block_chunk_t *chunks;
    size_t live_count;
} stow_block_store_t;

stow_block_t *stow__block_new(stow_block_store_t *store);
stow_status_t stow__block_store_grow(stow_block_store_t *store, size_t count);
/* Makes sure the next `count` stow__block_new calls cannot fail. */
static inline stow_status_t stow__block_reserve(stow_block_store_t *store, size_t count)
{
    return STOW_LIKELY(store->free_count >= count) ? STOW_OK : stow__block_store_grow(store, count);
}
void stow__block_delete(stow_block_store_t *store, stow_block_t *b);
void stow__block_store_destroy(stow_block_store_t *store);

#endif /* STOWAGE_ALLOCATOR_BLOCK_STORE_H */
