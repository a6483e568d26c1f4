/*
 * tests/unit/test_arena.c: planned arenas (allocator/arena.c).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "stowage/arena.h"
#include "test_support.h"

static const char csv[] = "id,lower,upper,size,alignment\n"
                          "w,0,10,1000,1\n"
                          "a,0,3,4096,4096\n"
                          "b,3,6,5000,512\n"
                          "c,4,8,3000,1\n";

Test(arena, planned_offsets_in_one_pool_block)
{
    stow_plan_problem_t p;
    char err[256];
    cr_assert_eq(stow_plan_parse_csv("t", csv, strlen(csv), &p, err, sizeof err), STOW_OK, "%s",
                 err);
    stow_plan_options_t o;
    memset(&o, 0, sizeof o);
    o.time_limit_seconds = 0.1;
    stow_plan_result_t r;
    cr_assert_eq(stow_plan_solve(&p, &o, &r), STOW_OK);
    stow_backend_t *sim = ts_sim(0, false, false);
    stow_pool_t *pool;
    cr_assert_eq(stow_pool_create(NULL, sim, &pool), STOW_OK);
    stow_arena_t *a;
    cr_assert_eq(stow_arena_create(pool, &p, &r, NULL, &a), STOW_OK);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.allocation[STOW_POOL_ALL].current, 1, "one block for every tensor");
    cr_assert_eq(s.requested_bytes[STOW_POOL_ALL].current, stow_arena_bytes(a));
    cr_assert(stow_arena_bytes(a) >= r.height);
    for (size_t i = 0; i < p.count; i++) {
        uintptr_t addr = (uintptr_t)stow_arena_ptr(a, i);
        cr_assert_eq(addr % p.buffers[i].alignment, 0, "buffer %zu alignment", i);
        cr_assert_eq(stow_arena_ptr_by_id(a, p.buffers[i].id), (void *)addr);
    }
    /* Live at the same time: disjoint bytes. */
    uintptr_t b = (uintptr_t)stow_arena_ptr_by_id(a, "b"), c = (uintptr_t)stow_arena_ptr_by_id(a, "c");
    cr_assert(b + 5000 <= c || c + 3000 <= b);
    cr_assert_null(stow_arena_ptr(a, p.count));
    cr_assert_null(stow_arena_ptr_by_id(a, "nope"));
    cr_assert_eq(stow_arena_destroy(a), STOW_OK);
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.allocation[STOW_POOL_ALL].current, 0);
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
    stow_plan_result_free(&r);
    stow_plan_problem_free(&p);
}

Test(arena, invalid_plans_are_refused)
{
    stow_plan_problem_t p;
    char err[256];
    cr_assert_eq(stow_plan_parse_csv("t", csv, strlen(csv), &p, err, sizeof err), STOW_OK);
    uint64_t zeros[4] = {0, 0, 0, 0}; /* everything at 0: b and c overlap */
    stow_plan_result_t bad;
    memset(&bad, 0, sizeof bad);
    bad.count = 4;
    bad.offsets = zeros;
    stow_backend_t *sim = ts_sim(0, false, false);
    stow_pool_t *pool;
    cr_assert_eq(stow_pool_create(NULL, sim, &pool), STOW_OK);
    stow_arena_t *a = (stow_arena_t *)0x1;
    cr_assert_eq(stow_arena_create(pool, &p, &bad, NULL, &a), STOW_EINVAL);
    cr_assert_eq(a, (stow_arena_t *)0x1);
    bad.count = 3;
    cr_assert_eq(stow_arena_create(pool, &p, &bad, NULL, &a), STOW_EINVAL);
    cr_assert_eq(stow_arena_create(NULL, &p, &bad, NULL, &a), STOW_EINVAL);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.allocation[STOW_POOL_ALL].allocated, 0, "nothing allocated");
    cr_assert_eq(stow_arena_destroy(NULL), STOW_OK);
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
    stow_plan_problem_free(&p);
}
