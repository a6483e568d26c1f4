/*
 * allocator/vmm.c: page-mapped segments (policy vmm).
 *
 * Blocks live in large virtual ranges, small and large requests alike, placed
 * by the same exact best fit as the classic pool; physical memory is mapped in
 * granules (2 MiB on CUDA) only under live blocks.
 *
 * Handles: a driver call costs about the same whatever the handle's size
 * (about 35 us to create, map and set access on an H200, h200-costs.md), so a
 * block whose granules need mapping gets a handle per stretch of them, of at
 * most vmm_handle_mb; a stretch longer than that keeps each end the block
 * covers only in part as a granule of its own (a neighbour may hold the rest
 * of it, and would pin a larger handle with it). A handle is unmapped only
 * whole. Near the device's limit handles shrink to single granules
 * (handle_max_granules).
 *
 * Physical memory is fungible: when a block needs granules mapped and a new
 * handle would take the pool beyond what its live bytes ever needed (times
 * 1 + vmm_slack, the allowance), it unmaps a mapping that holds no live block
 * (the oldest first) and maps its handle where it is needed, or gives it back
 * and takes one of the size needed, instead of taking more from the device.
 * So reserved memory tracks the high-water mark of live bytes, not what
 * fragmentation strands; it exceeds that only when live blocks themselves pin
 * more granules (blocks that share a granule with a free hole, or hold part
 * of a handle).
 *
 * Stream safety: a granule is unmapped only once no queued work can use it,
 * because unmapping is not stream-ordered: not even on a backend without
 * events, whose single stream still queues work. A remap knows it from events
 * recorded after the granule's blocks were freed, or synchronizes the device
 * (vmm_epochs.c); empty_cache, the out-of-memory retry and
 * destroy synchronize before they unmap.
 * Reserved bytes = the granules of the physical handles the pool holds
 * (mapped or not).
 *
 * This file backs and unbacks blocks' spans of granules, keeps the runs of
 * unused granules and the free handles, sizes and remaps handles, and builds
 * and releases the ranges. Beside it: vmm_allowance.c (how many granules the
 * pool may hold), vmm_epochs.c (when an unused granule may be unmapped),
 * vmm_place.c (where a big request goes), vmm_check.c (the invariants) and
 * vmm_granules.h (the bitmaps). Every function here is called with the pool lock held.
 */
#include "allocator/assert.h"
#include "allocator/block_store.h"
#include "allocator/pool.h"
#include "allocator/recorder.h"
#include "allocator/segment.h"
#include "allocator/types.h"
#include "allocator/vmm.h"
#include "allocator/vmm_allowance.h"
#include "allocator/vmm_epochs.h"
#include "allocator/vmm_granules.h"

#include <string.h>

/* ---- runs of unused granules (oldest first) and free handles ---- */

/* Run head h goes on the list after `after` (NULL: first). */
static void run_link_after(stow_pool_t *pool, stow_granule_t *after, stow_granule_t *h)
{
    h->run_prev = after;
    h->run_next = after ? after->run_next : pool->run_head;
    if (h->run_next)
        h->run_next->run_prev = h;
    else
        pool->run_tail = h;
    if (after)
        after->run_next = h;
    else
        pool->run_head = h;
}

static void run_unlink(stow_pool_t *pool, stow_granule_t *h)
{
    if (h->run_prev)
        h->run_prev->run_next = h->run_next;
    else
        pool->run_head = h->run_next;
    if (h->run_next)
        h->run_next->run_prev = h->run_prev;
    else
        pool->run_tail = h->run_prev;
}

/* Granules [from, end) of seg (mapped, no live block overlapping them) become
 * unused, after every granule already unused: appended to the last run when
 * they continue it, else as a run of their own, tagged with the unmap epoch
 * (vmm_epochs.c). A freed block's granules are thus queued in address
 * order, the lowest first to be taken for a remap, and the runs' tags never
 * decrease from the oldest to the newest.
 * This, unused_take and bits_fill are inlined into their few callers: a call's
 * register saves were about a sixth of what they cost. */
static inline __attribute__((always_inline)) void unused_push(stow_pool_t *pool,
                                                            stow_segment_t *seg, size_t from,
                                                            size_t end)
{
    stow_granule_t *tail = pool->run_tail;
    if (tail && tail->segment == seg && tail->run_end == from) {
        tail->run_end = (uint32_t)end;
        tail->unused_epoch = stow__vmm_epoch_open(&pool->epochs); /* the newest part decides */
    } else {
        stow_granule_t *h = &seg->granules[from];
        h->run_end = (uint32_t)end;
        h->unused_epoch = stow__vmm_epoch_open(&pool->epochs);
        bit_put(seg->run_start_bits, from, true);
        run_link_after(pool, tail, h);
    }
    bits_fill(seg->unused_bits, from, end, true);
    pool->unused_count += end - from;
}

/* Granules [from, end) of seg, all unused, leave their runs (to hold a live
 * block, or to be unmapped). What remains of a run keeps its place on the
 * list; a run cut in two becomes two entries side by side. to_live: they hold
 * a live block from now, and join the seen-live footprint in the same pass
 * over the bitmap words (cheaper than a second pass). */
static inline __attribute__((always_inline)) void unused_take(stow_pool_t *pool,
                                                            stow_segment_t *seg, size_t from,
                                                            size_t end, bool to_live)
{
    if (to_live)
        bits_move(seg->unused_bits, seg->seen_live_bits, from, end);
    else
        bits_fill(seg->unused_bits, from, end, false);
    pool->unused_count -= end - from;
    while (from < end) {
        /* After the first, every run met starts at `from`. */
        size_t start = bit_at(seg->run_start_bits, from) ? from
                                                          : prev_set_bit(seg->run_start_bits, from);
        stow_granule_t *h = &seg->granules[start];
        size_t run_end = h->run_end, cut_end = run_end < end ? run_end : end;
        stow_assert_internal(run_end > from);
        if (cut_end < run_end) {
            /* The part above the cut stays unused: a run of its own, where h was. */
            stow_granule_t *upper = &seg->granules[cut_end];
            upper->run_end = (uint32_t)run_end;
            upper->unused_epoch = h->unused_epoch;
            bit_put(seg->run_start_bits, cut_end, true);
            run_link_after(pool, h, upper);
        }
        if (from > start) {
            h->run_end = (uint32_t)from;
        } else {
            run_unlink(pool, h);
            bit_put(seg->run_start_bits, start, false);
        }
        from = cut_end;
    }
}

/* Every unused granule in [from, end) of seg leaves its run. */
static void unused_take_within(stow_pool_t *pool, stow_segment_t *seg, size_t from, size_t end)
{
    for (size_t i = next_bit(seg->unused_bits, from, end, true); i < end;) {
        size_t j = next_bit(seg->unused_bits, i, end, false);
        unused_take(pool, seg, i, j, false);
        i = next_bit(seg->unused_bits, j, end, true);
    }
}

/* Idle physical memory: unused mapped granules and unmapped handles. */
static void update_idle(stow_pool_t *pool)
{
    pool->acct.idle_segment_bytes =
        (uint64_t)(pool->unused_count + pool->free_handle_granules) * pool->granularity_bytes;
}

/* What the pool holds beside live data in ranges of `kind`, and can neither
 * use for another request size nor release (inactive_split_bytes): the free
 * bytes of live granules, granule bytes under live blocks less their bytes.
 * A block of `bytes` that made `granules` more granules live (backed; add) or
 * left them (unbacked) moves it by the difference, in one step so that its
 * peak never sees a value between. A remap moves granules from idle to live
 * and their reserved bytes between kinds, changing no kind's figure. */
static inline void note_beside_live(stow_pool_t *pool, unsigned kind, size_t granules,
                                    uint64_t bytes, bool add)
{
    int64_t grows = (int64_t)((uint64_t)granules << pool->granularity_shift) - (int64_t)bytes;
    if (!add)
        grows = -grows;
    if (grows >= 0)
        stow__stat2_add(pool->acct.s.inactive_split_bytes, kind, (uint64_t)grows);
    else
        stow__stat2_sub(pool->acct.s.inactive_split_bytes, kind, (uint64_t)-grows);
}

static uint64_t granule_bytes(const stow_pool_t *pool, size_t granules)
{
    return (uint64_t)granules << pool->granularity_shift;
}

static stow_status_t push_free_handle(stow_pool_t *pool, stow_phys_t h, size_t granules,
                                      unsigned kind)
{
    if (pool->free_handle_count == pool->free_handle_capacity) {
        size_t cap = pool->free_handle_capacity ? pool->free_handle_capacity * 2 : 64;
        stow_free_handle_t *grown = realloc(pool->free_handles, cap * sizeof *grown);
        if (!grown)
            return STOW_EHOSTMEM;
        pool->free_handles = grown;
        pool->free_handle_capacity = cap;
    }
    stow_free_handle_t *fh = &pool->free_handles[pool->free_handle_count++];
    fh->phys = h;
    fh->granules = (uint32_t)granules;
    fh->kind = (uint8_t)kind;
    pool->free_handle_granules += granules;
    return STOW_OK;
}

/* Takes free handle i off the stack (the last one moves into its place). */
static stow_free_handle_t take_free_handle(stow_pool_t *pool, size_t i)
{
    stow_free_handle_t fh = pool->free_handles[i];
    pool->free_handles[i] = pool->free_handles[--pool->free_handle_count];
    pool->free_handle_granules -= fh.granules;
    return fh;
}

/* Granules [head, end) of seg are mapped to handle h, one mapping. */
static void set_mapping(stow_segment_t *seg, size_t head, size_t end, stow_phys_t h)
{
    for (size_t i = head; i < end; i++) {
        seg->granules[i].segment = seg; /* entries start zeroed (vmm_grow) */
        seg->granules[i].phys = h;
    }
    bits_fill(seg->mapped_bits, head, end, h != 0);
    bit_put(seg->map_start_bits, head, h != 0);
    if (h && end > seg->granules_touched)
        seg->granules_touched = end;
}

/* ---- backend calls ---- */

static stow_status_t do_unmap(stow_pool_t *pool, stow_segment_t *seg, size_t head, size_t end)
{
    pool->acct.s.num_unmap_calls++;
    uintptr_t va = granule_va(pool, &seg->granules[head]);
    size_t bytes = (size_t)granule_bytes(pool, end - head);
    stow__record(pool, STOW_REC_UNMAP, va, bytes, 0, 0);
    return stow__backend_status(pool,
                                pool->backend->unmap(pool->backend->ctx, (void *)va, bytes));
}

static stow_status_t do_map(stow_pool_t *pool, stow_segment_t *seg, size_t head, size_t end,
                            stow_phys_t h)
{
    pool->acct.s.num_map_calls++;
    uintptr_t va = seg->base + granule_bytes(pool, head);
    size_t bytes = (size_t)granule_bytes(pool, end - head);
    stow__record(pool, STOW_REC_MAP, va, bytes, 0, 0);
    return stow__backend_status(pool,
                                pool->backend->map(pool->backend->ctx, (void *)va, bytes, h));
}

/* Unmaps the mapping [head, end) of seg, all of whose granules are unused:
 * *phys gets its handle. Nothing changes when the unmap fails. */
static stow_status_t unmap_idle(stow_pool_t *pool, stow_segment_t *seg, size_t head, size_t end,
                                stow_phys_t *phys)
{
    if (do_unmap(pool, seg, head, end) != STOW_OK)
        return STOW_EBACKEND;
    unused_take(pool, seg, head, end, false);
    *phys = seg->granules[head].phys;
    set_mapping(seg, head, end, 0);
    pool->mapped_count -= end - head;
    return STOW_OK;
}

/* Gives handle h of `granules` back to the device; false (h not released) on
 * a refusal. */
static bool release_handle(stow_pool_t *pool, stow_phys_t h, size_t granules, unsigned kind)
{
    uint64_t bytes = granule_bytes(pool, granules);
    if (stow__backend_status(pool, pool->backend->phys_release(pool->backend->ctx, h,
                                                               (size_t)bytes)) != STOW_OK)
        return false;
    pool->phys_granules -= granules;
    pool->acct.s.num_device_free++;
    stow__acct_reserved_sub(&pool->acct, kind, bytes);
    return true;
}

/* The oldest idle mapping: the first mapping, walking the runs of unused
 * granules from the oldest, all of whose granules are unused (a mapping part
 * of which holds a live block cannot be unmapped). *epoch gets the newest tag
 * of the runs it lies in. False when there is none. */
static bool oldest_idle_mapping(const stow_pool_t *pool, stow_segment_t **seg_out, size_t *head,
                                size_t *end, uint64_t *epoch)
{
    for (const stow_granule_t *h = pool->run_head; h; h = h->run_next) {
        stow_segment_t *seg = h->segment;
        size_t i = granule_no(seg, h), run_end = h->run_end;
        while (i < run_end) {
            size_t m_head = mapping_head(seg, i), m_end = mapping_end(seg, m_head);
            if (all_unused(seg, m_head, m_end)) {
                uint64_t newest = 0;
                for (size_t r = prev_set_bit(seg->run_start_bits, m_head); r < m_end;
                     r = next_bit(seg->run_start_bits, r + 1, m_end, true))
                    if (seg->granules[r].unused_epoch > newest)
                        newest = seg->granules[r].unused_epoch;
                *seg_out = seg;
                *head = m_head;
                *end = m_end;
                *epoch = newest;
                return true;
            }
            i = m_end;
        }
    }
    return false;
}

/* Unmaps the oldest idle mapping (after *synced, or waiting on its frees'
 * events); *out and *granules get its handle, *kind its range's kind.
 * STOW_ENOMEM when no mapping is idle. */
static stow_status_t unmap_oldest_idle(stow_pool_t *pool, bool *synced, stow_phys_t *out,
                                       size_t *granules, unsigned *kind)
{
    stow_segment_t *seg;
    size_t head, end;
    uint64_t epoch;
    if (!oldest_idle_mapping(pool, &seg, &head, &end, &epoch))
        return STOW_ENOMEM;
    if (!stow__vmm_unused_ready(pool, epoch, *synced)) {
        /* The mapping's last blocks may still be used by queued work, on any
         * stream or on a single-stream backend's only one: unmapping is not
         * stream-ordered. */
        if (!stow__pool_synchronize(pool))
            return STOW_EBACKEND;
        *synced = true;
    }
    if (unmap_idle(pool, seg, head, end, out) != STOW_OK)
        return STOW_EBACKEND;
    stow__vmm_note_remap(pool, end - head);
    *granules = end - head;
    *kind = seg->pool_kind;
    return STOW_OK;
}

/* Before a handle goes back to the device in the middle of a backing: when
 * the handles created for the block so far made a new reserved peak, the
 * waste breakdown is taken at that peak, before it falls (the block's granules
 * mapped so far count as split remainder there). */
static void note_peak_before_release(stow_pool_t *pool)
{
    if (pool->acct.reserved_peak_moved)
        stow__acct_note_waste_if_peak(&pool->acct, stow__pool_largest_free(pool));
}

/* Obtains a handle of `granules` for a range of `kind`: a free handle of that
 * size, or a new one while the pool stays within what it may hold (and its
 * limit): its allowance, or the most it has held since creation or the last
 * empty_cache, whichever is larger. A remap below that high-water mark could
 * not lower the pool's peak, which it reached already; it would only cost an
 * unmap and a map, and move the granules a later block of the same layout
 * needs (a freed block's room is where best fit puts the next one).
 * Beyond it, idle mappings are unmapped, the oldest first: one of that size is
 * remapped as it is (a loop's blocks of the same sizes take each other's
 * handles), one of another size (and any free handle) goes back to the device
 * to make room. Beyond the allowance with no idle mapping left, live blocks
 * themselves need more: a new handle. */
static stow_status_t obtain_handle(stow_pool_t *pool, unsigned kind, size_t granules,
                                   uint64_t live_bytes_high_water, bool *synced, stow_phys_t *out)
{
    uint64_t bytes = granule_bytes(pool, granules);
    for (size_t i = pool->free_handle_count; i-- > 0;)
        if (pool->free_handles[i].granules == granules) {
            stow_free_handle_t fh = take_free_handle(pool, i);
            stow__acct_reserved_move(&pool->acct, fh.kind, kind, bytes);
            *out = fh.phys;
            return STOW_OK;
        }
    uint64_t allowed = stow__vmm_remap_floor_for(pool, live_bytes_high_water);
    bool none_idle = false;
    for (;;) {
        uint64_t held = granule_bytes(pool, pool->phys_granules);
        bool within_limit = bytes <= pool->limit_bytes && held <= pool->limit_bytes - bytes;
        if (within_limit && (none_idle || pool->phys_granules + granules <= allowed)) {
            stow_status_t st = stow__backend_status(
                pool, pool->backend->phys_create(pool->backend->ctx, (size_t)bytes, out));
            if (st == STOW_OK) {
                pool->phys_granules += granules;
                if (pool->phys_granules > pool->phys_granules_high_water)
                    pool->phys_granules_high_water = pool->phys_granules;
                pool->acct.s.num_device_alloc++;
                stow__acct_reserved_add(&pool->acct, kind, bytes);
                return STOW_OK;
            }
            if (st != STOW_ENOMEM)
                return STOW_EBACKEND;
            if (none_idle && !pool->free_handle_count)
                return STOW_ENOMEM; /* the device is full: nothing left to give back */
        }
        /* Something goes back to the device first: a free handle, else the
         * oldest idle mapping. */
        if (pool->free_handle_count) {
            stow_free_handle_t fh = pool->free_handles[pool->free_handle_count - 1];
            note_peak_before_release(pool);
            if (!release_handle(pool, fh.phys, fh.granules, fh.kind))
                return STOW_EBACKEND;
            (void)take_free_handle(pool, pool->free_handle_count - 1);
            continue;
        }
        stow_phys_t h;
        size_t h_granules;
        unsigned h_kind;
        stow_status_t st = unmap_oldest_idle(pool, synced, &h, &h_granules, &h_kind);
        if (st == STOW_ENOMEM) {
            if (!within_limit || none_idle)
                return STOW_ENOMEM;
            none_idle = true;
            continue;
        }
        if (st != STOW_OK)
            return st;
        if (h_granules == granules) {
            stow__acct_reserved_move(&pool->acct, h_kind, kind, bytes);
            *out = h;
            return STOW_OK;
        }
        note_peak_before_release(pool);
        if (!release_handle(pool, h, h_granules, h_kind)) {
            /* Short of host memory too: the handle stays counted, unmapped. */
            (void)push_free_handle(pool, h, h_granules, h_kind);
            return STOW_EBACKEND;
        }
    }
}

/* Granules [first, end) of a block that stops being live (freed, or never
 * backed; all_mapped says whether every granule of the span is mapped, as a
 * live block's are): the block leaves its edges' counts, and every granule of
 * the span that is mapped and overlapped by no other live block becomes
 * unused, in address order. Only an edge can still be overlapped by another
 * live block. Inlined: in a free its all_mapped tests fold away, and its call
 * cost about 5 instructions per event (bench/warm_instructions.sh). */
static inline __attribute__((always_inline)) void release_span(stow_pool_t *pool,
                                                             stow_segment_t *seg, size_t first,
                                                             size_t end, bool all_mapped)
{
    size_t last = end - 1, lo = first, hi = end;
    stow_assert_internal(seg->granules[first].edges > 0 && seg->granules[last].edges > 0);
    if (--seg->granules[first].edges)
        lo = first + 1;
    if (last != first && --seg->granules[last].edges)
        hi = last;
    if (all_mapped) {
        if (lo < hi)
            unused_push(pool, seg, lo, hi);
        return;
    }
    for (size_t i = next_bit(seg->mapped_bits, lo, hi, true); i < hi;) {
        size_t j = next_bit(seg->mapped_bits, i, hi, false);
        unused_push(pool, seg, i, j);
        i = next_bit(seg->mapped_bits, j, hi, true);
    }
}

/* Granules the pool could still put under a span: free handles', unused
 * mapped granules (an upper bound: those in mappings partly live cannot be
 * remapped) and new ones up to its limit. */
static uint64_t obtainable_granules(const stow_pool_t *pool)
{
    uint64_t may_hold = pool->limit_bytes >> pool->granularity_shift;
    uint64_t may_create = may_hold > pool->phys_granules ? may_hold - pool->phys_granules : 0;
    return pool->free_handle_granules + pool->unused_count + may_create;
}

/* After backing granules [first, end) of seg failed (what the span had mapped
 * is unused again): as many granules as the attempt created (phys_granules
 * above phys_before) go back to the device, first from the free-handle stack
 * (a handle whose map failed waits there), then from the idle mappings inside
 * the span, top down (the attempt's own and any the span held before: either
 * way room the failed request does not use), so that the layout elsewhere is
 * left as it was. A request the device cannot hold then leaves the pool
 * holding about what it held before, as a failed cudaMalloc grows nothing. */
static void give_back_created(stow_pool_t *pool, stow_segment_t *seg, size_t first, size_t end,
                              uint64_t phys_before, bool synced)
{
    while (pool->phys_granules > phys_before && pool->free_handle_count) {
        stow_free_handle_t fh = pool->free_handles[pool->free_handle_count - 1];
        if (!release_handle(pool, fh.phys, fh.granules, fh.kind))
            return;
        (void)take_free_handle(pool, pool->free_handle_count - 1);
    }
    if (pool->phys_granules <= phys_before)
        return;
    if (!synced) {
        /* A granule the span held unused before may still be used by queued
         * work (on a single-stream backend too). */
        if (!stow__pool_synchronize(pool))
            return;
    }
    for (size_t i = end; i > first && pool->phys_granules > phys_before;) {
        i--;
        if (!bit_at(seg->unused_bits, i))
            continue;
        size_t head = mapping_head(seg, i), m_end = mapping_end(seg, head);
        if (head >= first && m_end <= end && all_unused(seg, head, m_end)) {
            stow_phys_t h;
            if (unmap_idle(pool, seg, head, m_end, &h) != STOW_OK)
                return;
            if (!release_handle(pool, h, m_end - head, seg->pool_kind) &&
                push_free_handle(pool, h, m_end - head, seg->pool_kind) != STOW_OK)
                return; /* short of host memory: the handle stays counted, unmapped */
        }
        i = head > first ? head : first;
    }
}

/* The block's edges count it; lo_live and hi_live say whether another live
 * block held its first and last granule before. */
static inline __attribute__((always_inline)) void count_edges(stow_segment_t *seg, size_t first,
                                                            size_t end, bool *lo_live,
                                                            bool *hi_live)
{
    stow_granule_t *lo_g = &seg->granules[first], *hi_g = &seg->granules[end - 1];
    *lo_live = lo_g->edges != 0;
    *hi_live = end - 1 != first && hi_g->edges != 0;
    lo_g->edges++;
    if (end - 1 != first)
        hi_g->edges++;
}

/* The block of size_bytes over granules [first, end) is live from now on. */
static inline __attribute__((always_inline)) void note_backed(stow_pool_t *pool,
                                                            stow_segment_t *seg, size_t first,
                                                            size_t end, uint64_t size_bytes,
                                                            bool lo_live, bool hi_live)
{
    uint64_t bytes_after = pool->live_bytes + size_bytes;
    pool->live_bytes = bytes_after;
    if (bytes_after > pool->live_bytes_high_water)
        pool->live_bytes_high_water = bytes_after;
    note_beside_live(pool, seg->pool_kind, (end - first) - lo_live - hi_live, size_bytes, true);
    update_idle(pool);
}

/* A handle takes at most 1 / HANDLE_HEADROOM_SHARE of what the pool may still
 * take from the device (its limit less what it holds): a pool that runs close
 * to its limit maps single granules, as when every handle was one, because
 * there a granule that a handle partly live pins is memory the pool needs.
 * Minimum capacities (replay --min-capacity, 20 MiB handles): gpt2_generate
 * 1.0118 and gpt2_train 1.0089 x live with a share of 16, 1.0042 and 1.0023
 * with 4096, as with a handle per granule. On an H200's 141 GB, handles of
 * 20 MiB shrink once the pool is within 80 GB of the device's memory. */
#define HANDLE_HEADROOM_SHARE 4096

/* The largest handle, in granules (config vmm_handle_mb; at least one). A
 * pool whose planned layer may still plan maps a handle per granule: a
 * block that outlives the steps (weights) then pins no idle granule beside
 * an arena, and planned steps make no call. Once every key rests, the pool
 * maps as it does alone (docs/decisions.md, vmm_handle_mb). */
static size_t handle_max_granules(const stow_pool_t *pool)
{
    if (pool->fine_handles)
        return 1;
    size_t n = ((size_t)pool->tuning.vmm_handle_mb << 20) >> pool->granularity_shift;
    uint64_t limit = pool->limit_bytes >> pool->granularity_shift;
    uint64_t headroom = limit > pool->phys_granules ? limit - pool->phys_granules : 0;
    if (headroom / HANDLE_HEADROOM_SHARE < n)
        n = (size_t)(headroom / HANDLE_HEADROOM_SHARE);
    return n ? n : 1;
}

/* Maps one handle of n granules from granule `at` of seg. */
static stow_status_t map_handle(stow_pool_t *pool, stow_segment_t *seg, size_t at, size_t n,
                                uint64_t bytes_high_water, bool *synced)
{
    stow_phys_t h;
    stow_status_t st = obtain_handle(pool, seg->pool_kind, n, bytes_high_water, synced, &h);
    if (st != STOW_OK)
        return st;
    if (do_map(pool, seg, at, at + n, h) != STOW_OK) {
        (void)push_free_handle(pool, h, n, seg->pool_kind);
        return STOW_EBACKEND;
    }
    set_mapping(seg, at, at + n, h);
    pool->mapped_count += n;
    return STOW_OK;
}

/* Maps handles over the unmapped granules [from, to) of a block's span: a
 * granule of its own at each end of the stretch that the block covers only in
 * part (lo_partial, hi_partial: a neighbour may hold the rest of it, now or
 * later, and would pin a larger handle with it), and the granules between in
 * handles of at most handle_max_granules, of sizes as even as can be. */
static stow_status_t map_stretch(stow_pool_t *pool, stow_segment_t *seg, size_t from, size_t to,
                                 bool lo_partial, bool hi_partial, uint64_t bytes_high_water,
                                 bool *synced)
{
    size_t most = handle_max_granules(pool);
    if (to - from <= most)
        lo_partial = hi_partial = false; /* one handle: nothing larger to pin */
    size_t lo = from + (lo_partial && from < to), hi = to - (hi_partial && to > lo);
    stow_status_t st = STOW_OK;
    if (lo > from)
        st = map_handle(pool, seg, from, 1, bytes_high_water, synced);
    size_t inner = hi - lo, pieces = (inner + most - 1) / most;
    for (size_t k = 0, at = lo; st == STOW_OK && at < hi; k++) {
        size_t n = inner / pieces + (k < inner % pieces);
        st = map_handle(pool, seg, at, n, bytes_high_water, synced);
        at += n;
    }
    if (st == STOW_OK && hi < to)
        st = map_handle(pool, seg, hi, 1, bytes_high_water, synced);
    return st;
}

/* Granules the stretch [from, end) that ends the span of a block that lifts
 * the live peak, at the top of what its range ever mapped, may map beyond the
 * block: up to a whole number of the largest handles, into at most half the
 * room the allowance (and the limit) leaves after the stretch, so that remaps
 * keep the other half. Growth then maps a handle for several blocks, as a
 * range that grows by whole pages does, and the next blocks up take its unused
 * granules without a call. A loop that stays under its peak maps nothing
 * ahead. */
static size_t ahead_granules(const stow_pool_t *pool, const stow_segment_t *seg, size_t from,
                             size_t end, uint64_t bytes_high_water)
{
    size_t most = handle_max_granules(pool), len = end - from;
    if (end < seg->granules_touched || most < 2)
        return 0;
    size_t ahead = (most - len % most) % most;
    size_t seg_granules = seg->size_bytes >> pool->granularity_shift;
    if (ahead > seg_granules - end)
        ahead = seg_granules - end;
    uint64_t allowed = stow__vmm_allowance_for(pool, bytes_high_water);
    uint64_t limit = pool->limit_bytes >> pool->granularity_shift;
    if (limit < allowed)
        allowed = limit;
    uint64_t after = pool->phys_granules + len;
    uint64_t room = allowed > after ? (allowed - after) / 2 : 0;
    return ahead < room ? ahead : (size_t)room;
}

/* Mapped granules of [from, end) that hold no live block become unused (a
 * stretch mapped ahead of a block). */
static void push_mapped_unused(stow_pool_t *pool, stow_segment_t *seg, size_t from, size_t end)
{
    for (size_t i = next_bit(seg->mapped_bits, from, end, true); i < end;) {
        size_t j = next_bit(seg->mapped_bits, i, end, false);
        unused_push(pool, seg, i, j);
        i = next_bit(seg->mapped_bits, j, end, true);
    }
}

/* stow__vmm_back_span when some granule of the span is unmapped (at
 * first_unmapped): maps the span's unmapped granules. Apart from the steady
 * state's path, so that that one saves fewer registers. lo_partial and
 * hi_partial: the block covers its first and last granule only in part. */
static __attribute__((noinline)) stow_status_t
back_span_mapping(stow_pool_t *pool, stow_segment_t *seg, size_t size_bytes, size_t first,
                  size_t end, size_t first_unmapped, bool lo_partial, bool hi_partial)
{
    uint64_t bytes_after = pool->live_bytes + size_bytes;
    uint64_t bytes_high_water =
        bytes_after > pool->live_bytes_high_water ? bytes_after : pool->live_bytes_high_water;
    /* The block counts at its edges, and the span's unused granules leave their
     * runs (so that a remap cannot take them): a few bitmap words and run
     * entries, not a pass over the granules. */
    bool lo_live, hi_live;
    count_edges(seg, first, end, &lo_live, &hi_live);
    unused_take_within(pool, seg, first, end);
    /* More granules to map than the pool can get under its limit: fail
     * before mapping any, rather than map up to the limit, fail, and have the
     * out-of-memory retry do it all again. The count is taken only when the
     * span alone could be too many. */
    uint64_t obtainable = obtainable_granules(pool);
    if (end - first > obtainable && end - first - mapped_in(seg, first, end) > obtainable) {
        release_span(pool, seg, first, end, false);
        update_idle(pool);
        return STOW_ENOMEM;
    }
    /* Remaps take idle mappings only, none of which overlaps the span now, so
     * the span's mapped bits change in the loop below alone. */
    uint64_t phys_before = pool->phys_granules;
    bool synced = false;
    stow_status_t st = STOW_OK;
    size_t ahead_end = end;
    for (size_t i = first_unmapped; i < end && st == STOW_OK;
         i = next_bit(seg->mapped_bits, i, end, false)) {
        size_t to = next_bit(seg->mapped_bits, i, end, true);
        size_t map_to = to;
        if (to == end && bytes_after > pool->live_bytes_high_water)
            map_to = ahead_end = end + ahead_granules(pool, seg, i, end, bytes_high_water);
        st = map_stretch(pool, seg, i, map_to, lo_partial && i == first,
                         hi_partial && map_to == end, bytes_high_water, &synced);
        i = to;
    }
    if (ahead_end > end)
        push_mapped_unused(pool, seg, end, ahead_end);
    if (st != STOW_OK) {
        /* Nothing becomes live: what the span had mapped goes (back) to unused,
         * and what this attempt created goes back to the device. The handles
         * it created were the device's memory all the same: when they made a
         * new reserved peak, the waste breakdown is taken now, at that peak
         * (the failed request returns before stow_pool_alloc would take it,
         * and the next success took it at whatever it held then). */
        release_span(pool, seg, first, end, false);
        update_idle(pool);
        if (pool->acct.reserved_peak_moved)
            stow__acct_note_waste_if_peak(&pool->acct, stow__pool_largest_free(pool));
        give_back_created(pool, seg, first, ahead_end, phys_before, synced);
        update_idle(pool);
        return st;
    }
    /* The granules that become live join the footprint of the adaptive
     * allowance's run (the only place a granule becomes live: a block inside
     * one granule a live block holds takes the fast path, and its bit is set). */
    bits_fill(seg->seen_live_bits, first, end, true);
    note_backed(pool, seg, first, end, size_bytes, lo_live, hi_live);
    return STOW_OK;
}

stow_status_t stow__vmm_back_span(stow_pool_t *pool, stow_block_t *b, size_t size_bytes,
                                  size_t first, size_t end)
{
    /* (A block inside one granule that a live block holds took the inline
     * fast path, stow__vmm_back.) */
    stow_segment_t *seg = b->segment;
    size_t first_unmapped = next_bit(seg->mapped_bits, first, end, false);
    if (first_unmapped != end) {
        size_t g_mask = pool->granularity_bytes - 1;
        return back_span_mapping(pool, seg, size_bytes, first, end, first_unmapped,
                                 ((b->addr - seg->base) & g_mask) != 0,
                                 ((b->addr + size_bytes - seg->base) & g_mask) != 0);
    }
    /* Every granule of the span is mapped, the steady state: only the edges
     * can hold another live block (the interior lies inside one free block),
     * so the unused ones are the span less its live edges, one stretch, and
     * nothing needs mapping. This skips the scans of the unused bits and the
     * count of obtainable handles. The granules taken become live: unused_take
     * adds them to the seen-live footprint of the adaptive allowance's run (the
     * span's live edges are in it already). */
    bool lo_live, hi_live;
    count_edges(seg, first, end, &lo_live, &hi_live);
    size_t lo = first + lo_live, hi = end - hi_live;
    if (lo < hi)
        unused_take(pool, seg, lo, hi, true);
    note_backed(pool, seg, first, end, size_bytes, lo_live, hi_live);
    return STOW_OK;
}

void stow__vmm_unback_span(stow_pool_t *pool, stow_block_t *b, size_t first, size_t end)
{
    stow_segment_t *seg = b->segment;
    stow_assert_internal(pool->live_bytes >= b->size_bytes);
    pool->live_bytes -= b->size_bytes;
    pool->extra_granules_live -= b->extra_granules;
    b->extra_granules = 0;
    size_t unused_before = pool->unused_count;
    release_span(pool, seg, first, end, true);
    size_t released = pool->unused_count - unused_before;
    if (released)
        stow__vmm_note_unused_pushed(pool, b->owner);
    note_beside_live(pool, seg->pool_kind, released, b->size_bytes, false);
    update_idle(pool);
}

/* ---- virtual ranges ---- */

/* A range holds requests of every size; another comes only when no free
 * block of those held fits a request. */
#define RANGE_BYTES ((size_t)64 << 30)

stow_status_t stow__vmm_grow(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                             size_t rounded, stow_block_t **out)
{
    size_t g = pool->granularity_bytes;
    size_t chunk = RANGE_BYTES;
    if (rounded > SIZE_MAX - (g - 1))
        return STOW_EOVERFLOW;
    size_t size = (rounded + g - 1) & ~(g - 1);
    /* A block larger than the pool may ever hold can never be backed: say so
     * before building a range (and its granule array) for it. */
    if (size > pool->limit_bytes)
        return STOW_ENOMEM;
    if (size < chunk)
        size = chunk;
    if (size / g > UINT32_MAX) /* granule indexes are 32-bit (run ends) */
        return STOW_ENOMEM;
    size_t words = (size / g + 63) / 64;
    stow_segment_t *seg = calloc(1, sizeof *seg);
    stow_block_t *b = stow__block_new(&pool->blocks);
    stow_granule_t *granules = calloc(size / g, sizeof *granules);
    /* mapped, unused, run starts, seen live, mapping starts */
    uint64_t *mapped_bits = calloc(5 * words, sizeof *mapped_bits);
    if (!seg || !b || !granules || !mapped_bits) {
        free(seg);
        free(granules);
        free(mapped_bits);
        if (b)
            stow__block_delete(&pool->blocks, b);
        return STOW_EHOSTMEM;
    }
    void *va = NULL;
    stow_status_t st =
        stow__backend_status(pool, pool->backend->va_reserve(pool->backend->ctx, size, &va));
    if (st != STOW_OK) {
        free(seg);
        free(granules);
        free(mapped_bits);
        stow__block_delete(&pool->blocks, b);
        return st == STOW_ENOMEM ? STOW_ENOMEM : STOW_EBACKEND;
    }
    seg->granules = granules;
    seg->mapped_bits = mapped_bits;
    seg->unused_bits = mapped_bits + words;
    seg->run_start_bits = mapped_bits + 2 * words;
    seg->seen_live_bits = mapped_bits + 3 * words;
    seg->map_start_bits = mapped_bits + 4 * words;
    stow__stat2_add(pool->acct.s.segment, kind, 1);
    stow__segment_install(pool, seg, b, ss, (uintptr_t)va, size, kind);
    *out = b;
    return STOW_OK;
}

/* ---- giving memory back ---- */

static void release_free_handles(stow_pool_t *pool)
{
    size_t kept = 0;
    for (size_t i = 0; i < pool->free_handle_count; i++) {
        stow_free_handle_t fh = pool->free_handles[i];
        if (release_handle(pool, fh.phys, fh.granules, fh.kind))
            pool->free_handle_granules -= fh.granules;
        else
            pool->free_handles[kept++] = fh;
    }
    pool->free_handle_count = kept;
}

uint64_t stow__vmm_releasable_bytes(const stow_pool_t *pool)
{
    uint64_t granules = pool->free_handle_granules;
    for (const stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (!seg->granules)
            continue;
        for (size_t i = next_bit(seg->unused_bits, 0, seg->granules_touched, true);
             i < seg->granules_touched;) {
            size_t head = mapping_head(seg, i), end = mapping_end(seg, head);
            if (all_unused(seg, head, end))
                granules += end - head;
            i = next_bit(seg->unused_bits, end, seg->granules_touched, true);
        }
    }
    return granule_bytes(pool, granules);
}

void stow__vmm_release_unused(stow_pool_t *pool)
{
    /* Caller synchronized: no queued work can touch an unused granule. Every
     * idle mapping is unmapped; unused granules in a mapping that also holds a
     * live block stay (a handle is unmapped only whole). */
    for (stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (!seg->granules)
            continue;
        for (size_t i = next_bit(seg->unused_bits, 0, seg->granules_touched, true);
             i < seg->granules_touched;) {
            size_t head = mapping_head(seg, i), end = mapping_end(seg, head);
            stow_phys_t h;
            if (all_unused(seg, head, end) && unmap_idle(pool, seg, head, end, &h) == STOW_OK &&
                push_free_handle(pool, h, end - head, seg->pool_kind) != STOW_OK)
                (void)release_handle(pool, h, end - head, seg->pool_kind); /* no room to keep it */
            i = next_bit(seg->unused_bits, end, seg->granules_touched, true);
        }
    }
    release_free_handles(pool);
    /* What remains mapped is live data and the handles it holds in part: that
     * is the new high-water baseline, of live bytes and of handles held. */
    pool->live_bytes_high_water = pool->live_bytes;
    pool->phys_granules_high_water = pool->phys_granules;
    update_idle(pool);
}

/* Destroy path: every mapping, handle and range goes back. */
void stow__vmm_release_segment(stow_pool_t *pool, stow_segment_t *seg)
{
    /* Only granules below granules_touched were ever mapped. */
    unused_take_within(pool, seg, 0, seg->granules_touched);
    for (size_t head = next_bit(seg->map_start_bits, 0, seg->granules_touched, true);
         head < seg->granules_touched;) {
        size_t end = mapping_end(seg, head), granules = end - head;
        stow_phys_t h = seg->granules[head].phys;
        uint64_t bytes = granule_bytes(pool, granules);
        (void)do_unmap(pool, seg, head, end);
        pool->mapped_count -= granules;
        if (stow__backend_status(pool, pool->backend->phys_release(pool->backend->ctx, h,
                                                                   (size_t)bytes)) == STOW_OK)
            pool->acct.s.num_device_free++;
        pool->phys_granules -= granules;
        stow__acct_reserved_sub(&pool->acct, seg->pool_kind, bytes);
        set_mapping(seg, head, end, 0);
        head = next_bit(seg->map_start_bits, end, seg->granules_touched, true);
    }
    stow__backend_status(pool, pool->backend->va_release(pool->backend->ctx, (void *)seg->base,
                                                         seg->size_bytes));
    stow__stat2_sub(pool->acct.s.segment, seg->pool_kind, 1);
    free(seg->granules);
    free(seg->mapped_bits); /* and the four bitmaps after it */
    seg->granules = NULL;
    seg->mapped_bits = seg->unused_bits = seg->run_start_bits = seg->seen_live_bits = NULL;
    seg->map_start_bits = NULL;
}

void stow__vmm_release_all_handles(stow_pool_t *pool)
{
    release_free_handles(pool);
    free(pool->free_handles);
    pool->free_handles = NULL;
    pool->free_handle_count = pool->free_handle_capacity = 0;
    update_idle(pool);
}
