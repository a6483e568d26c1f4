/*
 * allocator/types.h: the pool's data structures and their invariants.
 *
 * A pool owns segments (one backend reservation each). A segment is cut into
 * blocks that tile it exactly, linked in address order. A block is FREE (in
 * exactly one free index), ALLOCATED (in the live map), PENDING (freed by the
 * user, in the live map, waiting for events on the streams it was used on) or
 * QUICK (freed by the user, on exactly one quick list or mid ring slot,
 * allocator/quick.c) or ARENA (the planned layer's arena, allocator/planned.h:
 * live for its segment, in no index and not in the live map).
 *
 * Invariants (checked by stow__pool_check, STOW_DEBUG >= 3, and by the tests):
 *   sum(block sizes of a segment) == segment size; blocks are contiguous
 *   no two adjacent FREE blocks have the same owner (they would have merged)
 *   segment->live_blocks == number of its ALLOCATED + PENDING + ARENA blocks
 *   allocated_bytes + pending_bytes + free-index bytes + quick bytes == reserved_bytes
 *   a QUICK block is a small-pool block, on its size's quick list when of at
 *   most STOW_QUICK_MAX_BYTES, else in a slot of its owner's mid ring
 */
#ifndef STOWAGE_ALLOCATOR_TYPES_H
#define STOWAGE_ALLOCATOR_TYPES_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage.h"

#define STOW_MIN_BLOCK_BYTES ((size_t)512)       /* every size is a multiple of this */
#define STOW_SMALL_REQUEST_BYTES ((size_t)1 << 20) /* <= 1 MiB: small pool */
#define STOW_SMALL_REQUEST_KB 1024u                /* the same in KiB (vmm_small_kb's bound) */

/* Free-index bins. Sizes are multiples of 512 B; with x = size / 512:
 *  - x <= STOW_EXACT_LISTS (blocks of at most 2 MiB, every block of a small
 *    pool and most remainders): one list per exact size, most recently freed
 *    first, found through a two-level bitmap. Constant-time insert and remove;
 *    best fit by size is exact, ties go to the most recently freed block.
 *  - larger: bins 0..15 would hold x exactly, and above that each power of two
 *    is cut into 8 bins, so a bin spans at most 12.5% of its lower bound; a
 *    bin is an unsorted list, or a treap keyed by (size, address) once a scan
 *    found it longer than STOW_BIN_LIST_MAX (free_index.c). Bins are ordered
 *    by size, which makes "first non-empty bin at or above, then the smallest
 *    block in it" an exact best fit, lowest address among equal sizes.
 *    x < 2^55 gives at most 16 + 51 * 8 = 424 bins. */
#define STOW_FREE_BINS 448
/* A bin is an unsorted list until a scan meets more blocks in it than this:
 * most bins hold a few blocks, where a scan costs less than a treap's
 * descent (docs/decisions.md, free index). */
#define STOW_BIN_LIST_MAX 16
#define STOW_FREE_BITMAP_WORDS (STOW_FREE_BINS / 64)
#define STOW_EXACT_LISTS 4096
#define STOW_EXACT_MAX_BYTES ((size_t)STOW_EXACT_LISTS * STOW_MIN_BLOCK_BYTES)
#define STOW_EXACT_WORDS (STOW_EXACT_LISTS / 64)
/* Quick lists (allocator/quick.c) keep blocks of at most 64 KiB, one list per
 * size: larger kept blocks strand enough of a 2 MiB small segment to change
 * the layout (docs/decisions.md, quick lists). Larger small-pool blocks go to
 * the mid ring below instead. */
#define STOW_QUICK_MAX_BYTES ((size_t)64 << 10)
#define STOW_QUICK_LISTS (STOW_QUICK_MAX_BYTES / STOW_MIN_BLOCK_BYTES)
/* The mid ring (allocator/quick.c) keeps the last few small-pool blocks of
 * more than STOW_QUICK_MAX_BYTES freed on a stream, whatever their sizes: a
 * bound on the bytes kept (at most 8 MiB per stream), not a list per size. */
#define STOW_MID_SLOTS STOW_QUICK_MID_SLOTS_MAX

typedef struct stow_block stow_block_t;
typedef struct stow_segment stow_segment_t;
typedef struct stow_stream_state stow_stream_state_t;

/* QUICK: freed by the user, kept whole on its stream's quick list or mid ring
 * for the next request of its size (allocator/quick.c); neither coalesced nor
 * indexed. */
typedef enum {
    BLOCK_FREE = 0,
    BLOCK_ALLOCATED = 1,
    BLOCK_PENDING = 2,
    BLOCK_QUICK = 3,
    BLOCK_ARENA = 4
} stow_block_state_t;

/* Streams named by stow_record_stream, and the events recorded on them at free. */
typedef struct stow_stream_uses {
    uint32_t count;
    uint32_t capacity;
    uint32_t events_outstanding; /* PENDING: events not yet seen complete */
    struct {
        stow_stream_t stream;
        stow_event_t event; /* NULL until the free records it; NULL again once complete */
    } item[];
} stow_stream_uses_t;

struct stow_block {
    uintptr_t addr;               /* device address */
    size_t size_bytes;            /* multiple of 512 */
    size_t requested_bytes;       /* ALLOCATED/PENDING: the user's size */
    stow_block_t *prev, *next;    /* address neighbours in the segment */
    stow_segment_t *segment;
    stow_stream_state_t *owner;   /* FREE: the index holding it; else the allocation stream */
    stow_block_t *left, *right;   /* FREE: treap children, or list prev / next;
                                     PENDING: pending-list links; QUICK: right = next */
    stow_stream_uses_t *uses;     /* record_stream users, or NULL */
    uint64_t free_seq;            /* FREE: owner's free sequence number at insertion;
                                     ALLOCATED in a pool with vmm_learn_step: the number of
                                     the operation that allocated it (vmm_step.c), which its
                                     free's signature needs */
    uint32_t priority;            /* FREE in a treap bin: heap priority (hash of addr) */
    uint8_t state;                /* stow_block_state_t */
    uint8_t pool_kind;            /* STOW_POOL_SMALL or STOW_POOL_LARGE */
    uint8_t size_class;           /* ALLOCATED: stats size class of the request */
    uint8_t counted_split_;       /* FREE: counted in inactive_split (not a whole segment) */
    uint8_t tag;                  /* ALLOCATED/PENDING: the allocating thread's tag */
    uint16_t bin;                 /* FREE: its free-index bin (size_class.c) */
    uint32_t extra_granules;      /* ALLOCATED/PENDING, vmm: fresh granules it took beyond
                                     what best fit would have (vmm_place.c) */
};

/* Page-mapped pools (policy vmm, allocator/vmm.c): one entry per granule of a
 * virtual range. Physical handles are mapped whole over one or more granules
 * side by side (a mapping: its first granule's bit set in map_start_bits, every
 * granule of it holding the handle in phys). A granule is mapped (phys != 0,
 * its bit set in mapped_bits)
 * iff a live block overlaps it (ALLOCATED, PENDING, or QUICK: a kept block of
 * the small range holds its granules too; "live" below means all three) or it
 * is unused: mapped,
 * overlapped by no live block, kept for reuse, its bit set in unused_bits.
 * Unused granules form runs: granules next to each other in the range that
 * became unused together (a freed block's), one entry each on the pool's run
 * list, oldest first; a run's first granule holds its list links and its end
 * (its bit set in run_start_bits).
 *   edges == number of live blocks whose first or last granule this is.
 * A granule that two live blocks overlap is an edge of both: a block that
 * covers a granule with its interior is the only block overlapping it. So
 * interior granules need no count, and a block's allocation and free touch
 * its two edges and a run, not each of its granules. */
typedef struct stow_granule stow_granule_t;
struct stow_granule {
    stow_segment_t *segment;           /* its range; set when first mapped (entries start
                                          zeroed; the address is computed, vmm.c) */
    stow_phys_t phys;                  /* 0 = unmapped */
    stow_granule_t *run_prev, *run_next; /* run's first granule: neighbours on the run list */
    uint32_t run_end;                  /* run's first granule: index after the run's last */
    uint32_t edges;
    uint64_t unused_epoch;             /* run's first granule: the pool's unmap epoch when
                                          the run last grew (vmm_epochs.c) */
};

struct stow_segment {
    uintptr_t base;
    size_t size_bytes;
    stow_segment_t *prev, *next;  /* all segments of the pool */
    stow_block_t *first;          /* lowest-address block */
    uint64_t idle_since_op;       /* pool op counter when live_blocks last fell to 0 */
    uint32_t live_blocks;         /* ALLOCATED + PENDING blocks inside */
    uint8_t pool_kind;
    stow_granule_t *granules;     /* vmm: one per granule of [base, base+size); else NULL */
    size_t granules_touched;      /* vmm: 1 + the highest granule index ever mapped (every
                                     granule at or above it is unmapped) */
    uint64_t *mapped_bits;        /* vmm: bit i set <=> granules[i] is mapped */
    uint64_t *unused_bits;        /* vmm: bit i set <=> granules[i] is unused (in a run) */
    uint64_t *run_start_bits;     /* vmm: bit i set <=> a run starts at granules[i] */
    uint64_t *seen_live_bits;     /* vmm: bit i set => granules[i] held a live block at some
                                     time since the pool's remap count last began a run of
                                     windows (vmm_allowance.c); every live granule's
                                     bit is set. The five bitmaps share one allocation,
                                     mapped_bits first. */
    uint64_t *map_start_bits;     /* vmm: bit i set <=> a mapping starts at granules[i] */
};

typedef struct stow_free_index {
    stow_block_t *root[STOW_FREE_BINS];      /* list head, or treap root | 1 (free_index.c) */
    uint64_t bitmap[STOW_FREE_BITMAP_WORDS]; /* bit b set <=> root[b] != NULL */
    stow_block_t *exact[STOW_EXACT_LISTS];   /* [x - 1]: blocks of x * 512 bytes */
    uint64_t exact_bits[STOW_EXACT_WORDS];   /* bit i set <=> exact[i] != NULL */
    uint64_t exact_words;                    /* bit w set <=> exact_bits[w] != 0 */
    size_t block_count;
    size_t bytes;
} stow_free_index_t;

/* Per-stream free lists. `any` (stream STOW_ANY_STREAM) holds blocks every
 * stream may reuse: those whose freeing stream's clearance event completed. */
struct stow_stream_state {
    stow_stream_t stream;
    stow_free_index_t free[3];    /* indexed by STOW_POOL_SMALL / STOW_POOL_LARGE (slot 0,
                                     STOW_POOL_ALL's, unused) */
    uint64_t free_seq;            /* incremented at each free into this index */
    uint16_t index;               /* 1 + position in pool->streams; 0 for `any` */
    stow_event_t clear_event;     /* in flight: covers blocks with free_seq <= clear_upto */
    uint64_t clear_upto_seq;
    uint64_t vmm_closed_seq;      /* page-mapped pools: free_seq when an unmap epoch was last
                                     closed with an event on this stream (vmm_epochs.c) */
    bool is_any;
    /* Quick lists (allocator/quick.c): [x - 1] holds small-pool blocks of
     * x * 512 bytes freed on this stream, most recent first, at most the
     * pool's quick_depth each. */
    stow_block_t *quick[STOW_QUICK_LISTS];
    uint8_t quick_count[STOW_QUICK_LISTS];
    size_t quick_blocks;          /* on all of this stream's quick lists and mid slots */
    /* Mid ring (allocator/quick.c): the last pool->quick_mid_slots (at most
     * STOW_MID_SLOTS) small-pool blocks of more than STOW_QUICK_MAX_BYTES
     * freed on this stream; mid_size[j] is mid[j]'s size, 0 when the slot is
     * empty (the search reads sizes only). mid_next is the slot the next one
     * takes, and holds the oldest block when it is not empty. */
    stow_block_t *mid[STOW_MID_SLOTS];
    size_t mid_size[STOW_MID_SLOTS];
    unsigned mid_next;
};

#endif /* STOWAGE_ALLOCATOR_TYPES_H */
