/*
 * allocator/vmm_place.c: where a page-mapped pool (policy vmm) puts a big
 * request: where granules are already mapped, when that saves remaps.
 *
 * Reads the free index and the granule bitmaps; changes nothing but the free
 * block it carves the placement out of (stow__pool_split_free_at) and
 * pool->placed_extra. Called with the pool lock held.
 */
#include "allocator/free_index.h"
#include "allocator/pool.h"
#include "allocator/types.h"
#include "allocator/vmm.h"
#include "allocator/vmm_granules.h"

/* What a placement over granules [first, end) of a segment costs: granules
 * to map (each a remap when the pool is at its physical allowance; a handle
 * holds at most vmm_handle_mb) and fresh granules (no live block yet: they add
 * to the physical memory live data pins). */
typedef struct span_cost {
    size_t unmapped, fresh;
} span_cost_t;

/* Cost of placing `size` bytes at `addr` inside free block f: granules
 * strictly inside a free block hold no live block, so only f's first and last
 * granules can already be live (shared with a neighbour). */
static span_cost_t cost_at(const stow_pool_t *pool, const stow_block_t *f, uintptr_t addr,
                           size_t size)
{
    const stow_segment_t *seg = f->segment;
    size_t first, end, f_first, f_end;
    granule_span(pool, seg, addr, size, &first, &end);
    granule_span(pool, seg, f->addr, f->size_bytes, &f_first, &f_end);
    span_cost_t c = {(end - first) - mapped_in(seg, first, end), end - first};
    if (first == f_first && seg->granules[first].edges)
        c.fresh--;
    if (end == f_end && end - 1 != first && seg->granules[end - 1].edges)
        c.fresh--;
    return c;
}

typedef struct placement {
    const stow_pool_t *pool;
    size_t rounded;
    span_cost_t best_fit;   /* the cost at the best-fit block */
    uint64_t fresh_budget;  /* extra fresh granules a move may still take */
    stow_block_t *block;    /* chosen free block, address, cost */
    uintptr_t addr;
    span_cost_t cost;
} placement_t;

/* A move pays for its extra fresh granules (beyond best fit's) out of the
 * budget, and only when it saves at least STOW_VMM_MAPS_PER_EXTRA_GRANULE
 * granule maps for each. */
#define STOW_VMM_MAPS_PER_EXTRA_GRANULE 16
/* Blocks smaller than this many granules (256 MiB on CUDA) stay where best
 * fit puts them: moved to mapped windows, medium blocks fill the rooms of a
 * step's biggest blocks, which then remap every step (docs/decisions.md). */
#define STOW_VMM_PLACE_MIN_GRANULES 128
/* Extra granules that moved blocks may hold together, as a fraction of the
 * live peak: at most this, and at most half of vmm_slack. */
#define STOW_VMM_PLACE_BUDGET 0.00375

static void consider(placement_t *p, stow_block_t *f, uintptr_t addr)
{
    span_cost_t c = cost_at(p->pool, f, addr, p->rounded);
    /* Fewest granules to map, then fewest fresh ones, then the lowest
     * address. A room loses its lowest granules to remaps first (the oldest
     * unused go first, and a freed block's granules are queued from the
     * bottom up); with the windows that end where a run ends (consider_block)
     * and this last rule, a big block extends downwards into it instead of
     * creeping a little higher each training step. */
    if (c.unmapped > p->cost.unmapped ||
        (c.unmapped == p->cost.unmapped &&
         (c.fresh > p->cost.fresh || (c.fresh == p->cost.fresh && addr >= p->addr))))
        return;
    if (c.fresh > p->best_fit.fresh) {
        size_t extra = c.fresh - p->best_fit.fresh;
        if (extra > p->fresh_budget ||
            p->best_fit.unmapped - c.unmapped < extra * STOW_VMM_MAPS_PER_EXTRA_GRANULE)
            return;
    }
    p->block = f;
    p->addr = addr;
    p->cost = c;
}

/* Candidate placements inside free block f: its two ends, and windows that
 * start where a run of mapped granules starts or end where one ends (the
 * fewest unmapped granules under a window are always found at one of the
 * starts; the ends give the same count below the run instead of above it). */
static bool consider_block(void *arg, stow_block_t *f)
{
    placement_t *p = arg;
    const stow_segment_t *seg = f->segment;
    size_t g = p->pool->granularity_bytes;
    uintptr_t lo = f->addr, hi = f->addr + f->size_bytes - p->rounded;
    consider(p, f, lo);
    if (hi != lo)
        consider(p, f, hi);
    size_t k = (lo - seg->base + g - 1) / g, k_last = (hi - seg->base) / g;
    if (k_last >= seg->granules_touched)
        k_last = seg->granules_touched ? seg->granules_touched - 1 : 0;
    while (k <= k_last && p->cost.unmapped) {
        size_t run = next_bit(seg->mapped_bits, k, k_last + 1, true);
        if (run > k_last)
            break;
        consider(p, f, seg->base + run * g);
        k = next_bit(seg->mapped_bits, run, k_last + 1, false);
        uintptr_t run_end = seg->base + k * g;
        if (run_end >= lo + p->rounded && run_end - p->rounded <= hi)
            consider(p, f, run_end - p->rounded);
    }
    return p->cost.unmapped != 0;
}

stow_block_t *stow__vmm_place(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded,
                              stow_block_t *b)
{
    /* Only unused mapped granules make another placement cheaper, and only
     * big blocks move: a remap of one costs milliseconds, while small blocks
     * packed by best fit share granules, which keeps the physical peak down
     * (docs/decisions.md, big-block placement). */
    if (!pool->unused_count || rounded < STOW_VMM_PLACE_MIN_GRANULES * pool->granularity_bytes)
        return b;
    span_cost_t at_b = cost_at(pool, b, b->addr, rounded);
    if (!at_b.unmapped)
        return b;
    /* Moved blocks may hold, together, half the slack in extra granules, and
     * never more than STOW_VMM_PLACE_BUDGET of the live peak: a larger slack
     * is there to cache granules, not to loosen the layout. */
    uint64_t live_hw_granules = pool->live_bytes_high_water / pool->granularity_bytes;
    double budget_fraction = pool->tuning.vmm_slack / 2;
    if (budget_fraction > STOW_VMM_PLACE_BUDGET)
        budget_fraction = STOW_VMM_PLACE_BUDGET;
    uint64_t budget = (uint64_t)((double)live_hw_granules * budget_fraction);
    placement_t p = {pool, rounded, at_b,
                     budget > pool->extra_granules_live ? budget - pool->extra_granules_live : 0,
                     b, b->addr, at_b};
    stow__free_index_visit_fitting(&ss->free[b->pool_kind], rounded, consider_block, &p);
    if (ss != pool->any && p.cost.unmapped)
        stow__free_index_visit_fitting(&pool->any->free[b->pool_kind], rounded, consider_block,
                                       &p);
    pool->placed_extra = p.cost.fresh > at_b.fresh ? p.cost.fresh - at_b.fresh : 0;
    if (p.addr == p.block->addr)
        return p.block;
    /* Cannot fail: stow_pool_alloc reserved the block records. */
    return stow__pool_split_free_at(pool, p.block, p.addr - p.block->addr);
}
