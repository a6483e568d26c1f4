/*
 * allocator/period.h: the period of a loop's operations (allocator/period.c),
 * shared by the page-mapped pool's learned step (vmm_step.c) and the planned
 * layer's automatic steps (planned_auto.c).
 *
 * A loop is logged as one signature per operation: an allocation's is its
 * rounded size and stream, a free's how many operations back its block was
 * allocated. A period p of the log is a distance with which it repeats from
 * its end backwards.
 */
#ifndef STOWAGE_ALLOCATOR_PERIOD_H
#define STOWAGE_ALLOCATOR_PERIOD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STOW_SIG_SIZE_MASK (((uint64_t)1 << 48) - 2)

/* An allocation's signature: its rounded size (a multiple of 512, below
 * 2^48), bit 0 set, the stream's index in the top 16 bits. */
static inline uint64_t stow__sig_alloc(size_t rounded, unsigned stream_index)
{
    return ((uint64_t)rounded & STOW_SIG_SIZE_MASK) | 1u | ((uint64_t)stream_index << 48);
}

/* A free's: the distance back to its allocation, shifted (bit 0 clear). */
static inline uint64_t stow__sig_free(uint64_t distance_ops)
{
    return distance_ops << 1;
}

static inline bool stow__sig_is_alloc(uint64_t sig) { return sig & 1u; }

static inline size_t stow__sig_bytes(uint64_t sig) { return (size_t)(sig & STOW_SIG_SIZE_MASK); }

static inline unsigned stow__sig_stream(uint64_t sig) { return (unsigned)(sig >> 48); }

/* How many operations, back from the log's end, repeat with period p. */
size_t stow__period_tail(const uint64_t *sigs, size_t n, size_t p);

/* The smallest distance between two occurrences of `anchor` (from the first
 * or the last one to each other one) of at least min_period with which
 * sigs[0, n) repeats from its end back over two periods and half the log;
 * 0: none. An anchor should occur once a period: the largest allocation of
 * the loop, for one. O(n) plus O(n) per candidate tried. */
size_t stow__period_find(const uint64_t *sigs, size_t n, uint64_t anchor, size_t min_period);

/* stow__period_find anchored on the largest allocation of the log's second
 * half (the first of the largest size); 0: none. */
size_t stow__period_of_largest(const uint64_t *sigs, size_t n, size_t min_period);

#endif /* STOWAGE_ALLOCATOR_PERIOD_H */
