/*
 * python/csrc/torch_entry.c: PyTorch CUDAPluggableAllocator entry points
 * (stowage/torch.h).
 *
 * Owns the per-device pools behind the C-ABI hooks PyTorch calls, their lazy
 * creation and the once-per-device diagnostics, for both routes: the global
 * swap (one set of pools, slots[]) and the MemPool route (a set of pools per
 * open MemPool slot, mempools[], each with its own configuration and its own
 * pair of exported entry points, since PyTorch names no pool in its calls).
 * It must not add policy: every allocation decision is the pool's. The hot
 * path (malloc/free on an existing pool) is one atomic load plus the pool call.
 */
#include "stowage/torch.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage/cuda.h"
#include "stowage/record.h"
#include "stowage/snapshot.h"

#define TORCH_MSG_LEN 1024
#define STOW_LIKELY_(x) __builtin_expect(!!(x), 1)


typedef struct torch_slot {
    _Atomic(stow_pool_t *) pool; /* published after creation; Synchronization: torch_lock */
    stow_backend_t *backend;     /* Synchronization: torch_lock */
    bool backend_is_sim;
    double fraction;              /* 0 = not set; Synchronization: torch_lock */
    atomic_bool logged_create;    /* each diagnostic once per device */
    atomic_bool logged_oom;
    atomic_bool logged_error;
    atomic_bool logged_foreign;
    atomic_bool logged_fraction;
    char last_error[TORCH_MSG_LEN]; /* Synchronization: torch_lock */
} torch_slot_t;

static torch_slot_t slots[STOW_TORCH_MAX_DEVICES];
static pthread_mutex_t torch_lock = PTHREAD_MUTEX_INITIALIZER;

/* The pools behind one torch.cuda.MemPool (stow_torch_mempool_open). */
typedef struct torch_mempool {
    atomic_bool open;            /* written under torch_lock */
    char *conf;                  /* its STOWAGE_CONF text; NULL: the environment's */
    atomic_bool logged_closed;
    torch_slot_t dev[STOW_TORCH_MAX_DEVICES];
} torch_mempool_t;
static torch_mempool_t mempools[STOW_TORCH_MAX_MEMPOOLS];
static atomic_bool logged_bad_device;
static atomic_bool logged_foreign_record;

static void torch_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void torch_log(const char *fmt, ...)
{
    char line[TORCH_MSG_LEN + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "stowage: %s\n", line);
}

/* true the first time for this flag. */
static bool first_time(atomic_bool *flag) { return !atomic_exchange(flag, true); }

static torch_slot_t *slot_of(int device)
{
    if (device < 0 || device >= STOW_TORCH_MAX_DEVICES)
        return NULL;
    return &slots[device];
}

static bool env_wants_sim(void)
{
    const char *v = getenv("STOWAGE_BACKEND");
    return v && strcmp(v, "sim") == 0;
}

const char *stow_torch_backend_name(void) { return env_wants_sim() ? "sim" : "cuda"; }

/* "1073741824", "64M", "2G"... 0 when unset or malformed. */
static size_t env_size(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
    }
    if (end == v || *end != '\0' || n > (SIZE_MAX >> shift))
        return 0;
    return (size_t)n << shift;
}

static stow_status_t backend_create(torch_slot_t *s, int device, char *why, size_t why_len)
{
    if (env_wants_sim()) {
        stow_sim_config_t sc;
        stow_sim_config_default(&sc);
        sc.capacity_bytes = env_size("STOWAGE_SIM_CAPACITY");
        stow_status_t st = stow_sim_create(&sc, &s->backend);
        if (st != STOW_OK)
            snprintf(why, why_len, "simulated device: %s", stow_strerror(st));
        s->backend_is_sim = st == STOW_OK;
        return st;
    }
    s->backend_is_sim = false;
    return stow_cuda_backend_create(device, &s->backend, why, why_len);
}

static void backend_destroy(torch_slot_t *s)
{
    if (!s->backend)
        return;
    if (s->backend_is_sim)
        (void)stow_sim_destroy(s->backend);
    else
        stow_cuda_backend_destroy(s->backend);
    s->backend = NULL;
}

/* The configuration of a new pool: the MemPool's text (validated when it was
 * opened), else STOWAGE_CONF. A MemPool's pool never releases memory while it
 * grows: PyTorch asks it for segments while capturing CUDA graphs, when
 * nothing may be freed, and it holds no idle segment anyway (mempool_free). */
static void pool_config(stow_config_t *cfg, const torch_mempool_t *mp)
{
    stow_config_default(cfg);
    char err[256] = "";
    stow_status_t st = mp && mp->conf ? stow_config_parse(cfg, mp->conf, err, sizeof err)
                                      : stow_config_from_env(cfg, err, sizeof err);
    if (st != STOW_OK) {
        torch_log("STOWAGE_CONF: %s; using the defaults", err);
        stow_config_default(cfg);
    }
    if (mp)
        cfg->release_idle_on_grow = false;
}

/* Creates the device's pool. torch_lock held. */
static stow_status_t pool_create_locked(torch_slot_t *s, int device, const torch_mempool_t *mp,
                                        char *why, size_t why_len)
{
    stow_config_t cfg;
    pool_config(&cfg, mp);
    if (s->fraction > 0.0)
        cfg.memory_fraction = s->fraction;
    if (!s->backend) {
        stow_status_t st = backend_create(s, device, why, why_len);
        if (st != STOW_OK)
            return st;
    }
    stow_pool_t *pool = NULL;
    stow_status_t st = stow_pool_create(&cfg, s->backend, &pool);
    if (st != STOW_OK) {
        char detail[256] = "";
        if (!s->backend_is_sim)
            stow_cuda_last_error(s->backend, detail, sizeof detail);
        snprintf(why, why_len, "stow_pool_create: %s%s%s", stow_strerror(st),
                 detail[0] ? ": " : "", detail);
        backend_destroy(s);
        return st;
    }
    atomic_store_explicit(&s->pool, pool, memory_order_release);
    return STOW_OK;
}

/* The device's pool, created on first use; NULL (logged once) on failure. */
static stow_pool_t *pool_get(torch_slot_t *s, int device, const torch_mempool_t *mp)
{
    stow_pool_t *pool = atomic_load_explicit(&s->pool, memory_order_acquire);
    if (STOW_LIKELY_(pool != NULL))
        return pool;
    char why[TORCH_MSG_LEN] = "";
    pthread_mutex_lock(&torch_lock);
    pool = atomic_load_explicit(&s->pool, memory_order_acquire);
    stow_status_t st = STOW_OK;
    if (!pool) {
        st = pool_create_locked(s, device, mp, why, sizeof why);
        if (st == STOW_OK)
            pool = atomic_load_explicit(&s->pool, memory_order_relaxed);
        else
            snprintf(s->last_error, sizeof s->last_error, "%s", why);
    }
    pthread_mutex_unlock(&torch_lock);
    if (!pool && first_time(&s->logged_create))
        torch_log("cannot create the pool for device %d (%s backend): %s", device,
                  stow_torch_backend_name(), why);
    return pool;
}

/* ---- the PyTorch hooks ---- */

/* An allocation from s's pool into *out; a failure's explanation is kept as the
 * slot's last error, and logged (once per device and kind) when `log` is set. */
static stow_status_t slot_alloc_status(torch_slot_t *s, int device, const torch_mempool_t *mp,
                                       size_t size, stow_stream_t stream, bool log, void **out)
{
    stow_pool_t *pool = pool_get(s, device, mp);
    if (!pool)
        return env_wants_sim() || stow_cuda_probe(NULL, 0) == STOW_CUDA_PROBE_OK ? STOW_EBACKEND
                                                                                : STOW_ENODEV;
    stow_status_t st = stow_pool_alloc(pool, size, stream, out);
    if (STOW_LIKELY_(st == STOW_OK))
        return st;

    char msg[TORCH_MSG_LEN] = "";
    if (st == STOW_ENOMEM) {
        stow_pool_oom_message(pool, msg, sizeof msg);
    } else {
        char detail[256] = "";
        if (!s->backend_is_sim)
            stow_cuda_last_error(s->backend, detail, sizeof detail);
        snprintf(msg, sizeof msg, "allocating %zu bytes on device %d failed: %s%s%s", size,
                 device, stow_strerror(st), detail[0] ? ": " : "", detail);
    }
    pthread_mutex_lock(&torch_lock);
    snprintf(s->last_error, sizeof s->last_error, "%s", msg);
    pthread_mutex_unlock(&torch_lock);
    if (!log)
        return st;
    if (st == STOW_ENOMEM) {
        /* The pool's message starts with "stowage: out of memory". */
        if (first_time(&s->logged_oom))
            fprintf(stderr, "%s [device %d; later out-of-memory errors on it are not logged]\n",
                    msg, device);
    } else if (first_time(&s->logged_error)) {
        torch_log("%s", msg);
    }
    return st;
}

/* An allocation from s's pool, with the diagnostics of a failure. */
static void *slot_alloc(torch_slot_t *s, int device, const torch_mempool_t *mp, ssize_t size,
                        stow_stream_t stream)
{
    void *ptr = NULL;
    return slot_alloc_status(s, device, mp, (size_t)size, stream, true, &ptr) == STOW_OK ? ptr
                                                                                        : NULL;
}

static torch_slot_t *slot_or_log(torch_slot_t *table, int device)
{
    if (device >= 0 && device < STOW_TORCH_MAX_DEVICES)
        return &table[device];
    if (first_time(&logged_bad_device))
        torch_log("device %d is out of range (at most %d devices)", device,
                  STOW_TORCH_MAX_DEVICES);
    return NULL;
}

static _Atomic(stow_torch_site_fn) site_hook;

void stow_torch_set_site_hook(stow_torch_site_fn hook)
{
    atomic_store_explicit(&site_hook, hook, memory_order_release);
}

void *stow_torch_malloc(ssize_t size, int device, stow_stream_t stream)
{
    if (size <= 0)
        return NULL;
    torch_slot_t *s = slot_or_log(slots, device);
    if (!s)
        return NULL;
    stow_torch_site_fn hook = atomic_load_explicit(&site_hook, memory_order_acquire);
    if (STOW_LIKELY_(!hook))
        return slot_alloc(s, device, NULL, size, stream);
    /* The hook may run Python: it is called before the pool lock is taken. */
    uint32_t before = stow_record_site_current();
    if (stow_record_site_set(hook()) != STOW_OK)
        (void)stow_record_site_set(0);
    void *ptr = slot_alloc(s, device, NULL, size, stream);
    (void)stow_record_site_set(before);
    return ptr;
}

stow_status_t stow_torch_alloc(size_t size, int device, stow_stream_t stream, void **out)
{
    if (size == 0 || !out || device < 0 || device >= STOW_TORCH_MAX_DEVICES)
        return STOW_EINVAL;
    torch_slot_t *s = &slots[device];
    stow_torch_site_fn hook = atomic_load_explicit(&site_hook, memory_order_acquire);
    if (STOW_LIKELY_(!hook))
        return slot_alloc_status(s, device, NULL, size, stream, false, out);
    uint32_t before = stow_record_site_current();
    if (stow_record_site_set(hook()) != STOW_OK)
        (void)stow_record_site_set(0);
    stow_status_t st = slot_alloc_status(s, device, NULL, size, stream, false, out);
    (void)stow_record_site_set(before);
    return st;
}

/* A free into s's pool (NULL pool: never created), with the diagnostics of a
 * failure; returns the pool when the free succeeded. */
static stow_pool_t *slot_free(torch_slot_t *s, void *ptr, int device)
{
    stow_pool_t *pool = s ? atomic_load_explicit(&s->pool, memory_order_acquire) : NULL;
    stow_status_t st = pool ? stow_pool_free(pool, ptr) : STOW_ENOTOWNED;
    if (STOW_LIKELY_(st == STOW_OK))
        return pool;
    if (st == STOW_ENOTOWNED) {
        if (s ? first_time(&s->logged_foreign) : first_time(&logged_bad_device))
            torch_log("free of %p on device %d: not allocated by Stowage; ignored", ptr, device);
    } else if (s && first_time(&s->logged_error)) {
        torch_log("free of %p on device %d failed: %s", ptr, device, stow_strerror(st));
    }
    return NULL;
}

void stow_torch_free(void *ptr, ssize_t size, int device, stow_stream_t stream)
{
    (void)size;
    (void)stream;
    if (!ptr)
        return;
    (void)slot_free(slot_of(device), ptr, device);
}

void stow_torch_empty_cache(void)
{
    for (int d = 0; d < STOW_TORCH_MAX_DEVICES; d++) {
        stow_pool_t *pool = atomic_load_explicit(&slots[d].pool, memory_order_acquire);
        if (!pool)
            continue;
        stow_status_t st = stow_empty_cache(pool);
        if (st != STOW_OK && first_time(&slots[d].logged_error))
            torch_log("empty_cache on device %d failed: %s", d, stow_strerror(st));
    }
}

void stow_torch_record_stream(void *ptr, stow_stream_t stream)
{
    if (!ptr)
        return;
    /* PyTorch does not pass the device: ask each pool; at most one owns ptr. */
    for (int d = 0; d < STOW_TORCH_MAX_DEVICES; d++) {
        stow_pool_t *pool = atomic_load_explicit(&slots[d].pool, memory_order_acquire);
        if (!pool)
            continue;
        stow_status_t st = stow_record_stream(pool, ptr, stream);
        if (st == STOW_OK)
            return;
        if (st != STOW_ENOTOWNED) {
            if (first_time(&slots[d].logged_error))
                torch_log("record_stream(%p, %p) on device %d failed: %s", ptr, stream, d,
                          stow_strerror(st));
            return;
        }
    }
    if (first_time(&logged_foreign_record))
        torch_log("record_stream of %p: not allocated by Stowage; ignored", ptr);
}

void stow_torch_memory_fraction(double fraction, int device)
{
    torch_slot_t *s = slot_of(device);
    if (!s || !(fraction > 0.0 && fraction <= 1.0)) {
        torch_log("set_per_process_memory_fraction(%g, device %d): out of range; ignored",
                  fraction, device);
        return;
    }
    pthread_mutex_lock(&torch_lock);
    s->fraction = fraction;
    stow_pool_t *pool = atomic_load_explicit(&s->pool, memory_order_relaxed);
    pthread_mutex_unlock(&torch_lock);
    if (!pool)
        return;
    stow_status_t st = stow_pool_set_memory_fraction(pool, fraction);
    if (st != STOW_OK)
        torch_log("set_per_process_memory_fraction(%g, device %d): %s", fraction, device,
                  stow_strerror(st));
}

/* ---- for Python and tests ---- */

stow_pool_t *stow_torch_pool(int device)
{
    torch_slot_t *s = slot_of(device);
    return s ? atomic_load_explicit(&s->pool, memory_order_acquire) : NULL;
}

stow_status_t stow_torch_pool_init(int device, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    torch_slot_t *s = slot_of(device);
    if (!s) {
        if (why && why_len)
            snprintf(why, why_len, "device %d out of range", device);
        return STOW_EINVAL;
    }
    if (pool_get(s, device, NULL))
        return STOW_OK;
    pthread_mutex_lock(&torch_lock);
    if (why && why_len)
        snprintf(why, why_len, "%s", s->last_error);
    pthread_mutex_unlock(&torch_lock);
    return env_wants_sim() || stow_cuda_probe(NULL, 0) == STOW_CUDA_PROBE_OK ? STOW_EBACKEND
                                                                              : STOW_ENODEV;
}

stow_status_t stow_torch_record(int device, size_t capacity_events)
{
    stow_pool_t *pool = stow_torch_pool(device);
    return pool ? stow_record_start(pool, capacity_events) : STOW_EINVAL;
}

stow_status_t stow_torch_dump_trace(int device, const char *path)
{
    stow_pool_t *pool = stow_torch_pool(device);
    return pool ? stow_trace_dump(pool, path) : STOW_EINVAL;
}

stow_status_t stow_torch_step(int device, const char *key)
{
    if (!slot_of(device) ||
        (key && !stow_step_key_valid(key, strnlen(key, STOW_STEP_KEY_MAX + 1))))
        return STOW_EINVAL;
    stow_pool_t *pool = stow_torch_pool(device);
    return pool ? stow_pool_step(pool, key) : STOW_OK;
}

/* stow_stats_json of pool, or of all-zero stats when pool is NULL. */
static size_t pool_stats_json(stow_pool_t *pool, char *buf, size_t buf_len)
{
    stow_stats_t st;
    memset(&st, 0, sizeof st);
    st.size = (uint32_t)sizeof st;
    st.version = STOW_STATS_VERSION;
    if (pool && stow_pool_stats(pool, &st) != STOW_OK) {
        memset(&st, 0, sizeof st);
        st.size = (uint32_t)sizeof st;
        st.version = STOW_STATS_VERSION;
    }
    return stow_stats_json(&st, buf, buf_len);
}

size_t stow_torch_stats_json(int device, char *buf, size_t buf_len)
{
    return pool_stats_json(stow_torch_pool(device), buf, buf_len);
}

size_t stow_torch_summary(int device, char *buf, size_t buf_len)
{
    stow_pool_t *pool = stow_torch_pool(device);
    if (pool)
        return stow_summary(pool, buf, buf_len);
    int n = snprintf(buf, buf_len, "Stowage: no pool on device %d yet (nothing allocated)\n",
                     device);
    return n < 0 ? 0 : (size_t)n;
}

void stow_torch_reset_peak(int device)
{
    stow_pool_t *pool = stow_torch_pool(device);
    if (pool)
        stow_stats_reset_peak(pool);
}

void stow_torch_reset_accumulated(int device)
{
    stow_pool_t *pool = stow_torch_pool(device);
    if (pool)
        stow_stats_reset_accumulated(pool);
}

/* The slot's last error (snprintf semantics); s may be NULL. */
static size_t slot_last_error(torch_slot_t *s, char *buf, size_t buf_len)
{
    if (!s) {
        if (buf && buf_len)
            buf[0] = '\0';
        return 0;
    }
    pthread_mutex_lock(&torch_lock);
    size_t n = strlen(s->last_error);
    if (buf && buf_len)
        snprintf(buf, buf_len, "%s", s->last_error);
    pthread_mutex_unlock(&torch_lock);
    return n;
}

size_t stow_torch_last_error(int device, char *buf, size_t buf_len)
{
    return slot_last_error(slot_of(device), buf, buf_len);
}

/* Destroys s's pool (live blocks included) and backend, and forgets the rest.
 * torch_lock held. */
static void slot_reset_locked(torch_slot_t *s)
{
    stow_pool_t *pool = atomic_exchange(&s->pool, NULL);
    if (pool)
        stow_pool_destroy_force(pool);
    backend_destroy(s);
    s->fraction = 0.0;
    s->last_error[0] = '\0';
    atomic_store(&s->logged_create, false);
    atomic_store(&s->logged_oom, false);
    atomic_store(&s->logged_error, false);
    atomic_store(&s->logged_foreign, false);
    atomic_store(&s->logged_fraction, false);
}

/* Closes a MemPool slot and everything in it. torch_lock held. */
static void mempool_reset_locked(torch_mempool_t *mp)
{
    for (int d = 0; d < STOW_TORCH_MAX_DEVICES; d++)
        slot_reset_locked(&mp->dev[d]);
    free(mp->conf);
    mp->conf = NULL;
    atomic_store(&mp->logged_closed, false);
    atomic_store(&mp->open, false);
}

void stow_torch_shutdown(void)
{
    pthread_mutex_lock(&torch_lock);
    for (int d = 0; d < STOW_TORCH_MAX_DEVICES; d++)
        slot_reset_locked(&slots[d]);
    for (int k = 0; k < STOW_TORCH_MAX_MEMPOOLS; k++)
        mempool_reset_locked(&mempools[k]);
    atomic_store(&logged_bad_device, false);
    atomic_store(&logged_foreign_record, false);
    atomic_store(&site_hook, NULL);
    pthread_mutex_unlock(&torch_lock);
}

/* ---- the MemPool route ---- */

stow_status_t stow_torch_mempool_open(const char *conf, int *slot_out, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!slot_out)
        return STOW_EINVAL;
    if (conf) {
        stow_config_t cfg;
        stow_config_default(&cfg);
        char err[256] = "";
        if (stow_config_parse(&cfg, conf, err, sizeof err) != STOW_OK) {
            if (why && why_len)
                snprintf(why, why_len, "%s", err);
            return STOW_EINVAL;
        }
    }
    char *copy = conf ? strdup(conf) : NULL;
    if (conf && !copy)
        return STOW_EHOSTMEM;
    pthread_mutex_lock(&torch_lock);
    int k = 0;
    while (k < STOW_TORCH_MAX_MEMPOOLS && atomic_load(&mempools[k].open))
        k++;
    if (k < STOW_TORCH_MAX_MEMPOOLS) {
        mempools[k].conf = copy;
        atomic_store(&mempools[k].open, true);
    }
    pthread_mutex_unlock(&torch_lock);
    if (k == STOW_TORCH_MAX_MEMPOOLS) {
        free(copy);
        if (why && why_len)
            snprintf(why, why_len, "all %d MemPool slots are open (close one first)",
                     STOW_TORCH_MAX_MEMPOOLS);
        return STOW_EBUSY;
    }
    *slot_out = k;
    return STOW_OK;
}

/* Whether any of the slot's pools still has a live or pending block. torch_lock held. */
static bool mempool_busy_locked(torch_mempool_t *mp)
{
    for (int d = 0; d < STOW_TORCH_MAX_DEVICES; d++) {
        stow_pool_t *pool = atomic_load(&mp->dev[d].pool);
        stow_stats_t st;
        memset(&st, 0, sizeof st);
        st.size = (uint32_t)sizeof st;
        st.version = STOW_STATS_VERSION;
        if (pool && (stow_pool_stats(pool, &st) != STOW_OK ||
                     st.active_bytes[STOW_POOL_ALL].current != 0))
            return true;
    }
    return false;
}

stow_status_t stow_torch_mempool_close(int slot)
{
    if (slot < 0 || slot >= STOW_TORCH_MAX_MEMPOOLS)
        return STOW_EINVAL;
    torch_mempool_t *mp = &mempools[slot];
    pthread_mutex_lock(&torch_lock);
    stow_status_t st = STOW_OK;
    if (!atomic_load(&mp->open))
        st = STOW_EINVAL;
    else if (mempool_busy_locked(mp))
        st = STOW_EBUSY;
    else
        mempool_reset_locked(mp);
    pthread_mutex_unlock(&torch_lock);
    return st;
}

static torch_slot_t *mempool_slot(int slot, int device)
{
    if (slot < 0 || slot >= STOW_TORCH_MAX_MEMPOOLS || device < 0 ||
        device >= STOW_TORCH_MAX_DEVICES)
        return NULL;
    return &mempools[slot].dev[device];
}

stow_pool_t *stow_torch_mempool_pool(int slot, int device)
{
    torch_slot_t *s = mempool_slot(slot, device);
    return s ? atomic_load_explicit(&s->pool, memory_order_acquire) : NULL;
}

size_t stow_torch_mempool_stats_json(int slot, int device, char *buf, size_t buf_len)
{
    return pool_stats_json(stow_torch_mempool_pool(slot, device), buf, buf_len);
}

size_t stow_torch_mempool_last_error(int slot, int device, char *buf, size_t buf_len)
{
    return slot_last_error(mempool_slot(slot, device), buf, buf_len);
}

static void *mempool_malloc(int k, ssize_t size, int device, stow_stream_t stream)
{
    if (size <= 0)
        return NULL;
    torch_mempool_t *mp = &mempools[k];
    if (!atomic_load_explicit(&mp->open, memory_order_acquire)) {
        if (first_time(&mp->logged_closed))
            torch_log("MemPool slot %d: allocation after it was closed; refused", k);
        return NULL;
    }
    torch_slot_t *s = slot_or_log(mp->dev, device);
    return s ? slot_alloc(s, device, mp, size, stream) : NULL;
}

/* Whether `stream` is capturing a CUDA graph (CUDA backend only; unknown: no). */
static bool capturing(const torch_slot_t *s, stow_stream_t stream)
{
    typedef int (*is_capturing_fn)(void *stream, int *status);
    static _Atomic(is_capturing_fn) fn;
    static atomic_bool looked;
    if (s->backend_is_sim)
        return false;
    if (!atomic_load_explicit(&looked, memory_order_acquire)) {
        void *sym = stow_cuda_driver_symbol("cuStreamIsCapturing");
        is_capturing_fn f = NULL;
        memcpy(&f, &sym, sizeof sym); /* object -> function pointer, as POSIX allows */
        atomic_store(&fn, f);
        atomic_store_explicit(&looked, true, memory_order_release);
    }
    is_capturing_fn f = atomic_load(&fn);
    int status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
    return f && f(stream, &status) == 0 && status != 0;
}

/* PyTorch gives a MemPool's segment back only to return it to the device
 * (empty_cache, its out-of-memory retry, the pool's end): so does Stowage, at
 * once, as cudaFree would, and waiting for the device as cudaFree does. Not
 * while the stream captures a graph, where a synchronize is not allowed. */
static void mempool_free(int k, void *ptr, int device, stow_stream_t stream)
{
    if (!ptr)
        return;
    torch_slot_t *s = mempool_slot(k, device);
    stow_pool_t *pool = slot_free(s, ptr, device);
    if (!pool || capturing(s, stream))
        return;
    stow_status_t st = stow_empty_cache(pool);
    if (st != STOW_OK && first_time(&s->logged_error))
        torch_log("MemPool slot %d: returning memory on device %d failed: %s", k, device,
                  stow_strerror(st));
}

#define STOW_MEMPOOL_ENTRIES_(k)                                                              \
    void *stow_torch_mempool_malloc_##k(ssize_t size, int device, stow_stream_t stream)        \
    {                                                                                          \
        return mempool_malloc(k, size, device, stream);                                        \
    }                                                                                          \
    void stow_torch_mempool_free_##k(void *ptr, ssize_t size, int device, stow_stream_t stream) \
    {                                                                                          \
        (void)size;                                                                            \
        mempool_free(k, ptr, device, stream);                                                  \
    }
STOW_MEMPOOL_ENTRIES_(0)
STOW_MEMPOOL_ENTRIES_(1)
STOW_MEMPOOL_ENTRIES_(2)
STOW_MEMPOOL_ENTRIES_(3)
STOW_MEMPOOL_ENTRIES_(4)
STOW_MEMPOOL_ENTRIES_(5)
STOW_MEMPOOL_ENTRIES_(6)
STOW_MEMPOOL_ENTRIES_(7)
