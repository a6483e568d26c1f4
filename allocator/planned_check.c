/*
 * allocator/planned_check.c: the planned layer's invariants, checked from
 * scratch for stow_pool_check (allocator/planned.h lists them), and what its
 * busy slots add to the books that check.c compares.
 *
 * The busy slots of every layout (each key's current one and the one it
 * retired) are collected, sorted by address and required to lie inside the
 * arena without overlapping: the layer's safety, whatever the program did.
 */
#include <inttypes.h>
#include <string.h>

#include "allocator/check.h"
#include "allocator/planned.h"
#include "allocator/planned_serve.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/types.h"

typedef struct span {
    uintptr_t lo, hi;
} span_t;

static int by_lo(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* The overdue list: at most the overdue count and the list's room, distinct
 * entries, each overdue (serving trusts it whole when it holds them all). */
static stow_status_t check_overdue_list(const stow_planned_key_t *k, const stow_plan_layout_t *l,
                                        char *why, size_t len)
{
    if (l->overdue_listed > l->overdue || l->overdue_listed > STOW_PLANNED_OVERDUE_LISTED)
        return stow__violation(why, len, "planned key '%s': %zu overdue entries listed of %zu",
                               k->name, l->overdue_listed, l->overdue);
    for (size_t i = 0; i < l->overdue_listed; i++) {
        uint32_t x = l->overdue_list[i];
        if (x >= l->entry_count || !l->entries[x].overdue)
            return stow__violation(why, len, "planned key '%s': listed entry %u is not overdue",
                                   k->name, (unsigned)x);
        for (size_t j = 0; j < i; j++)
            if (l->overdue_list[j] == x)
                return stow__violation(why, len, "planned key '%s': entry %u listed twice", k->name,
                                       (unsigned)x);
    }
    return STOW_OK;
}

/* Walks one layout's entries: its busy ones go to spans and the books. */
static stow_status_t check_layout(stow_planned_t *pl, const stow_planned_key_t *k,
                                  const stow_plan_layout_t *l, span_t *spans, size_t *n_spans,
                                  size_t spans_cap, stow_planned_books_t *books, size_t *bytes,
                                  char *why, size_t len)
{
    size_t busy = 0, overdue = 0;
    for (size_t x = 0; x < l->entry_count; x++) {
        const stow_plan_entry_t *e = &l->entries[x];
        if (!e->busy) {
            if (e->overdue || e->pending)
                return stow__violation(why, len, "planned key '%s': entry %zu is free but flagged",
                                       k->name, x);
            continue;
        }
        busy++;
        overdue += e->overdue;
        uintptr_t addr = pl->base + e->offset;
        if (!pl->arena || !e->life || e->offset > pl->bytes || e->max_bytes > pl->bytes - e->offset)
            return stow__violation(why, len, "planned key '%s': busy entry %zu outside the arena",
                                   k->name, x);
        stow_ptr_slot_t *slot = stow__ptr_map_find(&pl->live, addr);
        if (!slot)
            return stow__violation(why, len, "planned slot %#" PRIxPTR " missing from its live map",
                                   addr);
        uint64_t v = (uint64_t)(uintptr_t)slot->value - 1;
        if (&pl->keys[v >> 40] != k || (size_t)(v & 0xffffffffu) != x ||
            ((v >> 32) & 0xff) != (l->generation & 0xff))
            return stow__violation(why, len, "planned slot %#" PRIxPTR " maps to another entry",
                                   addr);
        if (*n_spans == spans_cap)
            return stow__violation(why, len, "more busy planned slots than the books count");
        spans[(*n_spans)++] = (span_t){addr, addr + e->max_bytes};
        *bytes += e->max_bytes;
        if (e->pending) {
            books->pending_bytes += e->max_bytes;
            books->pending_blocks++;
        } else {
            if (e->requested_bytes == 0 || e->requested_bytes > e->max_bytes)
                return stow__violation(why, len, "planned slot %#" PRIxPTR ": requested %zu of %zu",
                                       addr, e->requested_bytes, e->max_bytes);
            books->allocated_bytes += e->max_bytes;
            books->requested_bytes += e->requested_bytes;
            books->allocations++;
        }
    }
    if (busy != l->busy || overdue != l->overdue)
        return stow__violation(why, len,
                               "planned key '%s': layout counts %zu busy, %zu overdue; "
                               "entries say %zu, %zu",
                               k->name, l->busy, l->overdue, busy, overdue);
    return check_overdue_list(k, l, why, len);
}

/* Whether a layout other than `active` has a busy entry at offset of bytes. */
static bool foreign_busy(const stow_planned_t *pl, const stow_plan_layout_t *active,
                         size_t offset, size_t bytes)
{
    for (unsigned i = 0; i < STOW_PLANNED_KEYS_MAX; i++) {
        const stow_plan_layout_t *of_key[2] = {pl->keys[i].layout, pl->keys[i].retired};
        for (unsigned j = 0; j < 2; j++) {
            const stow_plan_layout_t *o = of_key[j];
            for (size_t x = 0; o && o != active && x < o->entry_count; x++)
                if (o->entries[x].busy && o->entries[x].offset == offset &&
                    o->entries[x].max_bytes == bytes)
                    return true;
        }
    }
    return false;
}

/* The foreign list: none without an active layout; with one, every busy
 * entry of the other layouts, each once. */
static stow_status_t check_foreign(const stow_planned_t *pl, char *why, size_t len)
{
    const stow_plan_layout_t *a = pl->active;
    if (pl->foreign_count > STOW_PLANNED_FOREIGN_LISTED || (!a && pl->foreign_count))
        return stow__violation(why, len, "planned layer: %zu foreign slots listed%s",
                               pl->foreign_count, a ? "" : " without an active layout");
    if (!a)
        return STOW_OK;
    if (pl->busy_total - a->busy != pl->foreign_count)
        return stow__violation(why, len, "planned layer: %zu busy slots beside the active "
                               "layout, %zu listed", pl->busy_total - a->busy, pl->foreign_count);
    for (size_t i = 0; i < pl->foreign_count; i++) {
        if (!foreign_busy(pl, a, pl->foreign[i].offset, pl->foreign[i].bytes))
            return stow__violation(why, len, "planned layer: foreign slot at offset %zu (%zu "
                                   "bytes) is no busy slot of another layout",
                                   pl->foreign[i].offset, pl->foreign[i].bytes);
        for (size_t j = 0; j < i; j++)
            if (pl->foreign[j].offset == pl->foreign[i].offset)
                return stow__violation(why, len, "planned layer: foreign slot at offset %zu "
                                       "listed twice", pl->foreign[i].offset);
    }
    return STOW_OK;
}

stow_status_t stow__planned_check(stow_pool_t *pool, stow_planned_books_t *books, char *why,
                                  size_t len)
{
    memset(books, 0, sizeof *books);
    stow_planned_t *pl = pool->planned;
    if (!pl)
        return pool->planned_bytes ? stow__violation(why, len, "an arena without a planned layer")
                                   : STOW_OK;
    if (pl->allocated_hw < pool->acct.s.allocated_bytes[STOW_POOL_ALL].current)
        return stow__violation(why, len, "the planned layer's allocated high-water mark %" PRIu64
                               " is below the allocated bytes",
                               pl->allocated_hw);
    if (pool->planned_base != pl->base || pool->planned_bytes != pl->bytes ||
        (pl->arena && (pl->arena->state != BLOCK_ARENA || pl->arena->addr != pl->base ||
                       pl->arena->size_bytes != pl->bytes)) ||
        (!pl->arena && pl->bytes))
        return stow__violation(why, len, "the planned arena's bounds disagree with its block");
    size_t cap = pl->busy_total + 1;
    span_t *spans = malloc(cap * sizeof *spans);
    if (!spans)
        return STOW_OK; /* no host memory to check with: nothing found */
    size_t n = 0, bytes = 0, busy_total = 0;
    stow_status_t st = STOW_OK;
    for (unsigned i = 0; st == STOW_OK && i < STOW_PLANNED_KEYS_MAX; i++) {
        const stow_planned_key_t *k = &pl->keys[i];
        size_t before = n;
        if (k->layout)
            st = check_layout(pl, k, k->layout, spans, &n, cap, books, &bytes, why, len);
        if (st == STOW_OK && k->retired)
            st = check_layout(pl, k, k->retired, spans, &n, cap, books, &bytes, why, len);
        if (st == STOW_OK && n - before != k->busy_count)
            st = stow__violation(why, len, "planned key '%s': busy_count %zu, entries %zu", k->name,
                           k->busy_count, n - before);
        busy_total += n - before;
    }
    if (st == STOW_OK && (busy_total != pl->busy_total || pl->live.count != busy_total ||
                          bytes != pl->live_bytes))
        st = stow__violation(why, len, "planned books: %zu busy (%zu in the map, %zu bytes), "
                       "entries say %zu (%zu bytes)", pl->busy_total, pl->live.count,
                       pl->live_bytes, busy_total, bytes);
    if (st == STOW_OK) {
        qsort(spans, n, sizeof *spans, by_lo);
        for (size_t j = 1; j < n; j++)
            if (spans[j].lo < spans[j - 1].hi) {
                st = stow__violation(why, len, "planned slots %#" PRIxPTR " and %#" PRIxPTR
                               " overlap", spans[j - 1].lo, spans[j].lo);
                break;
            }
    }
    free(spans);
    return st == STOW_OK ? check_foreign(pl, why, len) : st;
}
