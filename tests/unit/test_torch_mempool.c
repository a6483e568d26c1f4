/*
 * tests/unit/test_torch_mempool.c: the MemPool route's entry points
 * (stowage/torch.h, python/csrc/torch_entry.c): slots, their exported pairs,
 * their own configurations, segments returned at once, closing.
 *
 * Suite torch_mempool runs on the simulated device (STOWAGE_BACKEND=sim, set
 * in each test: every Criterion test is its own process). Suite
 * torch_mempool_driver runs on the CUDA backend and needs the emulated driver
 * (tests/support/fake_cuda.c): ctest runs this binary a second time with it on
 * LD_LIBRARY_PATH (test_torch_mempool_fake_driver); without it, or on a real
 * GPU, that suite skips with the reason. There it also checks the data the
 * segments hold, and that the driver's bytes in use fall back at every free.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stowage/cuda.h"
#include "stowage/snapshot.h"
#include "stowage/torch.h"
#include "test_support.h"

#define MiB ((ssize_t)1 << 20)
#define S1 ((stow_stream_t)(uintptr_t)0x1000)

typedef void *(*mp_malloc_t)(ssize_t, int, stow_stream_t);
typedef void (*mp_free_t)(void *, ssize_t, int, stow_stream_t);
static const mp_malloc_t mallocs[STOW_TORCH_MAX_MEMPOOLS] = {
    stow_torch_mempool_malloc_0, stow_torch_mempool_malloc_1, stow_torch_mempool_malloc_2,
    stow_torch_mempool_malloc_3, stow_torch_mempool_malloc_4, stow_torch_mempool_malloc_5,
    stow_torch_mempool_malloc_6, stow_torch_mempool_malloc_7};
static const mp_free_t frees[STOW_TORCH_MAX_MEMPOOLS] = {
    stow_torch_mempool_free_0, stow_torch_mempool_free_1, stow_torch_mempool_free_2,
    stow_torch_mempool_free_3, stow_torch_mempool_free_4, stow_torch_mempool_free_5,
    stow_torch_mempool_free_6, stow_torch_mempool_free_7};

static int open_slot(const char *conf)
{
    int k = -1;
    char why[256];
    cr_assert_eq(stow_torch_mempool_open(conf, &k, why, sizeof why), STOW_OK, "%s", why);
    cr_assert(k >= 0 && k < STOW_TORCH_MAX_MEMPOOLS);
    return k;
}

static stow_stats_t slot_stats(int k, int device)
{
    stow_pool_t *pool = stow_torch_mempool_pool(k, device);
    cr_assert_not_null(pool, "slot %d has no pool on device %d", k, device);
    return ts_pool_stats(pool);
}

/* ---- stderr capture: count the lines Stowage logs ---- */
static int saved_stderr = -1;
static FILE *capture;

static void capture_begin(void)
{
    fflush(stderr);
    capture = tmpfile();
    cr_assert_not_null(capture);
    saved_stderr = dup(STDERR_FILENO);
    dup2(fileno(capture), STDERR_FILENO);
}

static int capture_end(const char *needle)
{
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    rewind(capture);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, capture))
        if (strstr(line, needle))
            n++;
    fclose(capture);
    return n;
}

static void teardown(void) { stow_torch_shutdown(); }

TestSuite(torch_mempool, .fini = teardown);

Test(torch_mempool, slots_open_check_their_conf_and_run_out)
{
    ts_torch_use_sim(NULL);
    int k = -7;
    char why[256] = "";
    cr_assert_eq(stow_torch_mempool_open("no_such_key:1", &k, why, sizeof why), STOW_EINVAL);
    cr_assert_eq(k, -7, "slot written on an error");
    cr_assert(strstr(why, "no_such_key"), "the reason names the key: %s", why);
    cr_assert_eq(stow_torch_mempool_open(NULL, NULL, NULL, 0), STOW_EINVAL);
    int seen[STOW_TORCH_MAX_MEMPOOLS];
    for (int i = 0; i < STOW_TORCH_MAX_MEMPOOLS; i++) {
        seen[i] = open_slot(i % 2 ? "policy:vmm" : NULL);
        for (int j = 0; j < i; j++)
            cr_assert_neq(seen[i], seen[j]);
    }
    cr_assert_eq(stow_torch_mempool_open(NULL, &k, why, sizeof why), STOW_EBUSY);
    cr_assert(strstr(why, "slots"), "%s", why);
    cr_assert_eq(stow_torch_mempool_close(seen[3]), STOW_OK);
    cr_assert_eq(stow_torch_mempool_close(seen[3]), STOW_EINVAL, "closed twice");
    cr_assert_eq(stow_torch_mempool_close(-1), STOW_EINVAL);
    cr_assert_eq(stow_torch_mempool_close(STOW_TORCH_MAX_MEMPOOLS), STOW_EINVAL);
    cr_assert_eq(open_slot(NULL), seen[3], "a closed slot is opened again");
}

/* Each exported pair serves its own slot's pool, apart from the global swap's. */
Test(torch_mempool, each_pair_serves_its_own_slot)
{
    ts_torch_use_sim(NULL);
    int k[STOW_TORCH_MAX_MEMPOOLS];
    void *p[STOW_TORCH_MAX_MEMPOOLS];
    for (int i = 0; i < STOW_TORCH_MAX_MEMPOOLS; i++)
        k[i] = open_slot(NULL);
    for (int i = 0; i < STOW_TORCH_MAX_MEMPOOLS; i++) {
        p[i] = mallocs[k[i]]((ssize_t)(i + 1) * 2 * MiB, 0, S1);
        cr_assert_not_null(p[i]);
    }
    for (int i = 0; i < STOW_TORCH_MAX_MEMPOOLS; i++) {
        stow_stats_t st = slot_stats(k[i], 0);
        cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 1, "slot %d", k[i]);
        cr_assert_eq(st.requested_bytes[STOW_POOL_ALL].current, (uint64_t)(i + 1) * 2 * MiB);
        for (int j = 0; j < i; j++)
            cr_assert_neq(stow_torch_mempool_pool(k[i], 0), stow_torch_mempool_pool(k[j], 0));
    }
    cr_assert_null(stow_torch_pool(0), "the global swap's pools are untouched");
    cr_assert_null(stow_torch_mempool_pool(k[0], 1), "no segment asked on device 1");
    for (int i = 0; i < STOW_TORCH_MAX_MEMPOOLS; i++)
        frees[k[i]](p[i], 0, 0, S1);
}

/* Every segment (classic) or mapped run (page-mapped) of the pool holds a live
 * block, and no physical memory is held unmapped: nothing idle is kept. */
static void assert_no_idle_memory(stow_pool_t *pool, int after)
{
    stow_snap_segment_t seg[64];
    stow_snap_block_t blk[256];
    stow_snap_totals_t t;
    cr_assert_eq(stow_pool_snapshot(pool, seg, 64, blk, 256, &t), STOW_OK);
    cr_assert(t.segment_count <= 64 && t.block_count <= 256);
    cr_assert_eq(t.unmapped_bytes, 0, "after free %d: unmapped memory kept", after);
    for (size_t i = 0; i < t.segment_count; i++) {
        bool live = false;
        for (uint64_t b = seg[i].first_block; b < seg[i].first_block + seg[i].block_count; b++)
            live |= blk[b].state != STOW_SNAP_INACTIVE;
        cr_assert(live, "after free %d: segment at %#llx (%llu bytes) is idle and kept", after,
                  (unsigned long long)seg[i].addr, (unsigned long long)seg[i].size_bytes);
    }
}

/* A segment PyTorch gives back goes back to the device at once, in both policies. */
static void returns_segments_at_once(const char *conf)
{
    ts_torch_use_sim(NULL);
    int k = open_slot(conf);
    void *seg[6];
    ssize_t sizes[6] = {2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 64 * MiB, 130 * MiB};
    for (int i = 0; i < 6; i++) {
        seg[i] = mallocs[k](sizes[i], 0, S1);
        cr_assert_not_null(seg[i]);
    }
    stow_stats_t st = slot_stats(k, 0);
    cr_assert_geq(st.reserved_bytes[STOW_POOL_ALL].current, (uint64_t)238 * MiB);
    for (int i = 5; i >= 0; i--) {
        frees[k](seg[i], sizes[i], 0, S1);
        st = slot_stats(k, 0);
        cr_assert_eq(st.allocation[STOW_POOL_ALL].current, (uint64_t)i);
        assert_no_idle_memory(stow_torch_mempool_pool(k, 0), i);
    }
    cr_assert_eq(st.reserved_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(st.num_idle_releases, 0, "growth released nothing (release_idle_on_grow off)");
    char why[128];
    cr_assert_eq(stow_pool_check(stow_torch_mempool_pool(k, 0), why, sizeof why), STOW_OK, "%s",
                 why);
}

Test(torch_mempool, classic_returns_segments_at_once) { returns_segments_at_once(NULL); }
Test(torch_mempool, page_mapped_returns_segments_at_once) { returns_segments_at_once("policy:vmm"); }

/* Each slot has its own configuration: a memory fraction in one slot's text
 * limits that slot alone. */
Test(torch_mempool, a_slot_has_its_own_configuration)
{
    ts_torch_use_sim("1G");
    int tight = open_slot("per_process_memory_fraction:0.25");
    int loose = open_slot(NULL);
    capture_begin();
    cr_assert_null(mallocs[tight](300 * MiB, 0, S1), "over a quarter of 1 GiB");
    cr_assert_eq(capture_end("out of memory"), 1);
    char msg[1024];
    cr_assert_gt(stow_torch_mempool_last_error(tight, 0, msg, sizeof msg), 0);
    cr_assert(strstr(msg, "out of memory"), "%s", msg);
    cr_assert_eq(slot_stats(tight, 0).num_ooms, 1);
    void *p = mallocs[loose](300 * MiB, 0, S1);
    cr_assert_not_null(p, "the other slot has the whole device");
    cr_assert_eq(stow_torch_mempool_last_error(loose, 0, msg, sizeof msg), 0);
    frees[loose](p, 0, 0, S1);
    /* STOWAGE_CONF is the configuration of a slot opened without one, when its pool is made. */
    setenv("STOWAGE_CONF", "policy:classic", 1);
    int env = open_slot(NULL);
    void *q = mallocs[env](4 * MiB, 0, S1);
    cr_assert_not_null(q);
    frees[env](q, 0, 0, S1);
    cr_assert_eq(slot_stats(env, 0).num_map_calls, 0, "classic, from STOWAGE_CONF");
    cr_assert_gt(slot_stats(loose, 0).num_map_calls, 0, "page-mapped: the default");
}

Test(torch_mempool, close_waits_for_the_last_block_then_refuses_allocations)
{
    ts_torch_use_sim(NULL);
    int k = open_slot(NULL);
    void *p = mallocs[k](2 * MiB, 0, S1);
    void *q = mallocs[k](2 * MiB, 3, S1);
    cr_assert(p && q);
    cr_assert_eq(stow_torch_mempool_close(k), STOW_EBUSY);
    frees[k](p, 0, 0, S1);
    cr_assert_eq(stow_torch_mempool_close(k), STOW_EBUSY, "device 3 still holds a segment");
    void *r = mallocs[k](2 * MiB, 0, S1);
    cr_assert_not_null(r, "a busy close changes nothing");
    frees[k](r, 0, 0, S1);
    frees[k](q, 0, 3, S1);
    cr_assert_eq(stow_torch_mempool_close(k), STOW_OK);
    cr_assert_null(stow_torch_mempool_pool(k, 0));
    capture_begin();
    cr_assert_null(mallocs[k](2 * MiB, 0, S1));
    cr_assert_null(mallocs[k](2 * MiB, 0, S1));
    cr_assert_eq(capture_end("closed"), 1, "logged once");
}

Test(torch_mempool, bad_device_size_and_foreign_pointers)
{
    ts_torch_use_sim(NULL);
    int k = open_slot(NULL);
    capture_begin();
    cr_assert_null(mallocs[k](0, 0, S1));
    cr_assert_null(mallocs[k](-1, 0, S1));
    cr_assert_null(mallocs[k](2 * MiB, -1, S1));
    cr_assert_null(mallocs[k](2 * MiB, STOW_TORCH_MAX_DEVICES, S1));
    frees[k](NULL, 0, 0, S1);
    int host;
    frees[k](&host, 4, 0, S1);
    cr_assert_eq(capture_end("out of range"), 1);
    cr_assert_null(stow_torch_mempool_pool(k, 0), "nothing made a pool");
    cr_assert_null(stow_torch_mempool_pool(-1, 0));
    cr_assert_null(stow_torch_mempool_pool(k, -1));
    cr_assert_eq(stow_torch_mempool_stats_json(-1, 0, NULL, 0) > 0, 1, "zero stats for no pool");
}

static int thread_slot;

static void *segment_churn(void *arg)
{
    uintptr_t seed = (uintptr_t)arg;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ seed;
    void *held[8] = {0};
    for (int i = 0; i < 400; i++) {
        int j = (int)(ts_xorshift(&rng) % 8);
        if (held[j]) {
            frees[thread_slot](held[j], 0, 0, S1);
            held[j] = NULL;
        } else {
            held[j] = mallocs[thread_slot]((ssize_t)(1 + ts_xorshift(&rng) % 10) * 2 * MiB, 0, S1);
            if (!held[j])
                return (void *)1;
        }
    }
    for (int j = 0; j < 8; j++)
        if (held[j])
            frees[thread_slot](held[j], 0, 0, S1);
    return NULL;
}

Test(torch_mempool, threads_share_a_slot)
{
    ts_torch_use_sim(NULL);
    thread_slot = open_slot("policy:vmm");
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, segment_churn, (void *)i), 0);
    for (int i = 0; i < 4; i++) {
        void *failed;
        pthread_join(t[i], &failed);
        cr_assert_null(failed, "thread %d saw an allocation fail", i);
    }
    stow_stats_t st = slot_stats(thread_slot, 0);
    cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 0);
    cr_assert_eq(st.reserved_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(stow_torch_mempool_close(thread_slot), STOW_OK);
}

/* ---- on the emulated CUDA driver ---- */

typedef uint64_t (*driver_count_t)(void);
typedef int (*memcpy_htod_t)(uint64_t dst, const void *src, size_t n);
typedef int (*memcpy_dtoh_t)(void *dst, uint64_t src, size_t n);

static driver_count_t used_bytes, violations;

/* A driver entry point (object -> function pointer, as POSIX allows), or NULL. */
static void driver_fn(const char *name, void *fn_out, size_t fn_size)
{
    void *sym = stow_cuda_driver_symbol(name);
    memset(fn_out, 0, fn_size);
    if (sym)
        memcpy(fn_out, &sym, sizeof sym);
}

/* Skips unless the CUDA backend runs on the emulated driver. */
static void use_emulated_driver(void)
{
    unsetenv("STOWAGE_BACKEND");
    unsetenv("STOWAGE_CONF");
    char why[256];
    if (stow_cuda_probe(why, sizeof why) != 0)
        cr_skip_test("no CUDA driver: %s", why);
    driver_fn("fake_cuda_used_bytes", &used_bytes, sizeof used_bytes);
    driver_fn("fake_cuda_violations", &violations, sizeof violations);
    if (!used_bytes || !violations)
        cr_skip_test("a real CUDA driver: these tests count the emulated driver's memory");
}

static void roundtrip(void *ptr, size_t n, unsigned seed)
{
    memcpy_htod_t htod;
    memcpy_dtoh_t dtoh;
    driver_fn("cuMemcpyHtoD_v2", &htod, sizeof htod);
    driver_fn("cuMemcpyDtoH_v2", &dtoh, sizeof dtoh);
    cr_assert(htod && dtoh);
    unsigned char out[4096], back[4096];
    for (size_t i = 0; i < n; i++)
        out[i] = (unsigned char)(i * 131 + seed);
    cr_assert_eq(htod((uintptr_t)ptr, out, n), 0);
    cr_assert_eq(dtoh(back, (uintptr_t)ptr, n), 0);
    cr_assert_eq(memcmp(out, back, n), 0, "segment at %p did not read back", ptr);
}

static void driver_segments(const char *conf)
{
    use_emulated_driver();
    int k = open_slot(conf);
    ssize_t sizes[5] = {2 * MiB, 20 * MiB, 2 * MiB, 96 * MiB, 20 * MiB};
    void *seg[5];
    for (int i = 0; i < 5; i++) {
        seg[i] = mallocs[k](sizes[i], 0, NULL);
        cr_assert_not_null(seg[i], "%s", "segment refused");
        roundtrip(seg[i], 4096, (unsigned)i);
        roundtrip((char *)seg[i] + sizes[i] - 4096, 4096, (unsigned)i + 50);
    }
    for (int i = 0; i < 5; i++) /* no two segments overlap */
        roundtrip(seg[i], 4096, (unsigned)i + 100);
    stow_stats_t st = slot_stats(k, 0);
    cr_assert_eq(st.reserved_bytes[STOW_POOL_ALL].current, used_bytes(),
                 "the slot's reserved bytes are the driver's bytes in use");
    for (int i = 0; i < 5; i++) {
        frees[k](seg[i], sizes[i], 0, NULL);
        st = slot_stats(k, 0);
        cr_assert_eq(st.reserved_bytes[STOW_POOL_ALL].current, used_bytes());
    }
    cr_assert_eq(used_bytes(), 0, "every segment went back to the driver at its free");
    /* Addresses are the driver's, unique across slots: a free through another
     * slot's pair is foreign there, and changes nothing. */
    int other = open_slot(NULL);
    void *p = mallocs[k](2 * MiB, 0, NULL);
    void *q = mallocs[other](2 * MiB, 0, NULL);
    cr_assert(p && q);
    capture_begin();
    frees[other](p, 2 * MiB, 0, NULL);
    cr_assert_eq(capture_end("not allocated by Stowage"), 1);
    cr_assert_eq(slot_stats(k, 0).allocation[STOW_POOL_ALL].current, 1);
    frees[k](p, 2 * MiB, 0, NULL);
    frees[other](q, 2 * MiB, 0, NULL);
    cr_assert_eq(stow_torch_mempool_close(other), STOW_OK);
    cr_assert_eq(used_bytes(), 0);
    cr_assert_eq(stow_torch_mempool_close(k), STOW_OK);
    cr_assert_eq(violations(), 0, "driver API violations (see stderr)");
}

TestSuite(torch_mempool_driver, .fini = teardown);

Test(torch_mempool_driver, classic_segments_hold_data_and_go_back)
{
    driver_segments(NULL);
}

Test(torch_mempool_driver, page_mapped_segments_hold_data_and_go_back)
{
    driver_segments("policy:vmm");
}

Test(torch_mempool_driver, out_of_memory_returns_null_with_the_reason)
{
    use_emulated_driver();
    int k = open_slot(NULL);
    capture_begin();
    void *p = mallocs[k](64 * 1024 * MiB, 0, NULL); /* more than the emulated device */
    cr_assert_eq(capture_end("out of memory"), 1);
    cr_assert_null(p);
    char msg[1024];
    stow_torch_mempool_last_error(k, 0, msg, sizeof msg);
    cr_assert(strstr(msg, "out of memory"), "%s", msg);
    cr_assert_eq(used_bytes(), 0);
    cr_assert_eq(violations(), 0);
}
