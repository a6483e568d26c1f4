/*
 * tests/unit/test_ptr_map.c: allocator/ptr_map.c.
 *
 * Random put/get/remove against a shadow, growth, replacing puts, and keys
 * crafted to share a home slot (including runs that wrap around the end of
 * the table) so that backward-shift deletion is exercised on every shape of
 * probe chain. After each mutation the linear-probing invariant is checked:
 * every key sits after its home slot with no empty slot in between.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/ptr_map.h"

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* White box: the map's hash (ptr_map.c), to craft colliding keys and to check
 * the probing invariant. */
static size_t home_slot(uintptr_t key, size_t mask)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & mask;
}

static void check_invariant(const stow_ptr_map_t *m)
{
    size_t mask = m->capacity - 1;
    size_t n = 0;
    cr_assert_eq(m->capacity & mask, 0, "capacity %zu not a power of two", m->capacity);
    cr_assert_leq(m->count * 4, m->capacity);
    for (size_t i = 0; i < m->capacity; i++) {
        if (!m->slots[i].key) {
            cr_assert_null(m->slots[i].value);
            continue;
        }
        n++;
        for (size_t j = home_slot(m->slots[i].key, mask); j != i; j = (j + 1) & mask)
            cr_assert_neq(m->slots[j].key, 0, "key %#lx at %zu: hole at %zu after its home",
                          (unsigned long)m->slots[i].key, i, j);
    }
    cr_assert_eq(n, m->count);
}

static void *val_of(uintptr_t key) { return (void *)(key ^ 0x5A5A0000u); }

static void put(stow_ptr_map_t *m, uintptr_t key, void *v)
{
    cr_assert_eq(stow__ptr_map_reserve_one(m), STOW_OK);
    stow__ptr_map_put(m, key, v);
}

Test(ptr_map, init_empty_and_destroy)
{
    stow_ptr_map_t m;
    cr_assert_eq(stow__ptr_map_init(&m), STOW_OK);
    cr_assert_eq(m.count, 0);
    cr_assert_geq(m.capacity, 2);
    cr_assert_null(stow__ptr_map_get(&m, 0x1000));
    cr_assert_null(stow__ptr_map_get(&m, 0));
    cr_assert_null(stow__ptr_map_remove(&m, 0x1000));
    cr_assert_null(stow__ptr_map_remove(&m, 0));
    cr_assert_eq(m.count, 0);
    stow__ptr_map_destroy(&m);
    cr_assert_null(m.slots);
    cr_assert_eq(m.count, 0);
}

Test(ptr_map, put_get_replace_remove)
{
    stow_ptr_map_t m;
    cr_assert_eq(stow__ptr_map_init(&m), STOW_OK);
    put(&m, 0x200, (void *)1);
    put(&m, 0x400, (void *)2);
    cr_assert_eq(stow__ptr_map_get(&m, 0x200), (void *)1);
    cr_assert_eq(stow__ptr_map_get(&m, 0x400), (void *)2);
    cr_assert_null(stow__ptr_map_get(&m, 0x600));
    put(&m, 0x200, (void *)3); /* replace: count unchanged */
    cr_assert_eq(m.count, 2);
    cr_assert_eq(stow__ptr_map_get(&m, 0x200), (void *)3);
    cr_assert_eq(stow__ptr_map_remove(&m, 0x200), (void *)3);
    cr_assert_null(stow__ptr_map_get(&m, 0x200));
    cr_assert_null(stow__ptr_map_remove(&m, 0x200));
    cr_assert_eq(m.count, 1);
    check_invariant(&m);
    stow__ptr_map_destroy(&m);
}

Test(ptr_map, growth_keeps_every_key)
{
    stow_ptr_map_t m;
    cr_assert_eq(stow__ptr_map_init(&m), STOW_OK);
    enum { N = 100000 };
    size_t prev_cap = m.capacity;
    for (uintptr_t i = 1; i <= N; i++) {
        put(&m, i * 512, val_of(i * 512));
        cr_assert_geq(m.capacity, prev_cap);
        prev_cap = m.capacity;
    }
    cr_assert_eq(m.count, N);
    check_invariant(&m);
    for (uintptr_t i = 1; i <= N; i++)
        cr_assert_eq(stow__ptr_map_get(&m, i * 512), val_of(i * 512));
    cr_assert_null(stow__ptr_map_get(&m, (N + 1) * 512));
    for (uintptr_t i = 1; i <= N; i += 2)
        cr_assert_eq(stow__ptr_map_remove(&m, i * 512), val_of(i * 512));
    check_invariant(&m);
    for (uintptr_t i = 1; i <= N; i++)
        cr_assert_eq(stow__ptr_map_get(&m, i * 512), i % 2 ? NULL : val_of(i * 512));
    stow__ptr_map_destroy(&m);
}

/* Keys whose home slot (for `mask`) is in `slots`, found by search. */
static size_t craft_keys(size_t mask, const size_t *slots, size_t nslots, uintptr_t *out,
                         size_t want, uintptr_t stride)
{
    size_t n = 0;
    for (uintptr_t k = stride; n < want; k += stride) {
        size_t h = home_slot(k, mask);
        for (size_t s = 0; s < nslots; s++)
            if (h == slots[s]) {
                out[n++] = k;
                break;
            }
    }
    return n;
}

/* Inserts the keys in a random order, removes them in another, checking
 * every key after each step against the shadow. */
static void churn(uintptr_t *keys, size_t n, unsigned rounds)
{
    bool *present = calloc(n, sizeof *present);
    cr_assert_not_null(present);
    for (unsigned r = 0; r < rounds; r++) {
        stow_ptr_map_t m;
        cr_assert_eq(stow__ptr_map_init(&m), STOW_OK);
        memset(present, 0, n * sizeof *present);
        for (unsigned step = 0; step < 6 * n; step++) {
            size_t i = (size_t)(rng_next() % n);
            if (rng_next() % 2) {
                put(&m, keys[i], val_of(keys[i]));
                present[i] = true;
            } else {
                void *v = stow__ptr_map_remove(&m, keys[i]);
                cr_assert_eq(v, present[i] ? val_of(keys[i]) : NULL, "remove %#lx",
                             (unsigned long)keys[i]);
                present[i] = false;
            }
            check_invariant(&m);
            if (n * 4 <= 64) /* crafted chains: they need the 64-slot table */
                cr_assert_eq(m.capacity, 64, "the table grew under %zu keys", n);
            size_t live = 0;
            for (size_t j = 0; j < n; j++) {
                live += present[j];
                cr_assert_eq(stow__ptr_map_get(&m, keys[j]), present[j] ? val_of(keys[j]) : NULL,
                             "get %#lx after step %u", (unsigned long)keys[j], step);
            }
            cr_assert_eq(m.count, live);
        }
        stow__ptr_map_destroy(&m);
    }
    free(present);
}

Test(ptr_map, one_home_slot_chain)
{
    /* 16 keys sharing one home slot in a 64-slot table (the load stays at
     * most 1/4, so the table never grows under them). */
    rng_state = 1;
    size_t slots[] = {20};
    uintptr_t keys[16];
    cr_assert_eq(craft_keys(63, slots, 1, keys, 16, 512), 16);
    churn(keys, 16, 20);
}

Test(ptr_map, chains_wrapping_around_the_end)
{
    /* Home slots at the end of the table and at its start: runs wrap from
     * slot 63 to slot 0, the case where hole > j in backward shift. */
    rng_state = 2;
    size_t slots[] = {60, 62, 63, 0, 1};
    uintptr_t keys[16];
    cr_assert_eq(craft_keys(63, slots, 5, keys, 16, 512), 16);
    churn(keys, 16, 20);
}

Test(ptr_map, interleaved_home_slots)
{
    rng_state = 3;
    size_t slots[] = {5, 6, 8, 9, 12};
    uintptr_t keys[16];
    cr_assert_eq(craft_keys(63, slots, 5, keys, 16, 4096), 16);
    churn(keys, 16, 20);
}

Test(ptr_map, same_low_bits_keys)
{
    /* Addresses that differ only in high bits (segment bases, 2 MiB apart or
     * 2^32 apart): a weak hash would put them all in one slot. */
    rng_state = 4;
    uintptr_t keys[200];
    for (size_t i = 0; i < 100; i++)
        keys[i] = (uintptr_t)0x100000000000ull + (uintptr_t)i * ((uintptr_t)2 << 20);
    for (size_t i = 0; i < 100; i++)
        keys[100 + i] = (uintptr_t)(i + 1) << 32;
    churn(keys, 200, 2);
}

Test(ptr_map, random_against_shadow)
{
    rng_state = 5;
    enum { NKEYS = 5000 };
    uintptr_t *keys = malloc(NKEYS * sizeof *keys);
    void **shadow = calloc(NKEYS, sizeof *shadow);
    cr_assert(keys && shadow);
    for (size_t i = 0; i < NKEYS; i++)
        keys[i] = (uintptr_t)(rng_next() % ((uint64_t)1 << 40) + 1) << (rng_next() % 12);
    /* Deduplicate by making each key unique in its low bits' complement. */
    for (size_t i = 0; i < NKEYS; i++)
        keys[i] = (keys[i] & ~(uintptr_t)0xFFFFF) | (uintptr_t)(i + 1);
    stow_ptr_map_t m;
    cr_assert_eq(stow__ptr_map_init(&m), STOW_OK);
    size_t live = 0;
    for (unsigned step = 0; step < 200000; step++) {
        size_t i = (size_t)(rng_next() % NKEYS);
        unsigned op = (unsigned)(rng_next() % 3);
        if (op == 0) {
            void *v = (void *)(uintptr_t)(rng_next() | 1);
            put(&m, keys[i], v);
            live += shadow[i] == NULL;
            shadow[i] = v;
        } else if (op == 1) {
            cr_assert_eq(stow__ptr_map_remove(&m, keys[i]), shadow[i]);
            live -= shadow[i] != NULL;
            shadow[i] = NULL;
        } else {
            cr_assert_eq(stow__ptr_map_get(&m, keys[i]), shadow[i]);
        }
        cr_assert_eq(m.count, live);
    }
    check_invariant(&m);
    for (size_t i = 0; i < NKEYS; i++)
        cr_assert_eq(stow__ptr_map_get(&m, keys[i]), shadow[i]);
    stow__ptr_map_destroy(&m);
    free(keys);
    free(shadow);
}

Test(ptr_map, remove_all_then_reuse)
{
    stow_ptr_map_t m;
    cr_assert_eq(stow__ptr_map_init(&m), STOW_OK);
    for (uintptr_t i = 1; i <= 1000; i++)
        put(&m, i << 21, val_of(i));
    size_t cap = m.capacity;
    for (uintptr_t i = 1000; i >= 1; i--)
        cr_assert_eq(stow__ptr_map_remove(&m, i << 21), val_of(i));
    cr_assert_eq(m.count, 0);
    for (size_t i = 0; i < m.capacity; i++)
        cr_assert_eq(m.slots[i].key, 0);
    for (uintptr_t i = 1; i <= 1000; i++)
        put(&m, i << 21, val_of(i + 1));
    cr_assert_eq(m.capacity, cap, "no growth needed for the same key count");
    for (uintptr_t i = 1; i <= 1000; i++)
        cr_assert_eq(stow__ptr_map_get(&m, i << 21), val_of(i + 1));
    stow__ptr_map_destroy(&m);
}
