/*
 * allocator/lock.c: the contended paths of the pool lock (allocator/lock.h).
 */
#include "allocator/lock.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Spins before sleeping: the pool holds its lock for well under a
 * microsecond on every fast path, a futex sleep and wake costs several. */
#define SPIN_TRIES 100

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void stow__lock_wait(stow_lock_t *lock, uint32_t seen)
{
    for (int i = 0; i < SPIN_TRIES && seen != 0; i++) {
        cpu_relax();
        seen = atomic_load_explicit(&lock->state, memory_order_relaxed);
        if (seen == 0) {
            uint32_t expected = 0;
            if (atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1,
                                                        memory_order_acquire,
                                                        memory_order_relaxed))
                return;
            seen = expected;
        }
    }
    /* Mark the lock contended (2) before sleeping, so that its holder wakes
     * someone at unlock; whoever takes it from here takes it as 2, which can
     * cost one needless wake, never a lost one. */
    if (seen != 2)
        seen = atomic_exchange_explicit(&lock->state, 2, memory_order_acquire);
    while (seen != 0) {
        syscall(SYS_futex, &lock->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        seen = atomic_exchange_explicit(&lock->state, 2, memory_order_acquire);
    }
}

void stow__lock_wake(stow_lock_t *lock)
{
    syscall(SYS_futex, &lock->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
