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
 * (stream safety of remaps, below); empty_cache, the out-of-memory retry and
 * destroy synchronize before they unmap.
 * Reserved bytes = physical granules the pool holds (mapped or not).
 */
#include "allocator/internal.h"

#include <string.h>

/* ---- granule bitmaps ---- */

static bool bit_at(const uint64_t *bits, size_t i) { return (bits[i / 64] >> (i % 64)) & 1; }

static void bit_put(uint64_t *bits, size_t i, bool value)
{
    uint64_t bit = (uint64_t)1 << (i % 64);
    if (value)
        bits[i / 64] |= bit;
    else
        bits[i / 64] &= ~bit;
}

/* Sets (value) or clears bits [from, end): masks for the first and last
 * words, whole-word stores between them (a freed big block's span is tens of
 * words, and this runs when it is freed and when it is backed again). */
static inline __attribute__((always_inline)) void bits_fill(uint64_t *bits, size_t from,
                                                          size_t end, bool value)
{
    if (from >= end)
        return;
    size_t w = from / 64, w_last = (end - 1) / 64;
    uint64_t first_mask = ~(uint64_t)0 << (from % 64);
    uint64_t last_mask = ~(uint64_t)0 >> (63 - (end - 1) % 64);
    if (w == w_last)
        first_mask &= last_mask;
    if (value)
        bits[w] |= first_mask;
    else
        bits[w] &= ~first_mask;
    if (w == w_last)
        return;
    uint64_t whole = value ? ~(uint64_t)0 : 0;
    while (++w < w_last)
        bits[w] = whole;
    if (value)
        bits[w_last] |= last_mask;
    else
        bits[w_last] &= ~last_mask;
}

/* First i in [from, end) whose bit is `value`, or end. */
static size_t next_bit(const uint64_t *bits, size_t from, size_t end, bool value)
{
    while (from < end) {
        uint64_t word = bits[from / 64];
        word = (value ? word : ~word) & (~(uint64_t)0 << (from % 64));
        if (word) {
            size_t i = (from & ~(size_t)63) + (size_t)__builtin_ctzll(word);
            return i < end ? i : end;
        }
        from = (from & ~(size_t)63) + 64;
    }
    return end;
}

/* Highest set bit at or below i; one must exist. */
static size_t prev_set_bit(const uint64_t *bits, size_t i)
{
    size_t w = i / 64;
    uint64_t word = bits[w] & (~(uint64_t)0 >> (63 - i % 64));
    while (!word)
        word = bits[--w];
    return w * 64 + 63 - (size_t)__builtin_clzll(word);
}

/* Bits set in x. __builtin_popcountll is a libgcc call on baseline x86-64
 * (no POPCNT instruction assumed), which placement makes tens of thousands of
 * times per training step; this is the same count inline. */
static unsigned popcount64(uint64_t x)
{
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (unsigned)((x * 0x0101010101010101ull) >> 56);
}

/* ---- runs of unused granules (oldest first) and free handles ---- */

static size_t granule_no(const stow_segment_t *seg, const stow_granule_t *g)
{
    return (size_t)(g - seg->granules);
}

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
 * (stream safety, below). A freed block's granules are thus queued in address
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
 * list; a run cut in two becomes two entries side by side. */
static inline __attribute__((always_inline)) void unused_take(stow_pool_t *pool,
                                                            stow_segment_t *seg, size_t from,
                                                            size_t end)
{
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
        unused_take(pool, seg, i, j);
        i = next_bit(seg->unused_bits, j, end, true);
    }
}

/* Idle physical memory: unused mapped granules and unmapped handles. And what
 * the pool holds but can neither use for another request size nor release:
 * the free bytes of granules that also hold live data (reserved - live -
 * idle), its inactive_split_bytes (the fast paths of stow__vmm_back and
 * _unback move it by the block's bytes themselves). */
static void update_idle(stow_pool_t *pool)
{
    pool->acct.idle_segment_bytes =
        (uint64_t)(pool->unused_count + pool->free_handle_count) * pool->granularity_bytes;
    uint64_t held = pool->acct.s.reserved_bytes[STOW_POOL_ALL].current;
    stow__stat2_set(pool->acct.s.inactive_split_bytes, STOW_POOL_LARGE,
                    held - pool->live_bytes - pool->acct.idle_segment_bytes);
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

/* Granules [first, end) overlapped by [addr, addr + size). */
static void granule_span(const stow_pool_t *pool, const stow_segment_t *seg, uintptr_t addr,
                         size_t size, size_t *first, size_t *end)
{
    *first = stow__granule_of(pool, seg, addr);
    *end = stow__granule_of(pool, seg, addr + size - 1) + 1;
}

/* A granule's address: entries do not store it, so that a new range's array
 * is calloc'ed zero pages nobody touches until a granule is mapped. */
static uintptr_t granule_va(const stow_pool_t *pool, const stow_granule_t *g)
{
    const stow_segment_t *seg = g->segment;
    return seg->base + (uintptr_t)granule_no(seg, g) * pool->granularity_bytes;
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

/* The granules the pool may hold while some mapped granule sits unused:
 * (1 + slack) times the high-water mark of live bytes, in whole granules
 * rounded down, and never fewer than that mark needs (rounded up). Measured in
 * bytes, not in live granules, so that granules which live blocks share only
 * partly (at the edges of free holes) do not raise the allowance, and rounded
 * down, so that the allowance alone never takes reserved memory beyond
 * (1 + vmm_slack) x the live peak, however small the pool: only a layout whose
 * live blocks pin more granules can. */
static uint64_t allowed_granules(const stow_pool_t *pool, uint64_t live_bytes_high_water)
{
    uint64_t g = pool->granularity_bytes;
    uint64_t live = live_bytes_high_water / g + (live_bytes_high_water % g != 0);
    double with_slack = (double)live_bytes_high_water * (1.0 + pool->adapt.slack) / (double)g;
    uint64_t allowed = (uint64_t)with_slack;
    return allowed > live ? allowed : live;
}

static bool may_create(const stow_pool_t *pool, uint64_t live_bytes_high_water)
{
    uint64_t g = pool->granularity_bytes;
    uint64_t held = pool->phys_count * g;
    if (held + g > pool->limit_bytes)
        return false;
    /* Beyond the allowance, an unused mapped granule is remapped instead; when
     * none is left, live blocks themselves need more. */
    return pool->phys_count < allowed_granules(pool, live_bytes_high_water) ||
           pool->unused_count == 0;
}

/* The adaptive allowance (docs/design.md). A pool whose steady state needs
 * more granules over a step than its allowance (a loop whose big blocks land
 * somewhere else each time) remaps on every step for good: about 37 us per
 * granule on an H200, plus a device synchronize per allocation that remaps
 * (h200-costs.md), which can cost a training step tens of milliseconds. So a
 * pool that keeps remapping keeps more: when ADAPT_HOT_WINDOWS windows of
 * ADAPT_WINDOW_OPS pool operations in a row each remap at least once per
 * ADAPT_HOT_OPS_PER_REMAP operations (hot), the slack grows (up to
 * vmm_slack_max), and again after the next such run, as long as each raise cut
 * the remap rate by ADAPT_MIN_GAIN or more; then it stays. The run is long
 * (65,536 operations) so that a pool settling by itself is not raised: a
 * single replay of a held-out trace never raises it. As many windows in a row
 * that each remap at least once per ADAPT_WARM_OPS_PER_REMAP operations, some
 * less than hot (a warm run), raise the slack only to a footprint within
 * ADAPT_WARM_SLACK_FACTOR x vmm_slack, a small raise that ends the remapping,
 * and never settle it. Why warm runs count at all: remapping belongs under
 * memory pressure, not in a loop's steady state; while only hot runs did,
 * vit_train's long run remapped 10 granules a step for good (one remap per
 * about 215 operations), each allocation that remapped synchronizing the
 * device, to keep 0.15 % of its memory (docs/design.md, adaptive allowance). */
#define ADAPT_WINDOW_OPS 8192
#define ADAPT_HOT_WINDOWS 8
#define ADAPT_HOT_OPS_PER_REMAP 64
#define ADAPT_WARM_OPS_PER_REMAP 1024
#define ADAPT_WARM_SLACK_FACTOR 2.0
#define ADAPT_GROWTH 1.5
#define ADAPT_MIN_GAIN 0.05
#define ADAPT_MIN_SLACK 0.005

/* The footprint of a run of windows: the granules its live blocks touched.
 * A run may begin where a window begins with none hot before it; from there
 * the seen-live bits are the granules live then, and stow__vmm_back_span adds
 * every span it backs. Cost: a pass over the bitmap words of the granules
 * ever mapped, once per window of a pool that remaps. */
static void seen_live_restart(stow_pool_t *pool)
{
    for (stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (!seg->granules)
            continue;
        size_t words = (seg->granules_touched + 63) / 64;
        for (size_t w = 0; w < words; w++)
            seg->seen_live_bits[w] = seg->mapped_bits[w] & ~seg->unused_bits[w];
    }
}

static uint64_t seen_live_count(const stow_pool_t *pool)
{
    uint64_t n = 0;
    for (const stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (!seg->granules)
            continue;
        size_t words = (seg->granules_touched + 63) / 64;
        for (size_t w = 0; w < words; w++)
            n += popcount64(seg->seen_live_bits[w]);
    }
    return n;
}

/* The slack whose allowance holds the run's footprint, plus the granule that
 * rounding the allowance down can cost: what keeps a loop whose layout
 * repeats from remapping at all. */
static double footprint_slack(const stow_pool_t *pool)
{
    double live_hw_granules =
        (double)pool->live_bytes_high_water / (double)pool->granularity_bytes;
    if (live_hw_granules <= 0)
        return 0;
    return ((double)seen_live_count(pool) + 1.0) / live_hw_granules - 1.0;
}

/* The end of a run of hot windows: unless the last raise (if any) failed to
 * cut the remap rate enough (then the slack stays, for good), raise the slack
 * to cover the run's footprint, or by half when the footprint is covered
 * already (the layout itself still moves). Until the thirty-first session
 * every raise was by half: a loop whose footprint lay further above the
 * allowance crept up in raises that each helped too little, and stopped
 * there, remapping on every step (docs/design.md, adaptive allowance). */
static void end_hot_run(stow_pool_t *pool, stow_vmm_adapt_t *a)
{
    double rate = (double)a->hot_remaps / (double)a->hot_ops;
    if (a->rate_at_last_raise > 0 && rate > a->rate_at_last_raise * (1.0 - ADAPT_MIN_GAIN)) {
        a->settled = true; /* the last raise did not help: keep it, no more */
        return;
    }
    double needed = footprint_slack(pool);
    a->slack = needed > a->slack ? needed : a->slack * ADAPT_GROWTH;
    if (a->slack < ADAPT_MIN_SLACK)
        a->slack = ADAPT_MIN_SLACK; /* from a slack of 0 */
    if (a->slack >= pool->config.vmm_slack_max) {
        a->slack = pool->config.vmm_slack_max;
        a->settled = true;
    }
    a->rate_at_last_raise = rate;
    pool->acct.s.num_vmm_allowance_raises++;
}

/* The end of a warm run: the slack goes to the footprint since the last
 * window before this one that was not hot (this window at least: the seen-live
 * bits restart after every window that is not hot), when that is above the
 * slack and within ADAPT_WARM_SLACK_FACTOR x vmm_slack (and vmm_slack_max);
 * else nothing changes. Rare remaps buy little memory: on the back-to-back mixes of
 * docs/design.md (adaptive allowance), warm raises to footprints up to
 * vmm_slack_max took pools to 1.033-1.038 x live and left them remapping. */
static void end_warm_run(stow_pool_t *pool, stow_vmm_adapt_t *a)
{
    double needed = footprint_slack(pool);
    double limit = ADAPT_WARM_SLACK_FACTOR * pool->config.vmm_slack;
    if (limit > pool->config.vmm_slack_max)
        limit = pool->config.vmm_slack_max;
    if (needed <= a->slack || needed > limit)
        return;
    a->slack = needed;
    pool->acct.s.num_vmm_allowance_raises++;
}

/* Counts one remap and closes the window it ends, if any. */
static void note_remap(stow_pool_t *pool)
{
    stow_vmm_adapt_t *a = &pool->adapt;
    if (a->settled)
        return;
    uint64_t ops = pool->op_count - a->window_start_op;
    if (ops >= ADAPT_WINDOW_OPS) {
        bool hot = a->window_remaps * ADAPT_HOT_OPS_PER_REMAP >= ops;
        bool warm = a->window_remaps * ADAPT_WARM_OPS_PER_REMAP >= ops;
        if (hot) {
            a->hot_ops += ops;
            a->hot_remaps += a->window_remaps;
            if (++a->hot_windows == ADAPT_HOT_WINDOWS)
                end_hot_run(pool, a);
        }
        if (!hot || a->hot_windows == ADAPT_HOT_WINDOWS) { /* the run ends */
            a->hot_windows = 0;
            a->hot_ops = a->hot_remaps = 0;
        }
        /* Warm windows in a row, hot ones included; a hot run that ended with
         * this window has decided for them. Eight of them end a warm run (not
         * all hot: those would have ended a hot run now). */
        bool hot_run_ended = hot && a->hot_windows == 0;
        a->warm_windows = warm && !hot_run_ended ? a->warm_windows + 1 : 0;
        if (a->warm_windows == ADAPT_HOT_WINDOWS) {
            if (!a->settled)
                end_warm_run(pool, a);
            a->warm_windows = 0;
        }
        a->window_start_op = pool->op_count;
        a->window_remaps = 0;
        if (a->hot_windows == 0)
            seen_live_restart(pool); /* a run may begin with this window */
    }
    a->window_remaps++;
}

/* ---- stream safety of remaps ----
 *
 * Unmapping is not stream-ordered: a granule may be unmapped only once no work
 * queued before its blocks were freed can still use it, on whatever stream
 * they lived. Until the thirty-fourth session every allocation that remapped
 * synchronized the device for that, which stalls a training step under
 * memory pressure once per such allocation. Now the pool counts unmap epochs:
 * a granule that becomes unused is tagged with the epoch in force (its run
 * keeps the newest tag). An epoch is closed by recording one event on each
 * stream that freed a block since its own last closure: every block that
 * stops holding granules (freed, flushed from a quick list, completed after
 * record_stream) goes through stow__pool_make_free, which counts it in its
 * stream's free_seq, so a free_seq that moved since the stream's closure
 * (vmm_closed_seq) says so at no cost to the free itself (a mark stored on
 * every free cost about 3 % of a page-mapped pool's host time). Once the
 * events of a closed epoch and of every epoch before it completed, granules
 * tagged with it are safe (unmap_safe_epoch). A synchronize makes every
 * granule unused so far safe at once. A remap then waits only when the
 * oldest unused granule, the one it takes, is not yet known safe after
 * querying the closed epochs' events (the oldest runs were freed longest
 * ago), and then, on a backend that can (event_synchronize, since the
 * thirty-fifth session), on those events alone, closing the open epoch first
 * when the granule is in it; it synchronizes the device only without one.
 *
 * Epochs are closed only while the pool remaps (for CLOSE_AFTER_REMAP_OPS
 * operations, one adaptive window, after a remap): every CLOSE_EVERY_FREES
 * frees that leave granules unused, one event per stream that freed (157 ns
 * each on an H200, h200-costs.md, against about 37 us per granule remapped),
 * at most STOW_VMM_CLOSURES epochs in flight (the oldest is queried when the
 * ring is full). A pool that stopped remapping stops recording within a
 * window: a steady state makes no backend call (test_replay_traces). On a
 * backend without events nothing is closed: every remap that needs a granule
 * not yet known safe synchronizes.
 * docs/design.md (remaps without a synchronize) compares other settings. */
#define CLOSE_EVERY_FREES 8
#define CLOSE_AFTER_REMAP_OPS 8192

void stow__vmm_drop_closures(stow_pool_t *pool, bool free_arrays)
{
    for (unsigned i = 0; i < STOW_VMM_CLOSURES; i++) {
        stow_vmm_closure_t *c = &pool->closures[i];
        for (uint32_t j = 0; j < c->count; j++)
            stow__pool_destroy_event(pool, c->events[j]);
        c->count = 0;
        if (free_arrays) {
            free(c->events);
            c->events = NULL;
            c->capacity = 0;
        }
    }
    pool->closure_first = pool->closure_count = 0;
}

void stow__vmm_synchronized(stow_pool_t *pool)
{
    /* Every granule unused so far is safe; those freed from now on are not. */
    pool->unmap_safe_epoch = pool->unmap_epoch++;
    pool->pushes_since_closure = 0;
    stow__vmm_drop_closures(pool, false);
}

/* The oldest closed epoch, whose events all completed, leaves the ring: its
 * granules (and every earlier epoch's) are safe. */
static void retire_oldest_closure(stow_pool_t *pool)
{
    pool->unmap_safe_epoch = pool->closures[pool->closure_first].epoch;
    pool->closure_first = (pool->closure_first + 1) % STOW_VMM_CLOSURES;
    pool->closure_count--;
}

/* Queries the events of the oldest closed epochs, and retires those whose
 * events all completed (in order: an epoch is safe only after every earlier
 * one). A query that fails counts as not complete. */
static void retire_closures(stow_pool_t *pool)
{
    while (pool->closure_count) {
        stow_vmm_closure_t *c = &pool->closures[pool->closure_first];
        for (uint32_t j = 0; j < c->count;) {
            bool done = false;
            pool->acct.s.num_event_queries++;
            if (stow__backend_status(pool, pool->backend->event_query(pool->backend->ctx,
                                                                      c->events[j], &done)) !=
                    STOW_OK ||
                !done) {
                j++;
                continue;
            }
            stow__pool_destroy_event(pool, c->events[j]);
            c->events[j] = c->events[--c->count];
        }
        if (c->count)
            return;
        retire_oldest_closure(pool);
    }
}

/* Records one event on each stream that freed a block since its last
 * closure, and on `freeing`, whose free is being made (stow__pool_make_free
 * counts it in free_seq only after the block left its granules), and starts
 * the next epoch; nothing changes when an event cannot be recorded (the epoch
 * stays open, and a remap of its granules synchronizes). */
static __attribute__((noinline)) void close_epoch(stow_pool_t *pool,
                                                  const stow_stream_state_t *freeing)
{
    if (pool->closure_count == STOW_VMM_CLOSURES) {
        retire_closures(pool);
        if (pool->closure_count == STOW_VMM_CLOSURES)
            return;
    }
    /* (Blocks are freed under `any` only without events, where nothing is
     * closed; with events `any` only receives blocks already free.) */
    unsigned slot = (pool->closure_first + pool->closure_count) % STOW_VMM_CLOSURES;
    stow_vmm_closure_t *c = &pool->closures[slot];
    if (c->capacity < pool->stream_count) {
        stow_event_t *grown = realloc(c->events, pool->stream_count * sizeof *grown);
        if (!grown)
            return;
        c->events = grown;
        c->capacity = (uint32_t)pool->stream_count;
    }
    c->count = 0;
    for (size_t i = 0; i < pool->stream_count; i++) {
        stow_stream_state_t *ss = pool->streams[i];
        if (ss->free_seq == ss->vmm_closed_seq && ss != freeing)
            continue;
        pool->acct.s.num_event_records++;
        if (stow__backend_status(pool, pool->backend->event_record(pool->backend->ctx,
                                                                   ss->stream,
                                                                   &c->events[c->count])) !=
            STOW_OK) {
            while (c->count)
                stow__pool_destroy_event(pool, c->events[--c->count]);
            return;
        }
        c->count++;
    }
    for (size_t i = 0; i < pool->stream_count; i++)
        pool->streams[i]->vmm_closed_seq = pool->streams[i]->free_seq;
    c->epoch = pool->unmap_epoch++;
    pool->closure_count++;
    pool->pushes_since_closure = 0;
}

/* A free on `freeing` just left granules unused (tagged with the current
 * epoch). Inline: outside a remapping stretch it is one comparison. */
static inline void note_unused_pushed(stow_pool_t *pool, const stow_stream_state_t *freeing)
{
    if (STOW_UNLIKELY(pool->op_count < pool->closing_until_op) &&
        ++pool->pushes_since_closure >= CLOSE_EVERY_FREES && pool->has_events)
        close_epoch(pool, freeing);
}

/* Whether the oldest unused granule, the next a remap takes, has no queued
 * work left on it. Tags never decrease along the run list, so when it has
 * some, every unused granule may. */
static bool oldest_unused_is_safe(stow_pool_t *pool)
{
    if (pool->run_head->unused_epoch <= pool->unmap_safe_epoch)
        return true;
    retire_closures(pool);
    return pool->run_head->unused_epoch <= pool->unmap_safe_epoch;
}

/* Waits on the events left in the oldest closed epoch (retire_closures
 * destroys those it saw complete) and retires it; false when a wait failed
 * (the epoch stays, holding the events not yet waited on). */
static bool wait_oldest_closure(stow_pool_t *pool)
{
    stow_vmm_closure_t *c = &pool->closures[pool->closure_first];
    while (c->count) {
        pool->acct.s.num_event_waits++;
        if (stow__backend_status(pool, pool->event_synchronize(pool->backend->ctx,
                                                               c->events[c->count - 1])) !=
            STOW_OK)
            return false;
        stow__pool_destroy_event(pool, c->events[--c->count]);
    }
    retire_oldest_closure(pool);
    return true;
}

/* Makes the oldest unused granule safe to unmap by waiting on events alone,
 * where the backend can (event_synchronize): a granule of the open epoch first
 * closes it (an event on each stream that freed since its last closure), then
 * the closed epochs' events are waited on, oldest first, up to the granule's.
 * Work queued after those events keeps running, on every stream, where a
 * synchronize would wait for all of it: on a GPU whose queue runs ahead of the
 * host, the remap no longer drains the queue. False when it cannot (no such
 * method, an event that could not be recorded, a wait that failed): the caller
 * synchronizes, as before. */
static bool wait_for_oldest_unused(stow_pool_t *pool)
{
    if (!pool->event_synchronize)
        return false;
    uint64_t epoch = pool->run_head->unused_epoch;
    if (epoch == pool->unmap_epoch) {
        if (pool->closure_count == STOW_VMM_CLOSURES && !wait_oldest_closure(pool))
            return false;
        close_epoch(pool, NULL);
        if (epoch == pool->unmap_epoch)
            return false;
    }
    while (epoch > pool->unmap_safe_epoch)
        if (!pool->closure_count || !wait_oldest_closure(pool))
            return false;
    return true;
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
    unused_take(pool, g->segment, i, i + 1);
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
    if (may_create(pool, live_bytes_high_water)) {
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
    pool->closing_until_op = pool->op_count + CLOSE_AFTER_REMAP_OPS;
    if (!*synced && !oldest_unused_is_safe(pool) && !wait_for_oldest_unused(pool)) {
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
    note_remap(pool);
    stow__acct_reserved_move(&pool->acct, from_kind, kind, pool->granularity_bytes);
    return STOW_OK;
}

/* Granules [first, end) of a block that stops being live (freed, or never
 * backed; all_mapped says whether every granule of the span is mapped, as a
 * live block's are): the block leaves its edges' counts, and every granule of
 * the span that is mapped and overlapped by no other live block becomes
 * unused, in address order. Only an edge can still be overlapped by another
 * live block. */
static void release_span(stow_pool_t *pool, stow_segment_t *seg, size_t first, size_t end,
                         bool all_mapped)
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

static size_t mapped_in(const stow_segment_t *seg, size_t first, size_t end);

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

stow_status_t stow__vmm_back_span(stow_pool_t *pool, stow_block_t *b, size_t size_bytes)
{
    stow_segment_t *seg = b->segment;
    size_t first, end;
    granule_span(pool, seg, b->addr, size_bytes, &first, &end);
    uint64_t bytes_after = pool->live_bytes + size_bytes;
    uint64_t bytes_high_water =
        bytes_after > pool->live_bytes_high_water ? bytes_after : pool->live_bytes_high_water;
    /* (A block inside one granule that a live block holds took the inline
     * fast path, stow__vmm_back.) */
    /* The block counts at its edges, and the span's unused granules leave their
     * runs (so that obtain_handle below cannot take them): a few bitmap words
     * and run entries, not a pass over the granules. */
    stow_granule_t *lo_g = &seg->granules[first], *hi_g = &seg->granules[end - 1];
    bool lo_live = lo_g->edges != 0, hi_live = end - 1 != first && hi_g->edges != 0;
    lo_g->edges++;
    if (end - 1 != first)
        hi_g->edges++;
    /* Remaps take unused granules only, so the span's mapped bits change in the
     * loop below alone. */
    size_t first_unmapped = next_bit(seg->mapped_bits, first, end, false);
    if (first_unmapped == end) {
        /* Every granule of the span is mapped, the steady state: only the
         * edges can hold another live block (the interior lies inside one
         * free block), so the unused ones are the span less its live edges,
         * one stretch, and nothing needs mapping. This skips the scans of the
         * unused bits and the count of obtainable handles. */
        size_t lo = first + lo_live, hi = end - hi_live;
        if (lo < hi)
            unused_take(pool, seg, lo, hi);
    } else {
        unused_take_within(pool, seg, first, end);
        /* More granules to map than the pool can get under its limit: fail
         * before mapping any (it used to map up to the limit first, then fail,
         * and the out-of-memory retry did it all again: about 950 map and 480
         * unmap calls on a 1 GiB device). The count is taken only when the
         * span alone could be too many. */
        uint64_t obtainable = obtainable_handles(pool);
        if (end - first > obtainable && end - first - mapped_in(seg, first, end) > obtainable) {
            release_span(pool, seg, first, end, false);
            update_idle(pool);
            return STOW_ENOMEM;
        }
    }
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
         * and what this attempt created goes back to the device. */
        release_span(pool, seg, first, end, false);
        give_back_created(pool, seg, first, end, phys_before, synced);
        update_idle(pool);
        return st;
    }
    /* The granules that become live join the footprint of the adaptive
     * allowance's run (the only place a granule becomes live: a block inside
     * one granule a live block holds takes the fast path, and its bit is set). */
    bits_fill(seg->seen_live_bits, first, end, true);
    pool->live_bytes = bytes_after;
    pool->live_bytes_high_water = bytes_high_water;
    update_idle(pool);
    return STOW_OK;
}

/* ---- placement where granules are already mapped ---- */

/* What a placement over granules [first, end) of a segment costs: granules
 * to map (each a remap when the pool is at its physical allowance: about
 * 37 us on an H200) and fresh granules (no live block yet: they add to the
 * physical memory live data pins). */
typedef struct span_cost {
    size_t unmapped, fresh;
} span_cost_t;

static size_t mapped_in(const stow_segment_t *seg, size_t first, size_t end)
{
    if (end > seg->granules_touched)
        end = seg->granules_touched;
    size_t count = 0;
    while (first < end) {
        size_t w = first / 64, lo = first % 64;
        size_t hi = (end - first) + lo < 64 ? (end - first) + lo : 64;
        uint64_t word = seg->mapped_bits[w] >> lo;
        if (hi - lo < 64)
            word &= ((uint64_t)1 << (hi - lo)) - 1;
        count += popcount64(word);
        first += hi - lo;
    }
    return count;
}

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
 * fit puts them. In long training runs, blocks of 32-127 granules that moved
 * to mapped windows filled the rooms of the step's biggest blocks, which then
 * remapped hundreds of granules every step (held-out gpt2_train variants:
 * median 179 map and unmap calls per 1000 events with 32, 13 with 128, at
 * vmm_slack 0.009; docs/design.md). */
#define STOW_VMM_PLACE_MIN_GRANULES 128
/* Extra granules that moved blocks may hold together, as a fraction of the
 * live peak: at most this, and at most half of vmm_slack. */
#define STOW_VMM_PLACE_BUDGET 0.00375

static void consider(placement_t *p, stow_block_t *f, uintptr_t addr)
{
    span_cost_t c = cost_at(p->pool, f, addr, p->rounded);
    /* Fewest granules to map, then fewest fresh ones, then the lowest
     * address. A big block whose room lost its lowest granules to remaps
     * (the oldest unused go first, and a freed block's granules are queued
     * from the bottom up) used to go where the mapped run starts, a little
     * higher each training step, and never settle; with the windows that end
     * where a run ends (consider_block) and this last rule it extends
     * downwards instead (gpt2_train x0.8: 169 map and unmap calls per 1000
     * events before, 16.5 settled now; either change alone moved nothing). */
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
     * (docs/design.md has the measurements). */
    if (!pool->unused_count || rounded < STOW_VMM_PLACE_MIN_GRANULES * pool->granularity_bytes)
        return b;
    span_cost_t at_b = cost_at(pool, b, b->addr, rounded);
    if (!at_b.unmapped)
        return b;
    /* Moved blocks may hold, together, half the slack in extra granules, and
     * never more than STOW_VMM_PLACE_BUDGET of the live peak: a larger slack
     * is there to cache granules, not to loosen the layout. */
    uint64_t live_hw_granules = pool->live_bytes_high_water / pool->granularity_bytes;
    double budget_fraction = pool->config.vmm_slack / 2;
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

void stow__vmm_unback_span(stow_pool_t *pool, stow_block_t *b)
{
    stow_segment_t *seg = b->segment;
    size_t first, end;
    granule_span(pool, seg, b->addr, b->size_bytes, &first, &end);
    stow_assert_internal(pool->live_bytes >= b->size_bytes);
    pool->live_bytes -= b->size_bytes;
    pool->extra_granules_live -= b->extra_granules;
    b->extra_granules = 0;
    size_t unused_before = pool->unused_count;
    release_span(pool, seg, first, end, true);
    if (pool->unused_count != unused_before)
        note_unused_pushed(pool, b->owner);
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

/* Check helpers. */
static bool bits_clear_from(const uint64_t *bits, size_t from, size_t n)
{
    if (from % 64 && bits[from / 64] >> (from % 64))
        return false;
    for (size_t w = (from + 63) / 64; w < (n + 63) / 64; w++)
        if (bits[w])
            return false;
    return true;
}

static bool segment_of_pool(const stow_pool_t *pool, const stow_segment_t *seg)
{
    for (const stow_segment_t *s = pool->segments; s; s = s->next)
        if (s == seg)
            return true;
    return false;
}

/* One range against its blocks: every live block on mapped granules that are
 * not unused, the edge counts, mapped == live or unused (never both), run
 * starts only on unused granules, every live granule seen live (the adaptive
 * allowance's footprint), nothing marked at or above granules_touched.
 * Adds to the counts of stow__vmm_check. */
static stow_status_t check_segment_granules(const stow_pool_t *pool, const stow_segment_t *seg,
                                            uint64_t counts[4], uint64_t *extra,
                                            uint64_t *live_bytes, char *why, size_t why_len)
{
    size_t touched = seg->granules_touched, n = seg->size_bytes / pool->granularity_bytes;
    uint32_t *edges = calloc(touched ? touched : 1, sizeof *edges);
    uint8_t *covered = calloc(touched ? touched : 1, 1);
    stow_status_t st = STOW_OK;
    if (!edges || !covered) {
        snprintf(why, why_len, "vmm: check: out of host memory");
        st = STOW_EHOSTMEM;
        goto out;
    }
    for (const stow_block_t *b = seg->first; b; b = b->next) {
        if (b->state == BLOCK_FREE)
            continue;
        size_t first, end;
        granule_span(pool, seg, b->addr, b->size_bytes, &first, &end);
        *extra += b->extra_granules;
        *live_bytes += b->size_bytes;
        for (size_t i = first; i < end; i++) {
            if (i >= touched || !seg->granules[i].phys || bit_at(seg->unused_bits, i)) {
                snprintf(why, why_len, "vmm: live block %#lx on granule %zu: unmapped or unused",
                         (unsigned long)b->addr, i);
                st = STOW_EINVAL;
                goto out;
            }
            covered[i] = 1;
        }
        edges[first]++;
        if (end - 1 != first)
            edges[end - 1]++;
    }
    /* Granules at and above granules_touched were never mapped (set_mapped is
     * the only writer of phys and keeps the mark): only the touched ones need
     * a look (a 64 GiB range has 32768 granules). */
    if (!bits_clear_from(seg->mapped_bits, touched, n) ||
        !bits_clear_from(seg->unused_bits, touched, n) ||
        !bits_clear_from(seg->run_start_bits, touched, n) ||
        !bits_clear_from(seg->seen_live_bits, touched, n)) {
        snprintf(why, why_len, "vmm: bits set above granule %zu", touched);
        st = STOW_EINVAL;
        goto out;
    }
    for (size_t i = 0; i < touched; i++) {
        const stow_granule_t *g = &seg->granules[i];
        bool mapped = bit_at(seg->mapped_bits, i), unused = bit_at(seg->unused_bits, i);
        bool run_start = bit_at(seg->run_start_bits, i);
        bool seen = bit_at(seg->seen_live_bits, i);
        if (mapped != (g->phys != 0) || g->edges != edges[i] ||
            mapped != (covered[i] || unused) || (run_start && !unused) || (covered[i] && !seen)) {
            snprintf(why, why_len,
                     "vmm: granule %zu: mapped bit %d, mapped %d, unused %d, run start %d, live %d, "
                     "seen live %d, edges %u (blocks say %u)",
                     i, mapped, g->phys != 0, unused, run_start, covered[i], seen, g->edges,
                     edges[i]);
            st = STOW_EINVAL;
            goto out;
        }
        counts[0] += mapped;
        counts[1] += unused;
        counts[2] += run_start;
        counts[3] += covered[i];
    }
out:
    free(edges);
    free(covered);
    return st;
}

/* The run list: linked both ways; each entry the start of a run of its range,
 * all of whose granules are unused and none of which starts another run. With
 * the entry count equal to the run starts and the lengths adding up to the
 * unused granules, the runs are exactly the unused granules. */
static stow_status_t check_runs(const stow_pool_t *pool, uint64_t run_starts, uint64_t unused,
                                char *why, size_t why_len)
{
    uint64_t entries = 0, in_runs = 0;
    for (const stow_granule_t *h = pool->run_head, *prev = NULL; h; prev = h, h = h->run_next) {
        const stow_segment_t *seg = h->segment;
        /* Tags never decrease from the oldest run, and none is from the future:
         * oldest_unused_is_safe reads the head's alone. */
        bool ok = h->run_prev == prev && ++entries <= run_starts && seg &&
                  segment_of_pool(pool, seg) && h->unused_epoch <= pool->unmap_epoch &&
                  (!prev || prev->unused_epoch <= h->unused_epoch);
        size_t i = ok ? granule_no(seg, h) : 0;
        ok = ok && bit_at(seg->run_start_bits, i) && h->run_end > i &&
             h->run_end <= seg->granules_touched &&
             next_bit(seg->unused_bits, i, h->run_end, false) == h->run_end &&
             next_bit(seg->run_start_bits, i + 1, h->run_end, true) == h->run_end &&
             (h->run_next || pool->run_tail == h);
        if (!ok) {
            snprintf(why, why_len, "vmm: run list broken at entry %llu",
                     (unsigned long long)entries);
            return STOW_EINVAL;
        }
        in_runs += h->run_end - i;
    }
    if (entries != run_starts || in_runs != unused || unused != pool->unused_count ||
        (!pool->run_head && pool->run_tail)) {
        snprintf(why, why_len, "vmm: %llu runs of %llu granules; %llu run starts, %llu unused, "
                 "count %llu",
                 (unsigned long long)entries, (unsigned long long)in_runs,
                 (unsigned long long)run_starts, (unsigned long long)unused,
                 (unsigned long long)pool->unused_count);
        return STOW_EINVAL;
    }
    return STOW_OK;
}

/* The unmap epochs: the safe one below the open one, closed epochs in flight
 * between them in increasing order, each with its events (none on a pool
 * without events). */
static stow_status_t check_closures(const stow_pool_t *pool, char *why, size_t why_len)
{
    bool ok = pool->unmap_safe_epoch < pool->unmap_epoch &&
              pool->closure_count <= STOW_VMM_CLOSURES &&
              pool->closure_first < STOW_VMM_CLOSURES &&
              (pool->has_events || pool->closure_count == 0);
    uint64_t last = pool->unmap_safe_epoch;
    for (unsigned k = 0; ok && k < pool->closure_count; k++) {
        unsigned slot = (pool->closure_first + k) % STOW_VMM_CLOSURES;
        const stow_vmm_closure_t *c = &pool->closures[slot];
        ok = c->epoch > last && c->epoch < pool->unmap_epoch && c->count <= c->capacity;
        last = c->epoch;
    }
    if (!ok) {
        snprintf(why, why_len, "vmm: unmap epochs: safe %llu, open %llu, %u closed in flight",
                 (unsigned long long)pool->unmap_safe_epoch,
                 (unsigned long long)pool->unmap_epoch, pool->closure_count);
        return STOW_EINVAL;
    }
    return STOW_OK;
}

stow_status_t stow__vmm_check(stow_pool_t *pool, char *why, size_t why_len)
{
    uint64_t counts[4] = {0}; /* mapped, unused, run starts, live granules */
    uint64_t extra = 0, live_bytes = 0;
    stow_status_t st;
    for (const stow_segment_t *seg = pool->segments; seg; seg = seg->next)
        if (seg->granules && (st = check_segment_granules(pool, seg, counts, &extra, &live_bytes,
                                                          why, why_len)) != STOW_OK)
            return st;
    if (extra != pool->extra_granules_live || live_bytes != pool->live_bytes) {
        snprintf(why, why_len, "vmm: extra granules %llu vs %llu, live bytes %llu vs %llu",
                 (unsigned long long)extra, (unsigned long long)pool->extra_granules_live,
                 (unsigned long long)live_bytes, (unsigned long long)pool->live_bytes);
        return STOW_EINVAL;
    }
    if ((st = check_runs(pool, counts[2], counts[1], why, why_len)) != STOW_OK ||
        (st = check_closures(pool, why, why_len)) != STOW_OK)
        return st;
    uint64_t g = pool->granularity_bytes, mapped = counts[0], unused = counts[1];
    if (mapped != pool->mapped_count || counts[3] != mapped - unused ||
        pool->phys_count != mapped + pool->free_handle_count ||
        pool->acct.s.reserved_bytes[STOW_POOL_ALL].current != pool->phys_count * g ||
        pool->acct.idle_segment_bytes != (unused + pool->free_handle_count) * g) {
        snprintf(why, why_len,
                 "vmm: mapped %llu vs %llu, live granules %llu, unused %llu, handles %llu",
                 (unsigned long long)mapped, (unsigned long long)pool->mapped_count,
                 (unsigned long long)counts[3], (unsigned long long)unused,
                 (unsigned long long)pool->phys_count);
        return STOW_EINVAL;
    }
    return STOW_OK;
}
