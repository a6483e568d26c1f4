/*
 * allocator/vmm_granules.h: granule bitmaps and granule arithmetic, shared by
 * the files of the page-mapped pool (vmm.c, vmm_allowance.c, vmm_epochs.c,
 * vmm_place.c, vmm_check.c) and by no other file.
 *
 * A range (stow_segment_t) keeps one entry per granule and five bitmaps of a
 * bit per granule (mapped, unused, run start, seen live, mapping start;
 * allocator/types.h and docs/design.md say what each holds). These helpers
 * read and write them and change nothing else. Static inline: the hot paths of backing and freeing
 * call them on every block whose span crosses a granule.
 */
#ifndef STOW_VMM_GRANULES_H
#define STOW_VMM_GRANULES_H

#include "allocator/pool.h"
#include "allocator/types.h"
#include "allocator/vmm.h"

/* ---- bitmaps ---- */

static inline bool bit_at(const uint64_t *bits, size_t i)
{
    return (bits[i / 64] >> (i % 64)) & 1;
}

static inline void bit_put(uint64_t *bits, size_t i, bool value)
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

/* Clears bits [from, end) of `clear` and sets them in `set`: one pass for two
 * bitmaps of the same range (granules that stop being unused and become live
 * join the seen-live footprint). */
static inline __attribute__((always_inline)) void bits_move(uint64_t *clear, uint64_t *set,
                                                          size_t from, size_t end)
{
    if (from >= end)
        return;
    size_t w = from / 64, w_last = (end - 1) / 64;
    uint64_t mask = ~(uint64_t)0 << (from % 64);
    uint64_t last_mask = ~(uint64_t)0 >> (63 - (end - 1) % 64);
    for (;; mask = ~(uint64_t)0) {
        if (w == w_last)
            mask &= last_mask;
        clear[w] &= ~mask;
        set[w] |= mask;
        if (w++ == w_last)
            return;
    }
}

/* First i in [from, end) whose bit is `value`, or end. */
static inline size_t next_bit(const uint64_t *bits, size_t from, size_t end, bool value)
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
static inline size_t prev_set_bit(const uint64_t *bits, size_t i)
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
static inline unsigned popcount64(uint64_t x)
{
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (unsigned)((x * 0x0101010101010101ull) >> 56);
}

/* ---- granules of a range ---- */

static inline size_t granule_no(const stow_segment_t *seg, const stow_granule_t *g)
{
    return (size_t)(g - seg->granules);
}

/* Granules [first, end) overlapped by [addr, addr + size). */
static inline void granule_span(const stow_pool_t *pool, const stow_segment_t *seg,
                                uintptr_t addr, size_t size, size_t *first, size_t *end)
{
    *first = stow__granule_of(pool, seg, addr);
    *end = stow__granule_of(pool, seg, addr + size - 1) + 1;
}

/* A granule's address: entries do not store it, so that a new range's array
 * is calloc'ed zero pages nobody touches until a granule is mapped. */
static inline uintptr_t granule_va(const stow_pool_t *pool, const stow_granule_t *g)
{
    const stow_segment_t *seg = g->segment;
    return seg->base + (uintptr_t)granule_no(seg, g) * pool->granularity_bytes;
}

/* How many of granules [first, end) of seg are mapped (none at or above
 * granules_touched is). */
static inline size_t mapped_in(const stow_segment_t *seg, size_t first, size_t end)
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

/* ---- mappings: one physical handle mapped whole over granules [head, end) ---- */

/* The first granule of the mapping that holds mapped granule i. */
static inline size_t mapping_head(const stow_segment_t *seg, size_t i)
{
    return prev_set_bit(seg->map_start_bits, i);
}

/* The end of the mapping that starts at head: where the next mapping starts,
 * or the first unmapped granule after head. */
static inline size_t mapping_end(const stow_segment_t *seg, size_t head)
{
    size_t end = seg->granules_touched;
    for (size_t i = head + 1; i < end;) {
        size_t w = i / 64;
        uint64_t word = seg->map_start_bits[w] | ~seg->mapped_bits[w];
        word &= ~(uint64_t)0 << (i % 64);
        if (word) {
            size_t j = w * 64 + (size_t)__builtin_ctzll(word);
            return j < end ? j : end;
        }
        i = (w + 1) * 64;
    }
    return end;
}

/* Whether every granule of [from, end) is unused (mapped, under no live block). */
static inline bool all_unused(const stow_segment_t *seg, size_t from, size_t end)
{
    return next_bit(seg->unused_bits, from, end, false) == end;
}

#endif /* STOW_VMM_GRANULES_H */
