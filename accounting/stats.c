/*
 * accounting/stats.c: snapshots, fragmentation, waste at the reserved peak,
 * peak resets and nestable high-water-mark scopes. The per-event updates are
 * the inline functions of accounting/accounting.h.
 */
#include "accounting/accounting.h"

#include <string.h>

void stow__acct_init(stow_accounting_t *a)
{
    memset(a, 0, sizeof *a);
    a->s.size = (uint32_t)sizeof(stow_stats_t);
    a->s.version = STOW_STATS_VERSION;
    a->frag_peak_largest = a->frag_peak_free = 1; /* fragmentation 0 */
    a->frag_bound_largest = a->frag_bound_free = 1;
}

static uint64_t free_reserved_bytes(const stow_accounting_t *a)
{
    return a->s.reserved_bytes[STOW_POOL_ALL].current - stow__acct_active_bytes(a, STOW_POOL_ALL);
}

void stow__acct_note_active_peak(stow_accounting_t *a, unsigned kind)
{
    unsigned k[2] = {STOW_POOL_ALL, kind};
    for (unsigned i = 0; i < 2; i++) {
        uint64_t bytes = stow__acct_active_bytes(a, k[i]);
        uint64_t blocks = stow__acct_active_blocks(a, k[i]);
        if (bytes > a->s.active_bytes[k[i]].peak)
            a->s.active_bytes[k[i]].peak = bytes;
        if (blocks > a->s.active[k[i]].peak)
            a->s.active[k[i]].peak = blocks;
    }
}

/* active_bytes and active of the snapshot from allocated + pending (their
 * peak: the larger of the one kept while blocks were pending and allocated's,
 * since with nothing pending active == allocated). */
static void fill_active(const stow_accounting_t *a, stow_stats_t *out)
{
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {
        stow_stat_t *ab = &out->active_bytes[k], *ac = &out->active[k];
        const stow_stat_t *al = &a->s.allocated_bytes[k], *n = &a->s.allocation[k];
        ab->current = stow__acct_active_bytes(a, k);
        ab->allocated = al->allocated + a->active_total_offset_bytes[k];
        ab->peak = a->s.active_bytes[k].peak > al->peak ? a->s.active_bytes[k].peak : al->peak;
        ac->current = stow__acct_active_blocks(a, k);
        ac->allocated = n->allocated + a->active_total_offset_blocks[k];
        ac->peak = a->s.active[k].peak > n->peak ? a->s.active[k].peak : n->peak;
    }
}

static double fragmentation_of(uint64_t free_bytes, uint64_t largest_free_bytes)
{
    if (free_bytes == 0)
        return 0.0;
    return 1.0 - (double)largest_free_bytes / (double)free_bytes;
}

void stow__acct_fragmentation_peak_moved(stow_accounting_t *a)
{
    a->s.fragmentation_peak = fragmentation_of(a->frag_peak_free, a->frag_peak_largest);
    stow__acct_fragmentation_bound(a, a->frag_peak_largest);
}

void stow__acct_fragmentation_bound(stow_accounting_t *a, uint64_t largest_free_bytes)
{
    a->frag_bound_largest = largest_free_bytes;
    if (!a->frag_peak_largest) {
        /* The peak is fragmentation 1 (free bytes, none in a block a request
         * could take): nothing passes it. */
        a->frag_bound_free = UINT64_MAX;
        return;
    }
    stow_u128_t bound = (stow_u128_t)largest_free_bytes * a->frag_peak_free / a->frag_peak_largest;
    a->frag_bound_free = bound > UINT64_MAX ? UINT64_MAX : (uint64_t)bound;
}

static void fragmentation_peak_reset(stow_accounting_t *a, uint64_t largest_free_bytes)
{
    uint64_t free_bytes = free_reserved_bytes(a);
    /* No free memory counts as fragmentation 0, the fraction 1/1. */
    a->frag_peak_largest = free_bytes ? largest_free_bytes : 1;
    a->frag_peak_free = free_bytes ? free_bytes : 1;
    stow__acct_fragmentation_peak_moved(a);
}

static void take_waste_snapshot(stow_accounting_t *a, uint64_t largest_free_bytes)
{
    const stow_stats_t *s = &a->s;
    stow_waste_t *w = &a->s.waste_at_peak;
    uint64_t reserved = s->reserved_bytes[STOW_POOL_ALL].current;
    uint64_t allocated = s->allocated_bytes[STOW_POOL_ALL].current;
    uint64_t requested = s->requested_bytes[STOW_POOL_ALL].current;
    uint64_t active = stow__acct_active_bytes(a, STOW_POOL_ALL);
    w->reserved_bytes = reserved;
    w->requested_bytes = requested;
    w->rounding_bytes = allocated - requested;
    w->pending_bytes = a->pending_bytes[STOW_POOL_ALL];
    w->idle_cached_bytes = a->idle_segment_bytes;
    w->split_remainder_bytes = reserved - active - a->idle_segment_bytes;
    w->fragmentation = fragmentation_of(reserved - active, largest_free_bytes);
    a->reserved_peak_moved = false;
}

void stow__acct_note_waste_if_peak(stow_accounting_t *a, uint64_t largest_free_bytes)
{
    if (a->reserved_peak_moved)
        take_waste_snapshot(a, largest_free_bytes);
}

#define FILL_ARRAY_FREED_(name, label)                   \
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++)      \
        out->name[k].freed = out->name[k].allocated - out->name[k].current;

void stow__acct_snapshot(const stow_accounting_t *a, uint64_t largest_free_bytes,
                         stow_stats_t *out)
{
    *out = a->s;
    fill_active(a, out);
    STOW_STAT_ARRAY_FIELDS(FILL_ARRAY_FREED_)
    out->free_reserved_bytes = free_reserved_bytes(a);
    out->largest_free_block_bytes = largest_free_bytes;
    out->fragmentation = fragmentation_of(out->free_reserved_bytes, largest_free_bytes);
}
#undef FILL_ARRAY_FREED_

#define RESET_ARRAY_PEAK_(name, label)                  \
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++)      \
        a->s.name[k].peak = a->s.name[k].current;

void stow__acct_reset_peak(stow_accounting_t *a, uint64_t largest_free_bytes)
{
    STOW_STAT_ARRAY_FIELDS(RESET_ARRAY_PEAK_)
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) { /* derived: their current is not kept */
        a->s.active_bytes[k].peak = stow__acct_active_bytes(a, k);
        a->s.active[k].peak = stow__acct_active_blocks(a, k);
    }
    for (unsigned c = 0; c < STOW_SIZE_CLASS_COUNT; c++)
        a->s.size_class[c].live_peak = a->s.size_class[c].live;
    fragmentation_peak_reset(a, largest_free_bytes);
    take_waste_snapshot(a, largest_free_bytes);
}
#undef RESET_ARRAY_PEAK_

#define RESET_ARRAY_TOTALS_(name, label)                \
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {    \
        a->s.name[k].allocated = a->s.name[k].current;  \
        a->s.name[k].freed = 0;                         \
    }
#define RESET_COUNTER_(name, desc) a->s.name = 0;

void stow__acct_reset_accumulated(stow_accounting_t *a)
{
    /* allocated - freed must keep equal to current, so the cumulative increase
     * restarts from the current value (as if everything live was allocated now). */
    STOW_STAT_ARRAY_FIELDS(RESET_ARRAY_TOTALS_)
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) { /* active = allocated + pending */
        a->active_total_offset_bytes[k] = a->pending_bytes[k];
        a->active_total_offset_blocks[k] = a->pending_blocks[k];
    }
    STOW_COUNTER_FIELDS(RESET_COUNTER_)
    for (unsigned c = 0; c < STOW_SIZE_CLASS_COUNT; c++) {
        stow_size_class_stats_t *sc = &a->s.size_class[c];
        sc->requests = sc->hits = sc->misses = 0;
    }
}
#undef RESET_ARRAY_TOTALS_
#undef RESET_COUNTER_

stow_status_t stow__acct_scope_push(stow_accounting_t *a, unsigned *depth_out)
{
    if (a->scope_depth >= STOW_SCOPE_MAX_DEPTH)
        return STOW_EBUSY;
    stow_scope_frame_t *f = &a->scope[a->scope_depth++];
    f->allocated_at_push = f->allocated_peak = a->s.allocated_bytes[STOW_POOL_ALL].current;
    f->reserved_at_push = f->reserved_peak = a->s.reserved_bytes[STOW_POOL_ALL].current;
    if (depth_out)
        *depth_out = a->scope_depth;
    return STOW_OK;
}

stow_status_t stow__acct_scope_pop(stow_accounting_t *a, stow_scope_result_t *out)
{
    if (a->scope_depth == 0)
        return STOW_EINVAL;
    /* Only the innermost frame is updated per event; its peaks flow into the
     * parent when it closes, which keeps the per-event cost O(1). */
    stow_scope_frame_t *f = &a->scope[--a->scope_depth];
    if (a->scope_depth) {
        stow_scope_frame_t *parent = &a->scope[a->scope_depth - 1];
        if (f->allocated_peak > parent->allocated_peak)
            parent->allocated_peak = f->allocated_peak;
        if (f->reserved_peak > parent->reserved_peak)
            parent->reserved_peak = f->reserved_peak;
    }
    if (out) {
        out->allocated_bytes_at_push = f->allocated_at_push;
        out->allocated_bytes_peak = f->allocated_peak;
        out->reserved_bytes_at_push = f->reserved_at_push;
        out->reserved_bytes_peak = f->reserved_peak;
        out->allocated_bytes_at_pop = a->s.allocated_bytes[STOW_POOL_ALL].current;
        out->reserved_bytes_at_pop = a->s.reserved_bytes[STOW_POOL_ALL].current;
    }
    return STOW_OK;
}
