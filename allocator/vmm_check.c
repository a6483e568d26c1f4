/*
 * allocator/vmm_check.c: the invariants of a page-mapped pool (policy vmm),
 * checked from scratch for stow_pool_check: every range's granules against
 * its blocks, the run list of unused granules, the unmap epochs, and the
 * pool's counts. Reads only (allocates scratch arrays, freed before return).
 * Called with the pool lock held.
 */
#include "allocator/pool.h"
#include "allocator/types.h"
#include "allocator/vmm.h"
#include "allocator/vmm_epochs.h"
#include "allocator/vmm_granules.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The bits of word w where no granule is mapped: none unused, starting a
 * run or starting a mapping (true also where some granule is mapped). */
static bool unmapped_word_ok(const stow_segment_t *seg, size_t w)
{
    return seg->mapped_bits[w] ||
           !(seg->unused_bits[w] | seg->run_start_bits[w] | seg->map_start_bits[w]);
}

/* One range against its blocks: every live block on mapped granules that are
 * not unused, the edge counts, mapped == live or unused (never both), each
 * mapping a start followed by granules of the same handle, run
 * starts only on unused granules, every live granule seen live (the adaptive
 * allowance's footprint), nothing marked at or above granules_touched.
 * Adds to the counts of stow__vmm_check, and to the recount of its range's
 * kind in *phys: mapped granules, and live granule bytes less live bytes. */
static stow_status_t check_segment_granules(const stow_pool_t *pool, const stow_segment_t *seg,
                                            uint64_t counts[4], uint64_t *extra,
                                            uint64_t *live_bytes, stow_vmm_recount_t *phys,
                                            char *why, size_t why_len)
{
    uint64_t seg_live_bytes = 0, seg_mapped = 0, seg_live_granules = 0;
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
        seg_live_bytes += b->size_bytes;
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
        !bits_clear_from(seg->seen_live_bits, touched, n) ||
        !bits_clear_from(seg->map_start_bits, touched, n)) {
        snprintf(why, why_len, "vmm: bits set above granule %zu", touched);
        st = STOW_EINVAL;
        goto out;
    }
    for (size_t i = 0; i < touched; i++) {
        const stow_granule_t *g = &seg->granules[i];
        if (i % 64 == 0 && i + 64 <= touched && !unmapped_word_ok(seg, i / 64)) {
            snprintf(why, why_len, "vmm: granules %zu-%zu: unused, run or mapping bits unmapped",
                     i, i + 63);
            st = STOW_EINVAL;
            goto out;
        }
        if (i + 64 <= touched && !seg->mapped_bits[i / 64]) {
            /* 64 unmapped granules (no live block can lie on them: the block
             * walk above checked that): no handle, no edge. A range whose
             * failed backings mapped high up is checked a word at a time. */
            if (g->phys || g->edges || edges[i] || covered[i]) {
                snprintf(why, why_len, "vmm: unmapped granule %zu: handle %d, edges %u (blocks "
                         "say %u)", i, g->phys != 0, g->edges, edges[i]);
                st = STOW_EINVAL;
                goto out;
            }
            continue;
        }
        bool mapped = bit_at(seg->mapped_bits, i), unused = bit_at(seg->unused_bits, i);
        bool run_start = bit_at(seg->run_start_bits, i);
        bool seen = bit_at(seg->seen_live_bits, i);
        /* A mapping: a start, then granules of the same handle; a handle is
         * mapped once (the next mapping's handle differs). */
        bool map_start = bit_at(seg->map_start_bits, i);
        bool same_as_prev = i > 0 && bit_at(seg->mapped_bits, i - 1) &&
                            seg->granules[i - 1].phys == g->phys;
        bool mapping_ok = !mapped ? !map_start : map_start != same_as_prev;
        if (mapped != (g->phys != 0) || g->edges != edges[i] ||
            mapped != (covered[i] || unused) || (run_start && !unused) || (covered[i] && !seen) ||
            !mapping_ok) {
            snprintf(why, why_len,
                     "vmm: granule %zu: mapped bit %d, mapped %d, unused %d, run start %d, live %d, "
                     "seen live %d, mapping start %d (handle of the granule before %d), edges %u "
                     "(blocks say %u)",
                     i, mapped, g->phys != 0, unused, run_start, covered[i], seen, map_start,
                     same_as_prev, g->edges, edges[i]);
            st = STOW_EINVAL;
            goto out;
        }
        counts[1] += unused;
        counts[2] += run_start;
        seg_mapped += mapped;
        seg_live_granules += covered[i];
    }
    counts[0] += seg_mapped;
    counts[3] += seg_live_granules;
    *live_bytes += seg_live_bytes;
    unsigned k = seg->pool_kind;
    phys->reserved_bytes[k] += seg_mapped * pool->granularity_bytes;
    phys->beside_live_bytes[k] += seg_live_granules * pool->granularity_bytes - seg_live_bytes;
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
                  segment_of_pool(pool, seg) &&
                  h->unused_epoch <= stow__vmm_epoch_open(&pool->epochs) &&
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

stow_status_t stow__vmm_check(stow_pool_t *pool, stow_vmm_recount_t *phys, char *why,
                             size_t why_len)
{
    uint64_t counts[4] = {0}; /* mapped, unused, run starts, live granules */
    uint64_t extra = 0, live_bytes = 0;
    stow_status_t st;
    memset(phys, 0, sizeof *phys);
    for (const stow_segment_t *seg = pool->segments; seg; seg = seg->next)
        if (seg->granules && (st = check_segment_granules(pool, seg, counts, &extra, &live_bytes,
                                                          phys, why, why_len)) != STOW_OK)
            return st;
    /* Free handles count where they were booked when they left their granule. */
    uint64_t free_granules = 0;
    for (size_t i = 0; i < pool->free_handle_count; i++) {
        const stow_free_handle_t *fh = &pool->free_handles[i];
        phys->reserved_bytes[fh->kind] += (uint64_t)fh->granules * pool->granularity_bytes;
        free_granules += fh->granules;
    }
    for (unsigned k = STOW_POOL_SMALL; k < STOW_POOL_KINDS; k++) {
        phys->reserved_bytes[STOW_POOL_ALL] += phys->reserved_bytes[k];
        phys->beside_live_bytes[STOW_POOL_ALL] += phys->beside_live_bytes[k];
    }
    if (extra != pool->extra_granules_live || live_bytes != pool->live_bytes) {
        snprintf(why, why_len, "vmm: extra granules %llu vs %llu, live bytes %llu vs %llu",
                 (unsigned long long)extra, (unsigned long long)pool->extra_granules_live,
                 (unsigned long long)live_bytes, (unsigned long long)pool->live_bytes);
        return STOW_EINVAL;
    }
    if ((st = check_runs(pool, counts[2], counts[1], why, why_len)) != STOW_OK ||
        (st = stow__vmm_epochs_check(pool, why, why_len)) != STOW_OK)
        return st;
    uint64_t g = pool->granularity_bytes, mapped = counts[0], unused = counts[1];
    if (mapped != pool->mapped_count || counts[3] != mapped - unused ||
        free_granules != pool->free_handle_granules ||
        pool->phys_granules != mapped + free_granules ||
        pool->phys_granules > pool->phys_granules_high_water ||
        pool->acct.s.reserved_bytes[STOW_POOL_ALL].current != pool->phys_granules * g ||
        pool->acct.idle_segment_bytes != (unused + free_granules) * g) {
        snprintf(why, why_len,
                 "vmm: mapped %llu vs %llu, live granules %llu, unused %llu, free handles' %llu "
                 "vs %llu, held %llu (high-water mark %llu)",
                 (unsigned long long)mapped, (unsigned long long)pool->mapped_count,
                 (unsigned long long)counts[3], (unsigned long long)unused,
                 (unsigned long long)free_granules,
                 (unsigned long long)pool->free_handle_granules,
                 (unsigned long long)pool->phys_granules,
                 (unsigned long long)pool->phys_granules_high_water);
        return STOW_EINVAL;
    }
    return STOW_OK;
}
