/*
 * allocator/check.c: the expensive whole-pool consistency check, computed
 * independently of the incremental books (SQLite's "compute it two ways").
 * Used by tests after every event and by STOW_DEBUG >= 3 builds.
 */
#include "allocator/check.h"
#include "allocator/planned_serve.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/types.h"
#include "allocator/vmm.h"

#include <inttypes.h>
#include <stdarg.h>

stow_status_t stow__violation(char *why, size_t len, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return STOW_EINVAL;
}

typedef struct tally {
    uint64_t reserved[STOW_POOL_KINDS], segments[STOW_POOL_KINDS];
    uint64_t allocated[STOW_POOL_KINDS], requested[STOW_POOL_KINDS], active[STOW_POOL_KINDS];
    uint64_t allocations[STOW_POOL_KINDS], active_count[STOW_POOL_KINDS];
    uint64_t split_bytes[STOW_POOL_KINDS], split_count[STOW_POOL_KINDS];
    uint64_t free_blocks, live_blocks, pending_bytes, idle_bytes, quick_blocks, arena_blocks;
} tally_t;

static void add2(uint64_t *arr, unsigned kind, uint64_t v)
{
    arr[STOW_POOL_ALL] += v;
    arr[kind] += v;
}

static stow_status_t check_segment(stow_pool_t *pool, const stow_segment_t *seg, tally_t *t,
                                   char *why, size_t len)
{
    unsigned k = seg->pool_kind;
    if (!seg->granules) /* page-mapped ranges hold no memory themselves */
        add2(t->reserved, k, seg->size_bytes);
    add2(t->segments, k, 1);
    uintptr_t expect = seg->base;
    uint32_t live = 0;
    const stow_block_t *prev = NULL;
    for (const stow_block_t *b = seg->first; b; prev = b, b = b->next) {
        if (b->addr != expect || b->prev != prev || b->segment != seg || b->pool_kind != k)
            return stow__violation(why, len,
                                   "segment %#" PRIxPTR ": block %#" PRIxPTR " breaks the tiling",
                                   seg->base, b->addr);
        if (b->size_bytes == 0 || b->size_bytes % STOW_MIN_BLOCK_BYTES)
            return stow__violation(why, len, "block %#" PRIxPTR ": bad size %zu", b->addr,
                                   b->size_bytes);
        expect += b->size_bytes;
        if (b->state == BLOCK_FREE) {
            t->free_blocks++;
            if (prev && prev->state == BLOCK_FREE && prev->owner == b->owner)
                return stow__violation(why, len,
                                       "blocks %#" PRIxPTR " and %#" PRIxPTR
                                       " are free, adjacent and unmerged",
                                       prev->addr, b->addr);
            if (b->prev || b->next) {
                add2(t->split_bytes, k, b->size_bytes);
                add2(t->split_count, k, 1);
            }
            if (stow__ptr_map_get(&pool->live, b->addr) == b)
                return stow__violation(why, len, "free block %#" PRIxPTR " is in the live map",
                                       b->addr);
        } else if (b->state == BLOCK_ARENA) {
            /* The planned layer's arena: live for its segment, in no book of
             * its own; its busy slots are counted by planned_check.c. */
            live++;
            t->arena_blocks++;
            if (!pool->planned || pool->planned_base != b->addr ||
                pool->planned_bytes != b->size_bytes)
                return stow__violation(why, len,
                                       "arena block %#" PRIxPTR " is not the planned arena",
                                       b->addr);
            if (stow__ptr_map_get(&pool->live, b->addr) == b)
                return stow__violation(why, len, "arena block %#" PRIxPTR " is in the live map",
                                       b->addr);
        } else if (b->state == BLOCK_QUICK) {
            t->quick_blocks++;
            if (k != STOW_POOL_SMALL || b->size_bytes > STOW_SMALL_REQUEST_BYTES ||
                (b->size_bytes <= STOW_QUICK_MAX_BYTES &&
                 b->owner->quick_count[b->size_bytes / STOW_MIN_BLOCK_BYTES - 1] == 0))
                return stow__violation(why, len,
                                       "quick block %#" PRIxPTR " (%zu bytes) is misplaced",
                                       b->addr, b->size_bytes);
            if (b->counted_split_ != ((b->prev || b->next) ? 1 : 0))
                return stow__violation(why, len, "quick block %#" PRIxPTR ": split count off",
                                       b->addr);
            if (b->counted_split_) {
                add2(t->split_bytes, k, b->size_bytes);
                add2(t->split_count, k, 1);
            }
            if (stow__ptr_map_get(&pool->live, b->addr) != b)
                return stow__violation(why, len,
                                       "quick block %#" PRIxPTR " missing from the live map",
                                       b->addr);
        } else {
            live++;
            t->live_blocks++;
            if (stow__ptr_map_get(&pool->live, b->addr) != b)
                return stow__violation(why, len,
                                       "live block %#" PRIxPTR " missing from the live map",
                                       b->addr);
            add2(t->active, k, b->size_bytes);
            add2(t->active_count, k, 1);
            if (b->state == BLOCK_ALLOCATED) {
                if (b->requested_bytes > b->size_bytes || b->requested_bytes == 0)
                    return stow__violation(why, len,
                                           "block %#" PRIxPTR ": requested %zu > size %zu", b->addr,
                                           b->requested_bytes, b->size_bytes);
                add2(t->allocated, k, b->size_bytes);
                add2(t->requested, k, b->requested_bytes);
                add2(t->allocations, k, 1);
            } else {
                t->pending_bytes += b->size_bytes;
            }
        }
    }
    if (expect != seg->base + seg->size_bytes)
        return stow__violation(why, len, "segment %#" PRIxPTR ": blocks cover %zu of %zu bytes",
                               seg->base, (size_t)(expect - seg->base), seg->size_bytes);
    if (live != seg->live_blocks)
        return stow__violation(why, len, "segment %#" PRIxPTR ": live_blocks %u, counted %u",
                               seg->base, seg->live_blocks, live);
    if (!live && !seg->granules)
        t->idle_bytes += seg->size_bytes;
    return STOW_OK;
}

static stow_status_t compare(const char *name, unsigned k, uint64_t books, uint64_t counted,
                             char *why, size_t len);

/* Every quick list holds its size's QUICK blocks, as many as counted. */
static stow_status_t check_quick_state(const stow_pool_t *pool, const stow_stream_state_t *o,
                                       uint64_t *listed, char *why, size_t len)
{
    size_t on_lists = 0;
    for (size_t i = 0; i < STOW_QUICK_LISTS; i++) {
        size_t n = 0;
        for (const stow_block_t *b = o->quick[i]; b; b = b->right, n++)
            if (b->state != BLOCK_QUICK || b->owner != o ||
                b->size_bytes != (i + 1) * STOW_MIN_BLOCK_BYTES)
                return stow__violation(why, len,
                                       "quick list %zu holds block %#" PRIxPTR " of %zu bytes", i,
                                       b->addr, b->size_bytes);
        if (n != o->quick_count[i])
            return stow__violation(why, len, "quick list %zu: counted %u, holds %zu", i,
                                   (unsigned)o->quick_count[i], n);
        on_lists += n;
    }
    for (unsigned j = 0; j < STOW_MID_SLOTS; j++) {
        const stow_block_t *b = o->mid[j];
        if (!b != !o->mid_size[j] || (b && (j >= pool->quick_mid_slots ||
                                           b->state != BLOCK_QUICK || b->owner != o ||
                                           b->size_bytes != o->mid_size[j] ||
                                           b->size_bytes <= STOW_QUICK_MAX_BYTES)))
            return stow__violation(why, len, "mid slot %u holds %#" PRIxPTR " (%zu bytes)", j,
                                   b ? b->addr : (uintptr_t)0, o->mid_size[j]);
        on_lists += b != NULL;
    }
    if (o->mid_next >= (pool->quick_mid_slots ? pool->quick_mid_slots : 1))
        return stow__violation(why, len, "mid ring position %u", o->mid_next);
    if (on_lists != o->quick_blocks)
        return stow__violation(why, len, "quick lists: counted %zu, hold %zu", o->quick_blocks,
                               on_lists);
    *listed += on_lists;
    return STOW_OK;
}

static stow_status_t check_quick_lists(stow_pool_t *pool, uint64_t in_segments, char *why,
                                       size_t len)
{
    uint64_t listed = 0;
    stow_status_t st = check_quick_state(pool, pool->any, &listed, why, len);
    for (size_t i = 0; st == STOW_OK && i < pool->stream_count; i++)
        st = check_quick_state(pool, pool->streams[i], &listed, why, len);
    if (st != STOW_OK)
        return st;
    if ((st = compare("quick blocks listed", 0, listed, in_segments, why, len)))
        return st;
    return compare("quick blocks", 0, pool->quick_blocks, in_segments, why, len);
}

static stow_status_t compare(const char *name, unsigned k, uint64_t books, uint64_t counted,
                             char *why, size_t len)
{
    if (books == counted)
        return STOW_OK;
    return stow__violation(why, len, "%s[%u]: books say %" PRIu64 ", blocks add up to %" PRIu64,
                           name, k, books, counted);
}

stow_status_t stow__pool_check_locked(stow_pool_t *pool, char *why, size_t len)
{
    tally_t t = {0};
    stow_status_t st;
    for (const stow_segment_t *seg = pool->segments; seg; seg = seg->next)
        if ((st = check_segment(pool, seg, &t, why, len)) != STOW_OK)
            return st;
    const stow_stats_t *s = &pool->acct.s;
    if (pool->vmm) {
        /* Physical granules are counted by vmm.c; vmm_check.c checks them
         * and recounts, per kind, what the books must say. */
        stow_vmm_recount_t phys;
        if ((st = stow__vmm_check(pool, &phys, why, len)) != STOW_OK)
            return st;
        t.idle_bytes = pool->acct.idle_segment_bytes;
        /* Free blocks count, their bytes not: the bytes are the physical
         * memory beside live data. */
        for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {
            t.reserved[k] = phys.reserved_bytes[k];
            t.split_bytes[k] = phys.beside_live_bytes[k];
        }
    }
    /* The planned arena's busy slots are allocations of the large pool kind. */
    stow_planned_books_t planned;
    if ((st = stow__planned_check(pool, &planned, why, len)) != STOW_OK)
        return st;
    if (t.arena_blocks != (pool->planned_bytes ? 1u : 0u))
        return stow__violation(why, len, "%" PRIu64 " arena blocks for an arena of %zu bytes",
                               t.arena_blocks, pool->planned_bytes);
    for (unsigned k = STOW_POOL_ALL; k <= STOW_POOL_LARGE; k += STOW_POOL_LARGE) {
        t.allocated[k] += planned.allocated_bytes;
        t.requested[k] += planned.requested_bytes;
        t.allocations[k] += planned.allocations;
        t.active[k] += planned.allocated_bytes + planned.pending_bytes;
        t.active_count[k] += planned.allocations + planned.pending_blocks;
    }
    t.pending_bytes += planned.pending_bytes;
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {
        if ((st = compare("reserved_bytes", k, s->reserved_bytes[k].current, t.reserved[k], why,
                          len)) ||
            (st = compare("segment", k, s->segment[k].current, t.segments[k], why, len)) ||
            (st = compare("allocated_bytes", k, s->allocated_bytes[k].current, t.allocated[k],
                          why, len)) ||
            (st = compare("requested_bytes", k, s->requested_bytes[k].current, t.requested[k],
                          why, len)) ||
            (st = compare("active_bytes", k, stow__acct_active_bytes(&pool->acct, k), t.active[k],
                          why, len)) ||
            (st = compare("allocation", k, s->allocation[k].current, t.allocations[k], why,
                          len)) ||
            (st = compare("active", k, stow__acct_active_blocks(&pool->acct, k),
                          t.active_count[k], why, len)) ||
            (st = compare("inactive_split_bytes", k, s->inactive_split_bytes[k].current,
                          t.split_bytes[k], why, len)) ||
            (st = compare("inactive_split", k, s->inactive_split[k].current, t.split_count[k],
                          why, len)))
            return st;
        if (s->reserved_bytes[k].current > s->reserved_bytes[k].peak ||
            s->allocated_bytes[k].current > s->allocated_bytes[k].peak)
            return stow__violation(why, len, "a current value exceeds its peak");
    }
    if ((st = compare("pending_bytes", 0, pool->acct.pending_bytes[STOW_POOL_ALL], t.pending_bytes,
                      why, len)) ||
        (st = compare("idle_segment_bytes", 0, pool->acct.idle_segment_bytes, t.idle_bytes, why,
                      len)) ||
        (st = compare("live map entries", 0, pool->live.count, t.live_blocks + t.quick_blocks,
                      why, len)))
        return st;
    uint64_t indexed = 0;
    for (size_t i = 0; i <= pool->stream_count; i++) {
        const stow_stream_state_t *ss = i ? pool->streams[i - 1] : pool->any;
        indexed += ss->free[STOW_POOL_SMALL].block_count + ss->free[STOW_POOL_LARGE].block_count;
    }
    if ((st = compare("free blocks indexed", 0, indexed, t.free_blocks, why, len)))
        return st;
    if ((st = check_quick_lists(pool, t.quick_blocks, why, len)) != STOW_OK)
        return st;
    if (!pool->largest_free_dirty) {
        uint64_t cached = pool->largest_free_cache;
        pool->largest_free_dirty = true;
        (void)stow__pool_largest_free(pool); /* recomputes the cache */
        if ((st = compare("largest free block", 0, cached, pool->largest_free_cache, why, len)))
            return st;
    }
    return STOW_OK;
}
