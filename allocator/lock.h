/*
 * allocator/lock.h: the pool lock, a futex mutex (U. Drepper, "Futexes Are
 * Tricky", mutex 3). States: 0 free, 1 held, 2 held and someone may sleep.
 *
 * Why not pthread_mutex_t: every allocation and free takes the pool lock once,
 * and glibc's lock/unlock are two out-of-line calls of about 25 instructions
 * each around the one atomic that matters. Here the uncontended path is one
 * compare-and-swap to lock and one exchange to unlock, inlined. Contended
 * threads spin briefly, then sleep in the kernel; unlock wakes one only when
 * someone may be asleep. Not recursive, not robust, process-private: the pool
 * lock needs none of that (every path takes it once and releases it before
 * returning).
 */
#ifndef STOWAGE_ALLOCATOR_LOCK_H
#define STOWAGE_ALLOCATOR_LOCK_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct stow_lock {
    _Atomic uint32_t state;
} stow_lock_t;

#define STOW_LOCK_INIT {0}

/* allocator/lock.c: the contended paths. */
void stow__lock_wait(stow_lock_t *lock, uint32_t seen);
void stow__lock_wake(stow_lock_t *lock);

static inline void stow__lock(stow_lock_t *lock)
{
    uint32_t expected = 0;
    if (__builtin_expect(atomic_compare_exchange_strong_explicit(
                             &lock->state, &expected, 1, memory_order_acquire,
                             memory_order_relaxed),
                         1))
        return;
    stow__lock_wait(lock, expected);
}

static inline void stow__unlock(stow_lock_t *lock)
{
    if (__builtin_expect(atomic_exchange_explicit(&lock->state, 0, memory_order_release) == 2, 0))
        stow__lock_wake(lock);
}

#endif /* STOWAGE_ALLOCATOR_LOCK_H */
