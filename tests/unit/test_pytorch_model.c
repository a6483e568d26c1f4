/*
 * tests/unit/test_pytorch_model.c: rules of the PyTorch caching-allocator model
 * (replay/pytorch_native.c) one by one, then a replay of every shared trace
 * against the reserved-bytes peaks real PyTorch 2.11 reached
 * (../shared/traces/README.md).
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/pytorch_model.h"
#include "stowage/trace.h"
#include "test_support.h"

#define KIB ((size_t)1024)
#define MIB ((size_t)1048576)

static stow_ptm_t *make_model(const stow_ptm_config_t *config) {
    stow_ptm_t *m = NULL;
    cr_assert_eq(stow__ptm_create(config, &m), STOW_OK);
    cr_assert_not_null(m);
    return m;
}

static stow_ptm_t *make_default(int expandable, size_t capacity_bytes) {
    stow_ptm_config_t c;
    stow__ptm_config_default(&c);
    c.expandable = expandable;
    c.capacity_bytes = capacity_bytes;
    return make_model(&c);
}

static uint64_t must_alloc(stow_ptm_t *m, size_t size, uint32_t stream) {
    uint64_t h = 0;
    cr_assert_eq(stow__ptm_alloc(m, size, stream, &h), STOW_OK, "alloc of %zu failed", size);
    cr_assert_eq(stow__ptm_check(m), STOW_OK);
    return h;
}

static void must_free(stow_ptm_t *m, uint64_t h) {
    cr_assert_eq(stow__ptm_free(m, h), STOW_OK);
    cr_assert_eq(stow__ptm_check(m), STOW_OK);
}

static stow_ptm_stats_t stats_of(const stow_ptm_t *m) {
    stow_ptm_stats_t s;
    stow__ptm_stats(m, &s);
    return s;
}

/* ------------------------------------------------------------------ config */

Test(pytorch_model, config_validation) {
    stow_ptm_config_t c;
    stow__ptm_config_default(&c);
    cr_assert_eq(c.max_split_size_bytes, SIZE_MAX);
    cr_assert_eq(c.max_non_split_rounding_bytes, 20 * MIB);
    stow_ptm_t *m = NULL;
    c.max_split_size_bytes = 19 * MIB; /* PyTorch requires >= 20 MiB */
    cr_assert_eq(stow__ptm_create(&c, &m), STOW_EINVAL);
    stow__ptm_config_default(&c);
    c.roundup_power2_divisions[3] = 3; /* not a power of two */
    cr_assert_eq(stow__ptm_create(&c, &m), STOW_EINVAL);
    stow__ptm_config_default(&c);
    c.garbage_collection_threshold = 1.0;
    cr_assert_eq(stow__ptm_create(&c, &m), STOW_EINVAL);
    cr_assert_null(m);
    cr_assert_eq(stow__ptm_create(NULL, NULL), STOW_EINVAL);
    cr_assert_eq(stow__ptm_create(NULL, &m), STOW_OK);
    stow__ptm_destroy(m);
    stow__ptm_destroy(NULL);
}

/* ------------------------------------------------- absurd sizes (bad input) */

/* A request larger than an expandable segment's whole virtual range (1 1/8 of
 * the device) fits no segment: out of memory, as on a real device, and the
 * model goes on. */
Test(pytorch_model, expandable_request_beyond_the_device_is_enomem) {
    size_t sizes[] = {(size_t)1 << 62, (size_t)1 << 40};
    size_t capacities[] = {0, (size_t)1 << 30};
    for (int k = 0; k < 2; k++) {
        stow_ptm_t *m = make_default(1, capacities[k]);
        uint64_t h = 0;
        cr_assert_eq(stow__ptm_alloc(m, sizes[k], 0, &h), STOW_ENOMEM, "size %zu", sizes[k]);
        cr_assert_eq(stow__ptm_check(m), STOW_OK);
        cr_assert_eq(stats_of(m).num_ooms, 1);
        cr_assert_eq(stats_of(m).reserved_bytes_peak, 0);
        must_free(m, must_alloc(m, 4 * MIB, 0));
        stow__ptm_destroy(m);
    }
}

/* With no capacity set, reservations end where the model's fake addresses (handed
 * out downward from 2^62) would: the reserved counter never wraps. */
Test(pytorch_model, unlimited_reservations_end_before_addresses_run_out) {
    stow_ptm_t *m = make_default(0, 0);
    uint64_t h = 0;
    must_alloc(m, (size_t)1 << 61, 0);
    cr_assert_eq(stow__ptm_alloc(m, (size_t)1 << 61, 0, &h), STOW_ENOMEM);
    cr_assert_eq(stow__ptm_alloc(m, (size_t)1 << 62, 0, &h), STOW_ENOMEM);
    cr_assert_eq(stow__ptm_check(m), STOW_OK);
    cr_assert_eq(stats_of(m).reserved_bytes_peak, (size_t)1 << 61);
    cr_assert_eq(stats_of(m).num_ooms, 2);
    must_free(m, must_alloc(m, 4 * MIB, 0));
    stow__ptm_destroy(m);
}

/* ------------------------------------------------------------------ rounding */

Test(pytorch_model, round_size_512) {
    stow_ptm_t *m = make_default(0, 0);
    cr_assert_eq(stow__ptm_round_size(m, 0), 512);
    cr_assert_eq(stow__ptm_round_size(m, 1), 512);
    cr_assert_eq(stow__ptm_round_size(m, 512), 512);
    cr_assert_eq(stow__ptm_round_size(m, 513), 1024);
    cr_assert_eq(stow__ptm_round_size(m, 5 * MIB + 1), 5 * MIB + 512);
    stow__ptm_destroy(m);
}

Test(pytorch_model, roundup_power2_divisions) {
    stow_ptm_config_t c;
    stow__ptm_config_default(&c);
    for (int i = 0; i < STOW_PTM_ROUNDUP_INTERVALS; i++) c.roundup_power2_divisions[i] = 4;
    c.roundup_power2_divisions[2] = 8; /* the [4 MiB, 8 MiB) interval */
    stow_ptm_t *m = make_model(&c);
    /* under 1 MiB: interval 0 applies (4 divisions), but only above 512 x 4 */
    cr_assert_eq(stow__ptm_round_size(m, 1200), 1536);
    cr_assert_eq(stow__ptm_round_size(m, 1200 * KIB), 1280 * KIB);
    cr_assert_eq(stow__ptm_round_size(m, 1024 * KIB), 1024 * KIB); /* powers of two stay */
    cr_assert_eq(stow__ptm_round_size(m, 2 * MIB + 1), 2 * MIB + 512 * KIB);
    cr_assert_eq(stow__ptm_round_size(m, 4 * MIB + 1), 4 * MIB + 512 * KIB); /* 8 divisions */
    cr_assert_eq(stow__ptm_round_size(m, 100 * MIB), 112 * MIB);
    stow__ptm_destroy(m);
}

/* ------------------------------------------------------------------ segments */

Test(pytorch_model, segment_sizes) {
    struct {
        size_t request, reserved;
    } cases[] = {
        {1, 2 * MIB},                      /* small pool: 2 MiB segment */
        {1 * MIB, 2 * MIB},                /* 1 MiB is still small */
        {1 * MIB + 1, 20 * MIB},           /* 1..10 MiB: 20 MiB segment */
        {10 * MIB - 512, 20 * MIB},
        {10 * MIB, 10 * MIB},              /* >= 10 MiB: rounded to 2 MiB */
        {10 * MIB + 1, 12 * MIB},
        {33 * MIB, 34 * MIB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        stow_ptm_t *m = make_default(0, 0);
        must_alloc(m, cases[i].request, 0);
        stow_ptm_stats_t s = stats_of(m);
        cr_assert_eq(s.reserved_bytes_current, cases[i].reserved, "request %zu reserved %zu",
                     cases[i].request, s.reserved_bytes_current);
        cr_assert_eq(s.device_alloc_calls, 1);
        stow__ptm_destroy(m);
    }
}

Test(pytorch_model, small_pool_packs_2mib_segments) {
    stow_ptm_t *m = make_default(0, 0);
    for (int i = 0; i < 4; i++) must_alloc(m, 512 * KIB, 0);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 2 * MIB);
    must_alloc(m, 512 * KIB, 0);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 4 * MIB);
    cr_assert_eq(stats_of(m).segment_count_current, 2);
    stow__ptm_destroy(m);
}

/* ------------------------------------------------------------------ split/merge */

Test(pytorch_model, large_split_and_reuse) {
    stow_ptm_t *m = make_default(0, 0);
    uint64_t a = must_alloc(m, 5 * MIB, 0);
    cr_assert_eq(stow__ptm_block_size(m, a), 5 * MIB); /* 20 MiB segment split */
    uint64_t b = must_alloc(m, 5 * MIB, 0);
    cr_assert_eq(stow__ptm_block_address(m, b), stow__ptm_block_address(m, a) + 5 * MIB);
    uint64_t c = must_alloc(m, 8 * MIB, 0); /* split: 2 MiB > 1 MiB remain */
    cr_assert_eq(stats_of(m).reserved_bytes_current, 20 * MIB);
    cr_assert_eq(stats_of(m).inactive_split_bytes, 2 * MIB);
    must_free(m, a);
    must_free(m, c);
    must_free(m, b); /* merges with both neighbours */
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.largest_free_block_bytes, 20 * MIB);
    cr_assert_eq(s.inactive_split_bytes, 0);
    must_alloc(m, 20 * MIB, 0); /* the whole segment again, no new cudaMalloc */
    cr_assert_eq(stats_of(m).device_alloc_calls, 1);
    stow__ptm_destroy(m);
}

Test(pytorch_model, large_remainder_up_to_1mib_is_not_split) {
    stow_ptm_t *m = make_default(0, 0);
    uint64_t a = must_alloc(m, 19 * MIB + 512 * KIB, 0); /* 20 MiB segment, 0.5 MiB left */
    cr_assert_eq(stow__ptm_block_size(m, a), 20 * MIB);
    uint64_t b = must_alloc(m, 19 * MIB, 0); /* 1 MiB left: still not > 1 MiB */
    cr_assert_eq(stow__ptm_block_size(m, b), 20 * MIB);
    must_free(m, b);
    uint64_t c = must_alloc(m, 18 * MIB, 0); /* 2 MiB left: split */
    cr_assert_eq(stow__ptm_block_size(m, c), 18 * MIB);
    stow__ptm_destroy(m);
}

Test(pytorch_model, small_pool_splits_512) {
    stow_ptm_t *m = make_default(0, 0);
    uint64_t b = must_alloc(m, 1 * MIB - 512, 0);
    uint64_t c = must_alloc(m, 1 * MIB, 0);
    uint64_t d = must_alloc(m, 512, 0); /* exactly 512 B remain in the segment */
    cr_assert_eq(stats_of(m).reserved_bytes_current, 2 * MIB);
    cr_assert_eq(stow__ptm_block_size(m, d), 512);
    (void)b;
    (void)c;
    stow__ptm_destroy(m);
}

Test(pytorch_model, best_fit_by_size_then_address) {
    stow_ptm_t *m = make_default(0, 0);
    uint64_t big = must_alloc(m, 40 * MIB, 0);
    uint64_t mid1 = must_alloc(m, 30 * MIB, 0);
    uint64_t mid2 = must_alloc(m, 30 * MIB, 0);
    uint64_t addr1 = stow__ptm_block_address(m, mid1), addr2 = stow__ptm_block_address(m, mid2);
    /* Segments get addresses downward, as cudaMalloc's mostly are (pytorch_native.c). */
    cr_assert_lt(addr2, addr1);
    must_free(m, big);
    must_free(m, mid2);
    must_free(m, mid1);
    uint64_t x = must_alloc(m, 28 * MIB, 0); /* best fit: a 30 MiB block, lowest address */
    cr_assert_eq(stow__ptm_block_address(m, x), addr2);
    cr_assert_eq(stats_of(m).device_alloc_calls, 3);
    stow__ptm_destroy(m);
}

Test(pytorch_model, blocks_stay_on_their_stream) {
    stow_ptm_t *m = make_default(0, 0);
    uint64_t a = must_alloc(m, 30 * MIB, 0);
    must_free(m, a);
    must_alloc(m, 30 * MIB, 1);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 60 * MIB);
    must_alloc(m, 30 * MIB, 0);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 60 * MIB);
    stow__ptm_destroy(m);
}

Test(pytorch_model, max_split_size_rules) {
    stow_ptm_config_t c;
    stow__ptm_config_default(&c);
    c.max_split_size_bytes = 40 * MIB;
    stow_ptm_t *m = make_model(&c);
    uint64_t a = must_alloc(m, 100 * MIB, 0);
    must_free(m, a);
    /* under max_split_size: never takes an oversize block */
    uint64_t b = must_alloc(m, 30 * MIB, 0);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 130 * MIB);
    must_free(m, b);
    /* oversize request: takes it only within max_non_split_rounding (20 MiB) */
    uint64_t d = must_alloc(m, 70 * MIB, 0);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 200 * MIB);
    uint64_t e = must_alloc(m, 90 * MIB, 0);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 200 * MIB);
    cr_assert_eq(stow__ptm_block_size(m, e), 100 * MIB); /* oversize blocks never split */
    (void)d;
    stow__ptm_destroy(m);
}

/* ------------------------------------------------------------------ OOM path */

Test(pytorch_model, oom_releases_cache_then_retries) {
    stow_ptm_t *m = make_default(0, 100 * MIB);
    uint64_t a = must_alloc(m, 60 * MIB, 0);
    must_free(m, a);
    uint64_t b = must_alloc(m, 70 * MIB, 0); /* cudaMalloc fails, cache freed, retry */
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.num_alloc_retries, 1);
    cr_assert_eq(s.num_sync_all_streams, 1);
    cr_assert_eq(s.reserved_bytes_current, 70 * MIB);
    cr_assert_eq(s.device_free_calls, 1);
    uint64_t h = 0;
    cr_assert_eq(stow__ptm_alloc(m, 40 * MIB, 0, &h), STOW_ENOMEM);
    cr_assert_eq(h, 0, "handle untouched on error");
    s = stats_of(m);
    cr_assert_eq(s.num_ooms, 1);
    cr_assert_eq(s.num_alloc_retries, 2);
    cr_assert_eq(stow__ptm_check(m), STOW_OK);
    must_free(m, b);
    must_alloc(m, 40 * MIB, 0); /* fits in the cached 70 MiB block */
    stow__ptm_destroy(m);
}

Test(pytorch_model, oom_split_segments_are_not_released) {
    stow_ptm_t *m = make_default(0, 40 * MIB);
    uint64_t a = must_alloc(m, 5 * MIB, 0); /* 20 MiB segment, split */
    must_alloc(m, 16 * MIB, 0); /* the 15 MiB remainder is too small: 16 MiB segment */
    uint64_t h = 0;
    cr_assert_eq(stow__ptm_alloc(m, 16 * MIB, 0, &h), STOW_ENOMEM);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 36 * MIB);
    must_free(m, a); /* now the 20 MiB segment is whole again and can go */
    must_alloc(m, 22 * MIB, 0);
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.reserved_bytes_current, 38 * MIB);
    cr_assert_eq(s.device_free_calls, 1);
    stow__ptm_destroy(m);
}

Test(pytorch_model, release_available_frees_oversize_first) {
    stow_ptm_config_t c;
    stow__ptm_config_default(&c);
    c.max_split_size_bytes = 40 * MIB;
    c.capacity_bytes = 200 * MIB;
    stow_ptm_t *m = make_model(&c);
    uint64_t a = must_alloc(m, 100 * MIB, 0);
    must_alloc(m, 80 * MIB, 0);
    must_free(m, a);
    must_alloc(m, 50 * MIB, 0); /* 100 >= 50 + 20: not reused; frees it instead */
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.reserved_bytes_current, 130 * MIB);
    cr_assert_eq(s.num_alloc_retries, 0);
    cr_assert_eq(s.num_sync_all_streams, 0);
    stow__ptm_destroy(m);
}

Test(pytorch_model, garbage_collection_threshold) {
    stow_ptm_config_t c;
    stow__ptm_config_default(&c);
    c.capacity_bytes = 400 * MIB;
    c.memory_fraction = 0.5;              /* 200 MiB allowed */
    c.garbage_collection_threshold = 0.5; /* collect above 100 MiB */
    stow_ptm_t *m = make_model(&c);
    uint64_t a = must_alloc(m, 60 * MIB, 0);
    uint64_t b = must_alloc(m, 60 * MIB, 0);
    must_free(m, a);
    must_free(m, b);
    must_alloc(m, 70 * MIB, 0);
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.num_gc_runs, 1);
    cr_assert_lt(s.reserved_bytes_current, 190 * MIB);
    /* the memory fraction caps reserved bytes like a smaller device */
    uint64_t h = 0;
    cr_assert_eq(stow__ptm_alloc(m, 150 * MIB, 0, &h), STOW_ENOMEM);
    stow__ptm_destroy(m);
}

Test(pytorch_model, empty_cache_and_bad_handles) {
    stow_ptm_t *m = make_default(0, 0);
    uint64_t a = must_alloc(m, 30 * MIB, 0);
    uint64_t b = must_alloc(m, 100, 0);
    must_free(m, a);
    cr_assert_eq(stow__ptm_free(m, a), STOW_ENOTOWNED);
    cr_assert_eq(stow__ptm_free(m, 12345), STOW_ENOTOWNED);
    stow__ptm_empty_cache(m);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 2 * MIB);
    must_free(m, b);
    stow__ptm_empty_cache(m);
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.reserved_bytes_current, 0);
    cr_assert_eq(s.reserved_bytes_peak, 32 * MIB);
    stow__ptm_reset_peak(m);
    cr_assert_eq(stats_of(m).reserved_bytes_peak, 0);
    stow__ptm_destroy(m);
}

/* ------------------------------------------------------------------ expandable */

Test(pytorch_model, expandable_maps_pages_on_demand) {
    stow_ptm_t *m = make_default(1, 0);
    must_alloc(m, 1000, 0);
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.reserved_bytes_current, 2 * MIB); /* one 2 MiB small page */
    cr_assert_eq(s.pages_created, 1);
    uint64_t a = must_alloc(m, 5 * MIB, 0);
    cr_assert_eq(stats_of(m).reserved_bytes_current, 22 * MIB); /* one 20 MiB page */
    uint64_t b = must_alloc(m, 16 * MIB, 0);                    /* grows the same segment */
    cr_assert_eq(stow__ptm_block_address(m, b), stow__ptm_block_address(m, a) + 5 * MIB);
    s = stats_of(m);
    cr_assert_eq(s.reserved_bytes_current, 42 * MIB);
    cr_assert_eq(s.map_calls, 3);
    cr_assert_eq(s.segment_count_current, 2); /* one per (stream, pool) */
    uint64_t c = must_alloc(m, 19 * MIB + 512 * KIB, 0); /* split threshold is 512 B */
    cr_assert_eq(stow__ptm_block_size(m, c), 19 * MIB + 512 * KIB);
    stow__ptm_destroy(m);
}

Test(pytorch_model, expandable_unmaps_free_pages) {
    stow_ptm_t *m = make_default(1, 0);
    uint64_t a = must_alloc(m, 5 * MIB, 0);
    uint64_t b = must_alloc(m, 30 * MIB, 0); /* [5, 35) MiB: two 20 MiB pages */
    cr_assert_eq(stats_of(m).reserved_bytes_current, 40 * MIB);
    must_free(m, b);
    stow__ptm_empty_cache(m); /* page [20, 40) is wholly free */
    cr_assert_eq(stow__ptm_check(m), STOW_OK);
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.reserved_bytes_current, 20 * MIB);
    cr_assert_eq(s.unmap_calls, 1);
    cr_assert_eq(s.pages_released, 1);
    must_free(m, a);
    stow__ptm_empty_cache(m);
    s = stats_of(m);
    cr_assert_eq(s.reserved_bytes_current, 0);
    cr_assert_eq(s.segment_count_current, 0);
    stow__ptm_destroy(m);
}

Test(pytorch_model, expandable_oom_unmaps_then_remaps) {
    stow_ptm_t *m = make_default(1, 60 * MIB);
    uint64_t a = must_alloc(m, 20 * MIB, 0); /* page 0 */
    uint64_t b = must_alloc(m, 20 * MIB, 0); /* page 1 */
    must_free(m, a);
    /* 25 MiB do not fit in page 0; two new pages would make 80 MiB: the retry
     * unmaps the free page 0 first, then maps pages 2 and 3. */
    uint64_t c = must_alloc(m, 25 * MIB, 0);
    stow_ptm_stats_t s = stats_of(m);
    cr_assert_eq(s.num_alloc_retries, 1);
    cr_assert_eq(s.unmap_calls, 1);
    cr_assert_eq(s.reserved_bytes_current, 60 * MIB);
    cr_assert_eq(stow__ptm_block_address(m, c), stow__ptm_block_address(m, b) + 20 * MIB);
    uint64_t h = 0;
    cr_assert_eq(stow__ptm_alloc(m, 30 * MIB, 0, &h), STOW_ENOMEM);
    cr_assert_eq(stats_of(m).num_ooms, 1);
    stow__ptm_destroy(m);
}

Test(pytorch_model, random_operations_keep_invariants) {
    uint64_t x = 0x243f6a8885a308d3ULL;
    for (int round = 0; round < 24; round++) {
        stow_ptm_config_t c;
        stow__ptm_config_default(&c);
        c.expandable = round & 1;
        c.capacity_bytes = (size_t)(64 + 32 * (round % 7)) * MIB;
        if (round % 3 == 1) c.max_split_size_bytes = 40 * MIB;
        if (round % 4 == 2) {
            c.memory_fraction = 0.8;
            c.garbage_collection_threshold = 0.6;
        }
        stow_ptm_t *m = make_model(&c);
        uint64_t live[256];
        int n = 0;
        for (int i = 0; i < 1500; i++) {
            ts_xorshift(&x);
            unsigned r = (unsigned)(x % 100);
            if (r < 55 && n < 256) {
                size_t size = (size_t)(x >> 20) % ((x & 8) ? 40 * MIB : MIB);
                uint64_t h;
                stow_status_t st = stow__ptm_alloc(m, size, (uint32_t)(x >> 60) % 2, &h);
                cr_assert(st == STOW_OK || st == STOW_ENOMEM);
                if (st == STOW_OK) live[n++] = h;
            } else if (r < 98 && n > 0) {
                int j = (int)((x >> 33) % (uint64_t)n);
                cr_assert_eq(stow__ptm_free(m, live[j]), STOW_OK);
                live[j] = live[--n];
            } else {
                stow__ptm_empty_cache(m);
            }
            cr_assert_eq(stow__ptm_check(m), STOW_OK, "round %d op %d", round, i);
        }
        while (n > 0) cr_assert_eq(stow__ptm_free(m, live[--n]), STOW_OK);
        stow__ptm_empty_cache(m);
        stow_ptm_stats_t s = stats_of(m);
        cr_assert_eq(s.reserved_bytes_current, 0);
        cr_assert_eq(s.allocated_bytes_current, 0);
        cr_assert_eq(s.requested_bytes_current, 0);
        stow__ptm_destroy(m);
    }
}

/* ------------------------------------------------------------------ replay */

/* Reserved-bytes peaks of PyTorch 2.11 on the H200 (../shared/traces/README.md). */
static const struct {
    const char *name;
    size_t native_peak;
    size_t expandable_peak;
} replay_golden[] = {
    {"gpt2_train", 15286140928u, 14543749120u},
    {"resnet50_train", 6824132608u, 6098518016u},
    {"resnet_multiscale_train", 7964983296u, 5700059136u},
    {"vit_train", 6283067392u, 5825888256u},
    {"gpt2_generate", 1373634560u, 1182793728u},
};

static size_t replay_peak(const stow_trace_t *t, int expandable) {
    stow_ptm_t *m = make_default(expandable, 0);
    uint64_t *handles = calloc(t->id_count ? t->id_count : 1, sizeof *handles);
    cr_assert_not_null(handles);
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC)
            cr_assert_eq(stow__ptm_alloc(m, (size_t)e->size_bytes, e->stream, &handles[e->id]),
                         STOW_OK, "%s event %zu", t->path, i);
        else
            cr_assert_eq(stow__ptm_free(m, handles[e->id]), STOW_OK, "%s event %zu", t->path, i);
    }
    cr_assert_eq(stow__ptm_check(m), STOW_OK);
    size_t peak = stats_of(m).reserved_bytes_peak;
    free(handles);
    stow__ptm_destroy(m);
    return peak;
}

static void replay_one(size_t idx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/traces/%s.rep", STOW_SHARED_DIR, replay_golden[idx].name);
    FILE *f = fopen(path, "r");
    if (!f) cr_skip_test("shared trace %s is missing", path);
    fclose(f);
    stow_trace_t *t = NULL;
    char err[256] = "";
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
    for (int expandable = 0; expandable < 2; expandable++) {
        size_t want = expandable ? replay_golden[idx].expandable_peak : replay_golden[idx].native_peak;
        size_t got = replay_peak(t, expandable);
        double rel = ((double)got - (double)want) / (double)want;
        cr_log_info("%s %s: model %zu, PyTorch %zu, error %+.4f%%", replay_golden[idx].name,
                    expandable ? "expandable" : "native", got, want, rel * 100.0);
        cr_assert(rel < 0.01 && rel > -0.01, "%s %s: model %zu vs PyTorch %zu (%+.3f%%)",
                  replay_golden[idx].name, expandable ? "expandable" : "native", got, want,
                  rel * 100.0);
    }
    stow_trace_free(t);
}

Test(pytorch_model_replay, gpt2_train) { replay_one(0); }
Test(pytorch_model_replay, resnet50_train) { replay_one(1); }
Test(pytorch_model_replay, resnet_multiscale_train) { replay_one(2); }
Test(pytorch_model_replay, vit_train) { replay_one(3); }
Test(pytorch_model_replay, gpt2_generate) { replay_one(4); }
