/*
 * allocator/stream.h: the per-stream free lists and the stream safety of
 * frees (stream.c): which index a stream's requests search, blocks freed
 * with record_stream users waiting for their events (PENDING), and the
 * clearance that hands a stream's frees to every stream.
 */
#ifndef STOWAGE_ALLOCATOR_STREAM_H
#define STOWAGE_ALLOCATOR_STREAM_H

#include <stdbool.h>

#include "allocator/types.h"

stow_stream_state_t *stow__stream_get(stow_pool_t *pool, stow_stream_t stream);
stow_status_t stow__stream_state_new(stow_pool_t *pool, stow_stream_t stream,
                                     stow_stream_state_t **out);
void stow__stream_states_destroy(stow_pool_t *pool);
/* Destroy path: forgets PENDING blocks, returning their events. */
void stow__stream_drop_pending(stow_pool_t *pool);
/* Frees a block with record_stream users: records events, makes it PENDING. */
stow_status_t stow__stream_defer_free(stow_pool_t *pool, stow_block_t *b);
/* Turns PENDING blocks whose events completed into FREE blocks. */
void stow__stream_process_pending(stow_pool_t *pool);
/* Keeps b (out of the live map, its scrub refused) PENDING with no event to
 * wait for: a synchronize (stow__stream_clear_all_synchronized) releases it,
 * and making it free scrubs it again. */
void stow__stream_park_unscrubbed(stow_pool_t *pool, stow_block_t *b);
/* Moves blocks freed on other streams into `any` once a clearance event
 * recorded after their free completed; returns whether any moved. Used on a
 * miss only with reuse_other_streams_on_miss. */
bool stow__stream_clear_others(stow_pool_t *pool, stow_stream_state_t *except);
/* After a device synchronize: everything free is clear for every stream. */
void stow__stream_clear_all_synchronized(stow_pool_t *pool);
stow_status_t stow__stream_add_use(stow_pool_t *pool, stow_block_t *b, stow_stream_t stream);

#endif /* STOWAGE_ALLOCATOR_STREAM_H */
