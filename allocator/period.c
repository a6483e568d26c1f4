/*
 * allocator/period.c: finding the period of a loop's operation log
 * (allocator/period.h), as bench/long_run.py and bench/step_plan_bound.py
 * find a training run's step.
 *
 * Pure functions of the log: no pool state. A candidate is kept only when the
 * log repeats with it from its end back over two periods (its last three
 * periods alike) and half the log, so that a stretch that repeats by chance
 * (a few layers alike) is not taken for the step.
 */
#include "allocator/period.h"

size_t stow__period_tail(const uint64_t *sigs, size_t n, size_t p)
{
    size_t i = n;
    while (i > p && sigs[i - 1] == sigs[i - 1 - p])
        i--;
    return n - i;
}

size_t stow__period_find(const uint64_t *sigs, size_t n, uint64_t anchor, size_t min_period)
{
    size_t first = SIZE_MAX, last = 0;
    for (size_t i = 0; i < n; i++)
        if (sigs[i] == anchor) {
            if (first == SIZE_MAX)
                first = i;
            last = i;
        }
    if (first == SIZE_MAX)
        return 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        if (sigs[i] != anchor)
            continue;
        size_t candidates[2] = {i - first, last - i};
        for (int c = 0; c < 2; c++) {
            size_t p = candidates[c];
            if (p < min_period || p > n / 3 || (best && p >= best))
                continue;
            size_t tail = stow__period_tail(sigs, n, p);
            if (tail >= 2 * p && tail >= n / 2)
                best = p;
        }
    }
    return best;
}

size_t stow__period_of_largest(const uint64_t *sigs, size_t n, size_t min_period)
{
    uint64_t biggest = 0;
    for (size_t i = n / 2; i < n; i++)
        if (stow__sig_is_alloc(sigs[i]) && stow__sig_bytes(sigs[i]) > stow__sig_bytes(biggest))
            biggest = sigs[i];
    return biggest ? stow__period_find(sigs, n, biggest, min_period) : 0;
}
