/*
 * tests/stress/regress_r2_leak.c: alloc, stow_record_stream on another
 * stream, free, destroy must not leak the block's stream-use list (48 B;
 * docs/reliability.md, regression inputs). A leak fails under LeakSanitizer at
 * exit (tests/check/asan.sh) and under valgrind; a plain build cannot see it.
 */
#include <stdint.h>
#include <stdio.h>

#include "stowage.h"
#include "stowage/sim.h"

int main(void)
{
    stow_backend_t *sim;
    stow_pool_t *pool;
    void *p = NULL;
    if (stow_sim_create(NULL, &sim) != STOW_OK || stow_pool_create(NULL, sim, &pool) != STOW_OK ||
        stow_pool_alloc(pool, 4096, NULL, &p) != STOW_OK ||
        stow_record_stream(pool, p, (stow_stream_t)(uintptr_t)0x22) != STOW_OK ||
        stow_pool_free(pool, p) != STOW_OK || stow_pool_destroy(pool) != STOW_OK)
        return 1;
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    if (stow_sim_destroy(sim) != STOW_OK || c.reserved_bytes)
        return 1;
    puts("regress_r2_leak: done (LeakSanitizer/valgrind decide)");
    return 0;
}
