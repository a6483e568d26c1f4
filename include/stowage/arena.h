/*
 * stowage/arena.h: a planned arena for inference.
 *
 * When every tensor's lifetime is known in advance (stowage/plan.h), one block
 * of the plan's height holds them all: each tensor lives at its planned offset,
 * tensors whose lifetimes do not overlap share bytes, and nothing is allocated
 * while the model runs. The block comes from a pool, so the arena shows in the
 * pool's accounting (allocated, requested and reserved bytes, and the current
 * tag's bytes).
 */
#ifndef STOWAGE_ARENA_H
#define STOWAGE_ARENA_H

#include <stddef.h>

#include "stowage.h"
#include "stowage/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stow_arena stow_arena_t; /* opaque */

/*
 * Checks `plan` against `problem` with the independent validator, then
 * allocates one block of the plan's height (plus room to honour alignments
 * above 512 bytes) from `pool` on `stream`.
 * Ownership: the arena copies what it needs from problem and plan; it borrows
 * the pool, which must outlive it.
 * Thread safety: creating and destroying are safe; lookups are read-only.
 * Errors: STOW_EINVAL (NULL argument, a plan that is invalid for the problem,
 * an alignment that is not a power of two), STOW_EOVERFLOW, and what
 * stow_pool_alloc returns (STOW_ENOMEM...).
 */
STOW_API STOW_NODISCARD stow_status_t stow_arena_create(stow_pool_t *pool,
                                                        const stow_plan_problem_t *problem,
                                                        const stow_plan_result_t *plan,
                                                        stow_stream_t stream, stow_arena_t **out);

/* Address of buffer `index` (its position in the problem); NULL if out of range. */
STOW_API void *stow_arena_ptr(const stow_arena_t *arena, size_t index);

/* Address of the buffer named `id` in the problem's CSV; NULL if none. O(log n). */
STOW_API void *stow_arena_ptr_by_id(const stow_arena_t *arena, const char *id);

/* Bytes of the arena's block (height, plus alignment room). */
STOW_API size_t stow_arena_bytes(const stow_arena_t *arena);

/* DESTRUCTOR: returns the block to the pool. NULL is a harmless no-op. */
STOW_API stow_status_t stow_arena_destroy(stow_arena_t *arena);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_ARENA_H */
