/*
 * bench/gpu/remap_wait.c: what a page-mapped pool's remap waits for on a GPU.
 *
 * A remap takes a granule whose last blocks may still be used by queued work,
 * so it waits for that work first (unmapping is not stream-ordered): on the
 * events of the streams that freed there (backend event_synchronize, that is
 * cuEventSynchronize), or, on a backend without it, by synchronizing the
 * whole device (cuCtxSynchronize). docs/design.md, remaps without a
 * synchronize.
 *
 * Each round makes a fresh page-mapped pool (vmm_slack 0: no granule beyond
 * the live peak) and, on stream s1, a block A of MIB MiB with a fence F after
 * it; queues a short memset into A on s1 and frees A; queues CHAIN memsets of
 * a MIB MiB block W on a second stream s2 (an NCCL or copy stream stand-in,
 * whose buffer W comes from another pool, as NCCL's do); then times the
 * allocation of 1.5 x MIB MiB on s1, which
 * fits nowhere mapped and takes A's granules. With event waits it waits for
 * s1's memset alone; with a synchronize, for s2's whole queue too. The rounds
 * alternate between the backend as it is and a copy without event_synchronize.
 * Prints, per variant, the median time of that allocation and its waits, their
 * ratio, and s2's queue time alone (a calibration round), and writes them as
 * JSON to OUT.
 *
 * Usage: remap_wait OUT.json [ROUNDS (20)] [MIB (64)] [CHAIN (40)]
 * On the emulated driver (tests/support/fake_cuda.c, ctest remap_wait_fake_driver)
 * it runs as a smoke test: that driver's clock is not time, so its figures mean
 * nothing there, but both variants must remap and the driver count no
 * violation.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stowage.h"
#include "stowage/cuda.h"

#define MIB ((size_t)1 << 20)
#define MAX_ROUNDS 200
#define MAX_MIB 65536 /* 64 GiB blocks */
#define MAX_CHAIN 100000

typedef void *cu_stream_t;
typedef unsigned long long cu_ptr_t;

static struct {
    int (*stream_create)(cu_stream_t *out, unsigned flags);
    int (*stream_destroy)(cu_stream_t s);
    int (*stream_synchronize)(cu_stream_t s);
    int (*ctx_synchronize)(void);
    int (*memset_d8_async)(cu_ptr_t dst, unsigned char value, size_t n, cu_stream_t s);
} drv;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A whole number in [lo, hi] (the whole argument), else false. */
static bool parse_count(const char *arg, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static int resolve(void *slot, const char *name)
{
    void *f = stow_cuda_driver_symbol(name);
    if (!f) {
        fprintf(stderr, "remap_wait: the driver has no %s\n", name);
        return -1;
    }
    memcpy(slot, &f, sizeof f);
    return 0;
}

/* What one timed allocation cost and waited for. */
typedef struct sample {
    double alloc_ms;
    uint64_t syncs, event_waits, unmaps;
} sample_t;

static int fail(const char *what, stow_status_t st)
{
    fprintf(stderr, "remap_wait: %s: %s\n", what, stow_strerror(st));
    return -1;
}

/* One round on `backend`: s2's CHAIN memsets go into w. */
static int round_on(stow_backend_t *backend, size_t block, int chain, cu_stream_t s1,
                    cu_stream_t s2, void *w, sample_t *out)
{
    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning;
    stow_tuning_default(&tuning);
    tuning.vmm_slack = 0.0;
    tuning.vmm_slack_max = 0.0;
    stow_pool_t *pool = NULL;
    stow_status_t st = stow_pool_create_tuned(&cfg, &tuning, backend, &pool);
    if (st != STOW_OK)
        return fail("pool create", st);
    void *a = NULL, *f = NULL, *c = NULL;
    int rc = -1;
    if ((st = stow_pool_alloc(pool, block, s1, &a)) != STOW_OK ||
        (st = stow_pool_alloc(pool, 2 * MIB, s1, &f)) != STOW_OK) {
        fail("alloc", st);
        goto out;
    }
    if (drv.memset_d8_async((cu_ptr_t)(uintptr_t)a, 1, block, s1) ||
        (st = stow_pool_free(pool, a)) != STOW_OK) {
        fail("free after a memset", st);
        goto out;
    }
    for (int i = 0; i < chain; i++)
        if (drv.memset_d8_async((cu_ptr_t)(uintptr_t)w, (unsigned char)i, block, s2)) {
            fprintf(stderr, "remap_wait: cuMemsetD8Async failed\n");
            goto out;
        }
    stow_stats_t before, after;
    (void)stow_pool_stats(pool, &before);
    double t0 = now_ms();
    st = stow_pool_alloc(pool, block + block / 2, s1, &c);
    out->alloc_ms = now_ms() - t0;
    (void)stow_pool_stats(pool, &after);
    if (st != STOW_OK) {
        fail("the remapping alloc", st);
        goto out;
    }
    out->syncs = after.num_sync_all_streams - before.num_sync_all_streams;
    out->event_waits = after.num_event_waits - before.num_event_waits;
    out->unmaps = after.num_unmap_calls - before.num_unmap_calls;
    rc = 0;
out:
    (void)drv.ctx_synchronize();
    void *blocks[] = {f, c};
    for (int i = 0; i < 2; i++)
        if (blocks[i])
            (void)stow_pool_free(pool, blocks[i]);
    (void)stow_pool_destroy(pool);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT.json [ROUNDS (20)] [MIB (64)] [CHAIN (40)]\n", argv[0]);
        return 2;
    }
    long rounds_arg = 20, mib = 64, chain_arg = 40;
    if ((argc > 2 && !parse_count(argv[2], 1, MAX_ROUNDS, &rounds_arg)) ||
        (argc > 3 && !parse_count(argv[3], 2, MAX_MIB, &mib)) ||
        (argc > 4 && !parse_count(argv[4], 1, MAX_CHAIN, &chain_arg))) {
        fprintf(stderr, "remap_wait: ROUNDS 1..%d, MIB 2..%d, CHAIN 1..%d (whole numbers)\n",
                MAX_ROUNDS, MAX_MIB, MAX_CHAIN);
        return 2;
    }
    int rounds = (int)rounds_arg, chain = (int)chain_arg;
    size_t block = (size_t)mib * MIB;
    char why[512];
    stow_backend_t *b = NULL;
    if (stow_cuda_backend_create(0, &b, why, sizeof why) != STOW_OK) {
        fprintf(stderr, "remap_wait: no CUDA backend: %s\n", why);
        return 1;
    }
    if (!b->va_reserve || !b->event_synchronize) {
        fprintf(stderr, "remap_wait: the driver has no page mapping or cuEventSynchronize\n");
        stow_cuda_backend_destroy(b);
        return 1;
    }
    if (resolve(&drv.stream_create, "cuStreamCreate") ||
        resolve(&drv.stream_destroy, "cuStreamDestroy_v2") ||
        resolve(&drv.stream_synchronize, "cuStreamSynchronize") ||
        resolve(&drv.ctx_synchronize, "cuCtxSynchronize") ||
        resolve(&drv.memset_d8_async, "cuMemsetD8Async"))
        return 1;
    stow_backend_t without = *b; /* the same device, remaps synchronize */
    without.event_synchronize = NULL;
    cu_stream_t s1 = NULL, s2 = NULL;
    if (drv.stream_create(&s1, 1) || drv.stream_create(&s2, 1)) {
        fprintf(stderr, "remap_wait: cuStreamCreate failed\n");
        return 1;
    }

    /* W, s2's buffer, from a pool of its own; s2's queue alone: CHAIN
     * memsets into it, queued and waited for. */
    void *w = NULL;
    stow_pool_t *wp = NULL;
    if (stow_pool_create(NULL, b, &wp) != STOW_OK || stow_pool_alloc(wp, block, s2, &w))
        return 1;
    (void)drv.memset_d8_async((cu_ptr_t)(uintptr_t)w, 0, block, s2); /* warm */
    (void)drv.stream_synchronize(s2);
    double t0 = now_ms();
    for (int i = 0; i < chain; i++)
        (void)drv.memset_d8_async((cu_ptr_t)(uintptr_t)w, (unsigned char)i, block, s2);
    (void)drv.stream_synchronize(s2);
    double queue_ms = now_ms() - t0;

    static double ms[2][MAX_ROUNDS];
    uint64_t syncs[2] = {0, 0}, waits[2] = {0, 0}, unmaps[2] = {0, 0};
    stow_backend_t *variant[2] = {b, &without};
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < 2; v++) {
            sample_t s;
            if (round_on(variant[v], block, chain, s1, s2, w, &s))
                return 1;
            ms[v][r] = s.alloc_ms;
            syncs[v] += s.syncs;
            waits[v] += s.event_waits;
            unmaps[v] += s.unmaps;
            if (!s.unmaps) {
                fprintf(stderr, "remap_wait: round %d remapped nothing\n", r);
                return 1;
            }
        }
    double med[2] = {median(ms[0], rounds), median(ms[1], rounds)};
    double med_events = med[0], med_sync = med[1];
    static const char *const names[2] = {"event waits:", "synchronize:"};
    printf("remap_wait: %d rounds, blocks of %zu MiB, s2 queue of %d memsets (%.3f ms alone)\n",
           rounds, block / MIB, chain, queue_ms);
    for (int v = 0; v < 2; v++)
        printf("  %-13s remapping alloc median %.3f ms (%llu syncs, %llu events waited on, "
               "%llu unmaps)\n",
               names[v], med[v], (unsigned long long)syncs[v], (unsigned long long)waits[v],
               (unsigned long long)unmaps[v]);
    printf("  synchronize / event waits: %.2f\n", med_events > 0 ? med_sync / med_events : 0.0);
    FILE *out = fopen(argv[1], "w");
    bool written = out != NULL;
    if (!out) {
        fprintf(stderr, "remap_wait: cannot write %s: %s\n", argv[1], strerror(errno));
    } else {
        fprintf(out,
                "{\"rounds\": %d, \"block_mib\": %zu, \"chain\": %d, \"s2_queue_ms\": %.4f, "
                "\"event_waits_alloc_ms\": %.4f, \"sync_alloc_ms\": %.4f, "
                "\"event_waits_syncs\": %llu, \"event_waits_waited\": %llu, "
                "\"sync_syncs\": %llu, \"unmaps\": %llu}\n",
                rounds, block / MIB, chain, queue_ms, med_events, med_sync,
                (unsigned long long)syncs[0], (unsigned long long)waits[0],
                (unsigned long long)syncs[1], (unsigned long long)(unmaps[0] + unmaps[1]));
        written = fclose(out) == 0;
        if (!written)
            fprintf(stderr, "remap_wait: cannot write %s: %s\n", argv[1], strerror(errno));
    }
    (void)stow_pool_free(wp, w);
    (void)stow_pool_destroy(wp);
    (void)drv.stream_destroy(s1);
    (void)drv.stream_destroy(s2);
    stow_cuda_backend_destroy(b);
    /* Each variant must have waited as it can: on events alone, or by
     * synchronizing; and the results must be written. */
    return written && syncs[0] == 0 && waits[0] > 0 && syncs[1] > 0 && waits[1] == 0 ? 0 : 1;
}
