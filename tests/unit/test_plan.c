/*
 * tests/unit/test_plan.c: the planner (planner/plan_csv.c, plan.c, plan_check.c).
 *
 * Parser errors are checked message by message because "FILE:LINE: reason" is
 * the user interface. Plans are checked by property: on random problems every
 * plan must pass the validator, respect alignment and be no lower than the load
 * bound, and the validator itself must agree with a brute-force O(n^2) check on
 * random (mostly invalid) plans.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stowage/plan.h"
#include "stowage/trace.h"

static stow_status_t parse(const char *text, stow_plan_problem_t *p, char *err)
{
    err[0] = '\0';
    return stow_plan_parse_csv("t.csv", text, strlen(text), p, err, 256);
}

static void expect_error(const char *text, const char *want)
{
    char err[256];
    stow_plan_problem_t p;
    cr_assert_eq(parse(text, &p, err), STOW_EPARSE, "accepted: %s", text);
    cr_assert_str_eq(err, want);
}

Test(plan_csv, parses_minimalloc_example)
{
    const char *text = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n";
    stow_plan_problem_t p;
    char err[256];
    cr_assert_eq(parse(text, &p, err), STOW_OK, "%s", err);
    cr_assert_eq(p.count, 5);
    cr_assert_str_eq(p.buffers[1].id, "b2");
    cr_assert_eq(p.buffers[1].lower, 3);
    cr_assert_eq(p.buffers[1].upper, 9);
    cr_assert_eq(p.buffers[4].size, 4);
    cr_assert_eq(p.buffers[4].alignment, 1);
    uint64_t lb;
    cr_assert_eq(stow_plan_lower_bound(&p, &lb), STOW_OK);
    cr_assert_eq(lb, 12); /* half-open: b1 ends where b2 starts */
    stow_plan_options_t o = stow_plan_options_default();
    o.capacity = 12;
    stow_plan_result_t r;
    cr_assert_eq(stow_plan_solve(&p, &o, &r), STOW_OK);
    cr_assert(r.fits);
    cr_assert_eq(r.height, 12);
    cr_assert(r.optimal);
    cr_assert_eq(stow_plan_validate(&p, r.offsets, 12, err, sizeof err), STOW_OK, "%s", err);
    stow_plan_result_free(&r);
    stow_plan_problem_free(&p);
}

Test(plan_csv, columns_in_any_order_with_optional_ones)
{
    const char *text = "# comment\r\n\r\nsize, upper ,lower,id,alignment,offset,hint\r\n"
                       "8,10,0,x,4,,\r\n16,5,1,y,1,32,7\r\n";
    stow_plan_problem_t p;
    char err[256];
    cr_assert_eq(parse(text, &p, err), STOW_OK, "%s", err);
    cr_assert_eq(p.count, 2);
    cr_assert_str_eq(p.buffers[0].id, "x");
    cr_assert_eq(p.buffers[0].size, 8);
    cr_assert_eq(p.buffers[0].upper, 10);
    cr_assert_eq(p.buffers[0].alignment, 4);
    cr_assert_eq(p.buffers[1].lower, 1);
    stow_plan_problem_free(&p);
}

Test(plan_csv, extreme_values_parse_and_wrap_is_rejected)
{
    stow_plan_problem_t p;
    char err[256];
    cr_assert_eq(parse("id,lower,upper,size\na,18446744073709551614,18446744073709551615,"
                       "18446744073709551615\n",
                       &p, err),
                 STOW_OK, "%s", err);
    cr_assert_eq(p.buffers[0].size, UINT64_MAX);
    stow_plan_problem_free(&p);
    expect_error("id,lower,upper,size\na,0,1,18446744073709551616\n",
                 "t.csv:2: size '18446744073709551616' is beyond 2^64 - 1");
}

#define LEGACY_HINT                                                                                \
    "a legacy MiniMalloc header (buffer,start,end,size, inclusive end); write "                    \
    "id,lower,upper,size with upper = end + 1"

Test(plan_csv, error_messages_name_file_and_line)
{
    expect_error("id,lower,upper,size,colour\n",
                 "t.csv:1: unknown column 'colour' (expected id,lower,upper,size"
                 "[,alignment][,offset][,hint])");
    expect_error("buffer,start,end,size\n", "t.csv:1: unknown column 'buffer': " LEGACY_HINT);
    expect_error("id,lower,upper\n", "t.csv:1: missing column 'size' in header");
    expect_error("id,lower,upper,size,size\n", "t.csv:1: column 'size' appears twice");
    expect_error("id,lower,upper,size\na,0,4,8\nb,1,5,0\n", "t.csv:3: size is 0");
    expect_error("id,lower,upper,size\na,4,4,8\n",
                 "t.csv:2: upper <= lower (lifetimes are half-open [lower, upper))");
    expect_error("id,lower,upper,size\na,5,4,8\n",
                 "t.csv:2: upper <= lower (lifetimes are half-open [lower, upper))");
    expect_error("id,lower,upper,size\na,-1,4,8\n", "t.csv:2: lower '-1' is negative");
    expect_error("id,lower,upper,size\na,1e3,4,8\n",
                 "t.csv:2: lower '1e3' is not a decimal number");
    expect_error("id,lower,upper,size\na,0,4\n",
                 "t.csv:2: expected 4 fields, got 3: the line ends before its size");
    expect_error("id,lower,upper,size\na,0,4,8,9\n", "t.csv:2: more than 4 fields");
    expect_error("id,lower,upper,size\n,0,4,8\n", "t.csv:2: empty id");
    expect_error("id,lower,upper,size,alignment\na,0,4,8,0\n", "t.csv:2: alignment is 0");
    expect_error("id,lower,upper,size\na,0,4,8\n\n# x\na,1,2,3\n",
                 "t.csv:5: duplicate id 'a' (first on line 2)");
    expect_error("",
                 "t.csv: the file is empty; a plan CSV starts with the header id,lower,upper,size");
    expect_error("# only a comment\n", "t.csv:1: no header line (expected id,lower,upper,size)");
}

/* Each way a number can be wrong has its own reason, in every column. */
Test(plan_csv, field_errors_name_the_column_and_the_reason)
{
    expect_error("id,lower,upper,size\na,0,4,-5\n", "t.csv:2: size '-5' is negative");
    expect_error("id,lower,upper,size\na,0,99999999999999999999999,5\n",
                 "t.csv:2: upper '99999999999999999999999' is beyond 2^64 - 1");
    expect_error("id,lower,upper,size\na,0,4,5x\n", "t.csv:2: size '5x' is not a decimal number");
    expect_error("id,lower,upper,size\na,0,4,-\n", "t.csv:2: size '-' is not a decimal number");
    expect_error("id,lower,upper,size\na,0,,5\n", "t.csv:2: upper is empty");
    expect_error("id,lower,upper,size\na\n",
                 "t.csv:2: expected 4 fields, got 1: the line ends before its lower");
    expect_error("size,id,upper,lower,alignment\n8,a,4,0\n",
                 "t.csv:2: expected 5 fields, got 4: the line ends before its alignment");
    expect_error("id,lower,upper,size,alignment\na,0,4,8,-64\n",
                 "t.csv:2: alignment '-64' is negative");
}

/* MiniMalloc's legacy header, whichever of its columns comes first, gets the
 * hint docs/planner.md promises. */
Test(plan_csv, legacy_minimalloc_header_gets_the_hint)
{
    expect_error("buffer,start,end,size\n0,0,3,5\n",
                 "t.csv:1: unknown column 'buffer': " LEGACY_HINT);
    expect_error("id,start,end,size\n", "t.csv:1: unknown column 'start': " LEGACY_HINT);
    expect_error("id,lower,end,size\n", "t.csv:1: unknown column 'end': " LEGACY_HINT);
}

Test(plan_csv, empty_file_and_directory_are_sentences)
{
    char path[] = "/tmp/stow_plan_XXXXXX", dir[] = "/tmp/stow_plan_dir_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_not_null(mkdtemp(dir));
    stow_plan_problem_t p;
    char err[512], want[600];
    cr_assert_eq(stow_plan_load_csv(path, &p, err, sizeof err), STOW_EPARSE);
    snprintf(want, sizeof want,
             "%s: the file is empty; a plan CSV starts with the header id,lower,upper,size", path);
    cr_assert_str_eq(err, want);
    cr_assert_eq(stow_plan_load_csv(dir, &p, err, sizeof err), STOW_EIO);
    snprintf(want, sizeof want, "%s: is a directory, not a CSV file", dir);
    cr_assert_str_eq(err, want);
    unlink(path);
    rmdir(dir);
}

Test(plan_csv, load_reports_missing_file)
{
    stow_plan_problem_t p;
    char err[256];
    cr_assert_eq(stow_plan_load_csv("/nonexistent/x.csv", &p, err, sizeof err), STOW_EIO);
    cr_assert_str_eq(err, "/nonexistent/x.csv: No such file or directory");
}

Test(plan_csv, write_then_read_round_trips)
{
    stow_plan_problem_t p;
    char err[256];
    cr_assert_eq(parse("id,lower,upper,size\nq,0,4,8\nr,2,6,8\n", &p, err), STOW_OK);
    uint64_t off[2] = {0, 8};
    char path[] = "/tmp/stow_plan_rtXXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(stow_plan_write_csv(path, &p, off), STOW_OK);
    stow_plan_problem_t q;
    cr_assert_eq(stow_plan_load_csv(path, &q, err, sizeof err), STOW_OK, "%s", err);
    remove(path);
    cr_assert_eq(q.count, 2);
    cr_assert_str_eq(q.buffers[1].id, "r");
    cr_assert_eq(q.buffers[1].size, 8);
    stow_plan_problem_free(&p);
    stow_plan_problem_free(&q);
}

/* ---------------------------------------------------------------- overflow -- */

Test(plan_overflow, load_that_wraps_is_reported)
{
    stow_plan_problem_t p;
    cr_assert_eq(stow_plan_problem_init(&p, 2), STOW_OK);
    p.buffers[0] = (stow_plan_buffer_t){NULL, 0, 10, UINT64_MAX / 2 + 1, 1};
    p.buffers[1] = (stow_plan_buffer_t){NULL, 5, 15, UINT64_MAX / 2 + 1, 1};
    uint64_t lb;
    cr_assert_eq(stow_plan_lower_bound(&p, &lb), STOW_EOVERFLOW);
    stow_plan_result_t r;
    cr_assert_eq(stow_plan_solve(&p, NULL, &r), STOW_EOVERFLOW);
    /* Disjoint in time: both fit at offset 0 although their sum would wrap. */
    p.buffers[1].lower = 10;
    p.buffers[1].upper = 20;
    cr_assert_eq(stow_plan_lower_bound(&p, &lb), STOW_OK);
    cr_assert_eq(lb, UINT64_MAX / 2 + 1);
    stow_plan_options_t o = stow_plan_options_default();
    o.time_limit_seconds = 0.05;
    cr_assert_eq(stow_plan_solve(&p, &o, &r), STOW_OK);
    cr_assert_eq(r.height, UINT64_MAX / 2 + 1);
    cr_assert_eq(stow_plan_validate(&p, r.offsets, 0, NULL, 0), STOW_OK);
    stow_plan_result_free(&r);
    stow_plan_problem_free(&p);
}

Test(plan_overflow, alignment_near_the_top_is_reported)
{
    stow_plan_problem_t p;
    cr_assert_eq(stow_plan_problem_init(&p, 2), STOW_OK);
    p.buffers[0] = (stow_plan_buffer_t){NULL, 0, 10, 3, 1};
    p.buffers[1] = (stow_plan_buffer_t){NULL, 0, 10, 8, UINT64_MAX};
    stow_plan_result_t r;
    /* The aligned buffer fits at 0 and the small one above it. */
    cr_assert_eq(stow_plan_solve(&p, NULL, &r), STOW_OK);
    cr_assert_eq(r.offsets[1], 0);
    stow_plan_result_free(&r);
    p.buffers[0].size = UINT64_MAX;
    cr_assert_eq(stow_plan_solve(&p, NULL, &r), STOW_EOVERFLOW);
    stow_plan_problem_free(&p);
}

/* A load of exactly 2^64 - 1 is a representable lower bound, but its plan's
 * top would be UINT64_MAX, the solver's "no plan" mark: fuzz_plan_csv found it
 * returned STOW_OK with offsets never written (two buffers at 0). */
Test(plan_overflow, top_at_uint64_max_is_reported)
{
    stow_plan_problem_t p;
    cr_assert_eq(stow_plan_problem_init(&p, 3), STOW_OK);
    p.buffers[0] = (stow_plan_buffer_t){NULL, 5, 50, UINT64_MAX / 2 - 1, 1};
    p.buffers[1] = (stow_plan_buffer_t){NULL, 10, 20, UINT64_MAX / 2 + 1, 1};
    p.buffers[2] = (stow_plan_buffer_t){NULL, 5, 15, 1, 1};
    uint64_t lb;
    cr_assert_eq(stow_plan_lower_bound(&p, &lb), STOW_OK);
    cr_assert_eq(lb, UINT64_MAX);
    stow_plan_result_t r;
    cr_assert_eq(stow_plan_solve(&p, NULL, &r), STOW_EOVERFLOW);
    /* One byte less and it plans, validly. */
    p.buffers[0].size--;
    cr_assert_eq(stow_plan_solve(&p, NULL, &r), STOW_OK);
    cr_assert_eq(r.height, UINT64_MAX - 1);
    cr_assert_eq(stow_plan_validate(&p, r.offsets, 0, NULL, 0), STOW_OK);
    stow_plan_result_free(&r);
    stow_plan_problem_free(&p);
}

Test(plan_overflow, validator_rejects_wrapping_end)
{
    stow_plan_problem_t p;
    cr_assert_eq(stow_plan_problem_init(&p, 1), STOW_OK);
    p.buffers[0] = (stow_plan_buffer_t){NULL, 0, 10, 16, 1};
    uint64_t off = UINT64_MAX - 3;
    char why[256];
    cr_assert_eq(stow_plan_validate(&p, &off, 0, why, sizeof why), STOW_EINVAL);
    cr_assert_str_eq(why, "buffer #0: offset + size overflows 64 bits");
    stow_plan_problem_free(&p);
}

/* ------------------------------------------------------------- validator -- */

Test(plan_check, messages_and_half_open_sharing)
{
    stow_plan_problem_t p;
    char err[256], why[512];
    cr_assert_eq(parse("id,lower,upper,size,alignment\na,0,4,8,1\nb,4,8,8,1\nc,2,6,4,4\n", &p, err),
                 STOW_OK);
    uint64_t ok[3] = {0, 0, 8};
    cr_assert_eq(stow_plan_validate(&p, ok, 12, why, sizeof why), STOW_OK, "%s", why);
    uint64_t over[3] = {0, 0, 4};
    cr_assert_eq(stow_plan_validate(&p, over, 0, why, sizeof why), STOW_EINVAL);
    cr_assert_str_eq(why, "buffers 'a' [0,4) at [0,8) and 'c' [2,6) at [4,8) overlap in time and "
                          "memory");
    uint64_t mis[3] = {0, 0, 10};
    cr_assert_eq(stow_plan_validate(&p, mis, 0, why, sizeof why), STOW_EINVAL);
    cr_assert_str_eq(why, "buffer 'c': offset 10 is not a multiple of 4");
    cr_assert_eq(stow_plan_validate(&p, ok, 11, why, sizeof why), STOW_EINVAL);
    cr_assert_str_eq(why, "buffer 'c': offset 8 + size 4 exceeds capacity 11");
    uint64_t same[3] = {16, 16, 0};
    cr_assert_eq(stow_plan_validate(&p, same, 0, why, sizeof why), STOW_OK, "%s", why);
    stow_plan_problem_free(&p);
}

/* -------------------------------------------------------------- properties -- */

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void random_problem(stow_plan_problem_t *p, size_t n, bool aligned)
{
    cr_assert_eq(stow_plan_problem_init(p, n), STOW_OK);
    uint64_t horizon = 1 + rnd() % 40;
    for (size_t i = 0; i < n; i++) {
        uint64_t l = rnd() % horizon;
        p->buffers[i].lower = l;
        p->buffers[i].upper = l + 1 + rnd() % (horizon / 2 + 1);
        p->buffers[i].size = 1 + rnd() % ((rnd() & 1) ? 8 : 200);
        p->buffers[i].alignment = aligned ? (uint64_t)1 << (rnd() % 4) : 1;
        if (aligned && rnd() % 5 == 0)
            p->buffers[i].alignment = 3 + rnd() % 5; /* not a power of two */
    }
}

static bool brute_valid(const stow_plan_problem_t *p, const uint64_t *off, uint64_t cap)
{
    for (size_t i = 0; i < p->count; i++) {
        const stow_plan_buffer_t *a = &p->buffers[i];
        if (off[i] % a->alignment || off[i] > UINT64_MAX - a->size)
            return false;
        if (cap && off[i] + a->size > cap)
            return false;
        for (size_t j = i + 1; j < p->count; j++) {
            const stow_plan_buffer_t *b = &p->buffers[j];
            bool time = a->lower < b->upper && b->lower < a->upper;
            bool mem = off[i] < off[j] + b->size && off[j] < off[i] + a->size;
            if (time && mem)
                return false;
        }
    }
    return true;
}

static uint64_t brute_load(const stow_plan_problem_t *p)
{
    uint64_t best = 0;
    for (size_t i = 0; i < p->count; i++) {
        uint64_t t = p->buffers[i].lower, sum = 0;
        for (size_t j = 0; j < p->count; j++)
            if (p->buffers[j].lower <= t && t < p->buffers[j].upper)
                sum += p->buffers[j].size;
        if (sum > best)
            best = sum;
    }
    return best;
}

Test(plan_props, solved_plans_are_valid_aligned_and_above_the_bound)
{
    for (int iter = 0; iter < 300; iter++) {
        stow_plan_problem_t p;
        random_problem(&p, 1 + rnd() % 40, iter % 2 == 1);
        stow_plan_options_t o = stow_plan_options_default();
        o.time_limit_seconds = iter % 3 == 0 ? 0 : 0.02;
        o.seed = (uint64_t)iter;
        stow_plan_result_t r;
        cr_assert_eq(stow_plan_solve(&p, &o, &r), STOW_OK);
        uint64_t lb;
        cr_assert_eq(stow_plan_lower_bound(&p, &lb), STOW_OK);
        cr_assert_eq(lb, brute_load(&p));
        cr_assert_eq(r.lower_bound, lb);
        cr_assert_geq(r.height, lb);
        cr_assert_leq(r.height, r.greedy_height);
        cr_assert_eq(r.optimal, r.height == lb);
        uint64_t h = 0;
        for (size_t i = 0; i < p.count; i++) {
            cr_assert_eq(r.offsets[i] % p.buffers[i].alignment, 0);
            if (r.offsets[i] + p.buffers[i].size > h)
                h = r.offsets[i] + p.buffers[i].size;
        }
        cr_assert_eq(h, r.height);
        char why[512];
        cr_assert_eq(stow_plan_validate(&p, r.offsets, r.height, why, sizeof why), STOW_OK,
                     "iter %d: %s", iter, why);
        cr_assert(brute_valid(&p, r.offsets, r.height));
        /* Break the plan on purpose: the validator must notice. */
        for (size_t i = 0; i + 1 < p.count; i++) {
            for (size_t j = i + 1; j < p.count; j++) {
                const stow_plan_buffer_t *a = &p.buffers[i], *b = &p.buffers[j];
                if (!(a->lower < b->upper && b->lower < a->upper))
                    continue;
                uint64_t saved = r.offsets[j];
                r.offsets[j] = r.offsets[i];
                cr_assert_eq(stow_plan_validate(&p, r.offsets, 0, NULL, 0), STOW_EINVAL);
                r.offsets[j] = saved;
                i = p.count;
                break;
            }
        }
        for (size_t i = 0; i < p.count; i++) {
            if (p.buffers[i].alignment > 1) {
                r.offsets[i] += 1;
                cr_assert_eq(stow_plan_validate(&p, r.offsets, 0, NULL, 0), STOW_EINVAL);
                r.offsets[i] -= 1;
                break;
            }
        }
        if (r.height > 1)
            cr_assert_eq(stow_plan_validate(&p, r.offsets, r.height - 1, NULL, 0), STOW_EINVAL);
        stow_plan_result_free(&r);
        stow_plan_problem_free(&p);
    }
}

Test(plan_props, validator_agrees_with_brute_force)
{
    for (int iter = 0; iter < 3000; iter++) {
        stow_plan_problem_t p;
        random_problem(&p, 1 + rnd() % 12, iter % 2 == 1);
        uint64_t off[12];
        for (size_t i = 0; i < p.count; i++)
            off[i] = (rnd() % 50) * ((rnd() & 1) ? p.buffers[i].alignment : 1);
        uint64_t cap = iter % 3 == 0 ? 100 + rnd() % 200 : 0;
        bool want = brute_valid(&p, off, cap);
        stow_status_t got = stow_plan_validate(&p, off, cap, NULL, 0);
        cr_assert_eq(got, want ? STOW_OK : STOW_EINVAL, "iter %d", iter);
        stow_plan_problem_free(&p);
    }
}

/* A perfect packing: a W x T rectangle cut at random into pieces (time along
 * one side, memory along the other). Greedy usually misses it; the exact
 * search must find a plan of height exactly W. */
static size_t cut(stow_plan_buffer_t *out, size_t n, uint64_t t0, uint64_t t1, uint64_t m0,
                  uint64_t m1, int depth)
{
    (void)m0;
    if (depth == 0 || (t1 - t0 < 2 && m1 - m0 < 2) || rnd() % 5 == 0) {
        out[n] = (stow_plan_buffer_t){NULL, t0, t1, m1 - m0, 1};
        return n + 1;
    }
    if ((rnd() & 1) && t1 - t0 >= 2) {
        uint64_t t = t0 + 1 + rnd() % (t1 - t0 - 1);
        n = cut(out, n, t0, t, m0, m1, depth - 1);
        return cut(out, n, t, t1, m0, m1, depth - 1);
    }
    if (m1 - m0 < 2)
        return cut(out, n, t0, t1, m0, m1, 0);
    uint64_t m = m0 + 1 + rnd() % (m1 - m0 - 1);
    n = cut(out, n, t0, t1, m0, m, depth - 1);
    return cut(out, n, t0, t1, m, m1, depth - 1);
}

Test(plan_props, search_finds_small_perfect_packings)
{
    int greedy_missed = 0;
    for (int iter = 0; iter < 40; iter++) {
        stow_plan_buffer_t pieces[64];
        size_t n = cut(pieces, 0, 0, 64, 0, 1000, 5);
        stow_plan_problem_t p;
        cr_assert_eq(stow_plan_problem_init(&p, n), STOW_OK);
        memcpy(p.buffers, pieces, n * sizeof pieces[0]);
        stow_plan_options_t o = stow_plan_options_default();
        o.capacity = 1000;
        o.time_limit_seconds = 20; /* a generous cap, not a timing assertion */
        stow_plan_result_t r;
        cr_assert_eq(stow_plan_solve(&p, &o, &r), STOW_OK);
        cr_assert_eq(r.lower_bound, 1000);
        cr_assert(r.fits, "iter %d: height %llu", iter, (unsigned long long)r.height);
        cr_assert_eq(stow_plan_validate(&p, r.offsets, 1000, NULL, 0), STOW_OK);
        greedy_missed += r.greedy_height > 1000;
        stow_plan_result_free(&r);
        stow_plan_problem_free(&p);
    }
    cr_assert_gt(greedy_missed, 0, "the instances should exercise the search");
}

Test(plan_props, ruin_phase_keeps_big_plans_valid)
{
    /* Above the exact search's size limit, so the ruin-and-recreate phase runs. */
    for (int iter = 0; iter < 2; iter++) {
        stow_plan_problem_t p;
        random_problem(&p, 4100, iter == 1);
        stow_plan_options_t o = stow_plan_options_default();
        o.time_limit_seconds = 0.3;
        o.seed = (uint64_t)iter + 7;
        stow_plan_result_t r;
        cr_assert_eq(stow_plan_solve(&p, &o, &r), STOW_OK);
        cr_assert_geq(r.height, r.lower_bound);
        cr_assert_leq(r.height, r.greedy_height);
        uint64_t h = 0;
        for (size_t i = 0; i < p.count; i++)
            if (r.offsets[i] + p.buffers[i].size > h)
                h = r.offsets[i] + p.buffers[i].size;
        cr_assert_eq(h, r.height);
        char why[512];
        cr_assert_eq(stow_plan_validate(&p, r.offsets, r.height, why, sizeof why), STOW_OK,
                     "iter %d: %s", iter, why);
        cr_assert(brute_valid(&p, r.offsets, r.height));
        stow_plan_result_free(&r);
        stow_plan_problem_free(&p);
    }
}

Test(plan_trace, lifetimes_are_event_indices)
{
    /* events: 0 a0, 1 a1, 2 f0, 3 a2, 4 f2; id 1 is never freed */
    const char *text = "3 5\na 0 100 0\na 1 50 0\nf 0\na 2 70 0\nf 2\n";
    stow_trace_t *t = NULL;
    char err[256] = "";
    cr_assert_eq(stow_trace_parse("t.rep", text, strlen(text), &t, err, sizeof err), STOW_OK,
                 "%s", err);
    stow_plan_problem_t p;
    cr_assert_eq(stow_plan_problem_from_trace(t, &p), STOW_OK);
    cr_assert_eq(p.count, 3);
    cr_assert_str_eq(p.buffers[0].id, "0");
    cr_assert_eq(p.buffers[0].lower, 0);
    cr_assert_eq(p.buffers[0].upper, 2);
    cr_assert_eq(p.buffers[0].size, 100);
    cr_assert_str_eq(p.buffers[1].id, "1");
    cr_assert_eq(p.buffers[1].lower, 1);
    cr_assert_eq(p.buffers[1].upper, 5);
    cr_assert_eq(p.buffers[2].lower, 3);
    cr_assert_eq(p.buffers[2].upper, 4);
    uint64_t lb;
    cr_assert_eq(stow_plan_lower_bound(&p, &lb), STOW_OK);
    cr_assert_eq(lb, t->peak_live_bytes);
    cr_assert_eq(lb, 150);
    stow_plan_result_t r;
    cr_assert_eq(stow_plan_solve(&p, NULL, &r), STOW_OK);
    cr_assert_eq(r.height, 150); /* 0 and 2 share memory: [0,2) and [3,4) */
    cr_assert_eq(stow_plan_validate(&p, r.offsets, 0, NULL, 0), STOW_OK);
    stow_plan_result_free(&r);
    stow_plan_problem_free(&p);
    cr_assert_eq(stow_plan_problem_from_trace(NULL, &p), STOW_EINVAL);
    cr_assert_eq(stow_plan_problem_from_trace(t, NULL), STOW_EINVAL);
    stow_trace_free(t);
}

Test(plan_api, rejects_bad_arguments)
{
    stow_plan_problem_t p;
    cr_assert_eq(stow_plan_problem_init(&p, 1), STOW_OK);
    stow_plan_result_t r;
    cr_assert_eq(stow_plan_solve(&p, NULL, &r), STOW_EINVAL); /* size 0 */
    char why[128];
    cr_assert_eq(stow_plan_problem_check(&p, why, sizeof why), STOW_EINVAL);
    cr_assert_str_eq(why, "buffer #0: size is 0");
    p.buffers[0] = (stow_plan_buffer_t){NULL, 0, 1, 1, 1};
    stow_plan_options_t o = stow_plan_options_default();
    o.time_limit_seconds = -1;
    cr_assert_eq(stow_plan_solve(&p, &o, &r), STOW_EINVAL);
    cr_assert_eq(stow_plan_solve(NULL, NULL, &r), STOW_EINVAL);
    cr_assert_eq(stow_plan_solve(&p, NULL, NULL), STOW_EINVAL);
    stow_plan_problem_free(&p);
    stow_plan_problem_free(NULL);
    stow_plan_result_free(NULL);
    stow_plan_problem_t empty;
    cr_assert_eq(stow_plan_problem_init(&empty, 0), STOW_OK);
    cr_assert_eq(stow_plan_solve(&empty, NULL, &r), STOW_OK);
    cr_assert_eq(r.height, 0);
    cr_assert_eq(r.count, 0);
    stow_plan_result_free(&r);
    stow_plan_problem_free(&empty);
}
