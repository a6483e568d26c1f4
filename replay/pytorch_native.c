/*
 * replay/pytorch_native.c: the PyTorch CUDACachingAllocator replay model, native
 * and expandable_segments modes (contract in replay/pytorch_model.h).
 *
 * This file owns the model's host state: block structs (slab-allocated, addressed by
 * handle), two pools (small, large) each with a treap of free mapped blocks keyed
 * (stream, size, address) and, for expandable segments, a treap of unmapped blocks
 * keyed (stream, address). It must not touch a device: "cudaMalloc" is a bump of a
 * fake address counter checked against capacity_bytes.
 *
 * The control flow follows PyTorch's DeviceCachingAllocator (malloc, free,
 * get_free_block, alloc_block, release_*, map_block, unmap_block) so that every
 * decision that changes reserved bytes is made by the same rule, in the same order.
 * The rules were learned from PyTorch's source and ../shared/notes/allocators.md
 * section 2; no PyTorch code is copied.
 *
 * Invariants (checked by stow__ptm_check):
 *   - blocks of one segment form a doubly linked list ordered by address, with no
 *     gaps: b->addr + b->size == b->next->addr;
 *   - a free mapped block is in its pool's `free_root` treap, an unmapped block in
 *     `unmapped_root`, an allocated block in neither;
 *   - no two neighbouring blocks are both free and of the same mapped state;
 *   - sum of mapped block sizes == reserved_bytes_current == total_reserved.
 */
#include "replay/pytorch_model.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { PTM_POOL_SMALL = 0, PTM_POOL_LARGE = 1, PTM_POOL_COUNT = 2 };

#define PTM_CHUNK_SHIFT 12u
#define PTM_CHUNK_BLOCKS (1u << PTM_CHUNK_SHIFT)
/* Fake device addresses are handed out downward from here. Best fit breaks
 * ties between free blocks of one size by address, so the order of
 * cudaMalloc's addresses decides which one PyTorch takes: in 8,707 pairs of
 * consecutive cudaMalloc calls of public memory snapshots, the second address
 * was below the first in 6,069 (docs/pytorch_model.md). Handed out upward, the
 * model parted from PyTorch on one of those 42 device traces (+7 %); downward,
 * on none, and the same peaks on the five shared traces either way. */
#define PTM_ADDR_TOP ((uint64_t)1 << 62)
#define PTM_VA_ALIGN ((uint64_t)2097152)             /* cudaMalloc / VA granularity */
#define PTM_EXPANDABLE_VA_MAX ((size_t)1 << 50)      /* one expandable segment's range, at most */

typedef struct ptm_segment ptm_segment_t;
typedef struct ptm_block ptm_block_t;

/* One expandable segment: a VA range of max_pages pages of page_bytes each. */
struct ptm_segment {
    uint64_t base;         /* first fake address of the VA range */
    size_t page_bytes;     /* 2 MiB (small pool) or large_segment_bytes (large pool) */
    size_t max_pages;      /* VA size / page_bytes */
    ptm_segment_t *prev_seg; /* list of live segments, for destroy */
    ptm_segment_t *next_seg;
};

struct ptm_block {
    uint64_t addr;           /* fake device address */
    size_t size;             /* bytes */
    size_t requested;        /* bytes asked for (allocated blocks only) */
    ptm_block_t *prev;       /* neighbour at lower address in the same segment */
    ptm_block_t *next;       /* neighbour at higher address in the same segment */
    ptm_block_t *left;       /* treap children (free list: also the slab free list) */
    ptm_block_t *right;
    ptm_segment_t *seg;      /* expandable segment, or NULL for a cudaMalloc segment */
    int64_t gc_count_base;   /* pool's get_free_block count when cached */
    uint32_t prio;           /* treap heap priority */
    uint32_t stream;         /* allocation stream */
    uint32_t id;             /* slot index: handle low half */
    uint32_t gen;            /* slot generation: handle high half */
    uint8_t pool;            /* PTM_POOL_* */
    uint8_t allocated;       /* handed out to the caller */
    uint8_t mapped;          /* backed by device memory (always 1 when seg == NULL) */
    uint8_t live;            /* slot in use (not on the slab free list) */
};

typedef struct ptm_pool {
    ptm_block_t *free_root;     /* free mapped blocks by (stream, size, addr) */
    ptm_block_t *unmapped_root; /* unmapped blocks by (stream, addr) */
    size_t free_count;          /* nodes in free_root */
    int64_t get_free_blocks_call_count; /* GC age clock */
} ptm_pool_t;

struct stow_ptm {
    stow_ptm_config_t cfg;
    ptm_pool_t pools[PTM_POOL_COUNT];
    size_t device_total;       /* capacity_bytes, or the H200 size when unlimited */
    size_t allowed_max;        /* memory_fraction x device_total */
    int set_fraction;          /* memory_fraction was given */
    int gc_enabled;            /* set_fraction && threshold > 0 */
    size_t total_reserved;     /* total_allocated_memory in PyTorch */
    uint64_t next_addr;        /* bump pointer for fake addresses */
    uint32_t rng;              /* xorshift32 state for treap priorities */
    ptm_block_t **chunks;      /* slab of block structs */
    uint32_t chunk_count;
    uint32_t chunk_cap;
    uint32_t slots_used;       /* slots ever handed out */
    ptm_block_t *free_slots;   /* recycled structs, linked through left */
    uint32_t free_slot_count;
    ptm_segment_t *segments;   /* live expandable segments */
    stow_ptm_stats_t st;       /* counters (largest_free/inactive_split filled on read) */
};

/* ---------------------------------------------------------------- size rules */

static unsigned ptm_floor_log2(size_t x) {
    return (unsigned)(63 - __builtin_clzll((unsigned long long)x));
}

static int ptm_is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

static unsigned ptm_divisions(const stow_ptm_t *m, size_t size) {
    int idx = (int)ptm_floor_log2(size) - 20; /* intervals start at 1 MiB = 2^20 */
    if (idx < 0) idx = 0;
    if (idx > STOW_PTM_ROUNDUP_INTERVALS - 1) idx = STOW_PTM_ROUNDUP_INTERVALS - 1;
    return m->cfg.roundup_power2_divisions[idx];
}

/* Rounds size up to the next of `divisions` equal steps between two powers of two. */
static size_t ptm_round_pow2_division(size_t size, unsigned divisions) {
    if (ptm_is_pow2(size)) return size;
    size_t floor2 = (size_t)1 << ptm_floor_log2(size);
    size_t step = floor2 >> ptm_floor_log2(divisions);
    if (step == 0) return floor2 << 1;
    size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
}

size_t stow__ptm_round_size(const stow_ptm_t *m, size_t size) {
    if (size < STOW_PTM_MIN_BLOCK_BYTES) return STOW_PTM_MIN_BLOCK_BYTES;
    unsigned div = m ? ptm_divisions(m, size) : 0;
    if (div > 1 && size > STOW_PTM_MIN_BLOCK_BYTES * div) return ptm_round_pow2_division(size, div);
    return (size + STOW_PTM_MIN_BLOCK_BYTES - 1) / STOW_PTM_MIN_BLOCK_BYTES * STOW_PTM_MIN_BLOCK_BYTES;
}

static size_t ptm_allocation_size(const stow_ptm_t *m, size_t size) {
    if (size <= STOW_PTM_SMALL_SIZE_BYTES) return STOW_PTM_SMALL_BUFFER_BYTES;
    if (size < STOW_PTM_MIN_LARGE_ALLOC_BYTES) return m->cfg.large_segment_bytes;
    return (size + STOW_PTM_ROUND_LARGE_BYTES - 1) / STOW_PTM_ROUND_LARGE_BYTES *
           STOW_PTM_ROUND_LARGE_BYTES;
}

/* ---------------------------------------------------------------- treaps */

/* Strict order of the free set: (stream, size, addr); of the unmapped set:
 * (stream, addr). Addresses are unique, so keys are unique. */
static int ptm_less(const ptm_block_t *a, const ptm_block_t *b, int by_addr) {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (!by_addr && a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
}

static ptm_block_t *tr_merge(ptm_block_t *a, ptm_block_t *b) {
    if (!a) return b;
    if (!b) return a;
    if (a->prio > b->prio) {
        a->right = tr_merge(a->right, b);
        return a;
    }
    b->left = tr_merge(a, b->left);
    return b;
}

/* Splits t into keys < key (*lo) and keys >= key (*hi). */
static void tr_split(ptm_block_t *t, const ptm_block_t *key, int by_addr, ptm_block_t **lo,
                     ptm_block_t **hi) {
    if (!t) {
        *lo = *hi = NULL;
    } else if (ptm_less(t, key, by_addr)) {
        tr_split(t->right, key, by_addr, &t->right, hi);
        *lo = t;
    } else {
        tr_split(t->left, key, by_addr, lo, &t->left);
        *hi = t;
    }
}

static ptm_block_t *tr_insert(ptm_block_t *t, ptm_block_t *n, int by_addr) {
    if (!t) return n;
    if (n->prio > t->prio) {
        tr_split(t, n, by_addr, &n->left, &n->right);
        return n;
    }
    if (ptm_less(n, t, by_addr))
        t->left = tr_insert(t->left, n, by_addr);
    else
        t->right = tr_insert(t->right, n, by_addr);
    return t;
}

/* pre: n is in t and its key has not changed since it was inserted. */
static ptm_block_t *tr_erase(ptm_block_t *t, const ptm_block_t *n, int by_addr) {
    if (t == n) return tr_merge(t->left, t->right);
    if (ptm_less(n, t, by_addr))
        t->left = tr_erase(t->left, n, by_addr);
    else
        t->right = tr_erase(t->right, n, by_addr);
    return t;
}

/* First node whose key is >= key (std::set::lower_bound). */
static ptm_block_t *tr_lower_bound(ptm_block_t *t, const ptm_block_t *key, int by_addr) {
    ptm_block_t *best = NULL;
    while (t) {
        if (ptm_less(t, key, by_addr)) {
            t = t->right;
        } else {
            best = t;
            t = t->left;
        }
    }
    return best;
}

/* First node whose key is > key. */
static ptm_block_t *tr_upper_bound(ptm_block_t *t, const ptm_block_t *key, int by_addr) {
    ptm_block_t *best = NULL;
    while (t) {
        if (ptm_less(key, t, by_addr)) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
}

/* Last node whose key is < key. */
static ptm_block_t *tr_before(ptm_block_t *t, const ptm_block_t *key, int by_addr) {
    ptm_block_t *best = NULL;
    while (t) {
        if (ptm_less(t, key, by_addr)) {
            best = t;
            t = t->right;
        } else {
            t = t->left;
        }
    }
    return best;
}

/* In-order walk into out[] (at most cap entries); returns the count written. */
static size_t tr_collect(ptm_block_t *t, ptm_block_t **out, size_t n, size_t cap) {
    while (t && n < cap) {
        n = tr_collect(t->left, out, n, cap);
        if (n < cap) out[n++] = t;
        t = t->right;
    }
    return n;
}

/* ---------------------------------------------------------------- slab */

static uint32_t ptm_rand(stow_ptm_t *m) {
    uint32_t x = m->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    m->rng = x;
    return x;
}

/* Makes sure `n` block structs can be taken without a host allocation failing. */
static int ptm_reserve_slots(stow_ptm_t *m, uint32_t n) {
    while (m->free_slot_count < n) {
        if ((m->slots_used & (PTM_CHUNK_BLOCKS - 1)) == 0 &&
            (m->slots_used >> PTM_CHUNK_SHIFT) == m->chunk_count) {
            if (m->chunk_count == m->chunk_cap) {
                uint32_t cap = m->chunk_cap ? m->chunk_cap * 2 : 16;
                ptm_block_t **c = realloc(m->chunks, cap * sizeof *c);
                if (!c) return 0;
                m->chunks = c;
                m->chunk_cap = cap;
            }
            ptm_block_t *chunk = calloc(PTM_CHUNK_BLOCKS, sizeof *chunk);
            if (!chunk) return 0;
            m->chunks[m->chunk_count++] = chunk;
        }
        if (m->slots_used == UINT32_MAX) return 0;
        uint32_t id = m->slots_used++;
        ptm_block_t *b = &m->chunks[id >> PTM_CHUNK_SHIFT][id & (PTM_CHUNK_BLOCKS - 1)];
        b->id = id;
        b->gen = 1;
        b->left = m->free_slots;
        m->free_slots = b;
        m->free_slot_count++;
    }
    return 1;
}

/* pre: ptm_reserve_slots succeeded for this many takes. */
static ptm_block_t *ptm_block_new(stow_ptm_t *m, uint64_t addr, size_t size, uint32_t stream,
                                  uint8_t pool, ptm_segment_t *seg, uint8_t mapped) {
    ptm_block_t *b = m->free_slots;
    m->free_slots = b->left;
    m->free_slot_count--;
    uint32_t id = b->id, gen = b->gen;
    memset(b, 0, sizeof *b);
    b->id = id;
    b->gen = gen;
    b->addr = addr;
    b->size = size;
    b->stream = stream;
    b->pool = pool;
    b->seg = seg;
    b->mapped = mapped;
    b->live = 1;
    b->prio = ptm_rand(m);
    return b;
}

static void ptm_block_delete(stow_ptm_t *m, ptm_block_t *b) {
    b->live = 0;
    b->allocated = 0;
    b->gen = b->gen + 1 ? b->gen + 1 : 1; /* stale handles stop matching */
    b->left = m->free_slots;
    m->free_slots = b;
    m->free_slot_count++;
}

static ptm_block_t *ptm_lookup(const stow_ptm_t *m, uint64_t handle) {
    uint32_t id = (uint32_t)handle, gen = (uint32_t)(handle >> 32);
    if (id >= m->slots_used) return NULL;
    ptm_block_t *b = &m->chunks[id >> PTM_CHUNK_SHIFT][id & (PTM_CHUNK_BLOCKS - 1)];
    if (!b->live || !b->allocated || b->gen != gen) return NULL;
    return b;
}

/* ---------------------------------------------------------------- counters */

static void ptm_reserved_add(stow_ptm_t *m, size_t bytes) {
    m->total_reserved += bytes;
    m->st.reserved_bytes_current = m->total_reserved;
    if (m->total_reserved > m->st.reserved_bytes_peak) m->st.reserved_bytes_peak = m->total_reserved;
}

static void ptm_reserved_sub(stow_ptm_t *m, size_t bytes) {
    m->total_reserved -= bytes;
    m->st.reserved_bytes_current = m->total_reserved;
}

static void ptm_segment_count_add(stow_ptm_t *m) {
    if (++m->st.segment_count_current > m->st.segment_count_peak)
        m->st.segment_count_peak = m->st.segment_count_current;
}

/* One driver call, told to the observer if there is one. */
static void ptm_driver_call(const stow_ptm_t *m, stow_ptm_driver_call_t call, size_t bytes) {
    if (m->cfg.on_driver_call) m->cfg.on_driver_call(m->cfg.on_driver_call_arg, call, bytes);
}

/* Would the simulated device refuse `bytes` more? */
static int ptm_device_full(const stow_ptm_t *m, size_t bytes) {
    return m->cfg.capacity_bytes != 0 && (bytes > m->cfg.capacity_bytes ||
                                          m->total_reserved > m->cfg.capacity_bytes - bytes);
}

/* Fake device addresses for `bytes`, handed out downward; 0 when what is left
 * above PTM_VA_ALIGN cannot hold them (a cudaMalloc that fails). Addresses are
 * never reused, so this also bounds what the model can ever reserve: its
 * counters cannot wrap, even with no capacity set. */
static uint64_t ptm_take_va(stow_ptm_t *m, size_t bytes) {
    if (bytes >= m->next_addr) return 0;
    uint64_t rounded = (uint64_t)bytes / PTM_VA_ALIGN * PTM_VA_ALIGN;
    if (rounded != bytes) rounded += PTM_VA_ALIGN; /* bytes < next_addr <= 2^62 */
    if (rounded >= m->next_addr) return 0;
    m->next_addr -= rounded;
    return m->next_addr;
}

/* ---------------------------------------------------------------- pool sets */

static void ptm_free_insert(stow_ptm_t *m, ptm_block_t *b) {
    ptm_pool_t *p = &m->pools[b->pool];
    b->gc_count_base = p->get_free_blocks_call_count;
    b->left = b->right = NULL;
    p->free_root = tr_insert(p->free_root, b, 0);
    p->free_count++;
}

static void ptm_free_erase(stow_ptm_t *m, ptm_block_t *b) {
    ptm_pool_t *p = &m->pools[b->pool];
    p->free_root = tr_erase(p->free_root, b, 0);
    p->free_count--;
}

static void ptm_unmapped_insert(stow_ptm_t *m, ptm_block_t *b) {
    ptm_pool_t *p = &m->pools[b->pool];
    b->left = b->right = NULL;
    p->unmapped_root = tr_insert(p->unmapped_root, b, 1);
}

static void ptm_unmapped_erase(stow_ptm_t *m, ptm_block_t *b) {
    ptm_pool_t *p = &m->pools[b->pool];
    p->unmapped_root = tr_erase(p->unmapped_root, b, 1);
}

/* try_merge_blocks: folds src into dst when src is free and of the same mapped
 * state. pre: dst is in no set (its key may change). */
static void ptm_try_merge(stow_ptm_t *m, ptm_block_t *dst, ptm_block_t *src) {
    if (!src || src->allocated || dst->mapped != src->mapped) return;
    if (src->mapped)
        ptm_free_erase(m, src);
    else
        ptm_unmapped_erase(m, src);
    if (dst->prev == src) {
        dst->addr = src->addr;
        dst->prev = src->prev;
        if (dst->prev) dst->prev->next = dst;
    } else {
        dst->next = src->next;
        if (dst->next) dst->next->prev = dst;
    }
    dst->size += src->size;
    ptm_block_delete(m, src);
}

/* Links b between before and after (either may be NULL). */
static void ptm_splice(ptm_block_t *b, ptm_block_t *before, ptm_block_t *after) {
    if (before) before->next = b;
    b->prev = before;
    if (after) after->prev = b;
    b->next = after;
}

/* ---------------------------------------------------------------- device side */

/* cudaFree of a whole cached segment (release_block). pre: b free, unsplit, mapped. */
static void ptm_release_block(stow_ptm_t *m, ptm_block_t *b) {
    ptm_free_erase(m, b);
    ptm_reserved_sub(m, b->size);
    m->st.segment_count_current--;
    m->st.device_free_calls++;
    ptm_driver_call(m, STOW_PTM_CUDA_FREE, b->size);
    ptm_block_delete(m, b);
}

/* unmap_block: unmaps the whole pages inside free block b, keeping the partial pages
 * at either end as free mapped blocks. pre: b is free, mapped, in the free set,
 * 2 spare slots reserved. */
static void ptm_unmap_block(stow_ptm_t *m, ptm_block_t *b) {
    ptm_segment_t *seg = b->seg;
    size_t ps = seg->page_bytes;
    uint64_t off = b->addr - seg->base;
    uint64_t first = (off + ps - 1) / ps, last = (off + b->size) / ps;
    if (first >= last) return;
    ptm_free_erase(m, b);
    uint64_t uaddr = seg->base + first * ps;
    size_t usize = (size_t)(last - first) * ps;
    size_t before = (size_t)(uaddr - b->addr);
    size_t after = b->size - before - usize;
    if (before > 0) {
        ptm_block_t *nb = ptm_block_new(m, b->addr, before, b->stream, b->pool, seg, 1);
        ptm_splice(nb, b->prev, b);
        ptm_free_insert(m, nb);
    }
    if (after > 0) {
        ptm_block_t *na = ptm_block_new(m, uaddr + usize, after, b->stream, b->pool, seg, 1);
        ptm_splice(na, b, b->next);
        ptm_free_insert(m, na);
    }
    b->addr = uaddr;
    b->size = usize;
    b->mapped = 0;
    ptm_try_merge(m, b, b->prev);
    ptm_try_merge(m, b, b->next);
    ptm_unmapped_insert(m, b);
    ptm_reserved_sub(m, usize);
    m->st.device_free_calls++;
    m->st.unmap_calls++;
    m->st.pages_released += last - first;
    /* unmapHandles: the segment's stream is synchronized first (unmapping is
     * not stream-ordered), then each page is unmapped and released. */
    ptm_driver_call(m, STOW_PTM_STREAM_SYNCHRONIZE, 0);
    for (uint64_t i = first; i < last; i++) {
        ptm_driver_call(m, STOW_PTM_MEM_UNMAP, ps);
        ptm_driver_call(m, STOW_PTM_MEM_RELEASE, ps);
    }
}

/* release_expandable_segment. pre: b is the segment's only block, unmapped. */
static void ptm_release_segment(stow_ptm_t *m, ptm_block_t *b) {
    ptm_segment_t *seg = b->seg;
    ptm_unmapped_erase(m, b);
    if (seg->prev_seg) seg->prev_seg->next_seg = seg->next_seg;
    else m->segments = seg->next_seg;
    if (seg->next_seg) seg->next_seg->prev_seg = seg->prev_seg;
    ptm_driver_call(m, STOW_PTM_ADDRESS_FREE, seg->max_pages * seg->page_bytes);
    free(seg);
    m->st.segment_count_current--;
    ptm_block_delete(m, b);
}

/* release_blocks: cudaFree every unsplit cached block; unmap the free pages of
 * every free expandable block, then drop segments left with no mapped page. */
static void ptm_release_blocks(stow_ptm_t *m, int pool) {
    ptm_pool_t *p = &m->pools[pool];
    size_t n = p->free_count;
    if (n == 0) return;
    ptm_block_t **all = malloc(n * sizeof *all);
    if (!all) return; /* host memory: leave the cache as it is */
    n = tr_collect(p->free_root, all, 0, n);
    size_t nunmap = 0;
    for (size_t i = 0; i < n; i++) {
        ptm_block_t *b = all[i];
        if (b->seg)
            all[nunmap++] = b; /* gathered first: unmapping changes the set */
        else if (!b->prev && !b->next)
            ptm_release_block(m, b);
    }
    for (size_t i = 0; i < nunmap; i++) {
        ptm_block_t *b = all[i];
        if (!ptm_reserve_slots(m, 2)) break;
        ptm_unmap_block(m, b);
        if (!b->prev && !b->next && !b->mapped) ptm_release_segment(m, b);
    }
    free(all);
}

/* release_cached_blocks (empty_cache, last step of the OOM path). */
static void ptm_release_cached(stow_ptm_t *m) {
    m->st.num_sync_all_streams++;
    ptm_release_blocks(m, PTM_POOL_LARGE);
    ptm_release_blocks(m, PTM_POOL_SMALL);
}

/* ---------------------------------------------------------------- expandable */

static int ptm_allocatable(const ptm_block_t *b) { return b && !b->allocated; }

static int ptm_has_space(const ptm_block_t *b, size_t size) {
    size_t bytes = 0;
    while (bytes < size && ptm_allocatable(b)) {
        bytes += b->size;
        b = b->next;
    }
    return bytes >= size;
}

/* find_expandable_block: the lowest address in a segment of (stream, pool) where
 * free and unmapped blocks together hold size bytes; else a new segment. Returns
 * NULL when no segment can hold size (more than its virtual range, or the
 * model's addresses are used up) or host memory runs out. */
static ptm_block_t *ptm_find_expandable(stow_ptm_t *m, uint32_t stream, int pool, size_t size) {
    ptm_pool_t *p = &m->pools[pool];
    ptm_block_t key;
    key.stream = stream;
    key.addr = 0;
    key.size = 0;
    for (ptm_block_t *c = tr_lower_bound(p->unmapped_root, &key, 1); c && c->stream == stream;
         c = tr_upper_bound(p->unmapped_root, c, 1)) {
        ptm_block_t *cand = ptm_allocatable(c->prev) ? c->prev : c;
        if (ptm_has_space(cand, size)) return cand;
    }
    size_t page_bytes = pool == PTM_POOL_SMALL ? STOW_PTM_SMALL_BUFFER_BYTES
                                               : m->cfg.large_segment_bytes;
    /* VA for 1 1/8 of the device, so pages unmapped early can be remapped late;
     * at most PTM_EXPANDABLE_VA_MAX, so that 4096 segments fit in the model's
     * addresses whatever capacity was set. A request beyond that fits no
     * segment: out of memory, as on the device. */
    size_t va = m->device_total > PTM_EXPANDABLE_VA_MAX / 9 * 8
                    ? PTM_EXPANDABLE_VA_MAX
                    : m->device_total + m->device_total / 8;
    size_t max_pages = (va + page_bytes - 1) / page_bytes;
    if (size > max_pages * page_bytes) return NULL;
    uint64_t base = ptm_take_va(m, max_pages * page_bytes);
    if (!base) return NULL;
    ptm_segment_t *seg = calloc(1, sizeof *seg);
    if (!seg) return NULL;
    seg->page_bytes = page_bytes;
    seg->max_pages = max_pages;
    seg->base = base;
    seg->next_seg = m->segments;
    if (m->segments) m->segments->prev_seg = seg;
    m->segments = seg;
    ptm_segment_count_add(m);
    ptm_driver_call(m, STOW_PTM_ADDRESS_RESERVE, seg->max_pages * seg->page_bytes);
    ptm_block_t *b = ptm_block_new(m, seg->base, seg->max_pages * seg->page_bytes, stream,
                                   (uint8_t)pool, seg, 0);
    ptm_unmapped_insert(m, b);
    return b;
}

/* map_block: maps the pages covering [to_map->addr, +size) and merges the result
 * with free mapped neighbours. pre: to_map unmapped, size <= to_map->size, one
 * spare slot. Returns 0 when the device is full (nothing mapped). */
static int ptm_map_block(stow_ptm_t *m, ptm_block_t *to_map, size_t size) {
    ptm_segment_t *seg = to_map->seg;
    size_t ps = seg->page_bytes;
    uint64_t off = to_map->addr - seg->base;
    uint64_t first = off / ps, last = (off + size + ps - 1) / ps;
    if (first == last) return 0;
    size_t bytes = (size_t)(last - first) * ps;
    if (ptm_device_full(m, bytes)) return 0; /* cuMemCreate fails; pages released */
    ptm_unmapped_erase(m, to_map);
    to_map->mapped = 1;
    if (bytes < to_map->size) {
        ptm_block_t *rest = ptm_block_new(m, to_map->addr + bytes, to_map->size - bytes,
                                          to_map->stream, to_map->pool, seg, 0);
        ptm_splice(rest, to_map, to_map->next);
        ptm_unmapped_insert(m, rest);
        to_map->size = bytes;
    }
    ptm_try_merge(m, to_map, to_map->prev);
    ptm_try_merge(m, to_map, to_map->next);
    ptm_free_insert(m, to_map);
    ptm_reserved_add(m, bytes);
    m->st.device_alloc_calls++;
    m->st.map_calls++;
    m->st.pages_created += last - first;
    /* map: a cuMemCreate per page, then mapAndSetAccess: a cuMemMap per page and
     * one cuMemSetAccess over them (which costs about as much per page). */
    for (uint64_t i = first; i < last; i++) ptm_driver_call(m, STOW_PTM_MEM_CREATE, ps);
    for (uint64_t i = first; i < last; i++) ptm_driver_call(m, STOW_PTM_MEM_MAP, ps);
    return 1;
}

/* try_allocate_expandable_block: maps just enough pages for size bytes and returns
 * the free block (removed from the free set), or NULL. */
static ptm_block_t *ptm_alloc_expandable(stow_ptm_t *m, uint32_t stream, int pool, size_t size) {
    if (!ptm_reserve_slots(m, 2)) return NULL;
    ptm_block_t *c = ptm_find_expandable(m, stream, pool, size);
    if (!c) return NULL;
    if (!c->mapped && !ptm_map_block(m, c, c->size < size ? c->size : size)) return NULL;
    while (c->size < size) {
        size_t rest = size - c->size;
        ptm_block_t *nc = c->next;
        if (!ptm_reserve_slots(m, 1)) return NULL;
        if (!ptm_map_block(m, nc, nc->size < rest ? nc->size : rest)) return NULL;
        c = nc; /* map_block folded the old candidate into nc */
    }
    ptm_free_erase(m, c);
    return c;
}

/* ---------------------------------------------------------------- malloc path */

/* Size used by best fit for an expandable block: its own size plus the unmapped
 * space right after it, which it could grow into. */
static size_t ptm_expandable_size(const ptm_block_t *b) {
    return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

/* get_free_block: best fit on the same stream, with the max_split_size rules. */
static ptm_block_t *ptm_get_free_block(stow_ptm_t *m, int pool, uint32_t stream, size_t size) {
    ptm_pool_t *p = &m->pools[pool];
    if (m->gc_enabled) p->get_free_blocks_call_count++;
    ptm_block_t key;
    key.stream = stream;
    key.size = size;
    key.addr = 0;
    ptm_block_t *it = tr_lower_bound(p->free_root, &key, 0);
    if (!it || it->stream != stream) return NULL;
    if (it->seg) {
        /* Prefer the next larger block while its growable size is smaller: do not
         * pick the segment tail (which could grow to the whole VA) when another
         * block fits better. */
        ptm_block_t *nx = tr_upper_bound(p->free_root, it, 0);
        while (it->seg && nx && nx->stream == stream &&
               ptm_expandable_size(nx) < ptm_expandable_size(it)) {
            it = nx;
            nx = tr_upper_bound(p->free_root, nx, 0);
        }
    }
    size_t msplit = m->cfg.max_split_size_bytes;
    if (size < msplit && it->size >= msplit) return NULL;
    if (size >= msplit && it->size >= size + m->cfg.max_non_split_rounding_bytes) return NULL;
    ptm_free_erase(m, it);
    return it;
}

/* alloc_block: one cudaMalloc of alloc_size (or page mapping in expandable mode). */
static ptm_block_t *ptm_alloc_block(stow_ptm_t *m, int pool, uint32_t stream, size_t size,
                                    size_t alloc_size, int is_retry) {
    if (is_retry) m->st.num_alloc_retries++;
    if (m->set_fraction &&
        (alloc_size > m->allowed_max || m->total_reserved > m->allowed_max - alloc_size))
        return NULL;
    if (m->cfg.expandable) return ptm_alloc_expandable(m, stream, pool, size);
    if (ptm_device_full(m, alloc_size)) return NULL;
    if (!ptm_reserve_slots(m, 1)) return NULL;
    uint64_t addr = ptm_take_va(m, alloc_size);
    if (!addr) return NULL;
    ptm_block_t *b = ptm_block_new(m, addr, alloc_size, stream, (uint8_t)pool, NULL, 1);
    ptm_reserved_add(m, alloc_size);
    ptm_segment_count_add(m);
    m->st.device_alloc_calls++;
    ptm_driver_call(m, STOW_PTM_CUDA_MALLOC, alloc_size);
    return b;
}

/* release_available_cached_blocks: frees oversize cached blocks (only when
 * max_split_size is set): the smallest one that covers the request, else the
 * largest ones until their sum does. Expandable blocks are skipped, as PyTorch 2.x
 * does (they are only unmapped by release_cached_blocks). */
static int ptm_release_available(stow_ptm_t *m, int pool, uint32_t stream, size_t size) {
    size_t msplit = m->cfg.max_split_size_bytes;
    if (msplit == SIZE_MAX) return 0;
    ptm_pool_t *p = &m->pools[pool];
    ptm_block_t key;
    key.stream = stream;
    key.size = size < msplit ? msplit : size;
    key.addr = 0;
    ptm_block_t *it = tr_lower_bound(p->free_root, &key, 0);
    if (it && it->stream == stream && !it->seg) {
        ptm_release_block(m, it);
        return 1;
    }
    it = tr_before(p->free_root, &key, 0);
    size_t released = 0;
    while (it && released < key.size && it->size >= msplit && it->stream == stream) {
        ptm_block_t *cur = it;
        it = tr_before(p->free_root, cur, 0);
        if (!cur->seg) {
            released += cur->size;
            ptm_release_block(m, cur);
        }
    }
    return released >= key.size;
}

/* garbage_collect_cached_blocks: frees unsplit large cached blocks older than the
 * average age until reserved falls under threshold x allowed memory. */
static void ptm_garbage_collect(stow_ptm_t *m) {
    size_t threshold = (size_t)(m->cfg.garbage_collection_threshold * (double)m->allowed_max);
    if (m->total_reserved <= threshold) return;
    size_t target = m->total_reserved - threshold, reclaimed = 0;
    ptm_pool_t *p = &m->pools[PTM_POOL_LARGE];
    size_t n = p->free_count;
    if (n == 0) return;
    ptm_block_t **all = malloc(n * sizeof *all);
    if (!all) return;
    n = tr_collect(p->free_root, all, 0, n);
    int64_t total_age = 0, count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!all[i]->prev && !all[i]->next) { /* expandable blocks are never unsplit */
            total_age += p->get_free_blocks_call_count - all[i]->gc_count_base;
            count++;
        }
    }
    int freed = 1, any = 0;
    while (reclaimed < target && freed && count > 0) {
        double age_threshold = (double)total_age / (double)count;
        freed = 0;
        size_t keep = 0;
        for (size_t i = 0; i < n; i++) {
            ptm_block_t *b = all[i];
            int64_t age = p->get_free_blocks_call_count - b->gc_count_base;
            if (!b->prev && !b->next && (double)age >= age_threshold) {
                freed = any = 1;
                reclaimed += b->size;
                total_age -= age;
                count--;
                ptm_release_block(m, b);
            } else {
                all[keep++] = b;
            }
        }
        n = keep;
    }
    free(all);
    if (any) m->st.num_gc_runs++;
}

/* should_split: small pool or expandable -> remainder >= 512 B; large pool ->
 * request under max_split_size and remainder over 1 MiB. */
static int ptm_should_split(const stow_ptm_t *m, const ptm_block_t *b, size_t size) {
    size_t remaining = b->size - size;
    if (b->pool == PTM_POOL_SMALL || m->cfg.expandable) return remaining >= STOW_PTM_MIN_BLOCK_BYTES;
    return size < m->cfg.max_split_size_bytes && remaining > STOW_PTM_SMALL_SIZE_BYTES;
}

stow_status_t stow__ptm_alloc(stow_ptm_t *m, size_t orig, uint32_t stream, uint64_t *handle_out) {
    if (!m || !handle_out) return STOW_EINVAL;
    if (orig > SIZE_MAX / 2) return STOW_EOVERFLOW;
    if (!ptm_reserve_slots(m, 4)) return STOW_EHOSTMEM;
    size_t size = stow__ptm_round_size(m, orig);
    int pool = size <= STOW_PTM_SMALL_SIZE_BYTES ? PTM_POOL_SMALL : PTM_POOL_LARGE;
    size_t alloc_size = ptm_allocation_size(m, size);

    ptm_block_t *b = ptm_get_free_block(m, pool, stream, size);
    if (!b) {
        if (m->gc_enabled) ptm_garbage_collect(m);
        b = ptm_alloc_block(m, pool, stream, size, alloc_size, 0);
        if (!b && ptm_release_available(m, pool, stream, size))
            b = ptm_alloc_block(m, pool, stream, size, alloc_size, 0);
        if (!b) {
            ptm_release_cached(m);
            b = ptm_alloc_block(m, pool, stream, size, alloc_size, 1);
        }
        if (!b) {
            m->st.num_ooms++;
            return STOW_ENOMEM;
        }
    }

    /* alloc_found_block: the front part is handed out, the rest stays cached. */
    if (ptm_should_split(m, b, size)) {
        if (!ptm_reserve_slots(m, 1)) {
            ptm_free_insert(m, b);
            return STOW_EHOSTMEM;
        }
        ptm_block_t *rest = b;
        b = ptm_block_new(m, rest->addr, size, stream, rest->pool, rest->seg, 1);
        ptm_splice(b, rest->prev, rest);
        rest->addr += size;
        rest->size -= size;
        ptm_free_insert(m, rest);
    }
    b->allocated = 1;
    b->requested = orig;
    m->st.allocated_bytes_current += b->size;
    if (m->st.allocated_bytes_current > m->st.allocated_bytes_peak)
        m->st.allocated_bytes_peak = m->st.allocated_bytes_current;
    m->st.requested_bytes_current += orig;
    if (m->st.requested_bytes_current > m->st.requested_bytes_peak)
        m->st.requested_bytes_peak = m->st.requested_bytes_current;
    m->st.allocation_count_current++;
    *handle_out = ((uint64_t)b->gen << 32) | b->id;
    return STOW_OK;
}

stow_status_t stow__ptm_free(stow_ptm_t *m, uint64_t handle) {
    if (!m) return STOW_EINVAL;
    ptm_block_t *b = ptm_lookup(m, handle);
    if (!b) return STOW_ENOTOWNED;
    m->st.allocated_bytes_current -= b->size;
    m->st.requested_bytes_current -= b->requested;
    m->st.allocation_count_current--;
    b->allocated = 0;
    b->requested = 0;
    /* free_block: coalesce with free neighbours of the same segment, then cache. */
    ptm_try_merge(m, b, b->prev);
    ptm_try_merge(m, b, b->next);
    ptm_free_insert(m, b);
    return STOW_OK;
}

/* ---------------------------------------------------------------- lifecycle */

void stow__ptm_config_default(stow_ptm_config_t *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->max_split_size_bytes = SIZE_MAX;
    c->max_non_split_rounding_bytes = STOW_PTM_LARGE_BUFFER_BYTES;
    c->large_segment_bytes = STOW_PTM_LARGE_BUFFER_BYTES;
}

stow_status_t stow__ptm_create(const stow_ptm_config_t *config, stow_ptm_t **out) {
    if (!out) return STOW_EINVAL;
    stow_ptm_config_t c;
    if (config)
        c = *config;
    else
        stow__ptm_config_default(&c);
    if (c.max_split_size_bytes < STOW_PTM_LARGE_BUFFER_BYTES) return STOW_EINVAL;
    if (c.large_segment_bytes == 0 || c.large_segment_bytes % STOW_PTM_ROUND_LARGE_BYTES)
        return STOW_EINVAL;
    for (int i = 0; i < STOW_PTM_ROUNDUP_INTERVALS; i++) {
        unsigned d = c.roundup_power2_divisions[i];
        if (d > 1 && !ptm_is_pow2(d)) return STOW_EINVAL;
    }
    if (c.garbage_collection_threshold < 0.0 || c.garbage_collection_threshold >= 1.0)
        return STOW_EINVAL;
    if (c.memory_fraction < 0.0 || c.memory_fraction > 1.0) return STOW_EINVAL;
    stow_ptm_t *m = calloc(1, sizeof *m);
    if (!m) return STOW_EHOSTMEM;
    m->cfg = c;
    m->device_total = c.capacity_bytes ? c.capacity_bytes : STOW_PTM_H200_TOTAL_BYTES;
    if (c.memory_fraction > 0.0) {
        m->set_fraction = 1;
        m->allowed_max = (size_t)(c.memory_fraction * (double)m->device_total);
    }
    m->gc_enabled = m->set_fraction && c.garbage_collection_threshold > 0.0;
    m->next_addr = PTM_ADDR_TOP;
    m->rng = 0x9e3779b9u;
    if (!ptm_reserve_slots(m, 4)) {
        stow__ptm_destroy(m);
        return STOW_EHOSTMEM;
    }
    *out = m;
    return STOW_OK;
}

void stow__ptm_destroy(stow_ptm_t *m) {
    if (!m) return;
    for (uint32_t i = 0; i < m->chunk_count; i++) free(m->chunks[i]);
    free(m->chunks);
    while (m->segments) {
        ptm_segment_t *s = m->segments;
        m->segments = s->next_seg;
        free(s);
    }
    free(m);
}

void stow__ptm_empty_cache(stow_ptm_t *m) {
    if (m) ptm_release_cached(m);
}

void stow__ptm_reset_peak(stow_ptm_t *m) {
    if (!m) return;
    m->st.reserved_bytes_peak = m->st.reserved_bytes_current;
    m->st.allocated_bytes_peak = m->st.allocated_bytes_current;
    m->st.requested_bytes_peak = m->st.requested_bytes_current;
    m->st.segment_count_peak = m->st.segment_count_current;
}

static void ptm_walk_free(const ptm_block_t *t, stow_ptm_stats_t *out) {
    while (t) {
        ptm_walk_free(t->left, out);
        if (t->size > out->largest_free_block_bytes) out->largest_free_block_bytes = t->size;
        if (!t->seg && (t->prev || t->next)) out->inactive_split_bytes += t->size;
        t = t->right;
    }
}

void stow__ptm_stats(const stow_ptm_t *m, stow_ptm_stats_t *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!m) return;
    *out = m->st;
    out->largest_free_block_bytes = 0;
    out->inactive_split_bytes = 0;
    for (int p = 0; p < PTM_POOL_COUNT; p++) ptm_walk_free(m->pools[p].free_root, out);
}

size_t stow__ptm_block_size(const stow_ptm_t *m, uint64_t handle) {
    const ptm_block_t *b = m ? ptm_lookup(m, handle) : NULL;
    return b ? b->size : 0;
}

uint64_t stow__ptm_block_address(const stow_ptm_t *m, uint64_t handle) {
    const ptm_block_t *b = m ? ptm_lookup(m, handle) : NULL;
    return b ? b->addr : 0;
}

/* ---------------------------------------------------------------- checker */

/* Verifies BST order, heap order and membership of one treap; counts nodes. */
static int ptm_check_tree(const ptm_block_t *t, int by_addr, int want_mapped, int pool,
                          const ptm_block_t *lo, const ptm_block_t *hi, size_t *count) {
    if (!t) return 1;
    if (!t->live || t->allocated || t->mapped != want_mapped || t->pool != pool) return 0;
    if (lo && !ptm_less(lo, t, by_addr)) return 0;
    if (hi && !ptm_less(t, hi, by_addr)) return 0;
    if ((t->left && t->left->prio > t->prio) || (t->right && t->right->prio > t->prio)) return 0;
    (*count)++;
    return ptm_check_tree(t->left, by_addr, want_mapped, pool, lo, t, count) &&
           ptm_check_tree(t->right, by_addr, want_mapped, pool, t, hi, count);
}

stow_status_t stow__ptm_check(const stow_ptm_t *m) {
    if (!m) return STOW_EINVAL;
    size_t in_free = 0, in_unmapped = 0;
    for (int p = 0; p < PTM_POOL_COUNT; p++) {
        size_t nf = 0;
        if (!ptm_check_tree(m->pools[p].free_root, 0, 1, p, NULL, NULL, &nf)) return STOW_EINVAL;
        if (nf != m->pools[p].free_count) return STOW_EINVAL;
        in_free += nf;
        if (!ptm_check_tree(m->pools[p].unmapped_root, 1, 0, p, NULL, NULL, &in_unmapped))
            return STOW_EINVAL;
    }
    size_t mapped = 0, allocated = 0, nfree = 0, nunmapped = 0, nalloc = 0;
    for (uint32_t id = 0; id < m->slots_used; id++) {
        const ptm_block_t *b = &m->chunks[id >> PTM_CHUNK_SHIFT][id & (PTM_CHUNK_BLOCKS - 1)];
        if (!b->live) continue;
        if (b->prev && (b->prev->next != b || b->prev->addr + b->prev->size != b->addr ||
                        b->prev->seg != b->seg || b->prev->stream != b->stream))
            return STOW_EINVAL;
        if (b->next && (b->next->prev != b || b->addr + b->size != b->next->addr)) return STOW_EINVAL;
        if (!b->seg && !b->mapped) return STOW_EINVAL;
        if (b->mapped) mapped += b->size;
        if (b->allocated) {
            allocated += b->size;
            nalloc++;
        } else if (b->mapped) {
            nfree++;
        } else {
            nunmapped++;
        }
        if (!b->allocated && b->next && !b->next->allocated && b->next->mapped == b->mapped)
            return STOW_EINVAL; /* two free neighbours left unmerged */
    }
    if (mapped != m->total_reserved || mapped != m->st.reserved_bytes_current) return STOW_EINVAL;
    if (allocated != m->st.allocated_bytes_current || nalloc != m->st.allocation_count_current)
        return STOW_EINVAL;
    if (nfree != in_free || nunmapped != in_unmapped) return STOW_EINVAL;
    if (m->cfg.capacity_bytes && m->total_reserved > m->cfg.capacity_bytes) return STOW_EINVAL;
    return STOW_OK;
}
