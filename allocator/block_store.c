/*
 * allocator/block_store.c: block metadata in chunks of 512, recycled through a
 * free list, so that splitting and merging blocks never calls malloc on the
 * hot path and destroying a pool frees everything at once.
 */
#include "allocator/assert.h"
#include "allocator/block_store.h"
#include "allocator/types.h"

#include <string.h>

#define BLOCKS_PER_CHUNK 512

struct stow_block_chunk {
    stow_block_chunk_t *next;
    stow_block_t blocks[BLOCKS_PER_CHUNK];
};

stow_status_t stow__block_store_grow(stow_block_store_t *store, size_t count)
{
    while (store->free_count < count) {
        stow_block_chunk_t *chunk = malloc(sizeof *chunk);
        if (!chunk)
            return STOW_EHOSTMEM;
        chunk->next = store->chunks;
        store->chunks = chunk;
        for (size_t i = BLOCKS_PER_CHUNK; i-- > 0;) {
            chunk->blocks[i].next = store->free_list;
            store->free_list = &chunk->blocks[i];
        }
        store->free_count += BLOCKS_PER_CHUNK;
    }
    return STOW_OK;
}

/* Every field, one store each: a memset of the record compiles to `rep stos`
 * here, whose start-up costs more than the stores on the split path. A field
 * added to stow_block_t must be added below (the size check says so). */
_Static_assert(sizeof(void *) != 8 || sizeof(stow_block_t) == 104, "stow__block_new must clear every field");

static void block_clear(stow_block_t *b)
{
    b->addr = 0;
    b->size_bytes = 0;
    b->requested_bytes = 0;
    b->prev = b->next = NULL;
    b->segment = NULL;
    b->owner = NULL;
    b->left = b->right = NULL;
    b->uses = NULL;
    b->free_seq = 0;
    b->priority = 0;
    b->state = 0;
    b->pool_kind = 0;
    b->size_class = 0;
    b->counted_split_ = 0;
    b->tag = 0;
    b->bin = 0;
    b->extra_granules = 0;
}

stow_block_t *stow__block_new(stow_block_store_t *store)
{
    if (STOW_UNLIKELY(stow__block_reserve(store, 1) != STOW_OK))
        return NULL;
    stow_block_t *b = store->free_list;
    store->free_list = b->next;
    store->free_count--;
    block_clear(b);
    store->live_count++;
    return b;
}

void stow__block_delete(stow_block_store_t *store, stow_block_t *b)
{
    if (STOW_UNLIKELY(b->uses != NULL)) { /* rare: record_stream users; free(NULL) is a call */
        free(b->uses);
        b->uses = NULL;
    }
    b->next = store->free_list;
    store->free_list = b;
    store->free_count++;
    store->live_count--;
}

void stow__block_store_destroy(stow_block_store_t *store)
{
    while (store->chunks) {
        stow_block_chunk_t *next = store->chunks->next;
        free(store->chunks);
        store->chunks = next;
    }
    store->free_list = NULL;
    store->free_count = 0;
    store->live_count = 0;
}
