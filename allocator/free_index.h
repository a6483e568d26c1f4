/*
 * allocator/free_index.h: the fit layer: free blocks indexed by size
 * (free_index.c), the bin of a size and the rounding of a request
 * (size_class.c). A free index holds blocks and knows nothing of streams,
 * segments or the pool; the pool (pool.c) chooses which index to search.
 */
#ifndef STOWAGE_ALLOCATOR_FREE_INDEX_H
#define STOWAGE_ALLOCATOR_FREE_INDEX_H

#include <stdbool.h>
#include <stddef.h>

#include "allocator/types.h"

/* Rounds a request to its block size; STOW_EOVERFLOW near SIZE_MAX. */
stow_status_t stow__round_size(const stow_config_t *config, size_t size_bytes, size_t *out);
/* Free-index bin of a block size: exact below 8 KiB (16 bins of 512 B), then
 * 8 bins per power of two. Inline: every index operation needs it. */
static inline unsigned stow__free_bin_of(size_t size_bytes)
{
    size_t x = size_bytes / STOW_MIN_BLOCK_BYTES;
    if (x < 16)
        return (unsigned)x;
    unsigned lg = 63u - (unsigned)__builtin_clzll((unsigned long long)x); /* >= 4 */
    unsigned sub = (unsigned)(x >> (lg - 3)) & 7u;
    unsigned bin = 16u + (lg - 4u) * 8u + sub;
    return bin < STOW_FREE_BINS ? bin : STOW_FREE_BINS - 1;
}

void stow__free_index_insert(stow_free_index_t *idx, stow_block_t *b);
void stow__free_index_remove(stow_free_index_t *idx, stow_block_t *b);
/* Smallest block with size >= size_bytes (most recently freed first among
 * equal sizes up to 2 MiB, lowest address above); NULL if none. Not const: a
 * bin found longer than STOW_BIN_LIST_MAX becomes a treap on the way, which
 * holds the same blocks. */
stow_block_t *stow__free_index_best_fit(stow_free_index_t *idx, size_t size_bytes);
/* Largest block (any of them among equal sizes), NULL if none; may turn a
 * long bin into a treap, as best_fit does. */
stow_block_t *stow__free_index_largest(stow_free_index_t *idx);
/* Whether a bin is held as a treap (tests; free_index.c). */
bool stow__free_index_bin_is_treap(const stow_free_index_t *idx, unsigned bin);
/* Calls visit(arg, b) for each block of at least size_bytes in increasing size
 * order (among equal sizes: most recently freed first up to 2 MiB, lowest
 * address first above) while it returns true. visit must not change idx; this
 * may, as best_fit does, turn a long bin into a treap before visiting it. */
void stow__free_index_visit_fitting(stow_free_index_t *idx, size_t size_bytes,
                                    bool (*visit)(void *arg, stow_block_t *b), void *arg);
/* Appends every block of idx to out[] (capacity idx->block_count), in no order. */
size_t stow__free_index_collect(const stow_free_index_t *idx, stow_block_t **out);

#endif /* STOWAGE_ALLOCATOR_FREE_INDEX_H */
