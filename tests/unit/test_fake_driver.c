/*
 * tests/unit/test_fake_driver.c: the emulated CUDA driver
 * (tests/support/fake_cuda.c) checked on its own.
 *
 * The CUDA tests trust it to refuse and count every call that breaks a rule
 * of the driver API ("zero violations" is their pass criterion), so each rule
 * it claims to check is broken here once, on purpose: the call must return the
 * driver's error, count exactly one violation, and change nothing. A correct
 * sequence of the same calls must count none and leave nothing behind.
 *
 * The library is opened by path (STOW_FAKE_CUDA_LIB, set by CMake), not
 * through LD_LIBRARY_PATH, and configured by environment before its first
 * call; Criterion runs every test in a fresh process, so each gets a fresh
 * driver.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"
#include "fake_cuda.h"

#define GRAN ((size_t)2 << 20)

/* The entry points, resolved once per test process. */
static struct {
    void *lib;
    CUresult (*init)(unsigned);
    CUresult (*retain)(void **, int);
    CUresult (*release_ctx)(int);
    CUresult (*set_current)(void *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*htod_async)(CUdeviceptr, const void *, size_t, void *);
    CUresult (*stream_create)(void **, unsigned);
    CUresult (*stream_destroy)(void *);
    CUresult (*stream_query)(void *);
    CUresult (*ctx_synchronize)(void);
    CUresult (*event_create)(void **, unsigned);
    CUresult (*event_record)(void *, void *);
    CUresult (*event_query)(void *);
    CUresult (*event_destroy)(void *);
    fake_cuda_counters_fn counters;
    fake_cuda_fail_nth_fn fail_nth;
} D;

static void *sym(const char *name)
{
    void *p = dlsym(D.lib, name);
    cr_assert(p, "the emulated driver lacks %s", name);
    return p;
}

/* Opens the driver with a 64 MiB device (quiet: the violations are wanted). */
static void open_driver(void)
{
    setenv("FAKE_CUDA_QUIET", "1", 1);
    setenv("FAKE_CUDA_TOTAL_MB", "64", 1);
    setenv("FAKE_CUDA_DEVICES", "1", 1);
    setenv("FAKE_CUDA_LAG", "3", 1);
    D.lib = dlopen(STOW_FAKE_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
    cr_assert(D.lib, "dlopen %s: %s", STOW_FAKE_CUDA_LIB, dlerror());
    *(void **)&D.init = sym("cuInit");
    *(void **)&D.retain = sym("cuDevicePrimaryCtxRetain");
    *(void **)&D.release_ctx = sym("cuDevicePrimaryCtxRelease_v2");
    *(void **)&D.set_current = sym("cuCtxSetCurrent");
    *(void **)&D.mem_alloc = sym("cuMemAlloc_v2");
    *(void **)&D.mem_free = sym("cuMemFree_v2");
    *(void **)&D.reserve = sym("cuMemAddressReserve");
    *(void **)&D.address_free = sym("cuMemAddressFree");
    *(void **)&D.create = sym("cuMemCreate");
    *(void **)&D.release = sym("cuMemRelease");
    *(void **)&D.map = sym("cuMemMap");
    *(void **)&D.unmap = sym("cuMemUnmap");
    *(void **)&D.set_access = sym("cuMemSetAccess");
    *(void **)&D.htod = sym("cuMemcpyHtoD_v2");
    *(void **)&D.dtoh = sym("cuMemcpyDtoH_v2");
    *(void **)&D.htod_async = sym("cuMemcpyHtoDAsync_v2");
    *(void **)&D.stream_create = sym("cuStreamCreate");
    *(void **)&D.stream_destroy = sym("cuStreamDestroy_v2");
    *(void **)&D.stream_query = sym("cuStreamQuery");
    *(void **)&D.ctx_synchronize = sym("cuCtxSynchronize");
    *(void **)&D.event_create = sym("cuEventCreate");
    *(void **)&D.event_record = sym("cuEventRecord");
    *(void **)&D.event_query = sym("cuEventQuery");
    *(void **)&D.event_destroy = sym("cuEventDestroy_v2");
    *(void **)&D.counters = sym("fake_cuda_counters");
    *(void **)&D.fail_nth = sym("fake_cuda_fail_nth");
}

static fake_cuda_counters_t counters(void)
{
    fake_cuda_counters_t c;
    D.counters(&c);
    return c;
}

/* cuInit, then device 0's primary context retained and made current. */
static void *start(void)
{
    void *ctx = NULL;
    cr_assert_eq(D.init(0), CUDA_SUCCESS);
    cr_assert_eq(D.retain(&ctx, 0), CUDA_SUCCESS);
    cr_assert_eq(D.set_current(ctx), CUDA_SUCCESS);
    return ctx;
}

static const CUmemAllocationProp device_prop = {.type = 1, .location = {1, 0}};
static const CUmemAccessDesc read_write = {.location = {1, 0}, .flags = 3};

/* A reservation of `granules` with one handle of `mapped` granules mapped at
 * its start, readable and writable. */
typedef struct mapped_range {
    CUdeviceptr base;
    size_t size;
    CUmemGenericAllocationHandle handle;
    size_t mapped;
} mapped_range_t;

static mapped_range_t map_range(size_t granules, size_t mapped)
{
    mapped_range_t r = {0, granules * GRAN, 0, mapped * GRAN};
    cr_assert_eq(D.reserve(&r.base, r.size, 0, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(D.create(&r.handle, r.mapped, &device_prop, 0), CUDA_SUCCESS);
    cr_assert_eq(D.map(r.base, r.mapped, 0, r.handle, 0), CUDA_SUCCESS);
    cr_assert_eq(D.set_access(r.base, r.mapped, &read_write, 1), CUDA_SUCCESS);
    return r;
}

static void unmap_range(mapped_range_t r)
{
    cr_assert_eq(D.unmap(r.base, r.mapped), CUDA_SUCCESS);
    cr_assert_eq(D.release(r.handle), CUDA_SUCCESS);
    cr_assert_eq(D.address_free(r.base, r.size), CUDA_SUCCESS);
}

/* The call must have been refused with `code`, counted once, and have
 * changed none of the live-object counts. */
static void expect_refused(CUresult got, CUresult code, const fake_cuda_counters_t *before,
                           const char *what, const char *says)
{
    fake_cuda_counters_t after = counters();
    cr_expect_eq(got, code, "%s: returned %d, not %d", what, got, code);
    cr_expect_eq(after.violations, before->violations + 1, "%s: %llu violations counted", what,
                 (unsigned long long)(after.violations - before->violations));
    cr_expect(strstr(after.last_violation, says), "%s: the violation says \"%s\"", what,
              after.last_violation);
    cr_expect_eq(after.used_bytes, before->used_bytes, "%s: used bytes changed", what);
    cr_expect_eq(after.allocations, before->allocations, "%s", what);
    cr_expect_eq(after.reservations, before->reservations, "%s", what);
    cr_expect_eq(after.handles, before->handles, "%s", what);
    cr_expect_eq(after.mappings, before->mappings, "%s", what);
    cr_expect_eq(after.streams, before->streams, "%s", what);
    cr_expect_eq(after.events, before->events, "%s", what);
}

#define REFUSED(call, code, says)                                                       \
    do {                                                                                \
        fake_cuda_counters_t before_ = counters();                                      \
        expect_refused((call), (code), &before_, #call, (says));                        \
    } while (0)

TestSuite(fake_driver, .init = open_driver);

Test(fake_driver, a_correct_program_breaks_no_rule_and_leaves_nothing)
{
    (void)start();
    /* cuMemAlloc: data written reads back. */
    CUdeviceptr p = 0;
    cr_assert_eq(D.mem_alloc(&p, 1000), CUDA_SUCCESS);
    cr_expect_eq(counters().used_bytes, GRAN, "cuMemAlloc is charged in 2 MiB pages");
    const char msg[] = "stowage";
    char back[sizeof msg] = {0};
    cr_assert_eq(D.htod(p + 100, msg, sizeof msg), CUDA_SUCCESS);
    cr_assert_eq(D.dtoh(back, p + 100, sizeof msg), CUDA_SUCCESS);
    cr_expect_str_eq(back, msg);
    cr_assert_eq(D.mem_free(p), CUDA_SUCCESS);

    /* A handle mapped twice: written through one mapping, read through the other. */
    CUdeviceptr a = 0, b = 0;
    CUmemGenericAllocationHandle h = 0;
    cr_assert_eq(D.reserve(&a, 2 * GRAN, 0, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(D.reserve(&b, 2 * GRAN, 0, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(D.create(&h, GRAN, &device_prop, 0), CUDA_SUCCESS);
    cr_assert_eq(D.map(a + GRAN, GRAN, 0, h, 0), CUDA_SUCCESS);
    cr_assert_eq(D.map(b, GRAN, 0, h, 0), CUDA_SUCCESS);
    cr_assert_eq(D.set_access(a + GRAN, GRAN, &read_write, 1), CUDA_SUCCESS);
    cr_assert_eq(D.set_access(b, GRAN, &read_write, 1), CUDA_SUCCESS);
    cr_assert_eq(D.release(h), CUDA_SUCCESS); /* freed at its last unmap, as the driver does */
    cr_expect_eq(counters().handles, 1);
    memset(back, 0, sizeof back);
    cr_assert_eq(D.htod(a + GRAN + 4096, msg, sizeof msg), CUDA_SUCCESS);
    cr_assert_eq(D.dtoh(back, b + 4096, sizeof msg), CUDA_SUCCESS);
    cr_expect_str_eq(back, msg);
    cr_assert_eq(D.unmap(a + GRAN, GRAN), CUDA_SUCCESS);
    cr_assert_eq(D.unmap(b, GRAN), CUDA_SUCCESS);
    cr_expect_eq(counters().handles, 0, "the released handle goes with its last mapping");
    cr_assert_eq(D.address_free(a, 2 * GRAN), CUDA_SUCCESS);
    cr_assert_eq(D.address_free(b, 2 * GRAN), CUDA_SUCCESS);

    /* Stream order: an event recorded after queued work completes a few queries later. */
    mapped_range_t r = map_range(1, 1);
    void *s = NULL, *e = NULL;
    cr_assert_eq(D.stream_create(&s, 1), CUDA_SUCCESS);
    cr_assert_eq(D.event_create(&e, 2), CUDA_SUCCESS);
    cr_assert_eq(D.htod_async(r.base, msg, sizeof msg, s), CUDA_SUCCESS);
    cr_assert_eq(D.event_record(e, s), CUDA_SUCCESS);
    int not_ready = 0;
    CUresult q;
    while ((q = D.event_query(e)) == CUDA_ERROR_NOT_READY)
        cr_assert(++not_ready < 100, "the event never completed");
    cr_expect_eq(q, CUDA_SUCCESS);
    cr_expect_geq(not_ready, 1, "completion is not immediate");
    cr_expect_eq(D.stream_query(s), CUDA_SUCCESS);
    cr_assert_eq(D.event_destroy(e), CUDA_SUCCESS);
    cr_assert_eq(D.stream_destroy(s), CUDA_SUCCESS);
    unmap_range(r);
    cr_assert_eq(D.release_ctx(0), CUDA_SUCCESS);

    fake_cuda_counters_t c = counters();
    cr_expect_eq(c.violations, 0, "last: %s", c.last_violation);
    cr_expect_eq(c.used_bytes + c.allocations + c.reservations + c.handles + c.mappings +
                     c.streams + c.events,
                 0);
    cr_expect_eq(c.primary_retains, 0);
}

Test(fake_driver, calls_before_init_or_without_a_context_are_refused)
{
    CUdeviceptr p = 0;
    REFUSED(D.mem_alloc(&p, 4096), CUDA_ERROR_NOT_INITIALIZED, "before cuInit");
    void *ctx = NULL;
    cr_assert_eq(D.init(0), CUDA_SUCCESS);
    REFUSED(D.mem_alloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT, "no current context");
    REFUSED(D.set_current(&p), CUDA_ERROR_INVALID_CONTEXT, "not a context");
    REFUSED(D.retain(&ctx, 1), CUDA_ERROR_INVALID_DEVICE, "device 1");
    REFUSED(D.release_ctx(0), CUDA_ERROR_INVALID_CONTEXT, "more often than retained");
    cr_assert_eq(D.retain(&ctx, 0), CUDA_SUCCESS);
    cr_assert_eq(D.set_current(ctx), CUDA_SUCCESS);
    cr_assert_eq(D.release_ctx(0), CUDA_SUCCESS);
    REFUSED(D.mem_alloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT, "released primary context");
    REFUSED(D.set_current(ctx), CUDA_ERROR_INVALID_CONTEXT, "not retained");
}

Test(fake_driver, cuMemFree_takes_only_the_bases_cuMemAlloc_returned)
{
    (void)start();
    CUdeviceptr p = 0;
    cr_assert_eq(D.mem_alloc(&p, 3 * GRAN), CUDA_SUCCESS);
    REFUSED(D.mem_free(p + 512), CUDA_ERROR_INVALID_VALUE, "not a cuMemAlloc base");
    cr_assert_eq(D.mem_free(p), CUDA_SUCCESS);
    REFUSED(D.mem_free(p), CUDA_ERROR_INVALID_VALUE, "not a cuMemAlloc base");
    REFUSED(D.mem_alloc(&p, 0), CUDA_ERROR_INVALID_VALUE, "0 bytes");
}

Test(fake_driver, copies_reach_only_allocated_or_accessible_memory)
{
    (void)start();
    const char byte = 7;
    CUdeviceptr p = 0;
    cr_assert_eq(D.mem_alloc(&p, 4096), CUDA_SUCCESS);
    REFUSED(D.htod(p + 4000, &byte, 200), CUDA_ERROR_INVALID_VALUE, "not allocated");
    cr_assert_eq(D.mem_free(p), CUDA_SUCCESS);
    REFUSED(D.htod(p, &byte, 1), CUDA_ERROR_INVALID_VALUE, "not allocated");

    CUdeviceptr base = 0;
    CUmemGenericAllocationHandle h = 0;
    cr_assert_eq(D.reserve(&base, 2 * GRAN, 0, 0, 0), CUDA_SUCCESS);
    REFUSED(D.htod(base, &byte, 1), CUDA_ERROR_INVALID_VALUE, "not mapped with access");
    cr_assert_eq(D.create(&h, GRAN, &device_prop, 0), CUDA_SUCCESS);
    cr_assert_eq(D.map(base, GRAN, 0, h, 0), CUDA_SUCCESS);
    REFUSED(D.htod(base, &byte, 1), CUDA_ERROR_INVALID_VALUE, "not mapped with access");
    const CUmemAccessDesc read_only = {.location = {1, 0}, .flags = 1};
    cr_assert_eq(D.set_access(base, GRAN, &read_only, 1), CUDA_SUCCESS);
    REFUSED(D.htod(base, &byte, 1), CUDA_ERROR_INVALID_VALUE, "not mapped with access");
    cr_assert_eq(D.set_access(base, GRAN, &read_write, 1), CUDA_SUCCESS);
    cr_expect_eq(D.htod(base + GRAN - 1, &byte, 1), CUDA_SUCCESS);
    /* One byte past the mapped granule, into the unmapped one. */
    REFUSED(D.htod(base + GRAN - 1, &byte, 2), CUDA_ERROR_INVALID_VALUE, "not mapped with access");
    REFUSED(D.set_access(base + GRAN, GRAN, &read_write, 1), CUDA_ERROR_INVALID_VALUE,
            "not mapped");
    cr_assert_eq(D.unmap(base, GRAN), CUDA_SUCCESS);
    REFUSED(D.htod(base, &byte, 1), CUDA_ERROR_INVALID_VALUE, "not mapped with access");
    cr_assert_eq(D.release(h), CUDA_SUCCESS);
    cr_assert_eq(D.address_free(base, 2 * GRAN), CUDA_SUCCESS);
    cr_expect_eq(counters().violations, 8);
}

Test(fake_driver, mappings_are_whole_granules_never_stacked_and_unmapped_whole)
{
    (void)start();
    mapped_range_t r = map_range(4, 2); /* one mapping of granules 0-1 */
    CUmemGenericAllocationHandle h = 0;
    cr_assert_eq(D.create(&h, 2 * GRAN, &device_prop, 0), CUDA_SUCCESS);
    REFUSED(D.map(r.base + GRAN, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE, "already mapped");
    REFUSED(D.map(r.base + 2 * GRAN, GRAN, 4096, h, 0), CUDA_ERROR_INVALID_VALUE,
            "offset must be 0");
    REFUSED(D.map(r.base + 2 * GRAN, GRAN, GRAN, h, 0), CUDA_ERROR_INVALID_VALUE,
            "offset must be 0");
    REFUSED(D.map(r.base + 2 * GRAN + 4096, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE,
            "whole granules");
    REFUSED(D.map(r.base + 2 * GRAN, 3 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE,
            "whole granules");
    REFUSED(D.map(r.base + 3 * GRAN, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE,
            "not inside a reservation");
    REFUSED(D.map(r.base + 2 * GRAN, GRAN, 0, h + 8, 0), CUDA_ERROR_INVALID_VALUE, "unknown");
    REFUSED(D.unmap(r.base, GRAN), CUDA_ERROR_INVALID_VALUE, "does not cover");
    REFUSED(D.unmap(r.base + GRAN, GRAN), CUDA_ERROR_INVALID_VALUE, "does not cover");
    REFUSED(D.unmap(r.base + 2 * GRAN, GRAN), CUDA_ERROR_INVALID_VALUE, "not mapped");
    REFUSED(D.unmap(r.base, 4096), CUDA_ERROR_INVALID_VALUE, "not whole granules");
    REFUSED(D.address_free(r.base, r.size), CUDA_ERROR_INVALID_VALUE, "still mapped");
    REFUSED(D.address_free(r.base, GRAN), CUDA_ERROR_INVALID_VALUE, "reserved with");
    REFUSED(D.reserve(&r.base, GRAN + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE, "whole granules");
    REFUSED(D.create(&h, GRAN / 2, &device_prop, 0), CUDA_ERROR_INVALID_VALUE, "whole granules");
    const CUmemAllocationProp host_prop = {.type = 1, .location = {2, 0}};
    REFUSED(D.create(&h, GRAN, &host_prop, 0), CUDA_ERROR_INVALID_VALUE, "location type 2");
    cr_assert_eq(D.map(r.base + 2 * GRAN, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    cr_assert_eq(D.release(h), CUDA_SUCCESS);
    REFUSED(D.release(h), CUDA_ERROR_INVALID_VALUE, "released twice");
    REFUSED(D.map(r.base, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE, "already released");
    cr_assert_eq(D.unmap(r.base + 2 * GRAN, 2 * GRAN), CUDA_SUCCESS);
    REFUSED(D.release(h), CUDA_ERROR_INVALID_VALUE, "not a handle");
    unmap_range(r);
    fake_cuda_counters_t c = counters();
    cr_expect_eq(c.violations, 19);
    cr_expect_eq(c.used_bytes + c.reservations + c.handles + c.mappings, 0);
}

/* Unmapping is not stream-ordered: a GPU unmaps at once, under work still
 * queued, which then writes into whatever is mapped there next. The driver
 * does it too (no error to return) but counts the violation. */
Test(fake_driver, an_unmap_under_queued_work_is_done_and_counted)
{
    (void)start();
    mapped_range_t r = map_range(2, 2);
    void *s = NULL;
    cr_assert_eq(D.stream_create(&s, 1), CUDA_SUCCESS);
    const char msg[] = "stowage";
    cr_assert_eq(D.htod_async(r.base + GRAN + 8, msg, sizeof msg, s), CUDA_SUCCESS);
    fake_cuda_counters_t before = counters();
    cr_expect_eq(D.unmap(r.base, r.mapped), CUDA_SUCCESS, "as on a GPU");
    fake_cuda_counters_t after = counters();
    cr_expect_eq(after.violations, before.violations + 1);
    cr_expect(strstr(after.last_violation, "still used by queued work"), "%s",
              after.last_violation);
    cr_expect_eq(after.mappings, before.mappings - 1, "unmapped all the same");
    /* After a synchronize the same unmap is correct. */
    cr_assert_eq(D.map(r.base, r.mapped, 0, r.handle, 0), CUDA_SUCCESS);
    cr_assert_eq(D.set_access(r.base, r.mapped, &read_write, 1), CUDA_SUCCESS);
    cr_assert_eq(D.htod_async(r.base + 8, msg, sizeof msg, s), CUDA_SUCCESS);
    cr_assert_eq(D.ctx_synchronize(), CUDA_SUCCESS);
    unmap_range(r);
    cr_assert_eq(D.stream_destroy(s), CUDA_SUCCESS);
    cr_assert_eq(D.release_ctx(0), CUDA_SUCCESS);
    fake_cuda_counters_t c = counters();
    cr_expect_eq(c.violations, after.violations, "last: %s", c.last_violation);
    cr_expect_eq(c.used_bytes + c.reservations + c.handles + c.mappings + c.streams, 0);
}

Test(fake_driver, streams_and_events_are_known_by_kind)
{
    (void)start();
    void *s = NULL, *e = NULL;
    cr_assert_eq(D.stream_create(&s, 0), CUDA_SUCCESS);
    cr_assert_eq(D.event_create(&e, 0), CUDA_SUCCESS);
    /* Each handle is only what it was created as. */
    REFUSED(D.event_record(s, s), CUDA_ERROR_INVALID_HANDLE, "unknown event");
    REFUSED(D.event_record(e, e), CUDA_ERROR_INVALID_HANDLE, "unknown stream");
    REFUSED(D.stream_query(e), CUDA_ERROR_INVALID_HANDLE, "not a stream");
    REFUSED(D.event_query(s), CUDA_ERROR_INVALID_HANDLE, "not an event");
    REFUSED(D.stream_destroy(e), CUDA_ERROR_INVALID_HANDLE, "not a stream");
    REFUSED(D.event_destroy(s), CUDA_ERROR_INVALID_HANDLE, "not an event");
    /* The default stream (NULL, and the legacy / per-thread handles 1 and 2) is always there. */
    cr_expect_eq(D.event_record(e, NULL), CUDA_SUCCESS);
    cr_expect_eq(D.event_record(e, (void *)2), CUDA_SUCCESS);
    cr_assert_eq(D.event_destroy(e), CUDA_SUCCESS);
    cr_assert_eq(D.stream_destroy(s), CUDA_SUCCESS);
    REFUSED(D.event_destroy(e), CUDA_ERROR_INVALID_HANDLE, "not an event");
    REFUSED(D.stream_destroy(s), CUDA_ERROR_INVALID_HANDLE, "not a stream");
    REFUSED(D.stream_query(s), CUDA_ERROR_INVALID_HANDLE, "not a stream");
    fake_cuda_counters_t c = counters();
    cr_expect_eq(c.violations, 9);
    cr_expect_eq(c.streams + c.events, 0);
}

Test(fake_driver, the_device_runs_out_without_a_violation)
{
    (void)start(); /* 64 MiB */
    CUdeviceptr p = 0, q = 0;
    CUmemGenericAllocationHandle h = 0;
    cr_assert_eq(D.mem_alloc(&p, 40u << 20), CUDA_SUCCESS);
    cr_expect_eq(D.mem_alloc(&q, 30u << 20), CUDA_ERROR_OUT_OF_MEMORY);
    cr_expect_eq(D.create(&h, 26u << 20, &device_prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    cr_assert_eq(D.create(&h, 24u << 20, &device_prop, 0), CUDA_SUCCESS);
    fake_cuda_counters_t c = counters();
    cr_expect_eq(c.used_bytes, 64u << 20);
    cr_expect_eq(c.violations, 0);
    cr_assert_eq(D.release(h), CUDA_SUCCESS);
    cr_assert_eq(D.mem_free(p), CUDA_SUCCESS);
    cr_expect_eq(counters().used_bytes, 0);
}

Test(fake_driver, a_requested_failure_fails_that_call_alone_and_does_nothing)
{
    (void)start();
    CUmemGenericAllocationHandle h = 0;
    D.fail_nth("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY);
    cr_assert_eq(D.create(&h, GRAN, &device_prop, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h2 = 0;
    cr_expect_eq(D.create(&h2, GRAN, &device_prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    fake_cuda_counters_t c = counters();
    cr_expect_eq(c.handles, 1, "the failed call created nothing");
    cr_expect_eq(c.used_bytes, GRAN);
    cr_expect_eq(c.faults_injected, 1);
    cr_expect_eq(c.violations, 0);
    cr_expect_eq(D.create(&h2, GRAN, &device_prop, 0), CUDA_SUCCESS, "only the one call fails");
    cr_assert_eq(D.release(h), CUDA_SUCCESS);
    cr_assert_eq(D.release(h2), CUDA_SUCCESS);
}
