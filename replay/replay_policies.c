/*
 * replay/replay_policies.c: the replay-engine adapters of the policies that
 * already exist elsewhere: `classic` and `vmm` (the Stowage pool of allocator/
 * on the simulated device) and `pytorch` / `pytorch-expandable`
 * (replay/pytorch_model.h).
 * Each adapter only translates calls; it must not change any policy decision.
 */
#include <stdlib.h>

#include "replay/pytorch_model.h"
#include "replay/replay_engine.h"
#include "stowage.h"
#include "stowage/sim.h"

/* ---- classic ---- */

typedef struct classic {
    stow_backend_t *sim;
    stow_pool_t *pool;
    stow_stats_t stats; /* filled by report */
} classic_t;

static void classic_destroy(void *ctx)
{
    classic_t *c = ctx;
    if (!c)
        return;
    stow_pool_destroy_force(c->pool);
    stow_sim_destroy(c->sim);
    free(c);
}

/* The measured constants the replayed pools take (--tuning): one set for the
 * process, as the tool replays one command line. */
static stow_tuning_t replay_tuning;
static bool replay_tuned;

void stow__replay_set_tuning(const stow_tuning_t *tuning)
{
    replay_tuned = tuning != NULL;
    if (tuning)
        replay_tuning = *tuning;
}

const stow_tuning_t *stow__replay_tuning(void)
{
    return replay_tuned ? &replay_tuning : NULL;
}

static stow_status_t pool_create_with(const stow_replay_setup_t *setup, stow_policy_t policy,
                                      bool planned, void **out)
{
    classic_t *c = calloc(1, sizeof *c);
    if (!c)
        return STOW_EHOSTMEM;
    stow_sim_config_t sc;
    stow_sim_config_default(&sc);
    sc.capacity_bytes = setup->capacity_bytes;
    stow_config_t config = *setup->config;
    config.policy = policy;
    config.planned_steps |= planned;
    /* Plans are made inline, at the marker that completes a key's recording:
     * a replay gives the same figures on every run (docs/planned.md). */
    config.planned_async = false;
    stow_status_t st = stow_sim_create(&sc, &c->sim);
    if (st == STOW_OK)
        st = stow_pool_create_tuned(&config, stow__replay_tuning(), c->sim, &c->pool);
    if (st != STOW_OK) {
        classic_destroy(c);
        return st;
    }
    *out = c;
    return STOW_OK;
}

static stow_status_t classic_create(const stow_replay_setup_t *setup, void **out)
{
    return pool_create_with(setup, STOW_POLICY_CLASSIC, false, out);
}

static stow_status_t vmm_create(const stow_replay_setup_t *setup, void **out)
{
    return pool_create_with(setup, STOW_POLICY_VMM, false, out);
}

static stow_status_t classic_planned_create(const stow_replay_setup_t *setup, void **out)
{
    return pool_create_with(setup, STOW_POLICY_CLASSIC, true, out);
}

static stow_status_t vmm_planned_create(const stow_replay_setup_t *setup, void **out)
{
    return pool_create_with(setup, STOW_POLICY_VMM, true, out);
}

static stow_stream_t classic_stream(uint32_t index)
{
    /* Distinct non-NULL handles; index 0 is the default stream. */
    return (stow_stream_t)(uintptr_t)(index + 1u);
}

static stow_status_t classic_alloc(void *ctx, uint64_t size_bytes, uint32_t stream,
                                   uint64_t *handle)
{
    classic_t *c = ctx;
    void *p;
    stow_status_t st = stow_pool_alloc(c->pool, (size_t)size_bytes, classic_stream(stream), &p);
    if (st == STOW_OK)
        *handle = (uint64_t)(uintptr_t)p;
    return st;
}

static void classic_free(void *ctx, uint64_t handle, uint64_t size_bytes)
{
    (void)size_bytes;
    classic_t *c = ctx;
    (void)stow_pool_free(c->pool, (void *)(uintptr_t)handle);
}

static void classic_step(void *ctx, const char *key)
{
    classic_t *c = ctx;
    (void)stow_pool_step(c->pool, key); /* keys were checked by the trace reader */
}

static void classic_report(void *ctx, stow_replay_report_t *out)
{
    classic_t *c = ctx;
    stow_pool_stats(c->pool, &c->stats);
    out->peak_reserved_bytes = c->stats.reserved_bytes[STOW_POOL_ALL].peak;
    out->backend_calls = c->stats.num_backend_calls;
    out->has_backend_calls = true;
    out->fragmentation_at_peak = c->stats.waste_at_peak.fragmentation;
    out->stats = &c->stats;
    out->has_map_calls = true;
    out->map_calls = c->stats.num_map_calls;
    out->unmap_calls = c->stats.num_unmap_calls;
    stow_sim_counters_t sc;
    stow_sim_counters(c->sim, &sc);
    out->has_modelled_time = true;
    out->modelled_backend_ns = sc.modelled_ns;
}

const stow_replay_policy_t stow__replay_policy_classic = {
    "classic", "the Stowage caching pool on the simulated device", true,
    classic_create, classic_alloc, classic_free, NULL, classic_report, classic_destroy, false,
    classic_step, false,
};

const stow_replay_policy_t stow__replay_policy_vmm = {
    "vmm", "Stowage with page-mapped segments (physical memory only under live data)", true,
    vmm_create, classic_alloc, classic_free, NULL, classic_report, classic_destroy, false,
    classic_step, false,
};

/* classic and vmm with planned_steps:true (docs/planned.md): in `--policy
 * all`, rows for traces with step markers. */
const stow_replay_policy_t stow__replay_policy_classic_planned = {
    "classic-planned", "classic with planned_steps:true (the trace's step markers planned)", true,
    classic_planned_create, classic_alloc, classic_free, NULL, classic_report, classic_destroy,
    false, classic_step, true,
};

const stow_replay_policy_t stow__replay_policy_vmm_planned = {
    "vmm-planned", "vmm with planned_steps:true (the trace's step markers planned)", true,
    vmm_planned_create, classic_alloc, classic_free, NULL, classic_report, classic_destroy,
    false, classic_step, true,
};

/* ---- pytorch, pytorch-expandable ---- */

/* The model, and the driver time of the calls it reports, priced by a simulated
 * device's cost model (stowage/sim.h), the one classic and vmm are priced by:
 * the two page-mapped allocators compare in one run. */
typedef struct ptm_adapter {
    stow_ptm_t *model;
    stow_backend_t *prices; /* a simulated device used for its cost model only */
    uint64_t modelled_ns;
} ptm_adapter_t;

stow_ptm_t *stow__replay_ptm_model(void *ctx) { return ((ptm_adapter_t *)ctx)->model; }

static void ptm_price_call(void *arg, stow_ptm_driver_call_t call, size_t size_bytes)
{
    static const stow_sim_call_t as_sim[] = {
        [STOW_PTM_CUDA_MALLOC] = STOW_SIM_RESERVE,
        [STOW_PTM_CUDA_FREE] = STOW_SIM_RELEASE,
        [STOW_PTM_ADDRESS_RESERVE] = STOW_SIM_VA_RESERVE,
        [STOW_PTM_ADDRESS_FREE] = STOW_SIM_VA_RELEASE,
        [STOW_PTM_MEM_CREATE] = STOW_SIM_PHYS_CREATE,
        [STOW_PTM_MEM_MAP] = STOW_SIM_MAP,
        [STOW_PTM_MEM_UNMAP] = STOW_SIM_UNMAP,
        [STOW_PTM_MEM_RELEASE] = STOW_SIM_PHYS_RELEASE,
        [STOW_PTM_STREAM_SYNCHRONIZE] = STOW_SIM_SYNCHRONIZE,
    };
    ptm_adapter_t *a = arg;
    a->modelled_ns += stow_sim_call_cost(a->prices, as_sim[call], size_bytes);
}

static void ptm_destroy(void *ctx)
{
    ptm_adapter_t *a = ctx;
    if (!a)
        return;
    stow__ptm_destroy(a->model);
    stow_sim_destroy(a->prices);
    free(a);
}

static stow_status_t ptm_create_mode(const stow_replay_setup_t *setup, bool expandable,
                                     void **out)
{
    const stow_config_t *c = setup->config;
    ptm_adapter_t *a = calloc(1, sizeof *a);
    if (!a)
        return STOW_EHOSTMEM;
    stow_status_t st = stow_sim_create(NULL, &a->prices);
    if (st != STOW_OK) {
        free(a);
        return st;
    }
    stow_ptm_config_t mc;
    stow__ptm_config_default(&mc);
    mc.capacity_bytes = setup->capacity_bytes;
    mc.expandable = expandable;
    mc.max_split_size_bytes = c->max_split_size_bytes;
    mc.max_non_split_rounding_bytes = c->max_non_split_rounding_bytes;
    for (unsigned i = 0; i < STOW_PTM_ROUNDUP_INTERVALS && i < STOW_ROUNDUP_INTERVALS; i++)
        mc.roundup_power2_divisions[i] = c->roundup_power2_divisions[i];
    mc.garbage_collection_threshold = c->garbage_collection_threshold;
    /* PyTorch's GC acts only under a memory fraction; 1 means "not set". */
    mc.memory_fraction = c->memory_fraction < 1.0 ? c->memory_fraction : 0.0;
    mc.on_driver_call = ptm_price_call;
    mc.on_driver_call_arg = a;
    st = stow__ptm_create(&mc, &a->model);
    if (st != STOW_OK) {
        ptm_destroy(a);
        return st;
    }
    *out = a;
    return STOW_OK;
}

static stow_status_t ptm_create_native(const stow_replay_setup_t *setup, void **out)
{
    return ptm_create_mode(setup, false, out);
}

static stow_status_t ptm_create_expandable(const stow_replay_setup_t *setup, void **out)
{
    return ptm_create_mode(setup, true, out);
}

static stow_status_t ptm_alloc(void *ctx, uint64_t size_bytes, uint32_t stream, uint64_t *handle)
{
    ptm_adapter_t *a = ctx;
    return stow__ptm_alloc(a->model, (size_t)size_bytes, stream, handle);
}

static void ptm_free(void *ctx, uint64_t handle, uint64_t size_bytes)
{
    (void)size_bytes;
    ptm_adapter_t *a = ctx;
    (void)stow__ptm_free(a->model, handle);
}

static void ptm_report(void *ctx, stow_replay_report_t *out)
{
    ptm_adapter_t *a = ctx;
    stow_ptm_stats_t s;
    stow__ptm_stats(a->model, &s);
    out->peak_reserved_bytes = s.reserved_bytes_peak;
    /* num_device_alloc + num_device_free: cudaMalloc/cudaFree, or map/unmap. */
    out->backend_calls = s.device_alloc_calls + s.device_free_calls;
    out->has_backend_calls = true;
    out->fragmentation_at_peak = -1.0; /* not tracked by the model */
    /* Expandable segments call cuMemMap and cuMemUnmap once per page, as the
     * vmm policy calls them once per physical handle: pages count as calls. */
    out->has_map_calls = true;
    out->map_calls = s.pages_created;
    out->unmap_calls = s.pages_released;
    out->has_modelled_time = true;
    out->modelled_backend_ns = a->modelled_ns;
}

const stow_replay_policy_t stow__replay_policy_pytorch = {
    "pytorch", "model of PyTorch's CUDACachingAllocator (native segments)", true,
    ptm_create_native, ptm_alloc, ptm_free, NULL, ptm_report, ptm_destroy, false, NULL, false,
};

const stow_replay_policy_t stow__replay_policy_pytorch_expandable = {
    "pytorch-expandable", "the same model with expandable_segments:True", true,
    ptm_create_expandable, ptm_alloc, ptm_free, NULL, ptm_report, ptm_destroy, false, NULL, false,
};
