/*
 * allocator/vmm.c: page-mapped segments (policy vmm).
 *
 * Blocks live in large virtual ranges, small and large requests alike, placed
 * by the same exact best fit as the classic pool; physical memory is mapped in
 * granules (2 MiB on CUDA) only under live blocks.
 * Physical granules are fungible: when a block needs a granule mapped and the
 * pool already holds as much physical memory as its live bytes ever needed
 * (times 1 + vmm_slack), it takes a granule that holds no live block
 * elsewhere (oldest first), unmaps it and maps it where it is needed,
 * instead of taking more from the device. So reserved memory tracks the
 * high-water mark of live bytes, not what fragmentation strands; it exceeds
 * that only when live blocks themselves pin more granules (blocks that share
 * a granule with a free hole).
 *
 * Stream safety: a granule is unmapped only once no queued work can use it,
 * because unmapping is not stream-ordered: not even on a backend without
 * events, whose single stream still queues work. A remap knows it from events
 * recorded after the granule's blocks were freed, or synchronizes the device
 * (vmm_epochs.c); empty_cache, the out-of-memory retry and
 * destroy synchronize before they unmap.
 * Reserved bytes = physical granules the pool holds (mapped or not).
 *
 * This file backs and unbacks blocks' spans of granules, keeps the runs of
 * unused granules and the free handles, remaps, and builds and releases the
 * ranges. Beside it: vmm_allowance.c (how many granules the pool may hold),
 * vmm_epochs.c (when an unused granule may be unmapped), vmm_place.c (where a
 * big request goes), vmm_check.c (the invariants) and vmm_granules.h (the
 * bitmaps). Every function here is called with the pool lock held.
 */
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
        tail->unused_epoch = pool->unmap_epoch; /* the newest part decides */
    } else {
        stow_granule_t *h = &seg->granules[from];
        h->run_end = (uint32_t)end;
        h->unused_epoch = pool->unmap_epoch;
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
        (uint64_t)(pool->unused_count + pool->free_handle_count) * pool->granularity_bytes;
}

/* What the pool holds beside live data in ranges of `kind`, and can neither
 * use for another request size nor release (inactive_split_bytes): the free
 * bytes of live granules, granule bytes under live blocks less their bytes.
 * A block of `bytes` that made `granules` more granules live (backed; add) or
 * left them (unbacked) moves it by the difference, in one step so that its
 * peak never sees a value between. A remap moves a granule from idle to live
 * and its reserved bytes between kinds, changing no kind's figure. */
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

static stow_status_t push_free_handle(stow_pool_t *pool, stow_phys_t h, unsigned kind)
{
    if (pool->free_handle_count == pool->free_handle_capacity) {
        size_t cap = pool->free_handle_capacity ? pool->free_handle_capacity * 2 : 64;
        stow_free_handle_t *grown = realloc(pool->free_handles, cap * sizeof *grown);
        if (!grown)
            return STOW_EHOSTMEM;
        pool->free_handles = grown;
        pool->free_handle_capacity = cap;
    }
    pool->free_handles[pool->free_handle_count].phys = h;
    pool->free_handles[pool->free_handle_count].kind = (uint8_t)kind;
    pool->free_handle_count++;
    return STOW_OK;
}

static void set_mapped(stow_granule_t *g, stow_phys_t h)
{
    stow_segment_t *seg = g->segment;
    size_t i = granule_no(seg, g);
    g->phys = h;
    bit_put(seg->mapped_bits, i, h != 0);
    if (h && i >= seg->granules_touched)
        seg->granules_touched = i + 1;
}

/* ---- backend calls ---- */

static stow_status_t do_unmap(stow_pool_t *pool, stow_granule_t *g)
{
    pool->acct.s.num_unmap_calls++;
    uintptr_t va = granule_va(pool, g);
    stow__record(pool, STOW_REC_UNMAP, va, pool->granularity_bytes, 0, 0);
    return stow__backend_status(pool, pool->backend->unmap(pool->backend->ctx, (void *)va,
                                                           pool->granularity_bytes));
}

static stow_status_t do_map(stow_pool_t *pool, stow_granule_t *g, stow_phys_t h)
{
    pool->acct.s.num_map_calls++;
    uintptr_t va = granule_va(pool, g);
    stow__record(pool, STOW_REC_MAP, va, pool->granularity_bytes, 0, 0);
    return stow__backend_status(
        pool, pool->backend->map(pool->backend->ctx, (void *)va, pool->granularity_bytes, h));
}

/* Unmaps the oldest unused granule, the first of the oldest run (one must
 * exist): *phys gets its handle, *kind its range's pool kind. Nothing changes
 * when the unmap fails. */
static stow_status_t unmap_unused(stow_pool_t *pool, stow_granule_t *g, stow_phys_t *phys,
                                  unsigned *kind)
{
    if (do_unmap(pool, g) != STOW_OK)
        return STOW_EBACKEND;
    size_t i = granule_no(g->segment, g);
    unused_take(pool, g->segment, i, i + 1, false);
    *phys = g->phys;
    *kind = g->segment->pool_kind;
    set_mapped(g, 0);
    pool->mapped_count--;
    return STOW_OK;
}

static stow_status_t unmap_oldest_unused(stow_pool_t *pool, stow_phys_t *phys, unsigned *kind)
{
    return unmap_unused(pool, pool->run_head, phys, kind);
}

/* Obtains one physical handle for a granule of `kind`: a free handle, a new
 * one, or one taken from an unused mapped granule (after *synced). */
static stow_status_t obtain_handle(stow_pool_t *pool, unsigned kind,
                                   uint64_t live_bytes_high_water, bool *synced, stow_phys_t *out)
{
    if (pool->free_handle_count) {
        stow_free_handle_t fh = pool->free_handles[--pool->free_handle_count];
        stow__acct_reserved_move(&pool->acct, fh.kind, kind, pool->granularity_bytes);
        *out = fh.phys;
        return STOW_OK;
    }
    if (stow__vmm_may_create(pool, live_bytes_high_water)) {
        stow_phys_t h = 0;
        stow_status_t st = stow__backend_status(
            pool, pool->backend->phys_create(pool->backend->ctx, pool->granularity_bytes, &h));
        if (st == STOW_OK) {
            pool->phys_count++;
            pool->acct.s.num_device_alloc++;
            stow__acct_reserved_add(&pool->acct, kind, pool->granularity_bytes);
            *out = h;
            return STOW_OK;
        }
        if (st != STOW_ENOMEM)
            return STOW_EBACKEND;
    }
    if (!pool->run_head)
        return STOW_ENOMEM;
    if (!stow__vmm_oldest_unused_ready(pool, *synced)) {
        /* The granule's last blocks may still be used by queued work, on any
         * stream or on a single-stream backend's only one: unmapping is not
         * stream-ordered. */
        if (!stow__pool_synchronize(pool))
            return STOW_EBACKEND;
        *synced = true;
    }
    unsigned from_kind;
    if (unmap_oldest_unused(pool, out, &from_kind) != STOW_OK)
        return STOW_EBACKEND;
    stow__vmm_note_remap(pool);
    stow__acct_reserved_move(&pool->acct, from_kind, kind, pool->granularity_bytes);
    return STOW_OK;
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

/* Handles the pool could still put under granules: free ones, unused mapped
 * granules (remapped) and new ones up to its limit. */
static uint64_t obtainable_handles(const stow_pool_t *pool)
{
    uint64_t may_hold = pool->limit_bytes >> pool->granularity_shift;
    uint64_t may_create = may_hold > pool->phys_count ? may_hold - pool->phys_count : 0;
    return pool->free_handle_count + pool->unused_count + may_create;
}

/* Gives handle h back to the device; false (h not released) on a refusal. */
static bool release_handle(stow_pool_t *pool, stow_phys_t h, unsigned kind)
{
    if (stow__backend_status(pool, pool->backend->phys_release(pool->backend->ctx, h,
                                                               pool->granularity_bytes)) !=
        STOW_OK)
        return false;
    pool->phys_count--;
    pool->acct.s.num_device_free++;
    stow__acct_reserved_sub(&pool->acct, kind, pool->granularity_bytes);
    return true;
}

/* After backing granules [first, end) of seg failed (what the span had mapped
 * is unused again): as many handles as the attempt created (phys_count above
 * phys_before) go back to the device, first from the free-handle stack (a
 * handle whose map failed waits there), then from the span's unused granules,
 * top down (the attempt's own and any the span held before: either way room
 * the failed request does not use), so that the layout elsewhere is left as it
 * was. A request the device cannot hold then leaves the pool holding what it
 * held before, as a failed cudaMalloc grows nothing; before, a page-mapped pool
 * was left holding every granule it could get (on a 1 GiB device, 1 GiB for
 * 68 MiB of live data). */
static void give_back_created(stow_pool_t *pool, stow_segment_t *seg, size_t first, size_t end,
                              uint64_t phys_before, bool synced)
{
    while (pool->phys_count > phys_before && pool->free_handle_count) {
        stow_free_handle_t fh = pool->free_handles[pool->free_handle_count - 1];
        if (!release_handle(pool, fh.phys, fh.kind))
            return;
        pool->free_handle_count--;
    }
    if (pool->phys_count <= phys_before)
        return;
    if (!synced) {
        /* A granule the span held unused before may still be used by queued
         * work (on a single-stream backend too). */
        if (!stow__pool_synchronize(pool))
            return;
    }
    for (size_t i = end; i > first && pool->phys_count > phys_before;) {
        i--;
        if (!bit_at(seg->unused_bits, i))
            continue;
        stow_phys_t h;
        unsigned kind;
        if (unmap_unused(pool, &seg->granules[i], &h, &kind) != STOW_OK)
            return;
        if (!release_handle(pool, h, kind) && push_free_handle(pool, h, kind) != STOW_OK)
            return; /* short of host memory: the handle stays counted, unmapped */
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

/* stow__vmm_back_span when some granule of the span is unmapped (at
 * first_unmapped): maps the span's unmapped granules. Apart from the steady
 * state's path, so that that one saves fewer registers. */
static __attribute__((noinline)) stow_status_t back_span_mapping(stow_pool_t *pool,
                                                                 stow_segment_t *seg,
                                                                 size_t size_bytes, size_t first,
                                                                 size_t end, size_t first_unmapped)
{
    uint64_t bytes_after = pool->live_bytes + size_bytes;
    uint64_t bytes_high_water =
        bytes_after > pool->live_bytes_high_water ? bytes_after : pool->live_bytes_high_water;
    /* The block counts at its edges, and the span's unused granules leave their
     * runs (so that obtain_handle below cannot take them): a few bitmap words
     * and run entries, not a pass over the granules. */
    bool lo_live, hi_live;
    count_edges(seg, first, end, &lo_live, &hi_live);
    unused_take_within(pool, seg, first, end);
    /* More granules to map than the pool can get under its limit: fail
     * before mapping any, rather than map up to the limit, fail, and have the
     * out-of-memory retry do it all again. The count is taken only when the
     * span alone could be too many. */
    uint64_t obtainable = obtainable_handles(pool);
    if (end - first > obtainable && end - first - mapped_in(seg, first, end) > obtainable) {
        release_span(pool, seg, first, end, false);
        update_idle(pool);
        return STOW_ENOMEM;
    }
    /* Remaps take unused granules only, so the span's mapped bits change in the
     * loop below alone. */
    uint64_t phys_before = pool->phys_count;
    bool synced = false;
    stow_status_t st = STOW_OK;
    for (size_t i = first_unmapped; i < end && st == STOW_OK;
         i = next_bit(seg->mapped_bits, i + 1, end, false)) {
        stow_granule_t *g = &seg->granules[i];
        g->segment = seg; /* entries start zeroed (vmm_grow): set when first mapped */
        stow_phys_t h;
        st = obtain_handle(pool, seg->pool_kind, bytes_high_water, &synced, &h);
        if (st == STOW_OK && (st = do_map(pool, g, h)) != STOW_OK) {
            (void)push_free_handle(pool, h, seg->pool_kind);
            st = STOW_EBACKEND;
        }
        if (st == STOW_OK) {
            set_mapped(g, h);
            pool->mapped_count++;
        }
    }
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
        give_back_created(pool, seg, first, end, phys_before, synced);
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
    if (first_unmapped != end)
        return back_span_mapping(pool, seg, size_bytes, first, end, first_unmapped);
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
    /* mapped, unused, run starts, seen live */
    uint64_t *mapped_bits = calloc(4 * words, sizeof *mapped_bits);
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
        if (!release_handle(pool, fh.phys, fh.kind))
            pool->free_handles[kept++] = fh;
    }
    pool->free_handle_count = kept;
}

void stow__vmm_release_unused(stow_pool_t *pool)
{
    /* Caller synchronized: no queued work can touch an unused granule. */
    stow_phys_t h;
    unsigned kind;
    while (pool->run_head && unmap_oldest_unused(pool, &h, &kind) == STOW_OK) {
        if (push_free_handle(pool, h, kind) != STOW_OK)
            (void)release_handle(pool, h, kind); /* no room to remember it: release it now */
    }
    release_free_handles(pool);
    /* What remains mapped is live data: that is the new high-water baseline. */
    pool->live_bytes_high_water = pool->live_bytes;
    update_idle(pool);
}

/* Destroy path: every granule, handle and range goes back. */
void stow__vmm_release_segment(stow_pool_t *pool, stow_segment_t *seg)
{
    /* Only granules below granules_touched were ever mapped. */
    unused_take_within(pool, seg, 0, seg->granules_touched);
    for (size_t i = 0; i < seg->granules_touched; i++) {
        stow_granule_t *g = &seg->granules[i];
        if (!g->phys)
            continue;
        (void)do_unmap(pool, g);
        pool->mapped_count--;
        if (stow__backend_status(pool, pool->backend->phys_release(pool->backend->ctx, g->phys,
                                                                   pool->granularity_bytes)) ==
            STOW_OK)
            pool->acct.s.num_device_free++;
        pool->phys_count--;
        stow__acct_reserved_sub(&pool->acct, g->segment->pool_kind, pool->granularity_bytes);
        set_mapped(g, 0);
    }
    stow__backend_status(pool, pool->backend->va_release(pool->backend->ctx, (void *)seg->base,
                                                         seg->size_bytes));
    stow__stat2_sub(pool->acct.s.segment, seg->pool_kind, 1);
    free(seg->granules);
    free(seg->mapped_bits); /* and the three bitmaps after it */
    seg->granules = NULL;
    seg->mapped_bits = seg->unused_bits = seg->run_start_bits = seg->seen_live_bits = NULL;
}

void stow__vmm_release_all_handles(stow_pool_t *pool)
{
    release_free_handles(pool);
    free(pool->free_handles);
    pool->free_handles = NULL;
    pool->free_handle_count = pool->free_handle_capacity = 0;
    update_idle(pool);
}

