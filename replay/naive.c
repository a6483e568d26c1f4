/*
 * replay/naive.c: the `naive` replay policy: no caching at all, one backend
 * reservation per request, released on free; what calling cudaMalloc and
 * cudaFree per tensor costs in reserved memory and backend calls.
 *
 * Each request reserves round_up(max(size, 1), 2 MiB) on a simulated device
 * (stowage/sim.h, default 2 MiB granularity), so reserved bytes are the sum of
 * live reservations. Why 2 MiB and not 512 B: the CUDA driver maps device memory
 * in 2 MiB pages, and a cudaMalloc of 1 GiB + 1 B costs 1 GiB + 2 MiB of device
 * memory as cudaMemGetInfo sees it. For small requests this is an upper bound:
 * the driver packs several small cudaMallocs into one 2 MiB page, which this
 * model does not try to reproduce (docs/benchmarks.md). An OOM is final: there
 * is no cache to release before a retry.
 *
 * It must not cache, pool or reorder anything: the point is the baseline.
 */
#include <stdlib.h>

#include "replay/replay_engine.h"
#include "stowage/sim.h"

typedef struct naive {
    stow_backend_t *sim;
} naive_t;

static void naive_destroy(void *ctx)
{
    naive_t *n = ctx;
    if (!n)
        return;
    /* Live reservations die with the device (stow_sim_destroy frees them). */
    stow_sim_destroy(n->sim);
    free(n);
}

static stow_status_t naive_create(const stow_replay_setup_t *setup, void **out)
{
    naive_t *n = calloc(1, sizeof *n);
    if (!n)
        return STOW_EHOSTMEM;
    stow_sim_config_t sc;
    stow_sim_config_default(&sc);
    sc.capacity_bytes = setup->capacity_bytes;
    sc.granularity_bytes = STOW_REPLAY_CAPACITY_STEP_BYTES;
    stow_status_t st = stow_sim_create(&sc, &n->sim);
    if (st != STOW_OK) {
        free(n);
        return st;
    }
    *out = n;
    return STOW_OK;
}

static size_t naive_round(uint64_t size_bytes)
{
    const uint64_t g = STOW_REPLAY_CAPACITY_STEP_BYTES;
    uint64_t s = size_bytes ? size_bytes : 1;
    return (size_t)((s + g - 1) / g * g);
}

static stow_status_t naive_alloc(void *ctx, uint64_t size_bytes, uint32_t stream,
                                 uint64_t *handle)
{
    naive_t *n = ctx;
    if (size_bytes > SIZE_MAX - STOW_REPLAY_CAPACITY_STEP_BYTES)
        return STOW_EOVERFLOW;
    void *p;
    stow_status_t st = n->sim->reserve(n->sim->ctx, naive_round(size_bytes),
                                       (stow_stream_t)(uintptr_t)(stream + 1u), &p);
    if (st == STOW_OK)
        *handle = (uint64_t)(uintptr_t)p;
    return st;
}

static void naive_free(void *ctx, uint64_t handle, uint64_t size_bytes)
{
    naive_t *n = ctx;
    (void)n->sim->release(n->sim->ctx, (void *)(uintptr_t)handle, naive_round(size_bytes));
}

static void naive_report(void *ctx, stow_replay_report_t *out)
{
    naive_t *n = ctx;
    stow_sim_counters_t c;
    stow_sim_counters(n->sim, &c);
    out->peak_reserved_bytes = c.reserved_bytes_peak;
    out->backend_calls = c.calls[STOW_SIM_RESERVE] + c.calls[STOW_SIM_RELEASE];
    out->has_backend_calls = true;
    out->fragmentation_at_peak = -1.0;
}

const stow_replay_policy_t stow__replay_policy_naive = {
    "naive", "one 2 MiB-granular backend reservation per request (cudaMalloc per tensor)", true,
    naive_create, naive_alloc, naive_free, NULL, naive_report, naive_destroy, false, NULL, false,
};
