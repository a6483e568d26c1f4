/*
 * accounting/accounting.h: the pool's books. The pool calls these at every
 * state change, with its lock held; they are inline because they sit on the
 * alloc/free fast path. Snapshots, scopes, summary and JSON live in
 * accounting/stats.c and accounting/emit.c.
 *
 * Invariants: every stow_stat_t keeps current <= peak and current <=
 * allocated (its `freed`, allocated - current, is filled in by snapshots);
 * each scope's peaks are >= the values at its push.
 *
 * Active = allocated + pending (PENDING blocks: freed by the user, not yet
 * reusable). active_bytes and active are derived from those in snapshots
 * rather than counted at every event; only their peak is kept here, and only
 * while blocks are pending, because at an allocation with nothing pending
 * active equals allocated, whose peak is tracked anyway (stow__acct_alloc).
 */
#ifndef STOWAGE_ACCOUNTING_H
#define STOWAGE_ACCOUNTING_H

#include <stdbool.h>
#include <stdint.h>

#include "stowage.h"

typedef struct stow_scope_frame {
    uint64_t allocated_at_push, allocated_peak;
    uint64_t reserved_at_push, reserved_peak;
} stow_scope_frame_t;

typedef struct stow_accounting {
    stow_stats_t s;                /* arrays, counters, size classes; snapshot source */
    /* PENDING blocks (freed, waiting for events), per stow_pool_kind_t */
    uint64_t pending_bytes[STOW_POOL_KINDS];
    uint64_t pending_blocks[STOW_POOL_KINDS];
    /* active's cumulative total = allocated's + these (the pending figures at
     * the last stow__acct_reset_accumulated; 0 before any) */
    uint64_t active_total_offset_bytes[STOW_POOL_KINDS];
    uint64_t active_total_offset_blocks[STOW_POOL_KINDS];
    uint64_t idle_segment_bytes;   /* segments with live_blocks == 0 */
    bool reserved_peak_moved;      /* a new reserved peak since the last waste snapshot */
    /* The fragmentation peak as the fraction it came from, compared exactly in
     * integers: fragmentation_peak == 1 - peak_largest / peak_free. */
    uint64_t frag_peak_largest, frag_peak_free;
    /* While the largest free block is frag_bound_largest bytes, fragmentation
     * passes its peak only with more than frag_bound_free free bytes
     * (floor(largest x peak_free / peak_largest)): one comparison per event
     * while the largest free block stays the same, as it mostly does in a
     * classic pool. When it changes, the fractions are compared as 128-bit
     * products, and the bound (a 128-bit division) is recomputed only once
     * the same new size is seen twice in a row: in a page-mapped pool the
     * largest free block is capped at the free physical bytes and changes on
     * most events (gpt2_train: 1.3 divisions per event before). */
    uint64_t frag_bound_largest, frag_bound_free;
    uint64_t frag_last_largest; /* largest free block at the previous check */
    unsigned scope_depth;
    stow_scope_frame_t scope[STOW_SCOPE_MAX_DEPTH];
} stow_accounting_t;

static inline void stow__stat_add(stow_stat_t *st, uint64_t n)
{
    st->current += n;
    st->allocated += n;
    if (st->current > st->peak)
        st->peak = st->current;
}

/* `freed` is not kept here: it is allocated - current, filled in by
 * stow__acct_snapshot (one store fewer per decrease on the free path). */
static inline void stow__stat_sub(stow_stat_t *st, uint64_t n) { st->current -= n; }

/* Adds to the "all" entry and to the pool kind's entry. */
static inline void stow__stat2_add(stow_stat_t *arr, unsigned kind, uint64_t n)
{
    stow__stat_add(&arr[STOW_POOL_ALL], n);
    stow__stat_add(&arr[kind], n);
}

static inline void stow__stat2_sub(stow_stat_t *arr, unsigned kind, uint64_t n)
{
    stow__stat_sub(&arr[STOW_POOL_ALL], n);
    stow__stat_sub(&arr[kind], n);
}

static inline void stow__acct_scope_note_allocated(stow_accounting_t *a)
{
    if (a->scope_depth) {
        stow_scope_frame_t *f = &a->scope[a->scope_depth - 1];
        uint64_t cur = a->s.allocated_bytes[STOW_POOL_ALL].current;
        if (cur > f->allocated_peak)
            f->allocated_peak = cur;
    }
}

/* accounting/stats.c: raises the active peaks after an allocation made while
 * blocks are pending. */
void stow__acct_note_active_peak(stow_accounting_t *a, unsigned kind);

/* Size class of a request for per-class counters (stowage/stats.h). */
static inline unsigned stow__size_class_of(size_t requested_bytes)
{
    if (requested_bytes <= 512)
        return 0;
    unsigned lg = 63u - (unsigned)__builtin_clzll((unsigned long long)(requested_bytes - 1));
    unsigned cls = lg - 8u; /* (2^lg, 2^(lg+1)] with lg >= 9 -> class lg - 8 */
    return cls < STOW_SIZE_CLASS_COUNT ? cls : STOW_SIZE_CLASS_COUNT - 1;
}

/* A block of block_bytes was handed out for requested_bytes. */
static inline void stow__acct_alloc(stow_accounting_t *a, unsigned kind, uint64_t block_bytes,
                                    uint64_t requested_bytes, unsigned size_class, bool hit)
{
    stow_stats_t *s = &a->s;
    stow__stat2_add(s->allocated_bytes, kind, block_bytes);
    stow__stat2_add(s->requested_bytes, kind, requested_bytes);
    stow__stat2_add(s->allocation, kind, 1);
    if (__builtin_expect(a->pending_blocks[STOW_POOL_ALL] != 0, 0))
        stow__acct_note_active_peak(a, kind);
    stow_size_class_stats_t *c = &s->size_class[size_class];
    c->requests++;
    if (hit) {
        c->hits++;
        s->num_cache_hits++;
    } else {
        c->misses++;
        s->num_cache_misses++;
    }
    if (++c->live > c->live_peak)
        c->live_peak = c->live;
    stow__acct_scope_note_allocated(a);
}

/* The user freed a block: allocation figures drop now (active ones with them,
 * unless the block becomes PENDING: stow__acct_pending). */
static inline void stow__acct_free(stow_accounting_t *a, unsigned kind, uint64_t block_bytes,
                                   uint64_t requested_bytes, unsigned size_class)
{
    stow_stats_t *s = &a->s;
    stow__stat2_sub(s->allocated_bytes, kind, block_bytes);
    stow__stat2_sub(s->requested_bytes, kind, requested_bytes);
    stow__stat2_sub(s->allocation, kind, 1);
    s->size_class[size_class].live--;
}

/* A freed block became PENDING (add) or left that state (!add). */
static inline void stow__acct_pending(stow_accounting_t *a, unsigned kind, uint64_t block_bytes,
                                      bool add)
{
    unsigned k[2] = {STOW_POOL_ALL, kind};
    for (unsigned i = 0; i < 2; i++) {
        a->pending_bytes[k[i]] += add ? block_bytes : -block_bytes;
        a->pending_blocks[k[i]] += add ? 1 : (uint64_t)-1;
    }
}

/* Bytes in live (ALLOCATED + PENDING) blocks of pool kind k. */
static inline uint64_t stow__acct_active_bytes(const stow_accounting_t *a, unsigned k)
{
    return a->s.allocated_bytes[k].current + a->pending_bytes[k];
}

/* Live (ALLOCATED + PENDING) blocks of pool kind k. */
static inline uint64_t stow__acct_active_blocks(const stow_accounting_t *a, unsigned k)
{
    return a->s.allocation[k].current + a->pending_blocks[k];
}

/* Reserved memory (backend memory the pool holds) grew or shrank. */
static inline void stow__acct_reserved_add(stow_accounting_t *a, unsigned kind, uint64_t bytes)
{
    stow_stats_t *s = &a->s;
    uint64_t old_peak = s->reserved_bytes[STOW_POOL_ALL].peak;
    stow__stat2_add(s->reserved_bytes, kind, bytes);
    if (s->reserved_bytes[STOW_POOL_ALL].peak > old_peak)
        a->reserved_peak_moved = true;
    if (a->scope_depth) {
        stow_scope_frame_t *f = &a->scope[a->scope_depth - 1];
        uint64_t cur = s->reserved_bytes[STOW_POOL_ALL].current;
        if (cur > f->reserved_peak)
            f->reserved_peak = cur;
    }
}

static inline void stow__acct_reserved_sub(stow_accounting_t *a, unsigned kind, uint64_t bytes)
{
    stow__stat2_sub(a->s.reserved_bytes, kind, bytes);
}

/* Reserved bytes changing pool kind without changing in total (a physical
 * granule remapped from one range to another): the "all" entry is untouched. */
static inline void stow__acct_reserved_move(stow_accounting_t *a, unsigned from, unsigned to,
                                            uint64_t bytes)
{
    if (from == to)
        return;
    stow__stat_sub(&a->s.reserved_bytes[from], bytes);
    stow__stat_add(&a->s.reserved_bytes[to], bytes);
}

static inline void stow__acct_segment_add(stow_accounting_t *a, unsigned kind, uint64_t bytes)
{
    stow__acct_reserved_add(a, kind, bytes);
    stow__stat2_add(a->s.segment, kind, 1);
}

static inline void stow__acct_segment_remove(stow_accounting_t *a, unsigned kind, uint64_t bytes)
{
    stow__stat2_sub(a->s.reserved_bytes, kind, bytes);
    stow__stat2_sub(a->s.segment, kind, 1);
}

/* A free block entered (+) or left (-) a free index while not covering its
 * whole segment: PyTorch's "inactive split" (the count alone). */
static inline void stow__acct_inactive_split_count(stow_accounting_t *a, unsigned kind, bool add)
{
    if (add)
        stow__stat2_add(a->s.inactive_split, kind, 1);
    else
        stow__stat2_sub(a->s.inactive_split, kind, 1);
}

/* The same, with its bytes (classic pools; a page-mapped pool keeps the bytes
 * figure itself: the physical memory beside live data, vmm.c). */
static inline void stow__acct_inactive_split(stow_accounting_t *a, unsigned kind, uint64_t bytes,
                                             bool add)
{
    if (add)
        stow__stat2_add(a->s.inactive_split_bytes, kind, bytes);
    else
        stow__stat2_sub(a->s.inactive_split_bytes, kind, bytes);
    stow__acct_inactive_split_count(a, kind, add);
}

/* 128-bit products for exact fraction comparisons (a GCC/Clang extension). */
__extension__ typedef unsigned __int128 stow_u128_t;

/* accounting/stats.c */
void stow__acct_init(stow_accounting_t *a);
void stow__acct_fragmentation_peak_moved(stow_accounting_t *a);

/* accounting/stats.c: frag_bound_* for a largest free block of that size. */
void stow__acct_fragmentation_bound(stow_accounting_t *a, uint64_t largest_free_bytes);

/* Records a new fragmentation peak if 1 - largest/free exceeds it (after
 * every allocation and free; the current value itself is computed only in
 * snapshots). largest_free is the largest cached block. */
static inline void stow__acct_note_fragmentation(stow_accounting_t *a, uint64_t largest_free_bytes)
{
    uint64_t free_bytes =
        a->s.reserved_bytes[STOW_POOL_ALL].current - stow__acct_active_bytes(a, STOW_POOL_ALL);
    /* 1 - L/F > 1 - Lp/Fp  <=>  L * Fp < Lp * F  <=>  F > floor(L * Fp / Lp) */
    bool passes;
    if (__builtin_expect(largest_free_bytes == a->frag_bound_largest, 1)) {
        passes = free_bytes > a->frag_bound_free;
    } else if (largest_free_bytes >= free_bytes) {
        /* Fragmentation 0 passes no peak: a page-mapped pool's, nearly always
         * (its largest free block is capped at the free physical bytes). */
        return;
    } else {
        passes = (stow_u128_t)largest_free_bytes * a->frag_peak_free <
                 (stow_u128_t)a->frag_peak_largest * free_bytes;
        if (largest_free_bytes == a->frag_last_largest)
            stow__acct_fragmentation_bound(a, largest_free_bytes);
        a->frag_last_largest = largest_free_bytes;
    }
    if (passes) {
        a->frag_peak_largest = largest_free_bytes;
        a->frag_peak_free = free_bytes;
        stow__acct_fragmentation_peak_moved(a);
    }
}
/* Takes the waste-at-peak snapshot if reserved reached a new peak since the last one. */
void stow__acct_note_waste_if_peak(stow_accounting_t *a, uint64_t largest_free_bytes);
void stow__acct_snapshot(const stow_accounting_t *a, uint64_t largest_free_bytes,
                         stow_stats_t *out);
void stow__acct_reset_peak(stow_accounting_t *a, uint64_t largest_free_bytes);
void stow__acct_reset_accumulated(stow_accounting_t *a);
stow_status_t stow__acct_scope_push(stow_accounting_t *a, unsigned *depth_out);
stow_status_t stow__acct_scope_pop(stow_accounting_t *a, stow_scope_result_t *out);

#endif /* STOWAGE_ACCOUNTING_H */
