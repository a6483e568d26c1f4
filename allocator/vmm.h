/*
 * allocator/vmm.h: the page-mapped backing (vmm.c, vmm_place.c,
 * vmm_check.c): virtual ranges whose granules are mapped to physical handles
 * as blocks need them and unmapped when unused granules exceed the
 * allowance (vmm_allowance.h), stream-safely (vmm_epochs.h). Its fast paths
 * (stow__vmm_back, stow__vmm_unback) are inline over the pool. Included by
 * the files that back, release or check page-mapped memory; the granule
 * arithmetic shared by vmm*.c is vmm_granules.h.
 */
#ifndef STOWAGE_ALLOCATOR_VMM_H
#define STOWAGE_ALLOCATOR_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "allocator/assert.h"
#include "allocator/pool.h"
#include "allocator/types.h"

/* An unmapped physical handle kept for reuse (pool->free_handles). */
typedef struct stow_free_handle {
    stow_phys_t phys;
    uint32_t granules; /* its size */
    uint8_t kind;      /* pool kind its reserved bytes are counted under */
} stow_free_handle_t;

/* The granule of a page-mapped range holding addr (the granularity is a power
 * of two, backend_valid checks it: a shift). */
static inline size_t stow__granule_of(const stow_pool_t *pool, const stow_segment_t *seg,
                                      uintptr_t addr)
{
    return (size_t)(addr - seg->base) >> pool->granularity_shift;
}
/* stow__vmm_back and _unback beyond their fast paths; the block's span of
 * granules [first, end) comes from them. */
stow_status_t stow__vmm_back_span(stow_pool_t *pool, stow_block_t *b, size_t size_bytes,
                                  size_t first, size_t end);
void stow__vmm_unback_span(stow_pool_t *pool, stow_block_t *b, size_t first, size_t end);
/* Maps physical granules under [b->addr, b->addr + size_bytes) (b is a FREE
 * block about to be handed out with that size). STOW_ENOMEM when the device and
 * the unused granules cannot provide them; nothing changes on error. Inline
 * fast path: most small blocks lie inside one granule that a live block
 * already holds (an edge count above 0 means mapped and not unused), and a
 * call into the general function cost more than the work. Always inlined:
 * left to GCC, it becomes a function of its own with the general one inlined
 * into it, and the fast path pays that one's register saves. */
static inline __attribute__((always_inline)) stow_status_t
stow__vmm_back(stow_pool_t *pool, stow_block_t *b, size_t size_bytes)
{
    stow_segment_t *seg = b->segment;
    size_t first = stow__granule_of(pool, seg, b->addr);
    size_t last = stow__granule_of(pool, seg, b->addr + size_bytes - 1);
    if (first == last && seg->granules[first].edges) {
        seg->granules[first].edges++;
        pool->live_bytes += size_bytes;
        if (pool->live_bytes > pool->live_bytes_high_water)
            pool->live_bytes_high_water = pool->live_bytes;
        /* Held memory beside live data shrinks by what the block now covers. */
        stow__stat2_sub(pool->acct.s.inactive_split_bytes, seg->pool_kind, size_bytes);
        return STOW_OK;
    }
    return stow__vmm_back_span(pool, b, size_bytes, first, last + 1);
}
/* The block (ALLOCATED or PENDING) stops holding its granules. Inline fast
 * path: a block inside one granule that another live block still holds (its
 * edge count stays above 0) changes no run and no idle figure. Always inlined,
 * as stow__vmm_back is. */
static inline __attribute__((always_inline)) void stow__vmm_unback(stow_pool_t *pool,
                                                                  stow_block_t *b)
{
    stow_segment_t *seg = b->segment;
    size_t first = stow__granule_of(pool, seg, b->addr);
    size_t last = stow__granule_of(pool, seg, b->addr + b->size_bytes - 1);
    if (first == last && seg->granules[first].edges > 1) {
        stow_assert_internal(pool->live_bytes >= b->size_bytes);
        seg->granules[first].edges--;
        pool->live_bytes -= b->size_bytes;
        stow__stat2_add(pool->acct.s.inactive_split_bytes, seg->pool_kind, b->size_bytes);
        pool->extra_granules_live -= b->extra_granules;
        b->extra_granules = 0;
        return;
    }
    stow__vmm_unback_span(pool, b, first, last + 1);
}
stow_status_t stow__vmm_grow(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                             size_t rounded, stow_block_t **out);
/* Unmaps unused granules and releases free handles (caller synchronized). */
void stow__vmm_release_unused(stow_pool_t *pool);
/* What stow__vmm_release_unused would give back now: free handles and the
 * mappings all of whose granules are unused. */
uint64_t stow__vmm_releasable_bytes(const stow_pool_t *pool);
void stow__vmm_release_segment(stow_pool_t *pool, stow_segment_t *seg);
void stow__vmm_release_all_handles(stow_pool_t *pool);

/* ---- vmm_place.c ---- */
/* Where a page-mapped pool puts a request of `rounded` bytes that best fit
 * placed at free block b (indexed, usable by ss). Big requests whose best-fit
 * span needs granules mapped go where the fewest need mapping instead: any
 * usable free block, at its start, its end or the start of a run of mapped
 * granules inside it, carved out and indexed; b when nothing is cheaper.
 * Sets pool->placed_extra. Needs two reserved block records. */
stow_block_t *stow__vmm_place(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded,
                              stow_block_t *b);

/* ---- vmm_check.c ---- */
/* A page-mapped pool's physical memory per pool kind, recounted from its
 * granules, blocks and free handles (not from the books). */
typedef struct stow_vmm_recount {
    uint64_t reserved_bytes[STOW_POOL_KINDS];    /* mapped granules and free handles */
    uint64_t beside_live_bytes[STOW_POOL_KINDS]; /* live granules' bytes less live bytes */
} stow_vmm_recount_t;
/* The invariants of a page-mapped pool; *phys gets the recount for the
 * books' check (check.c). */
stow_status_t stow__vmm_check(stow_pool_t *pool, stow_vmm_recount_t *phys, char *why,
                             size_t why_len);

#endif /* STOWAGE_ALLOCATOR_VMM_H */
