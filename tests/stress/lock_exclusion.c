/*
 * tests/stress/lock_exclusion.c: the pool lock (allocator/lock.h). N threads
 * take it M times each and update a plain counter and a plain "inside" flag
 * under it; any overlap of two holders, or a lost update, fails. More threads
 * than cores (the test machines have two) forces the contended path: spinning,
 * then sleeping in the futex, then being woken at unlock. Plain program so
 * that it also runs under ThreadSanitizer (tests/check/tsan.sh), which would
 * report a data race on the counter if the lock did not order the holders.
 *
 *   lock_exclusion [THREADS=8] [ROUNDS=200000]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "allocator/lock.h"

static stow_lock_t lock = STOW_LOCK_INIT;
static uint64_t counter;  /* plain: only ever touched under the lock */
static int inside;        /* plain: 1 while a holder is in its section */
static int overlaps;      /* plain: holders that found another inside */
static unsigned rounds;

static void *worker(void *arg)
{
    (void)arg;
    for (unsigned i = 0; i < rounds; i++) {
        stow__lock(&lock);
        if (inside)
            overlaps++;
        inside = 1;
        counter++;
        /* A few holders linger so that others reach the sleeping path. */
        if (i % 4096 == 0)
            for (volatile int spin = 0; spin < 20000; spin++)
                ;
        inside = 0;
        stow__unlock(&lock);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    unsigned threads = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 8;
    rounds = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 200000;
    if (threads == 0 || threads > 256 || rounds == 0) {
        fprintf(stderr, "usage: lock_exclusion [THREADS 1..256] [ROUNDS > 0]\n");
        return 2;
    }
    pthread_t tid[256];
    for (unsigned t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, worker, NULL) != 0) {
            fprintf(stderr, "lock_exclusion: pthread_create failed\n");
            return 1;
        }
    for (unsigned t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t want = (uint64_t)threads * rounds;
    printf("lock_exclusion: %u threads x %u rounds: counter %llu (want %llu), overlaps %d, "
           "lock word %u\n",
           threads, rounds, (unsigned long long)counter, (unsigned long long)want, overlaps,
           (unsigned)atomic_load(&lock.state));
    return counter == want && overlaps == 0 && atomic_load(&lock.state) == 0 ? 0 : 1;
}
