/*
 * planner/plan_check.c: the independent plan validator and the load lower bound.
 *
 * This file must not call into plan.c: a validator that shares the solver's
 * overlap logic would share its bugs. It works by a sweep over time (ends before
 * starts at equal times, because lifetimes are half-open) that keeps the live
 * buffers in a presence tree indexed by their rank in offset order; a new buffer
 * only needs to be compared with its offset-order neighbours, because the live
 * set is pairwise disjoint as long as no violation has been found.
 */
#include <stdlib.h>
#include <string.h>

#include "planner/plan_internal.h"

typedef struct check_event {
    uint64_t time;
    uint32_t is_start; /* 0 = end, sorts first at equal times */
    uint32_t buf;
} check_event_t;

static int check_event_cmp(const void *a, const void *b)
{
    const check_event_t *x = a, *y = b;
    if (x->time != y->time)
        return x->time < y->time ? -1 : 1;
    if (x->is_start != y->is_start)
        return x->is_start < y->is_start ? -1 : 1;
    return (x->buf > y->buf) - (x->buf < y->buf);
}

static check_event_t *check_events(const stow_plan_problem_t *p)
{
    check_event_t *ev = malloc(2 * (p->count ? p->count : 1) * sizeof *ev);
    if (ev == NULL)
        return NULL;
    for (size_t i = 0; i < p->count; i++) {
        ev[2 * i] = (check_event_t){p->buffers[i].lower, 1, (uint32_t)i};
        ev[2 * i + 1] = (check_event_t){p->buffers[i].upper, 0, (uint32_t)i};
    }
    qsort(ev, 2 * p->count, sizeof *ev, check_event_cmp);
    return ev;
}

stow_status_t stow_plan_lower_bound(const stow_plan_problem_t *problem, uint64_t *out)
{
    if (out == NULL || stow_plan_problem_check(problem, NULL, 0) != STOW_OK)
        return STOW_EINVAL;
    if (problem->count > UINT32_MAX / 2)
        return STOW_EOVERFLOW;
    check_event_t *ev = check_events(problem);
    if (ev == NULL)
        return STOW_EHOSTMEM;
    uint64_t live = 0, best = 0;
    for (size_t e = 0; e < 2 * problem->count; e++) {
        uint64_t s = problem->buffers[ev[e].buf].size;
        if (ev[e].is_start) {
            if (!stow__plan_add(live, s, &live)) {
                free(ev);
                return STOW_EOVERFLOW;
            }
            if (live > best)
                best = live;
        } else {
            live -= s;
        }
    }
    free(ev);
    *out = best;
    return STOW_OK;
}

/* ------------------------------------------------------------- validator -- */

typedef struct check_rank {
    uint64_t offset;
    uint32_t buf;
} check_rank_t;

static int check_rank_cmp(const void *a, const void *b)
{
    const check_rank_t *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return (x->buf > y->buf) - (x->buf < y->buf);
}

/* Presence tree over ranks: a perfect binary tree of counts, leaves at [P, 2P). */
typedef struct check_tree {
    uint32_t *cnt;
    size_t leaves;
} check_tree_t;

static void check_tree_set(check_tree_t *t, size_t r, int delta)
{
    for (size_t i = r + t->leaves; i >= 1; i /= 2)
        t->cnt[i] = (uint32_t)((int64_t)t->cnt[i] + delta);
}

/* Largest present rank < r, or SIZE_MAX. */
static size_t check_tree_prev(const check_tree_t *t, size_t r)
{
    size_t i = r + t->leaves;
    while (i > 1) {
        if ((i & 1) && t->cnt[i - 1] > 0) {
            i = i - 1;
            while (i < t->leaves)
                i = t->cnt[2 * i + 1] > 0 ? 2 * i + 1 : 2 * i;
            return i - t->leaves;
        }
        i /= 2;
    }
    return SIZE_MAX;
}

/* Smallest present rank > r, or SIZE_MAX. */
static size_t check_tree_next(const check_tree_t *t, size_t r)
{
    size_t i = r + t->leaves;
    while (i > 1) {
        if (!(i & 1) && t->cnt[i + 1] > 0) {
            i = i + 1;
            while (i < t->leaves)
                i = t->cnt[2 * i] > 0 ? 2 * i : 2 * i + 1;
            return i - t->leaves;
        }
        i /= 2;
    }
    return SIZE_MAX;
}

static void check_name(const stow_plan_problem_t *p, size_t i, char *buf, size_t len)
{
    if (p->buffers[i].id != NULL)
        stow__plan_errf(buf, len, "'%s'", p->buffers[i].id);
    else
        stow__plan_errf(buf, len, "#%zu", i);
}

static stow_status_t check_conflict(const stow_plan_problem_t *p, const uint64_t *off, size_t a,
                                    size_t b, char *why, size_t len)
{
    char na[80], nb[80];
    check_name(p, a, na, sizeof na);
    check_name(p, b, nb, sizeof nb);
    const stow_plan_buffer_t *x = &p->buffers[a], *y = &p->buffers[b];
    stow__plan_errf(why, len,
                    "buffers %s [%llu,%llu) at [%llu,%llu) and %s [%llu,%llu) at [%llu,%llu) "
                    "overlap in time and memory",
                    na, (unsigned long long)x->lower, (unsigned long long)x->upper,
                    (unsigned long long)off[a], (unsigned long long)(off[a] + x->size), nb,
                    (unsigned long long)y->lower, (unsigned long long)y->upper,
                    (unsigned long long)off[b], (unsigned long long)(off[b] + y->size));
    return STOW_EINVAL;
}

stow_status_t stow_plan_validate(const stow_plan_problem_t *problem, const uint64_t *offsets,
                                 uint64_t capacity, char *why, size_t len)
{
    if (problem == NULL || (problem->count > 0 && offsets == NULL)) {
        stow__plan_errf(why, len, "no problem or no offsets");
        return STOW_EINVAL;
    }
    stow_status_t rc = stow_plan_problem_check(problem, why, len);
    if (rc != STOW_OK)
        return rc;
    size_t n = problem->count;
    if (n > UINT32_MAX / 2) {
        stow__plan_errf(why, len, "too many buffers");
        return STOW_EINVAL;
    }
    char nm[80];
    for (size_t i = 0; i < n; i++) {
        const stow_plan_buffer_t *b = &problem->buffers[i];
        uint64_t top;
        check_name(problem, i, nm, sizeof nm);
        if (offsets[i] % b->alignment != 0) {
            stow__plan_errf(why, len, "buffer %s: offset %llu is not a multiple of %llu", nm,
                            (unsigned long long)offsets[i], (unsigned long long)b->alignment);
            return STOW_EINVAL;
        }
        if (!stow__plan_add(offsets[i], b->size, &top)) {
            stow__plan_errf(why, len, "buffer %s: offset + size overflows 64 bits", nm);
            return STOW_EINVAL;
        }
        if (capacity != 0 && top > capacity) {
            stow__plan_errf(why, len, "buffer %s: offset %llu + size %llu exceeds capacity %llu",
                            nm, (unsigned long long)offsets[i], (unsigned long long)b->size,
                            (unsigned long long)capacity);
            return STOW_EINVAL;
        }
    }
    if (n == 0)
        return STOW_OK;
    check_rank_t *ranks = malloc(n * sizeof *ranks);
    size_t *rank_of = malloc(n * sizeof *rank_of);
    size_t leaves = 1;
    while (leaves < n)
        leaves *= 2;
    check_tree_t tree = {calloc(2 * leaves, sizeof(uint32_t)), leaves};
    check_event_t *ev = check_events(problem);
    if (ranks == NULL || rank_of == NULL || tree.cnt == NULL || ev == NULL) {
        rc = STOW_EHOSTMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        ranks[i] = (check_rank_t){offsets[i], (uint32_t)i};
    qsort(ranks, n, sizeof *ranks, check_rank_cmp);
    for (size_t r = 0; r < n; r++)
        rank_of[ranks[r].buf] = r;
    for (size_t e = 0; e < 2 * n; e++) {
        size_t i = ev[e].buf, r = rank_of[i];
        if (!ev[e].is_start) {
            check_tree_set(&tree, r, -1);
            continue;
        }
        /* Predecessor in offset order must end at or below our offset, and the
         * successor must start at or above our end; equal offsets order by
         * index, so two live buffers at one offset are always neighbours. */
        size_t pr = check_tree_prev(&tree, r);
        if (pr != SIZE_MAX) {
            size_t j = ranks[pr].buf;
            if (offsets[j] + problem->buffers[j].size > offsets[i]) {
                rc = check_conflict(problem, offsets, j, i, why, len);
                goto out;
            }
        }
        size_t nx = check_tree_next(&tree, r);
        if (nx != SIZE_MAX) {
            size_t j = ranks[nx].buf;
            if (offsets[i] + problem->buffers[i].size > offsets[j]) {
                rc = check_conflict(problem, offsets, i, j, why, len);
                goto out;
            }
        }
        check_tree_set(&tree, r, +1);
    }
    rc = STOW_OK;
out:
    free(ranks);
    free(rank_of);
    free(tree.cnt);
    free(ev);
    return rc;
}
