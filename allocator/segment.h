/*
 * allocator/segment.h: growth and release of memory (segment.c): a request
 * no cached block fits reserves a segment (or, page-mapped, a range's
 * granules through vmm.h); idle segments go back to the device; the
 * out-of-memory retry and its explanation. Holds the idle-keep state, which
 * only segment.c reads (the pool embeds it). Includes no pool: pool.h
 * includes it for the state.
 */
#ifndef STOWAGE_ALLOCATOR_SEGMENT_H
#define STOWAGE_ALLOCATOR_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/types.h"

/* Segments that growth past the high-water mark released, the most recent
 * STOW_REGRET_SEGMENTS (segment.c, regretted releases). */
#define STOW_REGRET_SEGMENTS 64

/* Growth that keeps releasing idle segments (classic pools, segment.c,
 * keep_idle): growths past the high-water mark that released idle segments,
 * counted by windows of pool operations. */
typedef struct stow_idle_keep {
    size_t released_bytes[STOW_REGRET_SEGMENTS]; /* 0: an empty or matched entry */
    uint8_t released_kind[STOW_REGRET_SEGMENTS];
    unsigned released_next;      /* the entry the next release overwrites */
    uint64_t window_start_op;    /* op_count when the current window began */
    uint64_t window_releases;    /* growths in it that released idle segments */
    unsigned hot_windows;        /* consecutive windows with one per 1,024 operations or more */
    bool keeping;                /* after such a run: idle segments are kept, within the cap */
} stow_idle_keep_t;

/* Slow path: reserves a segment for a request of `rounded` bytes on `ss` and
 * returns its single free block (already indexed under ss), or an error after
 * the release-and-retry path. */
stow_status_t stow__segment_grow(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                                 size_t rounded, size_t requested, stow_block_t **out);
/* Releases segments whose only block is free; all = every such segment,
 * else only until `want_bytes` were released (oldest idle first). */
size_t stow__segment_release_idle(stow_pool_t *pool, bool all, size_t want_bytes);
void stow__segment_release_all(stow_pool_t *pool);
/* Links a new segment [base, base+size) into the pool with `b` as its single
 * free block, indexed under ss (or the shared lists). */
void stow__segment_install(stow_pool_t *pool, stow_segment_t *seg, stow_block_t *b,
                           stow_stream_state_t *ss, uintptr_t base, size_t size, unsigned kind);

/* Fills the out-of-memory message; `retried`: after the release-and-retry
 * (a page-mapped pool whose request no range can hold fails before it). */
void stow__segment_explain_oom(stow_pool_t *pool, size_t requested, size_t segment_bytes,
                               bool retried);
/* Before a retry: synchronize, make every free block reusable by all streams,
 * complete pending blocks, release idle memory (unused granules only once
 * stow__segment_sync_for_release succeeded). */
void stow__segment_release_cache_for_retry(stow_pool_t *pool);
/* Before empty_cache or the retry gives memory back: synchronizes the device
 * (when stow__pool_release_needs_sync) and hands every stream's frees to all,
 * completing pending blocks. Returns whether unused granules may be unmapped
 * now: false when a synchronize failed. */
bool stow__segment_sync_for_release(stow_pool_t *pool);

#endif /* STOWAGE_ALLOCATOR_SEGMENT_H */
