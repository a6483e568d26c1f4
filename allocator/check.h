/*
 * allocator/check.h: the invariant checks (check.c): the whole-pool check
 * that STOW_DEBUG >= 3 runs after every state change, and the one way the
 * checkers (check.c, planned_check.c) report a violation. Included by the
 * files that assert the whole pool or check a layer; includes nothing of the
 * allocator but assert.h.
 */
#ifndef STOWAGE_ALLOCATOR_CHECK_H
#define STOWAGE_ALLOCATOR_CHECK_H

#include <stddef.h>

#include "allocator/assert.h"
#include "stowage.h"

/* Walks every structure and checks the invariants of types.h and the books.
 * Returns STOW_OK or writes the first violation into why. Lock held. */
stow_status_t stow__pool_check_locked(stow_pool_t *pool, char *why, size_t why_len);
/* Writes a violation, printf-style, into why (if any) and returns STOW_EINVAL:
 * the checkers' (check.c, planned_check.c) one way to fail. */
stow_status_t stow__violation(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Level 3: the whole-pool check after every state change (O(blocks)). */
#if STOW_DEBUG >= 3
#define stow_assert_expensive(pool)                                            \
    do {                                                                       \
        char why_[256];                                                        \
        if (stow__pool_check_locked((pool), why_, sizeof why_) != STOW_OK) {   \
            fprintf(stderr, "stowage: %s:%d: pool check failed: %s\n", __FILE__, \
                    __LINE__, why_);                                           \
            abort();                                                           \
        }                                                                      \
    } while (0)
#else
#define stow_assert_expensive(pool) ((void)0)
#endif

#endif /* STOWAGE_ALLOCATOR_CHECK_H */
