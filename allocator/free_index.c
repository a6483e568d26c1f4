/*
 * allocator/free_index.c: the free blocks of one (stream, pool kind), for
 * exact best fit by size.
 *
 * Blocks of at most 2 MiB (x = size / 512 <= STOW_EXACT_LISTS) sit in one
 * doubly linked list per exact size, most recently freed first, with a
 * two-level bitmap of the non-empty lists: insert and remove are a few
 * pointer writes, best fit is two find-first-set. Every block of the small
 * pool is such a block, and on the real traces most events touch only those,
 * so this is the allocator's fast path. Among blocks of equal size the most
 * recently freed wins (the one most likely still in cache).
 *
 * Larger blocks are binned by size (size_class.c: bins ordered by size, a
 * bitmap of non-empty bins). Best fit = the smallest (size, address) of at
 * least (size, 0) in the request's own bin, else the smallest of the next
 * non-empty bin: the smallest block that fits, lowest address among equal
 * sizes. A bin is an unsorted doubly linked list, scanned whole for that key:
 * on the real traces most bins hold one to four blocks, and a push, an unlink
 * and a short scan cost less than a treap's descents, whose branches on
 * random priorities mispredict (docs/decisions.md). A scan that meets more than
 * STOW_BIN_LIST_MAX blocks turns the bin into a treap keyed by (size,
 * address), priorities hashed from the address (deterministic), O(log n); it
 * stays one until it is empty. The bin's root pointer says which it is (bit 0
 * set: a treap), so the list paths read nothing more.
 */
#include "allocator/assert.h"
#include "allocator/free_index.h"
#include "allocator/types.h"

/* ---- doubly linked lists (left = previous, right = next) ---- */

static void list_push(stow_block_t **head, stow_block_t *b)
{
    b->left = NULL;
    b->right = *head;
    if (b->right)
        b->right->left = b;
    *head = b;
}

static void list_unlink(stow_block_t **head, stow_block_t *b)
{
    if (b->left)
        b->left->right = b->right;
    else
        *head = b->right;
    if (b->right)
        b->right->left = b->left;
    b->left = b->right = NULL;
}

/* ---- exact-size lists (blocks of at most STOW_EXACT_MAX_BYTES) ---- */

static bool is_exact(size_t size_bytes) { return size_bytes <= STOW_EXACT_MAX_BYTES; }

/* List of a block size (a non-zero multiple of 512 up to the limit). */
static size_t exact_slot(size_t size_bytes) { return size_bytes / STOW_MIN_BLOCK_BYTES - 1; }

/* The first list whose blocks are at least size_bytes: x = ceil(size / 512). */
static size_t exact_slot_at_least(size_t size_bytes)
{
    return size_bytes ? (size_bytes - 1) / STOW_MIN_BLOCK_BYTES : 0;
}

static void exact_insert(stow_free_index_t *idx, stow_block_t *b)
{
    size_t i = exact_slot(b->size_bytes);
    list_push(&idx->exact[i], b);
    idx->exact_bits[i / 64] |= (uint64_t)1 << (i % 64);
    idx->exact_words |= (uint64_t)1 << (i / 64);
}

static void exact_remove(stow_free_index_t *idx, stow_block_t *b)
{
    size_t i = exact_slot(b->size_bytes);
    list_unlink(&idx->exact[i], b);
    if (!idx->exact[i]) {
        idx->exact_bits[i / 64] &= ~((uint64_t)1 << (i % 64));
        if (!idx->exact_bits[i / 64])
            idx->exact_words &= ~((uint64_t)1 << (i / 64));
    }
}

/* First non-empty list at or above list i, or -1. */
static long next_exact(const stow_free_index_t *idx, size_t i)
{
    size_t w = i / 64;
    uint64_t word = idx->exact_bits[w] & (~(uint64_t)0 << (i % 64));
    if (word)
        return (long)(w * 64 + (unsigned)__builtin_ctzll(word));
    uint64_t words = w + 1 < STOW_EXACT_WORDS ? idx->exact_words & (~(uint64_t)0 << (w + 1)) : 0;
    if (!words)
        return -1;
    w = (unsigned)__builtin_ctzll(words);
    return (long)(w * 64 + (unsigned)__builtin_ctzll(idx->exact_bits[w]));
}

/* ---- bins (larger blocks): unsorted lists, treaps once found long ---- */

static bool key_less(const stow_block_t *a, const stow_block_t *b)
{
    return a->size_bytes < b->size_bytes ||
           (a->size_bytes == b->size_bytes && a->addr < b->addr);
}

/* A bin's root is the head of its list, or, tagged with bit 0 (block records
 * are aligned), the root of its treap: the list paths test one bit of a
 * pointer they load anyway. */
#define TREAP_TAG ((uintptr_t)1)
_Static_assert(_Alignof(stow_block_t) > TREAP_TAG, "block records leave bit 0 of their address clear");

static bool is_treap(const stow_block_t *root) { return (uintptr_t)root & TREAP_TAG; }

static stow_block_t *untag(stow_block_t *root)
{
    return (stow_block_t *)((uintptr_t)root & ~TREAP_TAG);
}

static stow_block_t *tag(stow_block_t *treap)
{
    return treap ? (stow_block_t *)((uintptr_t)treap | TREAP_TAG) : NULL;
}

bool stow__free_index_bin_is_treap(const stow_free_index_t *idx, unsigned bin)
{
    return is_treap(idx->root[bin]);
}

static uint32_t priority_of(uintptr_t addr)
{
    uint64_t h = (uint64_t)addr * 0xD6E8FEB86659FD93ull;
    return (uint32_t)(h >> 32);
}

/* Splits t into keys < key (left) and >= key (right). */
static void treap_split(stow_block_t *t, const stow_block_t *key, stow_block_t **l,
                        stow_block_t **r)
{
    while (t) {
        if (key_less(t, key)) {
            *l = t;
            l = &t->right;
            t = t->right;
        } else {
            *r = t;
            r = &t->left;
            t = t->left;
        }
    }
    *l = NULL;
    *r = NULL;
}

/* Merges two treaps where every key of a is below every key of b. */
static stow_block_t *treap_merge(stow_block_t *a, stow_block_t *b)
{
    stow_block_t *root = NULL, **link = &root;
    while (a && b) {
        if (a->priority >= b->priority) {
            *link = a;
            link = &a->right;
            a = a->right;
        } else {
            *link = b;
            link = &b->left;
            b = b->left;
        }
    }
    *link = a ? a : b;
    return root;
}

/* Treaps are the rare case (bins found long): their paths stay out of line,
 * so that the list paths stay small and need few registers. */
#define STOW_COLD __attribute__((noinline, cold))

/* Inserts b into the (untagged) treap *root. */
static void treap_insert(stow_block_t **root, stow_block_t *b)
{
    b->priority = priority_of(b->addr);
    b->left = b->right = NULL;
    /* Descend while the existing nodes outrank b, then split the rest under b. */
    stow_block_t **link = root;
    while (*link && (*link)->priority > b->priority)
        link = key_less(b, *link) ? &(*link)->left : &(*link)->right;
    treap_split(*link, b, &b->left, &b->right);
    *link = b;
}

static STOW_COLD void bin_treap_insert(stow_free_index_t *idx, unsigned bin, stow_block_t *b)
{
    stow_block_t *t = untag(idx->root[bin]);
    treap_insert(&t, b);
    idx->root[bin] = tag(t);
}

static STOW_COLD void bin_treap_remove(stow_free_index_t *idx, unsigned bin, stow_block_t *b)
{
    stow_block_t *t = untag(idx->root[bin]), **link = &t;
    while (*link != b) {
        stow_assert_internal(*link != NULL);
        link = key_less(b, *link) ? &(*link)->left : &(*link)->right;
    }
    *link = treap_merge(b->left, b->right);
    idx->root[bin] = tag(t); /* an emptied bin is an empty list */
}

/* A scan found the bin's list longer than STOW_BIN_LIST_MAX: it becomes a
 * treap, and stays one until it is empty. */
static STOW_COLD void list_to_treap(stow_free_index_t *idx, unsigned bin)
{
    stow_block_t *l = idx->root[bin], *t = NULL;
    while (l) {
        stow_block_t *next = l->right;
        treap_insert(&t, l);
        l = next;
    }
    idx->root[bin] = tag(t);
}

static void bin_insert(stow_free_index_t *idx, stow_block_t *b)
{
    unsigned bin = stow__free_bin_of(b->size_bytes);
    b->bin = (uint16_t)bin;
    if (STOW_UNLIKELY(is_treap(idx->root[bin])))
        bin_treap_insert(idx, bin, b);
    else
        list_push(&idx->root[bin], b);
    idx->bitmap[bin / 64] |= (uint64_t)1 << (bin % 64);
}

static void bin_remove(stow_free_index_t *idx, stow_block_t *b)
{
    unsigned bin = b->bin;
    if (STOW_UNLIKELY(is_treap(idx->root[bin]))) {
        bin_treap_remove(idx, bin, b);
        b->left = b->right = NULL;
    } else {
        list_unlink(&idx->root[bin], b);
    }
    if (!idx->root[bin])
        idx->bitmap[bin / 64] &= ~((uint64_t)1 << (bin % 64));
}

void stow__free_index_insert(stow_free_index_t *idx, stow_block_t *b)
{
    stow_assert_internal(b->size_bytes && b->size_bytes % STOW_MIN_BLOCK_BYTES == 0);
    if (is_exact(b->size_bytes))
        exact_insert(idx, b);
    else
        bin_insert(idx, b);
    idx->block_count++;
    idx->bytes += b->size_bytes;
}

void stow__free_index_remove(stow_free_index_t *idx, stow_block_t *b)
{
    if (is_exact(b->size_bytes))
        exact_remove(idx, b);
    else
        bin_remove(idx, b);
    idx->block_count--;
    idx->bytes -= b->size_bytes;
}

static int next_nonempty_bin(const stow_free_index_t *idx, unsigned from)
{
    unsigned w = from / 64;
    if (w >= STOW_FREE_BITMAP_WORDS)
        return -1;
    uint64_t word = idx->bitmap[w] & (~(uint64_t)0 << (from % 64));
    for (;;) {
        if (word)
            return (int)(w * 64 + (unsigned)__builtin_ctzll(word));
        if (++w == STOW_FREE_BITMAP_WORDS)
            return -1;
        word = idx->bitmap[w];
    }
}

/* Smallest key of at least size_bytes in the (untagged) treap t, or NULL. */
static stow_block_t *treap_best(stow_block_t *t, size_t size_bytes)
{
    stow_block_t *best = NULL;
    while (t) {
        if (t->size_bytes >= size_bytes) { /* (size, 0) <= (t.size, t.addr) */
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
}

static STOW_COLD stow_block_t *bin_treap_best(stow_free_index_t *idx, unsigned bin,
                                              size_t size_bytes)
{
    return treap_best(untag(idx->root[bin]), size_bytes);
}

/* Smallest key of bin with size >= size_bytes, or NULL. A list scan that
 * meets more than STOW_BIN_LIST_MAX blocks turns the bin into a treap. */
static stow_block_t *bin_best(stow_free_index_t *idx, unsigned bin, size_t size_bytes)
{
    stow_block_t *t = idx->root[bin], *best = NULL;
    if (STOW_UNLIKELY(is_treap(t)))
        return bin_treap_best(idx, bin, size_bytes);
    for (unsigned n = 0; t; t = t->right) {
        if (STOW_UNLIKELY(++n > STOW_BIN_LIST_MAX)) {
            list_to_treap(idx, bin);
            return bin_treap_best(idx, bin, size_bytes);
        }
        if (t->size_bytes >= size_bytes && (!best || key_less(t, best)))
            best = t;
    }
    return best;
}

stow_block_t *stow__free_index_best_fit(stow_free_index_t *idx, size_t size_bytes)
{
    if (is_exact(size_bytes)) {
        long i = next_exact(idx, exact_slot_at_least(size_bytes));
        if (i >= 0)
            return idx->exact[i];
        size_bytes = STOW_EXACT_MAX_BYTES + 1; /* every bin block is at least that */
    }
    unsigned bin = stow__free_bin_of(size_bytes);
    int b = next_nonempty_bin(idx, bin);
    if (b < 0)
        return NULL;
    if ((unsigned)b == bin) {
        stow_block_t *best = bin_best(idx, bin, size_bytes);
        if (best)
            return best;
        b = next_nonempty_bin(idx, bin + 1);
        if (b < 0)
            return NULL;
    }
    /* Every block of a higher bin fits: its smallest key. */
    return bin_best(idx, (unsigned)b, 0);
}

stow_block_t *stow__free_index_largest(stow_free_index_t *idx)
{
    for (int w = STOW_FREE_BITMAP_WORDS - 1; w >= 0; w--) {
        if (!idx->bitmap[w])
            continue;
        unsigned bin = (unsigned)w * 64 + 63u - (unsigned)__builtin_clzll(idx->bitmap[w]);
        stow_block_t *t = idx->root[bin], *largest = t;
        if (!is_treap(t)) {
            unsigned n = 0;
            for (; t && n <= STOW_BIN_LIST_MAX; t = t->right, n++)
                if (key_less(largest, t))
                    largest = t;
            if (!t)
                return largest;
            list_to_treap(idx, bin);
        }
        for (t = untag(idx->root[bin]); t->right;)
            t = t->right;
        return t;
    }
    if (!idx->exact_words)
        return NULL;
    unsigned w = 63u - (unsigned)__builtin_clzll(idx->exact_words);
    return idx->exact[w * 64 + 63u - (unsigned)__builtin_clzll(idx->exact_bits[w])];
}

/* In-order walk of the keys of t that are at least size_bytes; false once
 * visit asked to stop. */
static bool visit_tree(stow_block_t *t, size_t size_bytes, bool (*visit)(void *, stow_block_t *),
                       void *arg)
{
    while (t) {
        if (t->size_bytes >= size_bytes) {
            if (!visit_tree(t->left, size_bytes, visit, arg) || !visit(arg, t))
                return false;
        }
        t = t->right;
    }
    return true;
}

/* The bin's blocks of at least size_bytes in key order. */
static bool visit_bin(stow_free_index_t *idx, unsigned bin, size_t size_bytes,
                      bool (*visit)(void *, stow_block_t *), void *arg)
{
    if (!is_treap(idx->root[bin])) {
        stow_block_t *sorted[STOW_BIN_LIST_MAX];
        size_t n = 0;
        for (stow_block_t *t = idx->root[bin]; t; t = t->right) {
            if (n == STOW_BIN_LIST_MAX) {
                list_to_treap(idx, bin);
                return visit_tree(untag(idx->root[bin]), size_bytes, visit, arg);
            }
            size_t j = n++; /* insertion sort */
            for (; j > 0 && key_less(t, sorted[j - 1]); j--)
                sorted[j] = sorted[j - 1];
            sorted[j] = t;
        }
        for (size_t i = 0; i < n; i++)
            if (sorted[i]->size_bytes >= size_bytes && !visit(arg, sorted[i]))
                return false;
        return true;
    }
    return visit_tree(untag(idx->root[bin]), size_bytes, visit, arg);
}

void stow__free_index_visit_fitting(stow_free_index_t *idx, size_t size_bytes,
                                    bool (*visit)(void *arg, stow_block_t *b), void *arg)
{
    if (is_exact(size_bytes)) {
        for (long i = next_exact(idx, exact_slot_at_least(size_bytes));
             i >= 0; i = (size_t)i + 1 < STOW_EXACT_LISTS ? next_exact(idx, (size_t)i + 1) : -1)
            for (stow_block_t *b = idx->exact[i]; b; b = b->right)
                if (!visit(arg, b))
                    return;
        size_bytes = STOW_EXACT_MAX_BYTES + 1;
    }
    for (int bin = next_nonempty_bin(idx, stow__free_bin_of(size_bytes)); bin >= 0;
         bin = next_nonempty_bin(idx, (unsigned)bin + 1))
        if (!visit_bin(idx, (unsigned)bin, size_bytes, visit, arg))
            return;
}

static size_t collect_tree(stow_block_t *t, stow_block_t **out, size_t n)
{
    /* Iterative pre-order with the output array as the stack's tail. */
    while (t) {
        out[n++] = t;
        if (t->right)
            n = collect_tree(t->right, out, n);
        t = t->left;
    }
    return n;
}

size_t stow__free_index_collect(const stow_free_index_t *idx, stow_block_t **out)
{
    size_t n = 0;
    for (uint64_t words = idx->exact_words; words; words &= words - 1) {
        unsigned w = (unsigned)__builtin_ctzll(words);
        for (uint64_t bits = idx->exact_bits[w]; bits; bits &= bits - 1)
            for (stow_block_t *b = idx->exact[w * 64 + (unsigned)__builtin_ctzll(bits)]; b;
                 b = b->right)
                out[n++] = b;
    }
    for (unsigned bin = 0; bin < STOW_FREE_BINS; bin++) {
        if (is_treap(idx->root[bin]))
            n = collect_tree(untag(idx->root[bin]), out, n);
        else /* a list's left links point back */
            for (stow_block_t *b = idx->root[bin]; b; b = b->right)
                out[n++] = b;
    }
    return n;
}
