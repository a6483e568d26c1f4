/*
 * stowage/snapshot.h: a pool's state and its recorded events, copied out for
 * tools that draw them (allocator/snapshot.c).
 *
 * stow_pool_snapshot copies the segments and the blocks that tile them, as one
 * consistent picture taken under the pool lock; stow_record_read copies the
 * events a recording pool kept (stowage/record.h), oldest first, with their
 * times and streams. python/stowage/torch.py turns both into the structure
 * torch.cuda.memory._snapshot() returns, which pytorch.org/memory_viz and
 * torch.cuda._memory_viz draw (docs/torch.md).
 *
 * Both follow snprintf's rule: they copy at most the capacity given and report
 * how many there are, so a caller retries with larger arrays when a count
 * exceeds its capacity.
 */
#ifndef STOWAGE_SNAPSHOT_H
#define STOWAGE_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "stowage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    STOW_SNAP_ALLOCATED = 0,    /* handed out and not freed */
    STOW_SNAP_PENDING_FREE = 1, /* freed, not reusable until other streams' events complete */
    STOW_SNAP_INACTIVE = 2      /* free: cached, or kept whole for its size (quick lists) */
} stow_snap_state_t;

typedef struct stow_snap_block {
    uint64_t addr;
    uint64_t size_bytes;      /* the block's size (a multiple of 512) */
    uint64_t requested_bytes; /* ALLOCATED, PENDING_FREE: the size asked for; else 0 */
    uint64_t stream;          /* ALLOCATED, PENDING_FREE: the allocation stream; else 0 */
    uint32_t state;           /* stow_snap_state_t */
    uint32_t tag;             /* the allocating thread's tag (stow_tag_name); 0: none */
} stow_snap_block_t;

/* A segment: a backend reservation (classic pools), or a run of mapped granules
 * of a page-mapped range (policy vmm: physical memory sits only under them).
 * Its blocks tile it in address order: blocks[first_block .. +block_count). */
typedef struct stow_snap_segment {
    uint64_t addr;
    uint64_t size_bytes;
    uint64_t first_block;
    uint64_t block_count;
    uint32_t pool_kind;       /* STOW_POOL_SMALL or STOW_POOL_LARGE (stowage/stats.h) */
    uint32_t mapped_run;      /* 1: a run of mapped granules; 0: a backend reservation */
} stow_snap_segment_t;

typedef struct stow_snap_totals {
    size_t segment_count;     /* segments in the pool (copied: at most the capacity) */
    size_t block_count;       /* blocks in them */
    uint64_t unmapped_bytes;  /* policy vmm: physical memory held but mapped nowhere, kept
                                 for reuse; with the segments' bytes, reserved_bytes */
    uint32_t page_mapped;     /* 1: policy vmm (segments are mapped runs; the recorded
                                 segment reservations are its address ranges) */
    uint32_t reserved_;
} stow_snap_totals_t;

/*
 * Copies the pool's segments, by address, and their blocks, into the arrays
 * (at most segment_cap and block_cap), and the full counts into *totals. The
 * segments' sizes add up to reserved_bytes.all.current less unmapped_bytes;
 * the ALLOCATED blocks' sizes to allocated_bytes.all.current.
 * Ownership: the caller's arrays. Thread safety: safe (under the pool lock).
 * Errors: STOW_EINVAL (NULL pool or totals; NULL array with a capacity).
 */
STOW_API stow_status_t stow_pool_snapshot(stow_pool_t *pool, stow_snap_segment_t *segments,
                                          size_t segment_cap, stow_snap_block_t *blocks,
                                          size_t block_cap, stow_snap_totals_t *totals);

typedef enum {
    STOW_EVENT_ALLOC = 0,           /* size: requested bytes */
    STOW_EVENT_FREE = 1,            /* size: the block's bytes */
    STOW_EVENT_SEGMENT_RESERVE = 2, /* a backend reservation (classic pools) */
    STOW_EVENT_SEGMENT_RELEASE = 3,
    STOW_EVENT_MAP = 4,             /* a granule mapped (policy vmm) */
    STOW_EVENT_UNMAP = 5,
    STOW_EVENT_OOM = 6,             /* addr 0; size: the request that failed */
    STOW_EVENT_STEP = 7             /* a step marker (stow_pool_step): addr 0 ends a step, else
                                       it is 1 + the key's number in the recording (dump names it) */
} stow_event_kind_t;

typedef struct stow_recorded_event {
    uint64_t time_ns;         /* since the recording started (times between the clock's
                                 samples are interpolated, as stow_trace_dump does) */
    uint64_t addr;
    uint64_t size_bytes;
    uint64_t stream;          /* ALLOC, FREE, SEGMENT_RESERVE: the stream; else 0 */
    uint32_t kind;            /* stow_event_kind_t */
    uint32_t tag;             /* ALLOC, FREE, OOM: the thread's tag; else 0 */
} stow_recorded_event_t;

/*
 * Copies the events the pool's recording kept, oldest first, into out (at most
 * cap), and their number into *count; *start_unix_ns (optional) gets the wall
 * clock (CLOCK_REALTIME, ns) at the recording's start.
 * Ownership: the caller's array. Thread safety: safe (the ring is copied under
 * the pool lock). Errors: STOW_EINVAL (not recording, NULL pool or count, NULL
 * out with a capacity), STOW_EHOSTMEM.
 */
STOW_API stow_status_t stow_record_read(stow_pool_t *pool, stow_recorded_event_t *out, size_t cap,
                                        size_t *count, uint64_t *start_unix_ns);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_SNAPSHOT_H */
