/*
 * allocator/assert.h: the assertion levels (STOW_DEBUG) and the branch hints.
 * Every file of allocator/ may include it; it includes nothing of the
 * allocator. The whole-pool check of level 3 is check.h's
 * (stow_assert_expensive), which needs the pool.
 */
#ifndef STOWAGE_ALLOCATOR_ASSERT_H
#define STOWAGE_ALLOCATOR_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

/* Assertion levels (STOW_DEBUG): 1 caller contracts, 2 internal, 3 expensive
 * whole-pool checks. Release builds (0) compile them out. A failed assertion is
 * an allocator bug, never bad user input (which gets a status code). */
#ifndef STOW_DEBUG
#define STOW_DEBUG 0
#endif
#define STOW_ASSERT_FAIL_(expr) \
    (fprintf(stderr, "stowage: %s:%d: assertion failed: %s\n", __FILE__, __LINE__, #expr), abort())
#if STOW_DEBUG >= 1
#define stow_assert(expr) ((expr) ? (void)0 : STOW_ASSERT_FAIL_(expr))
#else
#define stow_assert(expr) ((void)0)
#endif
#if STOW_DEBUG >= 2
#define stow_assert_internal(expr) ((expr) ? (void)0 : STOW_ASSERT_FAIL_(expr))
#else
#define stow_assert_internal(expr) ((void)0)
#endif

#define STOW_LIKELY(x) __builtin_expect(!!(x), 1)
#define STOW_UNLIKELY(x) __builtin_expect(!!(x), 0)

#endif /* STOWAGE_ALLOCATOR_ASSERT_H */
