/*
 * replay/ideal_remap.c: the `ideal-remap` replay policy, the reference that
 * ../shared/traces/README.md calls "a perfect page-granular remapping
 * allocator (physical memory mapped in 2 MiB pages only where live data is,
 * virtual addresses best-fit)", at 1.001-1.006 x live on the shared traces.
 * The page-mapped pool's goal of 1.01 x live is set against it; this model
 * gives the same figure for any trace, so that a held-out trace can be
 * judged against what its own layout allows.
 *
 * - Addresses: one unbounded virtual range shared by every stream (the
 *   README's allocator knows no streams). A request is rounded up to a
 *   multiple of 512 bytes (at least 512: the rounding of PyTorch and of
 *   Stowage by default) and placed by best fit: the smallest free block that
 *   holds it, the lowest address among equal sizes, the free top of the range
 *   when none does. The block is carved from the start of the free block, and
 *   a freed block merges with its free neighbours.
 * - Physical memory: exactly the 2 MiB pages that some live block overlaps,
 *   at every moment. Nothing is cached, so every page that becomes live is
 *   one map call and every page that stops being live one unmap call, and
 *   remapping costs nothing. Reserved bytes are those pages; their peak is
 *   the figure, and the minimum capacity equals it (the layout does not
 *   depend on the capacity, and nothing is held that could be given back).
 * - No setting applies (`--conf` changes vmm's rounding, not this): the
 *   yardstick stays the README's whatever the pool under test is set to.
 *
 * It is a reference, not a lower bound: another placement can need fewer
 * pages. Policy vmm places big blocks where granules are mapped and packs
 * small ones in ranges of their own, and is below it on some traces; even
 * without those rules it differs by a few pages either way, because its free
 * index gives a block of at most 2 MiB to the most recently freed of equal
 * size rather than to the lowest address. Host time is the model's own: the
 * free blocks are two sorted arrays, fine for a few thousand free blocks,
 * quadratic beyond.
 */
#include <stdlib.h>
#include <string.h>

#include "replay/replay_engine.h"

#define IR_ALIGN_BYTES 512u
#define IR_PAGE_SHIFT 21u /* 2 MiB: STOW_REPLAY_CAPACITY_STEP_BYTES */

typedef struct ir_free {
    uint64_t addr, size_bytes;
} ir_free_t;

typedef struct ir_array {
    ir_free_t *at;
    size_t count, cap;
} ir_array_t;

/* Live blocks whose first or last page is `page_plus_one - 1`. Only edge pages
 * are kept, in a hash table: a dense array would need an entry per page of the
 * address space, and a trace may ask for blocks of up to 2^62 bytes. */
typedef struct ir_edge {
    uint64_t page_plus_one;
    uint32_t edges;
} ir_edge_t;

typedef struct ideal_remap {
    ir_array_t by_addr;              /* free blocks below top, by address */
    ir_array_t by_size;              /* the same blocks, by (size, address) */
    uint64_t top;                    /* everything from here up is free */
    ir_edge_t *edges;                /* open addressing, linear probing; 0 = empty slot */
    size_t edge_slots;               /* a power of two, or 0 */
    size_t edge_count;               /* pages with edges > 0 */
    uint64_t map_calls, unmap_calls; /* one per page that becomes live, one per page that
                                        stops: their difference is the live pages */
    uint64_t live_pages_peak;        /* the highest that difference reached */
    bool limited;                    /* a device capacity was set */
    uint64_t capacity_pages;         /* whole pages within it */
} ideal_remap_t;

/* The pages some live block overlaps. */
static uint64_t ir_live_pages(const ideal_remap_t *m) { return m->map_calls - m->unmap_calls; }

static bool ir_less(const ir_free_t *a, const ir_free_t *b, bool by_size)
{
    if (by_size && a->size_bytes != b->size_bytes)
        return a->size_bytes < b->size_bytes;
    return a->addr < b->addr;
}

/* First index whose entry is not less than key. */
static size_t ir_lower_bound(const ir_array_t *a, const ir_free_t *key, bool by_size)
{
    size_t lo = 0, hi = a->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ir_less(&a->at[mid], key, by_size))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool ir_insert(ir_array_t *a, ir_free_t f, bool by_size)
{
    if (a->count == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        ir_free_t *at = realloc(a->at, cap * sizeof *at);
        if (!at)
            return false;
        a->at = at;
        a->cap = cap;
    }
    size_t i = ir_lower_bound(a, &f, by_size);
    memmove(&a->at[i + 1], &a->at[i], (a->count - i) * sizeof *a->at);
    a->at[i] = f;
    a->count++;
    return true;
}

/* pre: f is in a. */
static void ir_remove(ir_array_t *a, ir_free_t f, bool by_size)
{
    size_t i = ir_lower_bound(a, &f, by_size);
    memmove(&a->at[i], &a->at[i + 1], (a->count - i - 1) * sizeof *a->at);
    a->count--;
}

/* Both arrays or neither: a failed second insert takes the first one back. */
static bool ir_free_add(ideal_remap_t *m, ir_free_t f)
{
    if (!ir_insert(&m->by_addr, f, false))
        return false;
    if (!ir_insert(&m->by_size, f, true)) {
        ir_remove(&m->by_addr, f, false);
        return false;
    }
    return true;
}

static void ir_free_drop(ideal_remap_t *m, ir_free_t f)
{
    ir_remove(&m->by_addr, f, false);
    ir_remove(&m->by_size, f, true);
}

static size_t ir_slot_of(uint64_t page, size_t slots)
{
    return (size_t)((page * 0x9E3779B97F4A7C15ull) >> 20) & (slots - 1);
}

/* The slot of page, or the empty slot where it would go. pre: slots > 0. */
static size_t ir_edge_find(const ideal_remap_t *m, uint64_t page)
{
    size_t i = ir_slot_of(page, m->edge_slots);
    while (m->edges[i].page_plus_one && m->edges[i].page_plus_one != page + 1)
        i = (i + 1) & (m->edge_slots - 1);
    return i;
}

static uint32_t ir_edges_at(const ideal_remap_t *m, uint64_t page)
{
    return m->edge_slots ? m->edges[ir_edge_find(m, page)].edges : 0;
}

/* Room for two more edge pages (a block's first and last) at load <= 1/2. */
static bool ir_edges_reserve(ideal_remap_t *m)
{
    if (2 * (m->edge_count + 2) <= m->edge_slots)
        return true;
    size_t slots = m->edge_slots ? 2 * m->edge_slots : 256;
    ir_edge_t *old = m->edges, *e = calloc(slots, sizeof *e);
    if (!e)
        return false;
    size_t old_slots = m->edge_slots;
    m->edges = e;
    m->edge_slots = slots;
    for (size_t i = 0; i < old_slots; i++)
        if (old[i].page_plus_one)
            m->edges[ir_edge_find(m, old[i].page_plus_one - 1)] = old[i];
    free(old);
    return true;
}

/* Empties slot i and moves back the entries of its probe run that can no
 * longer be found past the hole (deletion without tombstones). */
static void ir_edge_erase(ideal_remap_t *m, size_t i)
{
    size_t mask = m->edge_slots - 1;
    for (size_t j = (i + 1) & mask; m->edges[j].page_plus_one; j = (j + 1) & mask) {
        size_t home = ir_slot_of(m->edges[j].page_plus_one - 1, m->edge_slots);
        /* Movable into the hole at i unless home lies cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            m->edges[i] = m->edges[j];
            i = j;
        }
    }
    m->edges[i] = (ir_edge_t){0, 0};
    m->edge_count--;
}

/* pre (delta > 0): ir_edges_reserve succeeded since the last insertion. */
static void ir_edge_add(ideal_remap_t *m, uint64_t page, int delta)
{
    size_t i = ir_edge_find(m, page);
    if (!m->edges[i].page_plus_one) {
        m->edges[i].page_plus_one = page + 1;
        m->edge_count++;
    }
    m->edges[i].edges += (uint32_t)delta;
    if (!m->edges[i].edges)
        ir_edge_erase(m, i);
}

/* Pages that become live when a block takes [addr, addr + size): its interior
 * pages lie inside the free block it was carved from, so no live block
 * overlaps them yet; an edge page is new when no live block has an edge on it
 * (a page that another block covers whole cannot hold this one's edge). The
 * same count, taken after a block's edges are removed, is the pages its free
 * leaves with no live block. */
static uint64_t ir_pages_gained(const ideal_remap_t *m, uint64_t addr, uint64_t size_bytes)
{
    uint64_t first = addr >> IR_PAGE_SHIFT, last = (addr + size_bytes - 1) >> IR_PAGE_SHIFT;
    uint64_t interior = last > first + 1 ? last - first - 1 : 0;
    return interior + (ir_edges_at(m, first) == 0) + (last != first && ir_edges_at(m, last) == 0);
}

static void ir_edges_add(ideal_remap_t *m, uint64_t addr, uint64_t size_bytes, int delta)
{
    uint64_t first = addr >> IR_PAGE_SHIFT, last = (addr + size_bytes - 1) >> IR_PAGE_SHIFT;
    ir_edge_add(m, first, delta);
    if (last != first)
        ir_edge_add(m, last, delta);
}

static void ir_destroy(void *ctx)
{
    ideal_remap_t *m = ctx;
    if (!m)
        return;
    free(m->by_addr.at);
    free(m->by_size.at);
    free(m->edges);
    free(m);
}

static stow_status_t ir_create(const stow_replay_setup_t *setup, void **out)
{
    ideal_remap_t *m = calloc(1, sizeof *m);
    if (!m)
        return STOW_EHOSTMEM;
    m->limited = setup->capacity_bytes != 0;
    m->capacity_pages = setup->capacity_bytes >> IR_PAGE_SHIFT;
    *out = m;
    return STOW_OK;
}

/* pre: size_bytes <= UINT64_MAX / 2. */
static uint64_t ir_round(uint64_t size_bytes)
{
    if (size_bytes <= IR_ALIGN_BYTES)
        return IR_ALIGN_BYTES;
    return (size_bytes + IR_ALIGN_BYTES - 1) & ~(uint64_t)(IR_ALIGN_BYTES - 1);
}

/* The best-fit place for size_bytes: a free block, or the top when *from_top. */
static ir_free_t ir_best_fit(const ideal_remap_t *m, uint64_t size_bytes, bool *from_top)
{
    ir_free_t key = {0, size_bytes};
    size_t i = ir_lower_bound(&m->by_size, &key, true);
    *from_top = i == m->by_size.count;
    if (*from_top)
        return (ir_free_t){m->top, UINT64_MAX - m->top};
    return m->by_size.at[i];
}

static stow_status_t ir_alloc(void *ctx, uint64_t size_bytes, uint32_t stream, uint64_t *handle)
{
    (void)stream;
    ideal_remap_t *m = ctx;
    if (size_bytes > UINT64_MAX / 2)
        return STOW_EOVERFLOW;
    uint64_t rounded = ir_round(size_bytes);
    bool from_top;
    ir_free_t f = ir_best_fit(m, rounded, &from_top);
    if (from_top && m->top > UINT64_MAX / 2 - rounded)
        return STOW_EOVERFLOW; /* the range would pass 2^63 bytes */
    if (!ir_edges_reserve(m))
        return STOW_EHOSTMEM;
    uint64_t gained = ir_pages_gained(m, f.addr, rounded);
    if (m->limited && ir_live_pages(m) + gained > m->capacity_pages)
        return STOW_ENOMEM; /* nothing is cached: no release to retry after */
    if (from_top) {
        m->top += rounded;
    } else {
        ir_free_drop(m, f);
        if (f.size_bytes > rounded &&
            !ir_free_add(m, (ir_free_t){f.addr + rounded, f.size_bytes - rounded})) {
            (void)ir_free_add(m, f); /* the room it had just freed */
            return STOW_EHOSTMEM;
        }
    }
    ir_edges_add(m, f.addr, rounded, +1);
    m->map_calls += gained;
    if (ir_live_pages(m) > m->live_pages_peak)
        m->live_pages_peak = ir_live_pages(m);
    *handle = f.addr + 1; /* addresses are 512-aligned: never 0 as a handle */
    return STOW_OK;
}

static void ir_free(void *ctx, uint64_t handle, uint64_t size_bytes)
{
    ideal_remap_t *m = ctx;
    uint64_t addr = handle - 1;
    uint64_t rounded = ir_round(size_bytes);
    ir_edges_add(m, addr, rounded, -1);
    uint64_t lost = ir_pages_gained(m, addr, rounded); /* the same count, now the block is gone */
    m->unmap_calls += lost;

    ir_free_t f = {addr, rounded};
    /* The free block just below, if it ends here. */
    size_t i = ir_lower_bound(&m->by_addr, &f, false);
    if (i > 0) {
        ir_free_t below = m->by_addr.at[i - 1];
        if (below.addr + below.size_bytes == addr) {
            ir_free_drop(m, below);
            f.addr = below.addr;
            f.size_bytes += below.size_bytes;
            i--;
        }
    }
    if (f.addr + f.size_bytes == m->top) {
        m->top = f.addr; /* the free top takes it */
        return;
    }
    if (i < m->by_addr.count) {
        ir_free_t above = m->by_addr.at[i];
        if (f.addr + f.size_bytes == above.addr) {
            ir_free_drop(m, above);
            f.size_bytes += above.size_bytes;
        }
    }
    /* Fails only when no merge made room in the arrays and host memory is
     * out: the block is then lost as address space, which changes no page
     * count, only where later blocks go. */
    (void)ir_free_add(m, f);
}

static void ir_report(void *ctx, stow_replay_report_t *out)
{
    ideal_remap_t *m = ctx;
    out->peak_reserved_bytes = m->live_pages_peak << IR_PAGE_SHIFT;
    out->backend_calls = m->map_calls + m->unmap_calls;
    out->has_backend_calls = true;
    out->fragmentation_at_peak = -1.0; /* not tracked */
    out->has_map_calls = true;
    out->map_calls = m->map_calls;
    out->unmap_calls = m->unmap_calls;
}

const stow_replay_policy_t stow__replay_policy_ideal_remap = {
    "ideal-remap",
    "reference: best-fit addresses, 2 MiB pages only under live data (not in all)", true,
    ir_create, ir_alloc, ir_free, NULL, ir_report, ir_destroy, true, NULL, false,
};
