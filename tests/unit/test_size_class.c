/*
 * tests/unit/test_size_class.c: allocator/size_class.c.
 *
 * stow__round_size: every request becomes a multiple of 512 B; with
 * roundup_power2_divisions d for the request's interval (and the request above
 * 512 x d, PyTorch's rule), a request in [2^k, 2^(k+1)) rounds up to the next
 * multiple of 2^k / d. Checked against a brute-force reference on fixed and
 * random sizes. stow__free_bin_of: bins ordered by size, in range for every
 * size up to 2^63, exact below 16 x 512 B and at most 1/8 wide above.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>

#include "allocator/free_index.h"
#include "allocator/types.h"

#define KIB ((size_t)1024)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A size with a log-uniform magnitude: 1 B .. 2^max_lg B. */
static size_t random_size(unsigned max_lg)
{
    unsigned lg = (unsigned)(rng_next() % (max_lg + 1));
    size_t base = (size_t)1 << lg;
    return base + (size_t)(rng_next() % base);
}

static unsigned ref_floor_log2(size_t x)
{
    unsigned lg = 0;
    while (lg < 63 && ((size_t)1 << (lg + 1)) <= x)
        lg++;
    return lg;
}

static unsigned ref_interval(size_t size)
{
    if (size < ((size_t)1 << 21))
        return 0;
    unsigned i = ref_floor_log2(size) - 20;
    return i < STOW_ROUNDUP_INTERVALS ? i : STOW_ROUNDUP_INTERVALS - 1;
}

/* The smallest multiple of `step` >= size, where step is 512 B, or
 * floor_pow2(size) / d when d > 1 and size > 512 x d. */
static size_t ref_round(const stow_config_t *c, size_t size)
{
    if (size <= 512)
        return 512;
    unsigned d = c->roundup_power2_divisions[ref_interval(size)];
    size_t step = 512;
    if (d > 1 && size > (size_t)512 * d)
        step = ((size_t)1 << ref_floor_log2(size)) / d;
    return (size / step + (size % step != 0)) * step;
}

static size_t round_ok(const stow_config_t *c, size_t size)
{
    size_t out = 0;
    stow_status_t st = stow__round_size(c, size, &out);
    cr_assert_eq(st, STOW_OK, "round_size(%zu) -> %d", size, (int)st);
    return out;
}

static void config_all_divisions(stow_config_t *c, unsigned d)
{
    stow_config_default(c);
    for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
        c->roundup_power2_divisions[i] = d;
}

Test(size_class, rounds_to_512_by_default)
{
    stow_config_t c;
    stow_config_default(&c);
    static const size_t cases[][2] = {
        {1, 512},          {2, 512},           {511, 512},         {512, 512},
        {513, 1024},       {1023, 1024},       {1024, 1024},       {1025, 1536},
        {1200, 1536},      {4000, 4096},       {MIB - 1, MIB},     {MIB, MIB},
        {MIB + 1, MIB + 512}, {3 * MIB + 7, 3 * MIB + 512}, {GIB + 1, GIB + 512},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(round_ok(&c, cases[i][0]), cases[i][1], "size %zu", cases[i][0]);
}

Test(size_class, zero_rounds_to_min_block)
{
    /* The pool rejects size 0 before rounding; the function itself is total. */
    stow_config_t c;
    stow_config_default(&c);
    cr_assert_eq(round_ok(&c, 0), 512);
}

Test(size_class, divisions_apply_only_above_512_times_d)
{
    /* PyTorch's doc example "1200 rounds to 1280 with 4 divisions" does not hold
     * in PyTorch's code either: 1200 <= 512 x 4, so plain 512 rounding applies. */
    stow_config_t c;
    config_all_divisions(&c, 4);
    cr_assert_eq(round_ok(&c, 1200), 1536);
    cr_assert_eq(round_ok(&c, 2048), 2048);
    cr_assert_eq(round_ok(&c, 2049), 2560); /* (2048, 4096) in steps of 512 */
    cr_assert_eq(round_ok(&c, 5000), 5120); /* (4096, 8192) in steps of 1024 */
    cr_assert_eq(round_ok(&c, 4097), 5120);
    cr_assert_eq(round_ok(&c, 1 * MIB + 1), MIB + MIB / 4);
    cr_assert_eq(round_ok(&c, 1280 * KIB), 1280 * KIB);
    cr_assert_eq(round_ok(&c, 1280 * KIB + 1), 1536 * KIB);
    cr_assert_eq(round_ok(&c, 3 * MIB), 3 * MIB);
    cr_assert_eq(round_ok(&c, 3 * MIB - 1), 3 * MIB);
    cr_assert_eq(round_ok(&c, 3 * MIB + 1), 3 * MIB + MIB / 2);
}

Test(size_class, powers_of_two_are_kept)
{
    stow_config_t c;
    for (unsigned d = 0; d <= 1024; d = d ? d * 2 : 1) {
        config_all_divisions(&c, d);
        for (unsigned lg = 9; lg < 62; lg++)
            cr_assert_eq(round_ok(&c, (size_t)1 << lg), (size_t)1 << lg, "d=%u lg=%u", d, lg);
    }
}

Test(size_class, one_division_is_plain_rounding)
{
    stow_config_t c;
    config_all_divisions(&c, 1);
    cr_assert_eq(round_ok(&c, 3 * MIB + 1), 3 * MIB + 512);
}

Test(size_class, divisions_are_per_interval)
{
    /* Interval i covers [2^(20+i), 2^(21+i)); below 1 MiB is interval 0; the
     * last interval takes every larger size. */
    stow_config_t c;
    stow_config_default(&c);
    c.roundup_power2_divisions[1] = 8; /* [2 MiB, 4 MiB) */
    c.roundup_power2_divisions[STOW_ROUNDUP_INTERVALS - 1] = 2;
    cr_assert_eq(round_ok(&c, MIB + 1), MIB + 512);             /* interval 0: off */
    cr_assert_eq(round_ok(&c, 2 * MIB + 1), 2 * MIB + 256 * KIB); /* interval 1 */
    cr_assert_eq(round_ok(&c, 4 * MIB + 1), 4 * MIB + 512);     /* interval 2: off */
    size_t last = (size_t)1 << (20 + STOW_ROUNDUP_INTERVALS - 1);
    cr_assert_eq(round_ok(&c, last + 1), last + last / 2);
    cr_assert_eq(round_ok(&c, 4 * last + 1), 4 * last + 2 * last); /* clamped to the last */
}

Test(size_class, interval_zero_covers_sizes_below_one_mib)
{
    stow_config_t c;
    stow_config_default(&c);
    c.roundup_power2_divisions[0] = 4;
    cr_assert_eq(round_ok(&c, 5000), 5120);
    cr_assert_eq(round_ok(&c, 600 * KIB), 640 * KIB);
    cr_assert_eq(round_ok(&c, 2 * MIB - 1), 2 * MIB); /* [1 MiB, 2 MiB) is interval 0 */
    cr_assert_eq(round_ok(&c, 2 * MIB + 1), 2 * MIB + 512);
}

Test(size_class, random_sizes_match_reference)
{
    stow_config_t c;
    for (unsigned round = 0; round < 64; round++) {
        stow_config_default(&c);
        for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++) {
            unsigned lg = (unsigned)(rng_next() % 12); /* 0 .. 1024 */
            c.roundup_power2_divisions[i] = lg == 11 ? 0 : 1u << lg;
        }
        for (unsigned i = 0; i < 4000; i++) {
            size_t s = random_size(i % 4 == 0 ? 61 : 40);
            size_t got = round_ok(&c, s);
            size_t want = ref_round(&c, s);
            cr_assert_eq(got, want, "size %zu: got %zu want %zu", s, got, want);
            cr_assert_geq(got, s);
            cr_assert_eq(got % 512, 0);
        }
    }
}

Test(size_class, rounding_is_monotone)
{
    stow_config_t c;
    config_all_divisions(&c, 4);
    c.roundup_power2_divisions[3] = 0;
    size_t prev = 0;
    for (size_t s = 1; s < 20 * MIB; s += 1 + (size_t)(rng_next() % 4096)) {
        size_t r = round_ok(&c, s);
        cr_assert_geq(r, prev, "size %zu", s);
        prev = r;
    }
}

Test(size_class, overflow_near_size_max)
{
    stow_config_t c;
    stow_config_default(&c);
    size_t out = 12345;
    size_t limit = SIZE_MAX - GIB;
    cr_assert_eq(stow__round_size(&c, SIZE_MAX, &out), STOW_EOVERFLOW);
    cr_assert_eq(stow__round_size(&c, SIZE_MAX - 511, &out), STOW_EOVERFLOW);
    cr_assert_eq(stow__round_size(&c, limit + 1, &out), STOW_EOVERFLOW);
    cr_assert_eq(out, 12345, "out must be untouched on error");
    cr_assert_eq(round_ok(&c, limit), (limit + 511) & ~(size_t)511);
    cr_assert_eq(round_ok(&c, (size_t)1 << 63), (size_t)1 << 63);
}

Test(size_class, free_bins_exact_below_16_units)
{
    for (size_t x = 0; x < 16; x++) {
        cr_assert_eq(stow__free_bin_of(x * 512), x);
        cr_assert_eq(stow__free_bin_of(x * 512 + 511), x); /* floor(size / 512) */
    }
    cr_assert_eq(stow__free_bin_of(16 * 512), 16);
}

Test(size_class, free_bins_monotone_and_in_range)
{
    /* Every boundary 2^k - 512, 2^k, 2^k + 512 and the 1/8 points. */
    unsigned prev = 0;
    size_t prev_size = 0;
    for (unsigned lg = 9; lg <= 63; lg++) {
        size_t p = (size_t)1 << lg;
        for (unsigned e = 0; e < 8; e++) {
            size_t s = p + (p / 8) * e;
            if (lg == 63 && e > 0)
                break;
            size_t probes[3] = {s - 512, s, s + 512};
            for (unsigned k = 0; k < 3; k++) {
                if (probes[k] < prev_size)
                    continue;
                unsigned b = stow__free_bin_of(probes[k]);
                cr_assert_lt(b, STOW_FREE_BINS, "size %zu bin %u", probes[k], b);
                cr_assert_geq(b, prev, "size %zu bin %u < bin %u of %zu", probes[k], b, prev,
                              prev_size);
                prev = b;
                prev_size = probes[k];
            }
        }
    }
    cr_assert_lt(stow__free_bin_of(SIZE_MAX), STOW_FREE_BINS);
    cr_assert_lt(stow__free_bin_of((size_t)1 << 63), STOW_FREE_BINS);
}

Test(size_class, free_bins_random_pairs_ordered)
{
    for (unsigned i = 0; i < 200000; i++) {
        size_t a = random_size(63) & ~(size_t)511;
        size_t b = random_size(63) & ~(size_t)511;
        if (a > b) {
            size_t t = a;
            a = b;
            b = t;
        }
        unsigned ba = stow__free_bin_of(a), bb = stow__free_bin_of(b);
        cr_assert_leq(ba, bb, "sizes %zu <= %zu but bins %u > %u", a, b, ba, bb);
        cr_assert_lt(bb, STOW_FREE_BINS);
    }
}

Test(size_class, free_bins_span_at_most_an_eighth)
{
    /* Up to 2^63 no size is clamped into the last bin, so a bin's sizes stay
     * within 12.5% of its lowest one (types.h). */
    for (unsigned lg = 13; lg < 63; lg++) {
        size_t p = (size_t)1 << lg;
        for (unsigned e = 0; e < 8; e++) {
            size_t lo = p + (p / 8) * e;
            size_t hi = lo + p / 8 - 512;
            unsigned b = stow__free_bin_of(lo);
            cr_assert_eq(stow__free_bin_of(hi), b, "lg %u e %u", lg, e);
            cr_assert_eq(stow__free_bin_of(hi + 512), b + 1, "lg %u e %u", lg, e);
        }
    }
}

Test(size_class, divisions_never_wrap_near_size_max)
{
    /* Below the EOVERFLOW limit, division rounding must not wrap past SIZE_MAX:
     * the result is >= the request, or the call fails with STOW_EOVERFLOW. */
    stow_config_t c;
    for (unsigned d = 2; d <= 1024; d *= 2) {
        config_all_divisions(&c, d);
        size_t step = ((size_t)1 << 63) / d;
        size_t sizes[] = {SIZE_MAX - GIB, SIZE_MAX - step + 1, ((size_t)1 << 63) + step * (d - 1) + 1};
        for (unsigned k = 0; k < 3; k++) {
            size_t out = 0;
            stow_status_t st = stow__round_size(&c, sizes[k], &out);
            cr_expect(st == STOW_EOVERFLOW || (st == STOW_OK && out >= sizes[k]),
                      "d=%u size %zu: status %d out %zu", d, sizes[k], (int)st, out);
        }
    }
}
