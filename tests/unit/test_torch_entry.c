/*
 * tests/unit/test_torch_entry.c: the PyTorch entry points (stowage/torch.h) on
 * the simulated device (STOWAGE_BACKEND=sim, set before the first call; each
 * Criterion test runs in its own process, so every test starts with no pool).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stowage/cuda.h"
#include "stowage/torch.h"
#include "test_support.h"

#define MiB ((size_t)1 << 20)
#define S1 ((stow_stream_t)(uintptr_t)0x1000)
#define S2 ((stow_stream_t)(uintptr_t)0x2000)

static stow_stats_t stats_of(int device)
{
    stow_stats_t st;
    memset(&st, 0, sizeof st);
    stow_pool_t *pool = stow_torch_pool(device);
    cr_assert_not_null(pool);
    cr_assert_eq(stow_pool_stats(pool, &st), STOW_OK);
    return st;
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

/* Returns how many lines of the captured text contain `needle`. */
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

TestSuite(torch_entry, .fini = teardown);

Test(torch_entry, malloc_free_roundtrip)
{
    ts_torch_use_sim(NULL);
    cr_assert_str_eq(stow_torch_backend_name(), "sim");
    cr_assert_null(stow_torch_pool(0), "no pool before the first allocation");
    void *p = stow_torch_malloc(1000, 0, S1);
    cr_assert_not_null(p);
    cr_assert_eq((uintptr_t)p % 512, 0);
    void *q = stow_torch_malloc(3 * (ssize_t)MiB, 0, S1);
    cr_assert_not_null(q);
    cr_assert_neq(p, q);
    stow_stats_t st = stats_of(0);
    cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 2);
    cr_assert_eq(st.requested_bytes[STOW_POOL_ALL].current, 1000 + 3 * MiB);
    stow_torch_free(p, 1000, 0, S1);
    stow_torch_free(q, 3 * (ssize_t)MiB, 0, S1);
    st = stats_of(0);
    cr_assert_eq(st.allocated_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_gt(st.reserved_bytes[STOW_POOL_ALL].current, 0, "freed blocks stay cached");
    char why[128];
    cr_assert_eq(stow_pool_check(stow_torch_pool(0), why, sizeof why), STOW_OK, "%s", why);
}

Test(torch_entry, size_zero_and_negative_return_null_without_a_pool)
{
    ts_torch_use_sim(NULL);
    capture_begin();
    cr_assert_null(stow_torch_malloc(0, 0, NULL));
    cr_assert_null(stow_torch_malloc(-5, 0, NULL));
    stow_torch_free(NULL, 0, 0, NULL); /* what PyTorch does with the null pointer */
    cr_assert_eq(capture_end("stowage"), 0, "nothing is logged for empty tensors");
    cr_assert_null(stow_torch_pool(0));
}

Test(torch_entry, one_pool_per_device)
{
    ts_torch_use_sim(NULL);
    void *a = stow_torch_malloc(4096, 0, NULL);
    void *b = stow_torch_malloc(4096, 3, NULL);
    cr_assert(a && b);
    cr_assert_not_null(stow_torch_pool(0));
    cr_assert_not_null(stow_torch_pool(3));
    cr_assert_null(stow_torch_pool(1));
    cr_assert_neq(stow_torch_pool(0), stow_torch_pool(3));
    cr_assert_eq(stats_of(3).allocation[STOW_POOL_ALL].current, 1);
    stow_torch_free(a, 4096, 0, NULL);
    stow_torch_free(b, 4096, 3, NULL);
    cr_assert_eq(stats_of(0).allocation[STOW_POOL_ALL].current, 0);
    cr_assert_eq(stats_of(3).allocation[STOW_POOL_ALL].current, 0);
}

Test(torch_entry, bad_device_returns_null_and_logs_once)
{
    ts_torch_use_sim(NULL);
    capture_begin();
    cr_assert_null(stow_torch_malloc(4096, -1, NULL));
    cr_assert_null(stow_torch_malloc(4096, STOW_TORCH_MAX_DEVICES, NULL));
    stow_torch_free((void *)(uintptr_t)0x1234, 1, 999, NULL);
    cr_assert_eq(capture_end("out of range"), 1);
    cr_assert_null(stow_torch_pool(-1));
}

Test(torch_entry, foreign_free_does_not_crash_and_logs_once)
{
    ts_torch_use_sim(NULL);
    int host = 0;
    capture_begin();
    stow_torch_free(&host, 4, 0, NULL); /* device 0 has no pool yet */
    void *p = stow_torch_malloc(4096, 0, NULL);
    cr_assert_not_null(p);
    stow_torch_free(&host, 4, 0, NULL);
    stow_torch_free((char *)p + 512, 4, 0, NULL); /* interior pointer */
    stow_torch_free(p, 4096, 0, NULL);
    stow_torch_free(p, 4096, 0, NULL); /* double free */
    cr_assert_eq(capture_end("not allocated by Stowage"), 1);
    stow_stats_t st = stats_of(0);
    cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 0);
    cr_assert_eq(st.num_invalid_frees, 3);
}

Test(torch_entry, record_stream_paths)
{
    ts_torch_use_sim(NULL);
    int host = 0;
    capture_begin();
    stow_torch_record_stream(&host, S2); /* no pool at all */
    stow_torch_record_stream(NULL, S2);
    void *p = stow_torch_malloc(8 * (ssize_t)MiB, 0, S1);
    void *q = stow_torch_malloc(4096, 1, S1);
    cr_assert(p && q);
    stow_torch_record_stream(p, S2);
    stow_torch_record_stream(p, S1); /* the allocation stream: a no-op */
    stow_torch_record_stream(q, S2); /* found in device 1's pool */
    stow_torch_record_stream(&host, S2);
    cr_assert_eq(capture_end("record_stream"), 1, "only the foreign pointer is logged, once");
    stow_torch_free(p, 8 * (ssize_t)MiB, 0, S1);
    stow_torch_free(q, 4096, 1, S1);
    stow_stats_t st = stats_of(0);
    cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 0);
    cr_assert_geq(st.num_event_records, 1, "the free recorded an event on the used stream");
    cr_assert_eq(stats_of(1).allocation[STOW_POOL_ALL].current, 0);
}

Test(torch_entry, empty_cache_releases_every_pool)
{
    ts_torch_use_sim(NULL);
    void *a = stow_torch_malloc(30 * (ssize_t)MiB, 0, NULL);
    void *b = stow_torch_malloc(30 * (ssize_t)MiB, 2, NULL);
    void *keep = stow_torch_malloc(4096, 0, NULL);
    cr_assert(a && b && keep);
    stow_torch_free(a, 0, 0, NULL);
    stow_torch_free(b, 0, 2, NULL);
    cr_assert_gt(stats_of(2).reserved_bytes[STOW_POOL_ALL].current, 0);
    stow_torch_empty_cache();
    cr_assert_eq(stats_of(2).reserved_bytes[STOW_POOL_ALL].current, 0);
    stow_stats_t st = stats_of(0);
    cr_assert_eq(st.reserved_bytes[STOW_POOL_ALL].current, 2 * MiB, "the live block's segment stays");
    cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 1);
    stow_torch_free(keep, 4096, 0, NULL);
    stow_torch_empty_cache();
    cr_assert_eq(stats_of(0).reserved_bytes[STOW_POOL_ALL].current, 0);
}

Test(torch_entry, empty_cache_without_pools_is_a_no_op)
{
    ts_torch_use_sim(NULL);
    stow_torch_empty_cache();
    cr_assert_null(stow_torch_pool(0));
}

Test(torch_entry, memory_fraction_before_first_use_limits_the_pool)
{
    ts_torch_use_sim("64M");
    stow_torch_memory_fraction(0.5, 0);
    cr_assert_null(stow_torch_pool(0), "the fraction alone creates no pool");
    capture_begin();
    cr_assert_null(stow_torch_malloc(40 * (ssize_t)MiB, 0, NULL), "40 MiB > 50%% of 64 MiB");
    cr_assert_eq(capture_end("out of memory"), 1);
    stow_stats_t st = stats_of(0);
    cr_assert_eq(st.limit_bytes, 32 * MiB);
    cr_assert_eq(st.capacity_bytes, 64 * MiB);
    void *p = stow_torch_malloc(20 * (ssize_t)MiB, 0, NULL);
    cr_assert_not_null(p);
    stow_torch_free(p, 0, 0, NULL);
}

Test(torch_entry, memory_fraction_overrides_stowage_conf)
{
    ts_torch_use_sim("100M");
    setenv("STOWAGE_CONF", "per_process_memory_fraction:0.9", 1);
    stow_torch_memory_fraction(0.25, 0);
    char why[256];
    cr_assert_eq(stow_torch_pool_init(0, why, sizeof why), STOW_OK, "%s", why);
    stow_config_t cfg;
    stow_pool_config(stow_torch_pool(0), &cfg);
    cr_assert_float_eq(cfg.memory_fraction, 0.25, 1e-12);
}

Test(torch_entry, memory_fraction_after_creation_and_out_of_range)
{
    ts_torch_use_sim("64M");
    void *p = stow_torch_malloc(4096, 0, NULL);
    cr_assert_not_null(p);
    capture_begin();
    stow_torch_memory_fraction(0.0, 0);
    stow_torch_memory_fraction(1.5, 0);
    stow_torch_memory_fraction(0.5, -1);
    int bad = capture_end("out of range");
    cr_assert_eq(bad, 3);
    capture_begin();
    stow_torch_memory_fraction(0.5, 0);
    stow_torch_memory_fraction(0.4, 0);
    int logged = capture_end("set_per_process_memory_fraction");
    /* Without stow_pool_set_memory_fraction the change is reported once; with
     * it, it applies silently. Either way nothing crashes and p stays valid. */
    cr_assert_leq(logged, 1);
    stow_torch_free(p, 4096, 0, NULL);
    cr_assert_eq(stats_of(0).allocation[STOW_POOL_ALL].current, 0);
}

Test(torch_entry, oom_returns_null_and_logs_once)
{
    ts_torch_use_sim("16M");
    void *small = stow_torch_malloc(1 * (ssize_t)MiB, 0, NULL);
    cr_assert_not_null(small);
    capture_begin();
    cr_assert_null(stow_torch_malloc(100 * (ssize_t)MiB, 0, NULL));
    cr_assert_null(stow_torch_malloc(200 * (ssize_t)MiB, 0, NULL));
    cr_assert_eq(capture_end("out of memory"), 1);
    char msg[1024];
    size_t n = stow_torch_last_error(0, msg, sizeof msg);
    cr_assert_gt(n, 0);
    cr_assert_not_null(strstr(msg, "200.00 MiB"), "the last OOM is kept: %s", msg);
    stow_stats_t st = stats_of(0);
    cr_assert_eq(st.num_ooms, 2);
    cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 1);
    void *again = stow_torch_malloc(4 * (ssize_t)MiB, 0, NULL);
    cr_assert_not_null(again, "the pool still serves what fits");
    stow_torch_free(again, 0, 0, NULL);
    stow_torch_free(small, 0, 0, NULL);
}

Test(torch_entry, alloc_returns_the_status_and_logs_nothing)
{
    ts_torch_use_sim("16M");
    void *p = NULL;
    cr_assert_eq(stow_torch_alloc(1000, 0, S1, &p), STOW_OK);
    cr_assert_not_null(p);
    void *untouched = (void *)0x1;
    cr_assert_eq(stow_torch_alloc(0, 0, S1, &untouched), STOW_EINVAL);
    cr_assert_eq(stow_torch_alloc(64, -1, S1, &untouched), STOW_EINVAL);
    cr_assert_eq(stow_torch_alloc(64, STOW_TORCH_MAX_DEVICES, S1, &untouched), STOW_EINVAL);
    cr_assert_eq(stow_torch_alloc(64, 0, S1, NULL), STOW_EINVAL);
    capture_begin();
    cr_assert_eq(stow_torch_alloc(100 * MiB, 0, S1, &untouched), STOW_ENOMEM);
    cr_assert_eq(capture_end("stowage"), 0, "the caller raises its own error");
    cr_assert_eq(untouched, (void *)0x1, "*out is untouched on error");
    char msg[1024];
    cr_assert_gt(stow_torch_last_error(0, msg, sizeof msg), 0);
    cr_assert_not_null(strstr(msg, "out of memory"), "%s", msg);
    cr_assert_eq(stats_of(0).num_ooms, 1);
    stow_torch_free(p, 1000, 0, S1);
}

Test(torch_entry, stowage_conf_is_applied)
{
    ts_torch_use_sim(NULL);
    setenv("STOWAGE_CONF", "max_split_size_mb:64,garbage_collection_threshold:0.5", 1);
    cr_assert_not_null(stow_torch_malloc(4096, 0, NULL));
    stow_config_t cfg;
    stow_pool_config(stow_torch_pool(0), &cfg);
    cr_assert_eq(cfg.max_split_size_bytes, 64 * MiB);
    cr_assert_float_eq(cfg.garbage_collection_threshold, 0.5, 1e-12);
}

Test(torch_entry, bad_stowage_conf_falls_back_to_defaults)
{
    ts_torch_use_sim(NULL);
    setenv("STOWAGE_CONF", "no_such_key:1", 1);
    capture_begin();
    cr_assert_not_null(stow_torch_malloc(4096, 0, NULL));
    cr_assert_eq(capture_end("STOWAGE_CONF"), 1);
    stow_config_t cfg, def;
    stow_pool_config(stow_torch_pool(0), &cfg);
    stow_config_default(&def);
    cr_assert_eq(cfg.max_split_size_bytes, def.max_split_size_bytes);
}

Test(torch_entry, stats_json_and_summary_without_a_pool)
{
    ts_torch_use_sim(NULL);
    size_t n = stow_torch_stats_json(0, NULL, 0);
    cr_assert_gt(n, 100);
    char *buf = malloc(n + 1);
    cr_assert_eq(stow_torch_stats_json(0, buf, n + 1), n);
    cr_assert_not_null(strstr(buf, "\"allocated_bytes.all.current\": 0"), "%.200s", buf);
    free(buf);
    char line[256];
    stow_torch_summary(0, line, sizeof line);
    cr_assert_not_null(strstr(line, "no pool"));
    stow_torch_reset_peak(0);        /* no-ops */
    stow_torch_reset_accumulated(0);
    cr_assert_null(stow_torch_pool(0));
}

Test(torch_entry, stats_json_and_reset_peak_with_a_pool)
{
    ts_torch_use_sim(NULL);
    void *p = stow_torch_malloc(10 * (ssize_t)MiB, 0, NULL);
    stow_torch_free(p, 0, 0, NULL);
    cr_assert_eq(stats_of(0).allocated_bytes[STOW_POOL_ALL].peak, 10 * MiB);
    stow_torch_reset_peak(0);
    cr_assert_eq(stats_of(0).allocated_bytes[STOW_POOL_ALL].peak, 0);
    char buf[1 << 16];
    cr_assert_lt(stow_torch_stats_json(0, buf, sizeof buf), sizeof buf);
    cr_assert_not_null(strstr(buf, "\"num_ooms\""));
    size_t n = stow_torch_summary(0, buf, sizeof buf);
    cr_assert_gt(n, 0);
    stow_torch_reset_accumulated(0);
    cr_assert_eq(stats_of(0).allocated_bytes[STOW_POOL_ALL].allocated, 0);
}

Test(torch_entry, no_cuda_device_is_reported_once)
{
    /* Without STOWAGE_BACKEND the CUDA backend is used: on a machine without a
     * GPU, pool creation fails with the driver's reason. */
    unsetenv("STOWAGE_BACKEND");
    char why[512];
    char probe[256];
    if (stow_cuda_probe(probe, sizeof probe) == STOW_CUDA_PROBE_OK)
        cr_skip_test("a CUDA device is present: the no-device path cannot be tested");
    capture_begin();
    cr_assert_null(stow_torch_malloc(4096, 0, NULL));
    cr_assert_null(stow_torch_malloc(4096, 0, NULL));
    cr_assert_eq(capture_end("cannot create the pool"), 1);
    cr_assert_eq(stow_torch_pool_init(0, why, sizeof why), STOW_ENODEV);
    cr_assert_gt(strlen(why), 0);
    cr_assert_str_eq(stow_torch_backend_name(), "cuda");
}

#define THREADS 8
#define ROUNDS 200

static void *worker(void *arg)
{
    stow_stream_t stream = (stow_stream_t)(uintptr_t)(0x100 * ((uintptr_t)arg + 1));
    void *live[16] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int k = i % 16;
        if (live[k])
            stow_torch_free(live[k], 0, 0, stream);
        live[k] = stow_torch_malloc((ssize_t)(512 + (size_t)(i * 7919) % (3 * MiB)), 0, stream);
        if (!live[k])
            return (void *)1;
        if (i % 5 == 0)
            stow_torch_record_stream(live[k], S2);
        if (i % 50 == 0)
            stow_torch_empty_cache();
    }
    for (int k = 0; k < 16; k++)
        stow_torch_free(live[k], 0, 0, stream);
    return NULL;
}

Test(torch_entry, concurrent_first_use_creates_one_pool)
{
    ts_torch_use_sim(NULL);
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, worker, (void *)i), 0);
    for (int i = 0; i < THREADS; i++) {
        void *ret = NULL;
        pthread_join(t[i], &ret);
        cr_assert_null(ret, "thread %d failed to allocate", i);
    }
    stow_stats_t st = stats_of(0);
    cr_assert_eq(st.allocation[STOW_POOL_ALL].current, 0);
    cr_assert_eq(st.allocation[STOW_POOL_ALL].allocated, THREADS * ROUNDS);
    cr_assert_eq(st.num_invalid_frees, 0, "every pointer went back to the pool that made it");
    char why[256];
    cr_assert_eq(stow_pool_check(stow_torch_pool(0), why, sizeof why), STOW_OK, "%s", why);
}

Test(torch_entry, shutdown_forgets_everything)
{
    ts_torch_use_sim("64M");
    stow_torch_memory_fraction(0.25, 0);
    void *p = stow_torch_malloc(4096, 0, NULL);
    cr_assert_not_null(p);
    stow_torch_shutdown(); /* drops p */
    cr_assert_null(stow_torch_pool(0));
    cr_assert_not_null(stow_torch_malloc(40 * (ssize_t)MiB, 0, NULL), "fraction forgotten");
    cr_assert_eq(stats_of(0).limit_bytes, 64 * MiB);
}
