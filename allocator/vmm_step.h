/*
 * allocator/vmm_step.h: the loop learner of a page-mapped pool (vmm_step.c,
 * config vmm_learn_step): it logs the signatures of a loop's operations,
 * finds the step's period and then places each large request of the step at
 * the address it had, ahead of the fit layer. The learned state lives here;
 * the pool embeds it (pool.h) and only vmm_step.c reads its fields: others
 * use the accessors below. Includes no pool.
 */
#ifndef STOWAGE_ALLOCATOR_VMM_STEP_H
#define STOWAGE_ALLOCATOR_VMM_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/types.h"

/* A layout learned from a loop's step (vmm_step.c, config vmm_learn_step):
 * while looking, a log of operation signatures; once the step repeats, the
 * plan: per phase of its cycle, the expected signature and, for a planned
 * allocation, its address. Owned by the pool; the arrays are freed when the
 * log or the plan is dropped. */
typedef struct stow_vmm_step {
    uint64_t ops;                /* operations noted (successful allocations and frees) */
    bool looking, active;
    bool placing;                /* active: from start_phase on, requests take their addresses */
    uint64_t *log_sigs;          /* looking: signature of each logged operation */
    uint32_t *log_lives;         /* looking: allocations: operations until freed, 0 while live */
    size_t log_count;
    size_t next_check;           /* looking: the log's length at the next period search */
    uint64_t log_first_op;       /* step_ops of log_sigs[0] */
    uint64_t look_after_op;      /* no looking before this operation (back-off) */
    uint64_t last_remap_op;      /* step_ops at the last remap */
    uint64_t backoff_ops;        /* the next back-off, doubled after each refusal */
    size_t cycle, phase;         /* active: operations per cycle; phase of the next one */
    size_t period;               /* active: operations per step (a cycle is one or two) */
    size_t ops_to_step_end;      /* active: operations until the next step's end, a phase
                                    start_phase is a multiple of period from */
    size_t start_phase;          /* active: where the planned blocks hold the fewest bytes */
    size_t cycle_misses;         /* active: planned requests this cycle whose address was taken */
    unsigned missed_cycles;      /* active: cycles in a row with such misses */
    uint64_t *plan_sigs;         /* active: expected signature per phase */
    uintptr_t *plan_addrs;       /* active: planned address per phase; 0: not planned */
    uintptr_t *plan_anchors;     /* active: per phase, a block below the planned address
                                    that is live then (the search starts there); 0: none */
    struct stow_stream_state *stream; /* active: the stream whose large range holds the plan */
    struct stow_segment *range;  /* active: that range */
    uintptr_t plan_top;          /* active: above every planned block and block that stays,
                                    on a granule: where a request whose address is taken goes */
} stow_vmm_step_t;

/* Whether a learned plan places requests now. Inline: stow_pool_alloc asks
 * on every request that reaches the fit layer. */
static inline bool stow__vmm_step_active(const stow_vmm_step_t *step) { return step->active; }
/* Operations noted so far: the number a block allocated now gets. */
static inline uint64_t stow__vmm_step_ops(const stow_vmm_step_t *step) { return step->ops; }

void stow__vmm_step_destroy(stow_pool_t *pool);
/* empty_cache: the free blocks change hands (to the streams' shared index),
 * so the plan and the log go; the pool looks again at its next remap. */
void stow__vmm_step_forget(stow_pool_t *pool);
/* A remap: start looking for the step, unless looking, planned or backing off. */
void stow__vmm_step_note_remap(stow_pool_t *pool);
/* The operations of a pool that looks for its step or follows a plan
 * (stow__vmm_step_note_alloc and _free beyond their fast paths). */
void stow__vmm_step_log_alloc(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *ss,
                              size_t rounded);
void stow__vmm_step_log_free(stow_pool_t *pool, stow_block_t *b);
/* Notes a successful allocation (b, served on ss) or free of the pool whose
 * learner is `step` (&pool->step). Inline: a pool neither looking for its
 * step nor following a plan, most of the time, only counts the operation, and
 * a call on every request would cost more than that. */
static inline void stow__vmm_step_note_alloc(stow_vmm_step_t *step, stow_pool_t *pool,
                                             stow_block_t *b, stow_stream_state_t *ss,
                                             size_t rounded)
{
    if (!step->looking && !step->active) {
        b->free_seq = step->ops++; /* its lifetime, should a log start before its free */
        return;
    }
    stow__vmm_step_log_alloc(pool, b, ss, rounded);
}
static inline void stow__vmm_step_note_free(stow_vmm_step_t *step, stow_pool_t *pool,
                                            stow_block_t *b)
{
    if (!step->looking && !step->active) {
        step->ops++;
        return;
    }
    stow__vmm_step_log_free(pool, b);
}
/* The free block cut at the planned address of this request, or NULL (no plan,
 * not the expected request, or the address is not free). Needs one reserved
 * block record. */
stow_block_t *stow__vmm_step_place(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded);

#endif /* STOWAGE_ALLOCATOR_VMM_STEP_H */
