/*
 * allocator/vmm_allowance.h: the allowance of a page-mapped pool
 * (vmm_allowance.c): how many granules it may hold for its live high-water
 * mark, and the slack that adapts to how often it remaps. The adaptive state
 * lives here; the pool embeds it (pool.h) and only vmm_allowance.c reads its
 * fields. Includes no pool.
 */
#ifndef STOWAGE_ALLOCATOR_VMM_ALLOWANCE_H
#define STOWAGE_ALLOCATOR_VMM_ALLOWANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage.h"

/* The adaptive allowance of a page-mapped pool (vmm_allowance.c): remaps
 * counted by windows of pool operations. */
typedef struct stow_vmm_adapt {
    double slack;                /* in force: tuning.vmm_slack, raised up to vmm_slack_max */
    uint64_t window_start_op;    /* op_count when the current window began */
    uint64_t window_remaps;      /* granules remapped in it so far */
    uint64_t hot_ops, hot_remaps; /* over the run of consecutive hot windows */
    unsigned hot_windows;        /* that run's length */
    unsigned warm_windows;       /* consecutive warm windows (hot ones included) */
    double rate_at_last_raise;   /* remaps per operation of the run that raised it; 0: none */
    bool settled;                /* no more raises: at the cap, or one that did not help */
} stow_vmm_adapt_t;

/* The slack in force at pool creation: the tuning's, settled when it cannot
 * be raised. */
static inline void stow__vmm_adapt_init(stow_vmm_adapt_t *adapt, const stow_tuning_t *tuning)
{
    adapt->slack = tuning->vmm_slack;
    adapt->settled = tuning->vmm_slack_max <= tuning->vmm_slack;
}

/* The granules the pool may hold for `live_bytes_high_water` (its limit is the
 * caller's to check). */
uint64_t stow__vmm_allowance_for(const stow_pool_t *pool, uint64_t live_bytes_high_water);
/* The granules the pool may hold before it remaps, for `live_bytes_high_water`:
 * the allowance, or the most the pool has held (its handle high-water mark)
 * when that is more, since a remap below it cannot lower a peak already
 * reached; the allowance alone while the planned layer caps it. */
uint64_t stow__vmm_remap_floor_for(const stow_pool_t *pool, uint64_t live_bytes_high_water);
/* Counts a remap of `granules` for the adaptive allowance (may raise the slack). */
void stow__vmm_note_remap(stow_pool_t *pool, size_t granules);

#endif /* STOWAGE_ALLOCATOR_VMM_ALLOWANCE_H */
