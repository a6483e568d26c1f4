/*
 * tests/install/consumer.c: a program built against an installed Stowage
 * (tests/install/check.sh), once through find_package(Stowage) and once
 * through pkg-config. It uses only the installed headers and library: a pool
 * on the simulated device, an allocation, its accounting, and the library's
 * version against the header's. Prints "consumer ok VERSION" and exits 0, or
 * names what failed and exits 1.
 */
#include <stdio.h>

#include <stowage.h>
#include <stowage/record.h>

static int fail(const char *what, stow_status_t st)
{
    fprintf(stderr, "consumer: %s: %s\n", what, stow_strerror(st));
    return 1;
}

int main(void)
{
    if (stow_version() != STOW_VERSION_HEX) {
        fprintf(stderr, "consumer: library %#x, header %#x\n", stow_version(), STOW_VERSION_HEX);
        return 1;
    }
    stow_sim_config_t sc;
    stow_sim_config_default(&sc);
    sc.capacity_bytes = (size_t)1 << 30;
    stow_backend_t *dev = NULL;
    stow_status_t st = stow_sim_create(&sc, &dev);
    if (st != STOW_OK)
        return fail("stow_sim_create", st);
    stow_config_t cfg;
    stow_config_default(&cfg);
    stow_pool_t *pool = NULL;
    if ((st = stow_pool_create(&cfg, dev, &pool)) != STOW_OK)
        return fail("stow_pool_create", st);
    void *p = NULL;
    if ((st = stow_pool_alloc(pool, 3u << 20, NULL, &p)) != STOW_OK)
        return fail("stow_pool_alloc", st);
    stow_stats_t s;
    s.size = (uint32_t)sizeof s;
    s.version = STOW_STATS_VERSION;
    if ((st = stow_pool_stats(pool, &s)) != STOW_OK)
        return fail("stow_pool_stats", st);
    if (s.allocated_bytes[STOW_POOL_ALL].current != 3u << 20) {
        fprintf(stderr, "consumer: allocated %llu bytes, expected %u\n",
                (unsigned long long)s.allocated_bytes[STOW_POOL_ALL].current, 3u << 20);
        return 1;
    }
    if ((st = stow_pool_free(pool, p)) != STOW_OK)
        return fail("stow_pool_free", st);
    if (stow_pool_free(pool, p) != STOW_ENOTOWNED) {
        fprintf(stderr, "consumer: a double free was not refused\n");
        return 1;
    }
    if ((st = stow_pool_destroy(pool)) != STOW_OK)
        return fail("stow_pool_destroy", st);
    if ((st = stow_sim_destroy(dev)) != STOW_OK)
        return fail("stow_sim_destroy", st);
    printf("consumer ok %u.%u.%u\n", STOW_VERSION_MAJOR, STOW_VERSION_MINOR, STOW_VERSION_PATCH);
    return 0;
}
