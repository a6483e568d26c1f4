/*
 * tests/unit/test_free_index.c: allocator/free_index.c.
 *
 * The free index is checked against a brute-force shadow (an array of the
 * blocks it should hold) under random insert/remove/best_fit/largest/collect.
 * Best fit must be the smallest size >= the request; among equal sizes, the
 * most recently inserted up to 2 MiB (exact-size lists), the lowest address
 * above (treaps); largest must have the largest size; collect must return
 * every block exactly once; block_count, bytes and both bitmaps must agree.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/free_index.h"
#include "allocator/types.h"

#define MIB ((size_t)1 << 20)

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct shadow {
    stow_block_t **items;
    size_t count;
} shadow_t;

static stow_free_index_t *index_new(void)
{
    stow_free_index_t *idx = calloc(1, sizeof *idx);
    cr_assert_not_null(idx);
    return idx;
}

/* Insertion order for the shadow's tie rule (kept in free_seq, which the
 * index itself never reads). */
static uint64_t insert_seq;

static void insert(stow_free_index_t *idx, stow_block_t *b)
{
    b->free_seq = ++insert_seq;
    stow__free_index_insert(idx, b);
}

static stow_block_t *block_new(uintptr_t addr, size_t size)
{
    stow_block_t *b = calloc(1, sizeof *b);
    cr_assert_not_null(b);
    b->addr = addr;
    b->size_bytes = size;
    return b;
}

/* Between two free blocks of equal size: does b win over best? */
static bool tie_wins(const stow_block_t *b, const stow_block_t *best)
{
    return b->size_bytes <= STOW_EXACT_MAX_BYTES ? b->free_seq > best->free_seq
                                                 : b->addr < best->addr;
}

static stow_block_t *shadow_best_fit(const shadow_t *sh, size_t size)
{
    stow_block_t *best = NULL;
    for (size_t i = 0; i < sh->count; i++) {
        stow_block_t *b = sh->items[i];
        if (b->size_bytes < size)
            continue;
        if (!best || b->size_bytes < best->size_bytes ||
            (b->size_bytes == best->size_bytes && tie_wins(b, best)))
            best = b;
    }
    return best;
}

static size_t shadow_max_size(const shadow_t *sh)
{
    size_t m = 0;
    for (size_t i = 0; i < sh->count; i++)
        if (sh->items[i]->size_bytes > m)
            m = sh->items[i]->size_bytes;
    return m;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (stow_block_t *const *)a;
    uintptr_t y = (uintptr_t) * (stow_block_t *const *)b;
    return x < y ? -1 : x > y;
}

static void check_full(stow_free_index_t *idx, const shadow_t *sh)
{
    cr_assert_eq(idx->block_count, sh->count);
    size_t bytes = 0;
    for (size_t i = 0; i < sh->count; i++)
        bytes += sh->items[i]->size_bytes;
    cr_assert_eq(idx->bytes, bytes);
    for (unsigned bin = 0; bin < STOW_FREE_BINS; bin++) {
        bool bit = (idx->bitmap[bin / 64] >> (bin % 64)) & 1;
        cr_assert_eq(bit, idx->root[bin] != NULL, "bin %u", bin);
    }
    for (unsigned i = 0; i < STOW_EXACT_LISTS; i++) {
        bool bit = (idx->exact_bits[i / 64] >> (i % 64)) & 1;
        cr_assert_eq(bit, idx->exact[i] != NULL, "exact list %u", i);
        for (const stow_block_t *b = idx->exact[i]; b; b = b->right) {
            cr_assert_eq(b->size_bytes, (size_t)(i + 1) * 512, "block in the wrong list");
            cr_assert(b->right == NULL || b->right->left == b, "list links");
        }
    }
    for (unsigned w = 0; w < STOW_EXACT_WORDS; w++)
        cr_assert_eq((idx->exact_words >> w) & 1, idx->exact_bits[w] != 0, "exact word %u", w);
    stow_block_t **got = malloc((sh->count + 1) * sizeof *got);
    stow_block_t **want = malloc((sh->count + 1) * sizeof *want);
    cr_assert(got && want);
    size_t n = stow__free_index_collect(idx, got);
    cr_assert_eq(n, sh->count);
    memcpy(want, sh->items, sh->count * sizeof *want);
    qsort(got, n, sizeof *got, cmp_ptr);
    qsort(want, n, sizeof *want, cmp_ptr);
    cr_assert_eq(memcmp(got, want, n * sizeof *got), 0, "collect returned other blocks");
    free(got);
    free(want);
    stow_block_t *l = stow__free_index_largest(idx);
    if (sh->count == 0)
        cr_assert_null(l);
    else
        cr_assert(l && l->size_bytes == shadow_max_size(sh));
}

static void check_best_fit(stow_free_index_t *idx, const shadow_t *sh, size_t size)
{
    stow_block_t *want = shadow_best_fit(sh, size);
    stow_block_t *got = stow__free_index_best_fit(idx, size);
    cr_assert_eq(got, want, "best_fit(%zu): got %p (size %zu addr %#lx) want %p (size %zu addr %#lx)",
                 size, (void *)got, got ? got->size_bytes : 0,
                 got ? (unsigned long)got->addr : 0ul, (void *)want,
                 want ? want->size_bytes : 0, want ? (unsigned long)want->addr : 0ul);
}

Test(free_index, empty)
{
    stow_free_index_t *idx = index_new();
    cr_assert_null(stow__free_index_best_fit(idx, 512));
    cr_assert_null(stow__free_index_best_fit(idx, 0));
    cr_assert_null(stow__free_index_largest(idx));
    cr_assert_eq(stow__free_index_collect(idx, NULL), 0);
    free(idx);
}

Test(free_index, single_block)
{
    stow_free_index_t *idx = index_new();
    stow_block_t *b = block_new(0x10000, 4096);
    insert(idx, b);
    cr_assert_eq(idx->block_count, 1);
    cr_assert_eq(idx->bytes, 4096);
    cr_assert_eq(stow__free_index_best_fit(idx, 512), b);
    cr_assert_eq(stow__free_index_best_fit(idx, 4096), b);
    cr_assert_eq(stow__free_index_best_fit(idx, 4000), b);
    cr_assert_null(stow__free_index_best_fit(idx, 4097));
    cr_assert_null(stow__free_index_best_fit(idx, 4608));
    cr_assert_eq(stow__free_index_largest(idx), b);
    stow__free_index_remove(idx, b);
    cr_assert_eq(idx->block_count, 0);
    cr_assert_eq(idx->bytes, 0);
    cr_assert_null(stow__free_index_best_fit(idx, 512));
    for (unsigned w = 0; w < STOW_FREE_BITMAP_WORDS; w++)
        cr_assert_eq(idx->bitmap[w], 0);
    free(b);
    free(idx);
}

Test(free_index, equal_sizes_lowest_address_first_above_2mib)
{
    stow_free_index_t *idx = index_new();
    uintptr_t addrs[] = {0x9000, 0x3000, 0x7000, 0x1000, 0x5000};
    stow_block_t *b[5];
    for (int i = 0; i < 5; i++) {
        b[i] = block_new(addrs[i] << 12, 4 * MIB);
        insert(idx, b[i]);
    }
    cr_assert_eq(stow__free_index_best_fit(idx, 4 * MIB)->addr, 0x1000 << 12);
    stow__free_index_remove(idx, b[3]);
    cr_assert_eq(stow__free_index_best_fit(idx, 4 * MIB)->addr, 0x3000 << 12);
    stow__free_index_remove(idx, b[1]);
    cr_assert_eq(stow__free_index_best_fit(idx, 3 * MIB)->addr, 0x5000 << 12);
    for (int i = 0; i < 5; i++)
        free(b[i]);
    free(idx);
}

Test(free_index, equal_sizes_most_recent_first_up_to_2mib)
{
    stow_free_index_t *idx = index_new();
    stow_block_t *b[5];
    for (int i = 0; i < 5; i++) {
        b[i] = block_new((uintptr_t)(0x1000 * (i + 1)), 8192);
        insert(idx, b[i]);
    }
    cr_assert_eq(stow__free_index_best_fit(idx, 8192), b[4]);
    stow__free_index_remove(idx, b[4]);
    cr_assert_eq(stow__free_index_best_fit(idx, 8000), b[3]);
    stow__free_index_remove(idx, b[2]); /* from the middle of the list */
    cr_assert_eq(stow__free_index_best_fit(idx, 100), b[3]);
    insert(idx, b[2]);
    cr_assert_eq(stow__free_index_best_fit(idx, 8192), b[2]);
    /* 2 MiB is the last exact size; one 512-byte step above is a treap block. */
    stow_block_t *top = block_new(0x100000000, STOW_EXACT_MAX_BYTES);
    stow_block_t *above = block_new(0x200000000, STOW_EXACT_MAX_BYTES + 512);
    insert(idx, above);
    insert(idx, top);
    cr_assert_eq(stow__free_index_best_fit(idx, 8193), top);
    cr_assert_eq(stow__free_index_best_fit(idx, STOW_EXACT_MAX_BYTES), top);
    cr_assert_eq(stow__free_index_best_fit(idx, STOW_EXACT_MAX_BYTES + 1), above);
    cr_assert_eq(stow__free_index_largest(idx), above);
    stow__free_index_remove(idx, above);
    cr_assert_eq(stow__free_index_largest(idx), top, "largest among the exact lists");
    stow__free_index_remove(idx, top);
    cr_assert_eq(stow__free_index_largest(idx)->size_bytes, 8192);
    for (int i = 0; i < 4; i++)
        stow__free_index_remove(idx, b[i]);
    cr_assert_eq(idx->exact_words, 0);
    cr_assert_null(stow__free_index_best_fit(idx, 512));
    for (int i = 0; i < 5; i++)
        free(b[i]);
    free(top);
    free(above);
    free(idx);
}

Test(free_index, exact_lists_across_bitmap_words)
{
    /* Sizes 64 lists apart land in different bitmap words: the search must
     * move from word to word through the summary. */
    stow_free_index_t *idx = index_new();
    size_t sizes[] = {512, 64 * 512, 65 * 512, 129 * 512, 4000 * 512};
    stow_block_t *b[5];
    for (int i = 0; i < 5; i++) {
        b[i] = block_new((uintptr_t)(0x10000 * (i + 1)), sizes[i]);
        insert(idx, b[i]);
    }
    cr_assert_eq(stow__free_index_best_fit(idx, 1), b[0]);
    cr_assert_eq(stow__free_index_best_fit(idx, 513), b[1]);
    cr_assert_eq(stow__free_index_best_fit(idx, 64 * 512 + 1), b[2]);
    cr_assert_eq(stow__free_index_best_fit(idx, 66 * 512), b[3]);
    cr_assert_eq(stow__free_index_best_fit(idx, 130 * 512), b[4]);
    cr_assert_null(stow__free_index_best_fit(idx, 4000 * 512 + 1));
    stow__free_index_remove(idx, b[3]);
    cr_assert_eq(stow__free_index_best_fit(idx, 66 * 512), b[4]);
    for (int i = 0; i < 5; i++)
        if (i != 3)
            stow__free_index_remove(idx, b[i]);
    cr_assert_eq(idx->exact_words, 0);
    for (int i = 0; i < 5; i++)
        free(b[i]);
    free(idx);
}

Test(free_index, smaller_size_beats_lower_address)
{
    /* Same bin (sizes within 1/8), different sizes: size decides first. */
    stow_free_index_t *idx = index_new();
    stow_block_t *big = block_new(0x1000, 17 * 512 * 64);
    stow_block_t *small = block_new(0x900000, 16 * 512 * 64 + 512);
    cr_assert_eq(stow__free_bin_of(big->size_bytes), stow__free_bin_of(small->size_bytes));
    insert(idx, big);
    insert(idx, small);
    cr_assert_eq(stow__free_index_best_fit(idx, 16 * 512 * 64), small);
    cr_assert_eq(stow__free_index_best_fit(idx, small->size_bytes), small);
    cr_assert_eq(stow__free_index_best_fit(idx, small->size_bytes + 1), big);
    cr_assert_eq(stow__free_index_largest(idx), big);
    free(big);
    free(small);
    free(idx);
}

Test(free_index, request_bin_has_only_smaller_blocks)
{
    /* The request's own bin holds only blocks too small: the next non-empty
     * bin's minimum is the answer. */
    stow_free_index_t *idx = index_new();
    size_t base = (size_t)1 << 24;
    stow_block_t *lo = block_new(0x1000, base);          /* bin of base */
    stow_block_t *hi = block_new(0x2000, 4 * base);      /* far bin */
    stow_block_t *hi2 = block_new(0x3000, 4 * base + 512);
    insert(idx, lo);
    insert(idx, hi2);
    insert(idx, hi);
    cr_assert_eq(stow__free_index_best_fit(idx, base + 512), hi);
    cr_assert_eq(stow__free_index_best_fit(idx, base), lo);
    cr_assert_null(stow__free_index_best_fit(idx, 4 * base + 1024));
    free(lo);
    free(hi);
    free(hi2);
    free(idx);
}

/* A size drawn from one of several shapes, always a multiple of 512. */
static size_t random_block_size(unsigned mode)
{
    switch (mode % 4) {
    case 0: /* few distinct sizes: many ties */
        return (size_t)512 * (1 + rng_next() % 6);
    case 1: /* small */
        return (size_t)512 * (1 + rng_next() % 64);
    case 2: { /* log-uniform up to 2^44 */
        unsigned lg = 9 + (unsigned)(rng_next() % 36);
        size_t s = ((size_t)1 << lg) + (rng_next() % ((size_t)1 << lg));
        return s & ~(size_t)511;
    }
    default: /* a handful of large sizes: ties in high bins */
        return MIB * (20 + 2 * (rng_next() % 4));
    }
}

static void random_differential(uint64_t seed, size_t max_blocks, unsigned steps)
{
    rng_state = seed;
    stow_free_index_t *idx = index_new();
    shadow_t sh = {calloc(max_blocks, sizeof(stow_block_t *)), 0};
    /* Unique addresses: a shuffled range of 512-aligned slots. */
    size_t naddr = max_blocks * 4;
    uintptr_t *addrs = malloc(naddr * sizeof *addrs);
    cr_assert(sh.items && addrs);
    for (size_t i = 0; i < naddr; i++)
        addrs[i] = (uintptr_t)0x100000000000ull + (uintptr_t)i * 512 * 3;
    for (size_t i = naddr - 1; i > 0; i--) {
        size_t j = (size_t)(rng_next() % (i + 1));
        uintptr_t t = addrs[i];
        addrs[i] = addrs[j];
        addrs[j] = t;
    }
    size_t next_addr = 0;
    for (unsigned step = 0; step < steps; step++) {
        unsigned op = (unsigned)(rng_next() % 10);
        if (op < 4 && sh.count < max_blocks && next_addr < naddr) {
            stow_block_t *b = block_new(addrs[next_addr++], random_block_size((unsigned)rng_next()));
            insert(idx, b);
            sh.items[sh.count++] = b;
        } else if (op < 6 && sh.count) {
            size_t i = (size_t)(rng_next() % sh.count);
            stow_block_t *b = sh.items[i];
            stow__free_index_remove(idx, b);
            sh.items[i] = sh.items[--sh.count];
            if (rng_next() % 2 && next_addr > 0) {
                free(b);
            } else {
                /* Reinsert later under a new size, same address: as a pool does
                 * after coalescing. */
                b->size_bytes = random_block_size((unsigned)rng_next());
                insert(idx, b);
                sh.items[sh.count++] = b;
            }
        } else if (op < 9) {
            size_t req;
            if (sh.count && rng_next() % 2)
                req = sh.items[rng_next() % sh.count]->size_bytes + (rng_next() % 3) * 512 - 512;
            else
                req = random_block_size((unsigned)rng_next());
            if (rng_next() % 8 == 0)
                req += 1 + rng_next() % 511; /* not a multiple of 512 */
            check_best_fit(idx, &sh, req);
        } else if (max_blocks < 100 || rng_next() % 64 == 0) {
            check_full(idx, &sh);
        }
    }
    check_full(idx, &sh);
    /* Drain through best fit: each removal must be the shadow's choice. */
    while (sh.count) {
        stow_block_t *b = stow__free_index_best_fit(idx, 0);
        cr_assert_eq(b, shadow_best_fit(&sh, 0));
        stow__free_index_remove(idx, b);
        for (size_t i = 0; i < sh.count; i++)
            if (sh.items[i] == b) {
                sh.items[i] = sh.items[--sh.count];
                break;
            }
        free(b);
    }
    check_full(idx, &sh);
    free(sh.items);
    free(addrs);
    free(idx);
}

Test(free_index, random_small)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        random_differential(seed, 24, 2000);
}

Test(free_index, random_large)
{
    random_differential(0xC0FFEE, 2000, 30000);
}

Test(free_index, ascending_and_descending_inserts)
{
    /* Sorted insert orders build degenerate shapes in naive trees (treap
     * sizes: above the exact lists). */
    stow_free_index_t *idx = index_new();
    enum { N = 4000 };
    const size_t size = 4 * MIB;
    stow_block_t **b = malloc(N * sizeof *b);
    shadow_t sh = {b, 0};
    for (size_t i = 0; i < N; i++) {
        b[i] = block_new((uintptr_t)(i + 1) * size, size);
        insert(idx, b[i]);
        sh.count++;
    }
    check_best_fit(idx, &sh, size);
    cr_assert_eq(stow__free_index_best_fit(idx, size)->addr, size);
    for (size_t i = 0; i < N; i++)
        stow__free_index_remove(idx, b[i]);
    for (size_t i = N; i-- > 0;)
        insert(idx, b[i]);
    check_full(idx, &sh);
    cr_assert_eq(stow__free_index_best_fit(idx, 512)->addr, size);
    for (size_t i = 0; i < N; i++) {
        stow_block_t *f = stow__free_index_best_fit(idx, 512);
        cr_assert_eq(f, b[i]);
        stow__free_index_remove(idx, f);
    }
    for (size_t i = 0; i < N; i++)
        free(b[i]);
    free(b);
    free(idx);
}

Test(free_index, huge_sizes)
{
    stow_free_index_t *idx = index_new();
    stow_block_t *a = block_new(0x1000, (size_t)1 << 62);
    stow_block_t *c = block_new(0x2000, ((size_t)1 << 50) + 512);
    insert(idx, a);
    insert(idx, c);
    cr_assert_eq(stow__free_index_best_fit(idx, (size_t)1 << 50), c);
    cr_assert_eq(stow__free_index_best_fit(idx, ((size_t)1 << 50) + 1024), a);
    cr_assert_null(stow__free_index_best_fit(idx, ((size_t)1 << 62) + 512));
    cr_assert_eq(stow__free_index_largest(idx), a);
    free(a);
    free(c);
    free(idx);
}

typedef struct visit_log {
    stow_block_t **seen;
    size_t n;
} visit_log_t;

static bool log_visit(void *arg, stow_block_t *b)
{
    visit_log_t *log = arg;
    log->seen[log->n++] = b;
    return true;
}

static int cmp_key(const void *a, const void *b)
{
    const stow_block_t *x = *(stow_block_t *const *)a, *y = *(stow_block_t *const *)b;
    if (x->size_bytes != y->size_bytes)
        return x->size_bytes < y->size_bytes ? -1 : 1;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Blocks above 2 MiB, of at least size, must come in (size, address) order. */
static void check_visit_order(stow_free_index_t *idx, const shadow_t *sh, size_t size)
{
    stow_block_t **want = malloc((sh->count + 1) * sizeof *want);
    stow_block_t **seen = malloc((sh->count + 1) * sizeof *seen);
    cr_assert(want && seen);
    size_t n = 0;
    for (size_t i = 0; i < sh->count; i++)
        if (sh->items[i]->size_bytes >= size)
            want[n++] = sh->items[i];
    qsort(want, n, sizeof *want, cmp_key);
    visit_log_t log = {seen, 0};
    stow__free_index_visit_fitting(idx, size, log_visit, &log);
    cr_assert_eq(log.n, n, "visit saw %zu blocks of at least %zu, want %zu", log.n, size, n);
    cr_assert_eq(memcmp(seen, want, n * sizeof *seen), 0, "visit order");
    free(want);
    free(seen);
}

Test(free_index, a_long_bin_becomes_a_treap_and_a_list_again_when_empty)
{
    /* Bins hold an unsorted list until a scan finds more than
     * STOW_BIN_LIST_MAX blocks in one; then a treap until the bin is empty.
     * Equal and near sizes in one bin (4 MiB to 4.5 MiB), shuffled
     * addresses: every query must still be the shadow's exact best fit. */
    rng_state = 77;
    enum { N = 3 * STOW_BIN_LIST_MAX };
    stow_free_index_t *idx = index_new();
    stow_block_t *blocks[N];
    shadow_t sh = {calloc(N, sizeof(stow_block_t *)), 0};
    cr_assert_not_null(sh.items);
    for (size_t i = 0; i < N; i++) {
        size_t size = 4 * MIB + (size_t)512 * (rng_next() % 4) * 256;
        uintptr_t addr = (uintptr_t)0x200000000000ull + (uintptr_t)(rng_next() % 1000000) * 4096 * 1024 + i * 512;
        blocks[i] = block_new(addr, size);
    }
    unsigned bin = stow__free_bin_of(4 * MIB);
    for (size_t i = 0; i < N; i++) {
        insert(idx, blocks[i]);
        sh.items[sh.count++] = blocks[i];
        check_best_fit(idx, &sh, 4 * MIB + 512 * (rng_next() % 600));
        if (i == STOW_BIN_LIST_MAX - 1)
            cr_assert_not(stow__free_index_bin_is_treap(idx, bin), "a short bin is a list");
    }
    cr_assert(stow__free_index_bin_is_treap(idx, bin), "a long bin scanned becomes a treap");
    check_full(idx, &sh);
    check_visit_order(idx, &sh, 4 * MIB);
    check_visit_order(idx, &sh, 4 * MIB + 1024 * 256);
    /* Drain in random order, checking on the way; empty, the bin is a list again. */
    while (sh.count) {
        size_t i = (size_t)(rng_next() % sh.count);
        stow__free_index_remove(idx, sh.items[i]);
        sh.items[i] = sh.items[--sh.count];
        check_best_fit(idx, &sh, 4 * MIB);
    }
    cr_assert_not(stow__free_index_bin_is_treap(idx, bin), "an empty bin is a list");
    check_full(idx, &sh);
    /* A list too long for the largest-block lookup becomes a treap there too. */
    for (size_t i = 0; i < N; i++) {
        insert(idx, blocks[i]);
        sh.items[sh.count++] = blocks[i];
    }
    cr_assert_not(stow__free_index_bin_is_treap(idx, bin), "inserts alone never scan");
    check_visit_order(idx, &sh, 0);
    cr_assert(stow__free_index_bin_is_treap(idx, bin), "visit converts a long list");
    check_full(idx, &sh);
    for (size_t i = 0; i < N; i++)
        free(blocks[i]);
    free(sh.items);
    free(idx);
}

Test(free_index, visit_in_key_order_across_list_and_treap_bins)
{
    for (uint64_t seed = 1; seed <= 20; seed++) {
        rng_state = seed;
        enum { N = 400 };
        stow_free_index_t *idx = index_new();
        shadow_t sh = {calloc(N, sizeof(stow_block_t *)), 0};
        cr_assert_not_null(sh.items);
        for (size_t i = 0; i < N; i++) {
            size_t size = random_block_size((unsigned)rng_next());
            if (size == 0)
                size = 512;
            stow_block_t *b = block_new((uintptr_t)0x300000000000ull + (uintptr_t)i * 4096, size);
            insert(idx, b);
            sh.items[sh.count++] = b;
        }
        for (int q = 0; q < 8; q++) {
            size_t size = random_block_size((unsigned)rng_next());
            check_visit_order(idx, &sh, size > STOW_EXACT_MAX_BYTES ? size : STOW_EXACT_MAX_BYTES + 1);
            check_best_fit(idx, &sh, size);
        }
        check_full(idx, &sh);
        for (size_t i = 0; i < sh.count; i++)
            free(sh.items[i]);
        free(sh.items);
        free(idx);
    }
}
