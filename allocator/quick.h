/*
 * allocator/quick.h: the quick lists and mid rings (quick.c): blocks freed
 * by the user kept whole for the next request of their size on their
 * stream, in front of the fit layer. Included by pool.c (the fast paths) and
 * by growth and release, which flushes them before memory moves (segment.c).
 */
#ifndef STOWAGE_ALLOCATOR_QUICK_H
#define STOWAGE_ALLOCATOR_QUICK_H

#include <stdbool.h>
#include <stddef.h>

#include "allocator/types.h"

/* Keeps b (ALLOCATED, just freed by the user: its allocation figures already
 * dropped) whole on a quick list of `owner` (over 64 KiB: in its mid ring,
 * whose oldest block is then freed the normal way), and in the live map, so
 * that a second free of it is refused and its reuse needs no map insertion;
 * false, with nothing changed, when b is not a candidate or the list is full
 * (or there is no ring). */
bool stow__quick_push(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *owner);
/* A QUICK block of exactly `rounded` bytes usable on ss (ss's own list or
 * ring, then `any`'s), off it, FREE, in no index but still in the live map;
 * NULL if none. */
stow_block_t *stow__quick_pop(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded);
/* Frees every QUICK block the normal way (out of the live map, coalesced,
 * indexed): before the pool grows, releases memory, or retries after
 * out-of-memory. */
void stow__quick_flush(stow_pool_t *pool);
/* Frees the mid rings' blocks the normal way (merged and indexed), and only
 * those; true when there were any. Counted in num_quick_flushes. */
bool stow__quick_flush_mid(stow_pool_t *pool);

#endif /* STOWAGE_ALLOCATOR_QUICK_H */
