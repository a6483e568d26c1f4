/*
 * python/csrc/torch_allocator.cpp: Stowage as PyTorch's CUDA allocator, behind
 * the whole of c10::cuda::CUDACachingAllocator::CUDAAllocator (docs/torch.md,
 * "The adapter").
 *
 * Owns the adapter object PyTorch calls once stow_torch_adapter_install has
 * made it the current allocator (before CUDA starts); the private pools of
 * CUDA graphs and torch.cuda.MemPool (one Stowage pool each, on a backend of
 * its own); the captures under way; the history PyTorch's memory tools read;
 * the out-of-memory observers. The device pools are the global swap's
 * (torch_entry.c, stowage/torch.h), so stowage.memory_stats(), stowage.record()
 * and the step markers see the pools PyTorch allocates from.
 *
 * Must not: make an allocation decision (each is a pool's), throw from a
 * deleter, or call into the device from a path a capturing thread takes except
 * in relaxed capture mode. A method it cannot serve throws c10::Error saying
 * what and why.
 *
 * Built against the interface of torch 2.11 or 2.15 (the #if below; what 2.15
 * has beside 2.11 is under STOW_TORCH_2_15); the C ABI at the end is what
 * python/stowage/torch.py loads with ctypes.
 */
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#endif
#if !defined(TORCH_VERSION_MAJOR) || TORCH_VERSION_MAJOR != 2 || \
    (TORCH_VERSION_MINOR != 11 && TORCH_VERSION_MINOR != 15)
/* The interface's methods and layout change between minor versions. */
#error "torch_allocator.cpp implements the CUDAAllocator interface of torch 2.11 and 2.15 only"
#endif
/* Torch 2.15's interface: 2.11's, and markCaptureBegin/End, getContextForPointer,
 * supportsUserMetadata (each thread's own metadata), annotateMemory,
 * attachOomRejectionObserver, allocateWithAddress; DeviceStats'
 * reserved_bytes_by_private_pools; the annotate action; two more settings. */
#define STOW_TORCH_2_15 (TORCH_VERSION_MINOR == 15)

#include <c10/core/Allocator.h>
#if STOW_TORCH_2_15
#include <c10/core/AllocatorConfig.h>
#endif
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "stowage.h"
#include "stowage/cuda.h"
#include "stowage/record.h"
#include "stowage/snapshot.h"
#include "stowage/torch.h"

#define STOW_ADAPTER_API extern "C" __attribute__((visibility("default")))
#define STOW_ADAPTER_STR_(x) #x
#define STOW_ADAPTER_STR(x) STOW_ADAPTER_STR_(x)
#define STOW_ADAPTER_TORCH                                                   \
    STOW_ADAPTER_STR(TORCH_VERSION_MAJOR) "." STOW_ADAPTER_STR(TORCH_VERSION_MINOR) "." \
        STOW_ADAPTER_STR(TORCH_VERSION_PATCH)

namespace {

namespace CCA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;
using c10::MempoolId_t;
using Action = CDA::TraceEntry::Action;

using StatType = c10::CachingAllocator::StatType;
static_assert(STOW_POOL_ALL == static_cast<int>(StatType::AGGREGATE) &&
                  STOW_POOL_SMALL == static_cast<int>(StatType::SMALL_POOL) &&
                  STOW_POOL_LARGE == static_cast<int>(StatType::LARGE_POOL),
              "Stowage's pool kinds index PyTorch's StatArray");

constexpr int kMaxDevices = STOW_TORCH_MAX_DEVICES;
constexpr MempoolId_t kDefaultPool{0, 0};
constexpr uint64_t kSeqNow = UINT64_MAX; /* trace_locked: the pool's count at the call */

void adapter_delete(void *ptr);

/* ---- small helpers ---- */

void log_line(const std::string &text) { std::fprintf(stderr, "stowage: %s\n", text.c_str()); }

/* Sizes as PyTorch's allocator writes them in its messages (GiB at most). */
std::string format_bytes(size_t n)
{
    char buf[64];
    double v = static_cast<double>(n);
    if (n <= 1024)
        std::snprintf(buf, sizeof buf, "%zu bytes", n);
    else if (n <= (size_t{1} << 20))
        std::snprintf(buf, sizeof buf, "%.2f KiB", v / 1024.0);
    else if (n <= (size_t{1} << 30))
        std::snprintf(buf, sizeof buf, "%.2f MiB", v / 1048576.0);
    else
        std::snprintf(buf, sizeof buf, "%.2f GiB", v / 1073741824.0);
    return buf;
}

std::string pool_name(MempoolId_t id)
{
    return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

int64_t now_us() { return static_cast<int64_t>(c10::getTimeSinceEpoch() / 1000); }

/* The events pool's recording counted since it started (0 without one). */
uint64_t recorded_events(stow_pool_t *pool)
{
    uint64_t recorded = 0;
    if (pool)
        stow_record_counts(pool, &recorded, nullptr);
    return recorded;
}

stow_stats_t empty_stats()
{
    stow_stats_t s;
    std::memset(&s, 0, sizeof s);
    s.size = static_cast<uint32_t>(sizeof s);
    s.version = STOW_STATS_VERSION;
    return s;
}

/* The pool's statistics; all zero when pool is NULL or the call fails. */
stow_stats_t stats_of(stow_pool_t *pool)
{
    stow_stats_t s = empty_stats();
    if (pool && stow_pool_stats(pool, &s) != STOW_OK)
        s = empty_stats();
    return s;
}

/* "64M" style sizes, as torch_entry.c reads STOWAGE_SIM_CAPACITY; 0 when unset. */
size_t env_size(const char *name)
{
    const char *v = std::getenv(name);
    if (!v || !*v)
        return 0;
    char *end = nullptr;
    unsigned long long n = std::strtoull(v, &end, 10);
    unsigned shift = 0;
    switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
    }
    if (end == v || *end != '\0' || n > (SIZE_MAX >> shift))
        return 0;
    return static_cast<size_t>(n) << shift;
}

void add_array(c10::CachingAllocator::StatArray &out, const stow_stat_t *in)
{
    for (int k = 0; k < STOW_POOL_KINDS; k++) {
        out[k].current += static_cast<int64_t>(in[k].current);
        out[k].peak += static_cast<int64_t>(in[k].peak);
        out[k].allocated += static_cast<int64_t>(in[k].allocated);
        out[k].freed += static_cast<int64_t>(in[k].freed);
    }
}

/* Adds a pool's figures to PyTorch's structure (docs/torch.md says how the
 * pools of one device add up). */
void add_stats(CDA::DeviceStats &out, const stow_stats_t &s)
{
#define STOW_ADD_(name, label) add_array(out.name, s.name);
    STOW_STAT_ARRAY_FIELDS(STOW_ADD_)
#undef STOW_ADD_
    out.num_alloc_retries += static_cast<int64_t>(s.num_alloc_retries);
    out.num_ooms += static_cast<int64_t>(s.num_ooms);
    out.num_sync_all_streams += static_cast<int64_t>(s.num_sync_all_streams);
    out.num_device_alloc += static_cast<int64_t>(s.num_device_alloc);
    out.num_device_free += static_cast<int64_t>(s.num_device_free);
}

template <typename F> void for_each_array(CDA::DeviceStats &s, F f)
{
    for (auto *a : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                    &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes,
                    &s.requested_bytes})
        for (auto &stat : *a)
            f(stat);
}

/* A pool's blocks and segments, copied under its lock. */
struct PoolPicture {
    std::vector<stow_snap_segment_t> segments;
    std::vector<stow_snap_block_t> blocks;
};

PoolPicture picture_of(stow_pool_t *pool)
{
    PoolPicture p;
    stow_snap_totals_t totals{};
    for (int attempt = 0; attempt < 8; attempt++) {
        if (stow_pool_snapshot(pool, p.segments.data(), p.segments.size(), p.blocks.data(),
                               p.blocks.size(), &totals) != STOW_OK)
            return {};
        if (totals.segment_count <= p.segments.size() && totals.block_count <= p.blocks.size()) {
            p.segments.resize(totals.segment_count);
            p.blocks.resize(totals.block_count);
            return p;
        }
        /* The pool changed between the two calls: room for some more. */
        p.segments.resize(totals.segment_count + totals.segment_count / 4 + 16);
        p.blocks.resize(totals.block_count + totals.block_count / 4 + 64);
    }
    TORCH_CHECK(false, "Stowage: the pool kept changing while its picture was taken");
}

/* ---- the simulated device of a private pool ----
 *
 * Each simulated device hands out the same fake addresses. A private pool's
 * simulated device is seen through these methods, which move its addresses by
 * a distance of its own, so that no two pools of the process share an address
 * (as on a GPU, where every pool's memory has distinct addresses). */
struct ShiftedSim {
    stow_backend_t view;     /* what the pool sees */
    stow_backend_t *inner;   /* the simulated device */
    uintptr_t shift;
};

stow_status_t shifted_reserve(void *ctx, size_t size, stow_stream_t stream, void **out)
{
    auto *s = static_cast<ShiftedSim *>(ctx);
    void *p = nullptr;
    stow_status_t st = s->inner->reserve(s->inner->ctx, size, stream, &p);
    if (st == STOW_OK)
        *out = reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(p) + s->shift);
    return st;
}
stow_status_t shifted_release(void *ctx, void *ptr, size_t size)
{
    auto *s = static_cast<ShiftedSim *>(ctx);
    return s->inner->release(s->inner->ctx,
                             reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(ptr) - s->shift),
                             size);
}
stow_status_t shifted_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    auto *s = static_cast<ShiftedSim *>(ctx);
    return s->inner->mem_info(s->inner->ctx, free_bytes, total_bytes);
}
stow_status_t shifted_synchronize(void *ctx)
{
    auto *s = static_cast<ShiftedSim *>(ctx);
    return s->inner->synchronize(s->inner->ctx);
}
stow_status_t shifted_event_record(void *ctx, stow_stream_t stream, stow_event_t *out)
{
    auto *s = static_cast<ShiftedSim *>(ctx);
    return s->inner->event_record(s->inner->ctx, stream, out);
}
stow_status_t shifted_event_query(void *ctx, stow_event_t event, bool *done)
{
    auto *s = static_cast<ShiftedSim *>(ctx);
    return s->inner->event_query(s->inner->ctx, event, done);
}
stow_status_t shifted_event_destroy(void *ctx, stow_event_t event)
{
    auto *s = static_cast<ShiftedSim *>(ctx);
    return s->inner->event_destroy(s->inner->ctx, event);
}

/* ---- state ---- */

/* A private pool: CUDA graph captures and torch.cuda.MemPool allocate from
 * it. use_count is PyTorch's count of its users (graphs, MemPools, a
 * use_mem_pool block); at 0 the pool gives its memory back, and is destroyed
 * once its last block is freed (retire_if_done). */
struct PrivatePool {
    int device = 0;
    MempoolId_t id{0, 0};
    stow_backend_t *backend = nullptr; /* CUDA backend, or `sim.view` */
    std::unique_ptr<ShiftedSim> sim;   /* the simulated device, in sim mode */
    stow_pool_t *pool = nullptr;
    int use_count = 1;
    bool use_on_oom = false;
    bool recording = false; /* history started its recording */
    uint64_t source = 0;       /* Trace::source of its entries (from 1) */
    uint64_t history_from = 0; /* its first recorded event that the history holds */
#if STOW_TORCH_2_15
    /* reserved_bytes' allocated at the last resetAccumulatedStats (as reset_base_) */
    int64_t reserved_base[STOW_POOL_KINDS] = {};
#endif
};

/* A capture or use_mem_pool block sending a device's allocations to a pool. */
struct Capture {
    int device;
    MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
};

/* What the history keeps of a live block. */
struct LiveBlock {
    std::shared_ptr<c10::GatheredContext> context;
    cudaStream_t stream;
    int device;
    MempoolId_t pool;
};

/* One history entry, as TraceEntry needs it. */
struct Trace {
    Action action;
    int device;
    size_t addr;
    size_t size;
    cudaStream_t stream;
    MempoolId_t pool;
    int64_t time_us;
    /* The pool instance it came from (0: the device pool, else its
     * PrivatePool's source) and its place among that pool's recorded events:
     * a segment entry is event number seq of the recording; a block entry
     * stands after the first seq events and before the others. */
    uint64_t source;
    uint64_t seq;
    std::shared_ptr<c10::GatheredContext> context;
    std::string compile_context;
    std::string user_metadata;
};

bool is_segment_action(Action a)
{
    return a == Action::SEGMENT_ALLOC || a == Action::SEGMENT_FREE ||
           a == Action::SEGMENT_MAP || a == Action::SEGMENT_UNMAP;
}

/* Puts a device's history in order, oldest first.
 *
 * Entries of one pool follow the pool's own order of events: a segment entry
 * whose event was counted before a block entry's seq comes before it (the
 * pool maps inside an allocation, and unmaps inside a free, after the entry's
 * count). Their times do not decide it: a recording's times come from the
 * pool's cycle counter, converted to the wall clock when the recording is
 * read, while block entries take PyTorch's clock, and the two need not agree
 * to the microsecond that can lie between a segment event and its block's.
 * Along one pool's entries a segment entry's time is held between the times
 * of the block entries around it, and every time is at least the one before.
 *
 * Entries of different pools are merged by time (then by source), each
 * pool's entries keeping their order: sorting stably first by (source, place
 * in the pool) and then by time, both strict weak orders, does that. */
void order_history(std::vector<Trace> &entries)
{
    /* A block entry stands between events seq - 1 and seq: 2 * seq sorts it there. */
    auto place = [](const Trace &t) {
        return is_segment_action(t.action) ? 2 * t.seq + 1 : 2 * t.seq;
    };
    std::stable_sort(entries.begin(), entries.end(), [&place](const Trace &a, const Trace &b) {
        if (a.source != b.source)
            return a.source < b.source;
        return place(a) < place(b);
    });
    for (size_t i = 0; i < entries.size();) {
        size_t end = i;
        while (end < entries.size() && entries[end].source == entries[i].source)
            end++;
        /* next_block[k - i]: the time of the first block entry after k, if any. */
        std::vector<std::optional<int64_t>> next_block(end - i);
        std::optional<int64_t> next;
        for (size_t k = end; k-- > i;) {
            next_block[k - i] = next;
            if (!is_segment_action(entries[k].action))
                next = entries[k].time_us;
        }
        int64_t last = std::numeric_limits<int64_t>::min();
        for (size_t k = i; k < end; k++) {
            int64_t t = entries[k].time_us;
            if (is_segment_action(entries[k].action) && next_block[k - i])
                t = std::min(t, *next_block[k - i]);
            t = std::max(t, last);
            entries[k].time_us = last = t;
        }
        i = end;
    }
    std::stable_sort(entries.begin(), entries.end(),
                     [](const Trace &a, const Trace &b) { return a.time_us < b.time_us; });
}

struct Annotation {
    int device;
    int64_t time_us;
    std::vector<std::pair<std::string, std::string>> metadata;
};

/* A block of a checkpoint as the pool can make it again at its address. */
struct CheckpointBlock {
    size_t requested = 0;
    uint64_t stream = 0;
};

/* A checkpoint of a private pool: its live blocks (getCheckpointState). */
struct PoolState final : CCA::AllocatorState {
    int device = 0;
    MempoolId_t id{0, 0};
    std::vector<std::pair<uintptr_t, size_t>> live; /* address, block size; by address */
    std::map<uintptr_t, CheckpointBlock> made;      /* each live block's request and stream */
};

thread_local int tl_sim_device = 0;
thread_local cudaStream_t tl_sim_stream = nullptr;
thread_local std::vector<std::string> tl_compile_context;
#if STOW_TORCH_2_15
thread_local std::string tl_user_metadata; /* torch 2.15: each thread's own */
#endif

class StowageAllocator;
StowageAllocator *g_adapter = nullptr;

class StowageAllocator final : public CCA::CUDAAllocator {
  public:
    explicit StowageAllocator(bool sim) : sim_(sim) {}

    /* ---- c10::Allocator ---- */
    c10::DataPtr allocate(size_t size) override
    {
        int device = current_device();
        void *ptr = alloc(size, device, current_stream(device));
        return {ptr, ptr, &adapter_delete,
                c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &adapter_delete; }
    void copy_data(void *dest, const void *src, std::size_t count) const override
    {
        TORCH_CHECK(!sim_, "Stowage: the simulated device has no memory to copy");
        C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
    }

    /* ---- c10::DeviceAllocator ---- */
    bool initialized() override { return initialized_.load(); }
    void emptyCache(MempoolId_t mempool_id) override;
    using CCA::CUDAAllocator::recordStream;
    void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override;
    CDA::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
    void resetAccumulatedStats(c10::DeviceIndex device) override;
    void resetPeakStats(c10::DeviceIndex device) override;
    std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

    /* ---- CUDAAllocator ---- */
    void *raw_alloc(size_t nbytes) override
    {
        int device = current_device();
        return alloc(nbytes, device, current_stream(device));
    }
    void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override
    {
        return alloc(nbytes, current_device(), stream);
    }
    void raw_delete(void *ptr) override { free_ptr(ptr); }
    void init(int device_count) override;
    double getMemoryFraction(c10::DeviceIndex device) override;
    void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
    std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override
    {
        /* Stowage's page-mapped pools are not PyTorch's expandable segments. */
        return {};
    }
    void enable(bool value) override
    {
        TORCH_CHECK(value, "Stowage cannot turn caching off (caching_allocator_enable(False)): "
                           "its pools always cache; torch.cuda.empty_cache() returns the cache");
    }
    bool isEnabled() const override { return true; }
    void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) override;
    void *getBaseAllocation(void *ptr, size_t *size) override;
    CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override;
    void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                             std::function<bool(cudaStream_t)> filter) override;
    void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override;
    void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override;
    int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override;
    void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                            std::shared_ptr<CCA::CUDAAllocator> allocator) override;
    void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override;
    void setNoSplit(c10::DeviceIndex, MempoolId_t mempool_id) override
    {
        TORCH_CHECK(false, "Stowage does not serve MemPool(no_split=True) (pool ",
                    pool_name(mempool_id), "): its pools split segments, and a pool that "
                    "gives each allocation a segment of its own is not one of its policies");
    }
    bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                  const std::unordered_set<void *> &expected) override;
    CCA::ShareableHandle shareIpcHandle(void *) override
    {
        TORCH_CHECK(false, ipc_refusal());
    }
    std::shared_ptr<void> getIpcDevPtr(std::string) override { TORCH_CHECK(false, ipc_refusal()); }
    bool isHistoryEnabled() override { return history_on_.load(); }
    void recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                       size_t alloc_trace_max_entries, CCA::RecordContext when,
                       bool clearHistory, const std::vector<std::string> &skip_actions) override;
    void recordAnnotation(const std::vector<std::pair<std::string, std::string>> &md) override;
    void pushCompileContext(std::string &md) override
    {
        if (history_on_.load())
            tl_compile_context.push_back(md);
    }
    void popCompileContext() override
    {
        if (!tl_compile_context.empty())
            tl_compile_context.pop_back();
    }
    void setUserMetadata(const std::string &metadata) override
    {
        std::lock_guard<std::mutex> lock(mu_);
        user_metadata() = metadata;
    }
    std::string getUserMetadata() override
    {
        std::lock_guard<std::mutex> lock(mu_);
        return user_metadata();
    }
    void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override
    {
        std::lock_guard<std::mutex> lock(mu_);
        observers_.push_back(std::move(observer));
    }
    void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker) override
    {
        TORCH_CHECK(false, "Stowage does not serve attachAllocatorTraceTracker: its pools "
                           "reserve and release segments inside libstowage and do not report "
                           "each one as it happens (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK "
                           "needs that; leave it unset)");
    }
    void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
    cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                            cudaStream_t stream, bool p2p_enabled) override;
    std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                            MempoolId_t id) override;
    CCA::CheckpointDelta setCheckpointPoolState(
        c10::DeviceIndex device, std::shared_ptr<CCA::AllocatorState> pps) override;
    std::string name() override { return "stowage"; }
#if STOW_TORCH_2_15
    bool supportsUserMetadata() override { return true; }
    void annotateMemory(const void *ptr, const std::string &metadata) override;
    std::shared_ptr<c10::GatheredContext> getContextForPointer(const void *ptr) override
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = live_.find(const_cast<void *>(ptr));
        return it == live_.end() ? nullptr : it->second.context;
    }
    /* A capture runs between these (an allocation to a pool may run without one). */
    void markCaptureBegin(c10::DeviceIndex) override { graph_captures_.fetch_add(1); }
    void markCaptureEnd(c10::DeviceIndex) override
    {
        int n = graph_captures_.load();
        while (n > 0 && !graph_captures_.compare_exchange_weak(n, n - 1)) {
        }
        TORCH_CHECK(n > 0, "Stowage: markCaptureEnd without a capture under way");
    }
    /* Stowage rejects no allocation ahead of the device (PyTorch's
     * throw_on_cudamalloc_oom): there is nothing to observe, and
     * num_oom_rejections stays 0. */
    void attachOomRejectionObserver(CCA::OomRejectionObserver) override {}
    c10::DataPtr allocateWithAddress(size_t size, void *addr) override;
#endif

    /* ---- for the deleter and the C ABI ---- */
    void free_ptr(void *ptr) noexcept;
    void select_sim(int device, cudaStream_t stream)
    {
        tl_sim_device = device;
        tl_sim_stream = stream;
    }
    bool sim() const { return sim_; }
    void reset_for_tests();

  private:
    int current_device() const
    {
        if (sim_)
            return tl_sim_device;
        c10::DeviceIndex d = -1;
        C10_CUDA_CHECK(c10::cuda::GetDevice(&d));
        return d;
    }
    cudaStream_t current_stream(int device) const
    {
        if (sim_)
            return tl_sim_stream;
        return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    }
    static void check_device(int device)
    {
        TORCH_CHECK(device >= 0 && device < kMaxDevices, "Stowage serves devices 0 to ",
                    kMaxDevices - 1, "; device ", device, " is out of range");
    }
    static std::string ipc_refusal()
    {
        return "Stowage does not serve CUDA IPC of tensors (torch.multiprocessing sharing a CUDA "
               "tensor with another process): its pools' segments are not exported to other "
               "processes. Share host tensors, or keep the shared tensors under PyTorch's own "
               "allocator (the MemPool route, docs/torch.md)";
    }
    /* Whether a CUDA graph capture may be under way: torch 2.15 says when one
     * is; under 2.11 any allocation to a pool may be one. */
    bool capture_under_way() const
    {
#if STOW_TORCH_2_15
        return graph_captures_.load() != 0;
#else
        return captures_total_.load() != 0;
#endif
    }
    /* The metadata trace entries carry: the process's under torch 2.11, the
     * calling thread's under 2.15, as PyTorch's allocator (mu_ held). */
    std::string &user_metadata()
    {
#if STOW_TORCH_2_15
        return tl_user_metadata;
#else
        return user_metadata_;
#endif
    }
    bool slow_path() const
    {
        return captures_total_.load(std::memory_order_acquire) != 0 ||
               private_count_.load(std::memory_order_acquire) != 0 ||
               history_on_.load(std::memory_order_acquire) ||
               stream_used_count_.load(std::memory_order_acquire) != 0;
    }

    void *alloc(size_t size, int device, cudaStream_t stream);
    stow_status_t alloc_routed(size_t size, int device, cudaStream_t stream, void **out,
                               PrivatePool **pp_out);
    [[noreturn]] void alloc_failed(stow_status_t st, size_t size, int device, PrivatePool *pp);
    void note_device(int device);
    void record_device_pool(int device);
    void free_slow(void *ptr);
    bool free_in_locked(stow_pool_t *pool, void *ptr, int device, MempoolId_t pool_id,
                        size_t requested);
    void device_memory(int device, size_t *free_bytes, size_t *total_bytes);
    std::shared_ptr<c10::GatheredContext> gather_context(CCA::RecordContext level);

    /* mu_ held for these. */
    PrivatePool *find_pool_locked(int device, MempoolId_t id);
    PrivatePool *create_pool_locked(int device, MempoolId_t id);
    void create_or_incref_locked(int device, MempoolId_t id);
    void retire_if_done_locked(PrivatePool *pp);
    /* time_us < 0: now; seq == kSeqNow: the pool's events recorded so far. */
    bool trace_locked(Action action, int device, size_t addr, size_t size, cudaStream_t stream,
                      MempoolId_t pool, std::shared_ptr<c10::GatheredContext> context,
                      int64_t time_us = -1, uint64_t seq = kSeqNow);
    void start_recording_locked(stow_pool_t *pool, bool *started);
    void add_segments_locked(CCA::SnapshotInfo &info, stow_pool_t *pool, int device,
                             MempoolId_t id);
    void add_segment_traces_locked(std::vector<Trace> &out, stow_pool_t *pool, int device,
                                   MempoolId_t id, uint64_t source, uint64_t from);
    void add_device_segment_traces_locked(std::vector<Trace> &out, int device);
    /* The pool's live blocks (address, block size), by address; with made,
     * also each one's request and stream, from the same picture. */
    std::vector<std::pair<uintptr_t, size_t>> live_blocks_locked(
        stow_pool_t *pool, std::map<uintptr_t, CheckpointBlock> *made = nullptr);
    std::vector<stow_pool_t *> device_pools_locked(int device);
#if STOW_TORCH_2_15
    void reset_retired_by_pool_locked(int device, bool peak);
#endif

    const bool sim_;
    std::atomic<bool> initialized_{false};
    std::atomic<uint64_t> devices_used_{0};   /* bit d: device d's pool served an allocation */
    std::atomic<int> captures_total_{0};      /* captures under way, all devices */
    std::atomic<int> private_count_{0};       /* private pools */
    std::atomic<bool> history_on_{false};
    std::atomic<int> stream_used_count_{0};   /* stream_used_.size() */
    std::atomic<int> captures_[kMaxDevices] = {};
#if STOW_TORCH_2_15
    std::atomic<int> graph_captures_{0};      /* between markCaptureBegin and End */
#endif

    std::mutex mu_; /* guards everything below */
    std::map<std::pair<int, MempoolId_t>, std::unique_ptr<PrivatePool>> pools_;
    uint64_t next_shift_ = 1;
    uint64_t next_source_ = 1; /* PrivatePool::source of the next private pool */
    std::vector<Capture> captures_list_;
    std::unordered_set<void *> stream_used_;  /* blocks given to recordStream */
    std::vector<void *> deferred_;            /* frees held until no capture is under way */
    double fraction_[kMaxDevices] = {};       /* set_per_process_memory_fraction; 0: none */
    CDA::DeviceStats retired_[kMaxDevices];   /* private pools destroyed on each device */
    /* The cumulative increases at the last resetAccumulatedStats: Stowage
     * restarts them from the current values, PyTorch from 0. */
    CDA::DeviceStats reset_base_[kMaxDevices];
    std::vector<CCA::OutOfMemoryObserver> observers_;
#if !STOW_TORCH_2_15
    std::string user_metadata_;
#else
    /* reserved_bytes of destroyed private pools: current 0, the rest kept until reset */
    std::map<MempoolId_t, c10::CachingAllocator::StatArray> retired_by_pool_[kMaxDevices];
#endif
    /* history */
    CCA::CreateContextFn recorder_ = nullptr;
    CCA::RecordContext when_ = CCA::RecordContext::NEVER;
    size_t max_entries_ = 1;
    std::set<int> skip_;
    std::deque<Trace> traces_[kMaxDevices];
    std::deque<Annotation> annotations_;
    std::unordered_map<void *, LiveBlock> live_;  /* blocks allocated while recording */
    bool recording_[kMaxDevices] = {};            /* history started device d's recording */
    uint64_t history_from_[kMaxDevices] = {};     /* as PrivatePool::history_from */
};

/* ---- allocation ---- */

void *StowageAllocator::alloc(size_t size, int device, cudaStream_t stream)
{
    if (size == 0)
        return nullptr;
    check_device(device);
    TORCH_CHECK_WITH(OutOfMemoryError, size < (size_t{1} << 60),
                     "CUDA out of memory. Tried to allocate more than 1EB memory.");
    std::shared_ptr<c10::GatheredContext> context;
    if (C10_UNLIKELY(history_on_.load(std::memory_order_relaxed)))
        context = gather_context(CCA::RecordContext::STATE);
    void *ptr = nullptr;
    PrivatePool *pp = nullptr;
    stow_status_t st;
    if (C10_LIKELY(captures_total_.load(std::memory_order_acquire) == 0)) {
        if (C10_UNLIKELY(history_on_.load(std::memory_order_relaxed)) &&
            !(devices_used_.load(std::memory_order_relaxed) & (uint64_t{1} << device)))
            record_device_pool(device);
        st = stow_torch_alloc(size, device, stream, &ptr);
    } else {
        st = alloc_routed(size, device, stream, &ptr, &pp);
    }
    if (C10_UNLIKELY(st != STOW_OK)) {
        if (st == STOW_ENOMEM && !pp) {
            /* A MemPool(use_on_oom=True) of this device may still hold room. */
            std::lock_guard<std::mutex> lock(mu_);
            for (auto &entry : pools_) {
                PrivatePool *cand = entry.second.get();
                if (cand->device == device && cand->use_on_oom &&
                    stow_pool_alloc(cand->pool, size, stream, &ptr) == STOW_OK) {
                    pp = cand;
                    st = STOW_OK;
                    break;
                }
            }
        }
        if (st != STOW_OK)
            alloc_failed(st, size, device, pp);
    }
    if (!pp)
        note_device(device);
    if (C10_UNLIKELY(history_on_.load(std::memory_order_relaxed))) {
        std::lock_guard<std::mutex> lock(mu_);
        MempoolId_t id = pp ? pp->id : kDefaultPool;
        if (when_ != CCA::RecordContext::NEVER)
            live_[ptr] = LiveBlock{context, stream, device, id};
        trace_locked(Action::ALLOC, device, reinterpret_cast<size_t>(ptr), size, stream, id,
                     when_ >= CCA::RecordContext::ALLOC ? context : nullptr);
    }
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
        CDA::DeviceStats s = getDeviceStats(static_cast<c10::DeviceIndex>(device));
        c10::reportMemoryUsageToProfiler(
            ptr, static_cast<int64_t>(size), static_cast<size_t>(s.allocated_bytes[0].current),
            static_cast<size_t>(s.reserved_bytes[0].current),
            c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    }
    return ptr;
}

/* While captures are under way: the allocation goes to the private pool of
 * the newest capture of this device whose filter takes the stream, else to
 * the device pool; in relaxed capture mode, as a capture may be asking. */
stow_status_t StowageAllocator::alloc_routed(size_t size, int device, cudaStream_t stream,
                                             void **out, PrivatePool **pp_out)
{
    std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed;
    if (!sim_)
        relaxed.emplace(cudaStreamCaptureModeRelaxed);
    std::unique_lock<std::mutex> lock(mu_);
    for (auto it = captures_list_.rbegin(); it != captures_list_.rend(); ++it) {
        if (it->device != device || !it->filter(stream))
            continue;
        PrivatePool *pp = find_pool_locked(device, it->id);
        TORCH_INTERNAL_ASSERT(pp, "a capture's pool is missing");
        *pp_out = pp;
        return stow_pool_alloc(pp->pool, size, stream, out);
    }
    lock.unlock();
    return stow_torch_alloc(size, device, stream, out);
}

void StowageAllocator::alloc_failed(stow_status_t st, size_t size, int device, PrivatePool *pp)
{
    std::string where = "GPU " + std::to_string(device);
    if (pp)
        where += " (private pool " + pool_name(pp->id) + ")";
    char why[2048] = "";
    if (pp)
        stow_pool_oom_message(pp->pool, why, sizeof why);
    else
        stow_torch_last_error(device, why, sizeof why);
    if (st != STOW_ENOMEM)
        TORCH_CHECK(false, "Stowage could not allocate ", size, " bytes on ", where, ": ",
                    stow_strerror(st), why[0] ? ": " : "", why);

    size_t free_bytes = 0, total_bytes = 0;
    device_memory(device, &free_bytes, &total_bytes);
    CDA::DeviceStats s = getDeviceStats(static_cast<c10::DeviceIndex>(device));
    stow_stats_t ps = stats_of(pp ? pp->pool : stow_torch_pool(device));
    size_t limit = ps.limit_bytes ? static_cast<size_t>(ps.limit_bytes) : total_bytes;
    std::vector<CCA::OutOfMemoryObserver> observers;
    {
        std::lock_guard<std::mutex> lock(mu_);
        trace_locked(Action::OOM, device, free_bytes, size, nullptr,
                     pp ? pp->id : kDefaultPool, nullptr);
        observers = observers_;
    }
    c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size),
                                     static_cast<size_t>(s.allocated_bytes[0].current),
                                     static_cast<size_t>(s.reserved_bytes[0].current), dev);
    for (const auto &obs : observers)
        obs(device, size, limit, free_bytes);
    /* PyTorch's own first sentences (tools match them), then Stowage's account. */
    int64_t allocated = s.allocated_bytes[0].current, reserved = s.reserved_bytes[0].current;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ",
                     format_bytes(size), ". ", where, " has a total capacity of ",
                     format_bytes(total_bytes), " of which ", format_bytes(free_bytes),
                     " is free. Of the allocated memory ",
                     format_bytes(static_cast<size_t>(allocated)),
                     " is allocated by PyTorch, and ",
                     format_bytes(static_cast<size_t>(reserved - allocated)),
                     " is reserved by PyTorch but unallocated. Stowage's allocator: ",
                     why[0] ? why : "stowage: out of memory",
                     "\nstowage.memory_summary() shows the pool; STOWAGE_CONF sets its policy "
                     "(docs/torch.md).");
}

void StowageAllocator::note_device(int device)
{
    uint64_t bit = uint64_t{1} << device;
    if (C10_LIKELY(devices_used_.load(std::memory_order_relaxed) & bit))
        return;
    devices_used_.fetch_or(bit, std::memory_order_acq_rel);
    if (history_on_.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        start_recording_locked(stow_torch_pool(device), &recording_[device]);
    }
}

/* Creates the device's pool ahead of its first allocation while the history
 * records, and starts its recording: the segments that allocation maps are
 * then in the history before its block. */
void StowageAllocator::record_device_pool(int device)
{
    if (stow_torch_pool_init(device, nullptr, 0) != STOW_OK)
        return;
    std::lock_guard<std::mutex> lock(mu_);
    if (history_on_.load())
        start_recording_locked(stow_torch_pool(device), &recording_[device]);
}

#if STOW_TORCH_2_15
/* As PyTorch's allocator: a block at addr exactly, taken from the free blocks
 * of the pool an allocation on the current stream would come from (the
 * newest capture's private pool whose filter takes the stream, else the
 * device pool); no memory is reserved for it. stow_pool_alloc_at does that
 * for a classic pool; a page-mapped one places its blocks on the pages it
 * maps and cannot. */
c10::DataPtr StowageAllocator::allocateWithAddress(size_t size, void *addr)
{
    int device = current_device();
    check_device(device);
    cudaStream_t stream = current_stream(device);
    c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    if (size == 0)
        return {nullptr, nullptr, &adapter_delete, dev};
    std::shared_ptr<c10::GatheredContext> context;
    if (history_on_.load())
        context = gather_context(CCA::RecordContext::STATE);
    /* The pool may query the events of blocks freed on other streams. */
    std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed;
    if (!sim_)
        relaxed.emplace(cudaStreamCaptureModeRelaxed);
    std::lock_guard<std::mutex> lock(mu_);
    PrivatePool *pp = nullptr;
    for (auto it = captures_list_.rbegin(); !pp && it != captures_list_.rend(); ++it)
        if (it->device == device && it->filter(stream))
            pp = find_pool_locked(device, it->id);
    stow_pool_t *pool = pp ? pp->pool : stow_torch_pool(device);
    stow_status_t st = pool ? stow_pool_alloc_at(pool, addr, size,
                                                 reinterpret_cast<stow_stream_t>(stream))
                            : STOW_ENOTOWNED;
    if (st != STOW_OK) {
        std::string where = pp ? "private pool " + pool_name(pp->id) : "the device pool";
        const char *why =
            st == STOW_ENOSYS ? " is page-mapped: it places blocks on the pages it maps, not at "
                                "a given address (STOWAGE_CONF=policy:classic serves this)"
            : st == STOW_EINVAL ? " takes only addresses aligned to 512 bytes"
            : st == STOW_ENOTOWNED ? " holds those bytes in no free block that the stream may "
                                     "take"
                                   : nullptr;
        TORCH_CHECK(false, "Could not allocate CUDA storage at exact address ", addr, " (",
                    size, " bytes) on GPU ", device, ": Stowage's ", where,
                    why ? why : ": ", why ? "" : stow_strerror(st));
    }
    if (history_on_.load()) {
        MempoolId_t id = pp ? pp->id : kDefaultPool;
        if (when_ != CCA::RecordContext::NEVER)
            live_[addr] = LiveBlock{context, stream, device, id};
        trace_locked(Action::ALLOC, device, reinterpret_cast<size_t>(addr), size, stream, id,
                     when_ >= CCA::RecordContext::ALLOC ? context : nullptr);
    }
    return {addr, addr, &adapter_delete, dev};
}
#endif

/* ---- free ---- */

void adapter_delete(void *ptr)
{
    if (ptr && g_adapter)
        g_adapter->free_ptr(ptr);
}

void StowageAllocator::free_ptr(void *ptr) noexcept
{
    if (!ptr)
        return;
    if (C10_LIKELY(!slow_path())) {
        uint64_t mask = devices_used_.load(std::memory_order_acquire);
        if (C10_LIKELY(mask != 0 && (mask & (mask - 1)) == 0)) {
            stow_pool_t *pool = stow_torch_pool(__builtin_ctzll(mask));
            if (C10_LIKELY(pool && stow_pool_free(pool, ptr) == STOW_OK))
                return;
        }
    }
    try {
        free_slow(ptr);
    } catch (const std::exception &e) {
        log_line(std::string("free of a block failed: ") + e.what());
    } catch (...) {
        log_line("free of a block failed");
    }
}

/* Frees ptr in pool when the pool owns it (mu_ held); keeps the history. */
bool StowageAllocator::free_in_locked(stow_pool_t *pool, void *ptr, int device,
                                      MempoolId_t pool_id, size_t requested)
{
    /* The free's entries take their time and place before the pool frees: a
     * page-mapped pool unmaps granules inside stow_pool_free, and its recorded
     * segment_unmap must follow the free_completed, as in PyTorch's history
     * (memory_viz walks the history backwards from the segments and needs
     * that order). */
    bool history = history_on_.load();
    int64_t freed_us = history ? now_us() : 0;
    uint64_t seq = history ? recorded_events(pool) : 0;
    if (stow_pool_free(pool, ptr) != STOW_OK)
        return false;
    if (history) {
        auto it = live_.find(ptr);
        cudaStream_t stream = it != live_.end() ? it->second.stream : nullptr;
        std::shared_ptr<c10::GatheredContext> context;
        if (it != live_.end() && when_ == CCA::RecordContext::ALL)
            context = it->second.context;
        /* Stowage frees at once; a use on another stream delays only the reuse. */
        trace_locked(Action::FREE_REQUESTED, device, reinterpret_cast<size_t>(ptr), requested,
                     stream, pool_id, context, freed_us, seq);
        trace_locked(Action::FREE_COMPLETED, device, reinterpret_cast<size_t>(ptr), requested,
                     stream, pool_id, context, freed_us, seq);
    }
    live_.erase(ptr);
    return true;
}

void StowageAllocator::free_slow(void *ptr)
{
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_used_.count(ptr)) {
        if (captures_total_.load() != 0) {
            /* Its free would record events on the streams that used it, which
             * a capture does not allow: held until the captures end. */
            deferred_.push_back(ptr);
            return;
        }
        stream_used_.erase(ptr);
        stream_used_count_.store(static_cast<int>(stream_used_.size()));
    }
    size_t block = 0, requested = 0;
    for (auto &entry : pools_) {
        PrivatePool *pp = entry.second.get();
        if (stow_pool_block_size(pp->pool, ptr, &block, &requested) != STOW_OK)
            continue;
        if (free_in_locked(pp->pool, ptr, pp->device, pp->id, requested))
            retire_if_done_locked(pp);
        return;
    }
    uint64_t mask = devices_used_.load();
    for (int d = 0; d < kMaxDevices; d++) {
        stow_pool_t *pool = (mask >> d) & 1 ? stow_torch_pool(d) : nullptr;
        if (pool && stow_pool_block_size(pool, ptr, &block, &requested) == STOW_OK) {
            free_in_locked(pool, ptr, d, kDefaultPool, requested);
            return;
        }
    }
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "free of %p: not allocated by Stowage; ignored", ptr);
        log_line(buf);
    }
}

/* ---- streams ---- */

void StowageAllocator::recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream)
{
    void *p = ptr.get();
    /* Not Stowage's (shared from another process, or DLPack): nothing to order. */
    if (!p || ptr.get_deleter() != &adapter_delete)
        return;
    /* On the simulated device every stream is an external one, whose id is
     * its handle (torch 2.15's stream() asks CUDA for the device). */
    cudaStream_t s = sim_ ? reinterpret_cast<cudaStream_t>(stream.id()) : stream.stream();
    std::lock_guard<std::mutex> lock(mu_);
    stow_status_t st = STOW_ENOTOWNED;
    for (auto &entry : pools_)
        if ((st = stow_record_stream(entry.second->pool, p, s)) != STOW_ENOTOWNED)
            break;
    uint64_t mask = devices_used_.load();
    for (int d = 0; st == STOW_ENOTOWNED && d < kMaxDevices; d++)
        if ((mask >> d) & 1)
            st = stow_record_stream(stow_torch_pool(d), p, s);
    TORCH_CHECK(st == STOW_OK, "Stowage: record_stream of ", p, " failed: ", stow_strerror(st));
    stream_used_.insert(p);
    stream_used_count_.store(static_cast<int>(stream_used_.size()));
}

/* ---- device-wide calls ---- */

void StowageAllocator::init(int device_count)
{
    if (device_count > kMaxDevices)
        log_line("this process sees " + std::to_string(device_count) +
                 " devices; Stowage serves the first " + std::to_string(kMaxDevices));
    initialized_.store(true);
}

void StowageAllocator::device_memory(int device, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    if (!sim_ && captures_total_.load() == 0) {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        if (cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess)
            return;
        (void)cudaGetLastError();
    }
    /* The simulated device, or while capturing: what the pools report. */
    uint64_t reserved = 0, capacity = 0;
    std::lock_guard<std::mutex> lock(mu_);
    for (stow_pool_t *pool : device_pools_locked(device)) {
        stow_stats_t s = stats_of(pool);
        reserved += s.reserved_bytes[STOW_POOL_ALL].current;
        capacity = std::max<uint64_t>(capacity, s.capacity_bytes);
    }
    *total_bytes = static_cast<size_t>(capacity);
    *free_bytes = static_cast<size_t>(capacity > reserved ? capacity - reserved : 0);
}

std::pair<size_t, size_t> StowageAllocator::getMemoryInfo(c10::DeviceIndex device)
{
    if (!sim_)
        return CCA::CUDAAllocator::getMemoryInfo(device);
    size_t free_bytes = 0, total_bytes = 0;
    device_memory(device, &free_bytes, &total_bytes);
    return {free_bytes, total_bytes};
}

/* The device pool (when it exists) and the private pools of device. */
std::vector<stow_pool_t *> StowageAllocator::device_pools_locked(int device)
{
    std::vector<stow_pool_t *> out;
    if (stow_pool_t *pool = stow_torch_pool(device))
        out.push_back(pool);
    for (auto &entry : pools_)
        if (entry.second->device == device)
            out.push_back(entry.second->pool);
    return out;
}

CDA::DeviceStats StowageAllocator::getDeviceStats(c10::DeviceIndex device)
{
    check_device(device);
    CDA::DeviceStats out;
    std::lock_guard<std::mutex> lock(mu_);
    for (stow_pool_t *pool : device_pools_locked(device))
        add_stats(out, stats_of(pool));
    const CDA::DeviceStats &r = retired_[device];
    for (int k = 0; k < STOW_POOL_KINDS; k++) {
#define STOW_ADD_RETIRED_(name, label)          \
    out.name[k].current += r.name[k].current;     \
    out.name[k].peak += r.name[k].peak;           \
    out.name[k].allocated += r.name[k].allocated; \
    out.name[k].freed += r.name[k].freed;
        STOW_STAT_ARRAY_FIELDS(STOW_ADD_RETIRED_)
#undef STOW_ADD_RETIRED_
    }
    out.num_alloc_retries += r.num_alloc_retries;
    out.num_ooms += r.num_ooms;
    out.num_sync_all_streams += r.num_sync_all_streams;
    out.num_device_alloc += r.num_device_alloc;
    out.num_device_free += r.num_device_free;
    for (int k = 0; k < STOW_POOL_KINDS; k++) {
#define STOW_SUB_BASE_(name, label) \
    out.name[k].allocated -= reset_base_[device].name[k].allocated;
        STOW_STAT_ARRAY_FIELDS(STOW_SUB_BASE_)
#undef STOW_SUB_BASE_
    }
#if STOW_TORCH_2_15
    out.reserved_bytes_by_private_pools.insert(retired_by_pool_[device].begin(),
                                               retired_by_pool_[device].end());
    for (auto &entry : pools_) {
        PrivatePool *pp = entry.second.get();
        if (pp->device != device)
            continue;
        c10::CachingAllocator::StatArray live;
        add_array(live, stats_of(pp->pool).reserved_bytes);
        auto &a = out.reserved_bytes_by_private_pools[pp->id];
        for (int k = 0; k < STOW_POOL_KINDS; k++) {
            a[k].current += live[k].current;
            a[k].peak += live[k].peak;
            a[k].allocated += live[k].allocated - pp->reserved_base[k];
            a[k].freed += live[k].freed;
        }
    }
#endif
    stow_config_t cfg;
    if (stow_pool_t *pool = stow_torch_pool(device)) {
        stow_pool_config(pool, &cfg);
    } else {
        char err[256];
        stow_config_default(&cfg);
        if (stow_config_from_env(&cfg, err, sizeof err) != STOW_OK)
            stow_config_default(&cfg);
    }
    /* SIZE_MAX (unlimited) is -1, as PyTorch's own allocator reports it. */
    out.max_split_size = static_cast<int64_t>(cfg.max_split_size_bytes);
    return out;
}

void StowageAllocator::resetAccumulatedStats(c10::DeviceIndex device)
{
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    CDA::DeviceStats base;
    for (stow_pool_t *pool : device_pools_locked(device)) {
        stow_stats_reset_accumulated(pool);
        add_stats(base, stats_of(pool)); /* allocated == current now */
    }
    CDA::DeviceStats &r = retired_[device];
    for_each_array(r, [](c10::CachingAllocator::Stat &s) { s.reset_accumulated(); });
    r.num_alloc_retries = r.num_ooms = r.num_sync_all_streams = 0;
    r.num_device_alloc = r.num_device_free = 0;
    reset_base_[device] = base;
#if STOW_TORCH_2_15
    for (auto &entry : pools_) {
        PrivatePool *pp = entry.second.get();
        if (pp->device == device)
            for (int k = 0; k < STOW_POOL_KINDS; k++)
                pp->reserved_base[k] =
                    static_cast<int64_t>(stats_of(pp->pool).reserved_bytes[k].allocated);
    }
    reset_retired_by_pool_locked(device, false);
#endif
}

void StowageAllocator::resetPeakStats(c10::DeviceIndex device)
{
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    for (stow_pool_t *pool : device_pools_locked(device))
        stow_stats_reset_peak(pool);
    for_each_array(retired_[device], [](c10::CachingAllocator::Stat &s) { s.reset_peak(); });
#if STOW_TORCH_2_15
    reset_retired_by_pool_locked(device, true);
#endif
}

#if STOW_TORCH_2_15
/* Resets the peaks or the accumulated figures of the destroyed pools; a pool
 * whose figures are all 0 then leaves reserved_bytes_by_private_pools. */
void StowageAllocator::reset_retired_by_pool_locked(int device, bool peak)
{
    auto &retired = retired_by_pool_[device];
    for (auto it = retired.begin(); it != retired.end();) {
        bool zero = true;
        for (auto &stat : it->second) {
            if (peak)
                stat.reset_peak();
            else
                stat.reset_accumulated();
            zero = zero && stat.peak == 0 && stat.allocated == 0 && stat.freed == 0;
        }
        it = zero ? retired.erase(it) : std::next(it);
    }
}
#endif

void StowageAllocator::emptyCache(MempoolId_t mempool_id)
{
    if (capture_under_way()) {
        TORCH_WARN_ONCE("Stowage: empty_cache while a CUDA graph captures was skipped: returning "
                        "memory waits for the device, which a capture does not allow");
        return;
    }
    /* The device pools wait for the device: outside the adapter's lock. */
    if (mempool_id == kDefaultPool)
        stow_torch_empty_cache();
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<PrivatePool *> chosen;
    for (auto &entry : pools_) {
        PrivatePool *pp = entry.second.get();
        /* The default pool's call also returns the memory of pools no graph uses. */
        if (mempool_id == kDefaultPool ? pp->use_count == 0 : pp->id == mempool_id)
            chosen.push_back(pp);
    }
    for (PrivatePool *pp : chosen) {
        stow_status_t st = stow_empty_cache(pp->pool);
        if (st != STOW_OK)
            TORCH_WARN("Stowage: empty_cache of private pool ", pool_name(pp->id), " failed: ",
                       stow_strerror(st));
        retire_if_done_locked(pp);
    }
}

double StowageAllocator::getMemoryFraction(c10::DeviceIndex device)
{
    check_device(device);
    if (stow_pool_t *pool = stow_torch_pool(device)) {
        stow_stats_t s = stats_of(pool);
        if (s.capacity_bytes)
            return static_cast<double>(s.limit_bytes) / static_cast<double>(s.capacity_bytes);
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (fraction_[device] > 0.0)
            return fraction_[device];
    }
    stow_config_t cfg;
    char err[256];
    stow_config_default(&cfg);
    if (stow_config_from_env(&cfg, err, sizeof err) != STOW_OK)
        stow_config_default(&cfg);
    return cfg.memory_fraction;
}

void StowageAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device)
{
    check_device(device);
    TORCH_CHECK(fraction > 0.0 && fraction <= 1.0, "Stowage: memory fraction ", fraction,
                " is outside (0, 1] (a pool needs room for one segment)");
    std::lock_guard<std::mutex> lock(mu_);
    for (stow_pool_t *pool : device_pools_locked(device)) {
        stow_status_t st = stow_pool_set_memory_fraction(pool, fraction);
        TORCH_CHECK(st == STOW_OK, "Stowage: memory fraction ", fraction, " on device ",
                    static_cast<int>(device), ": ", stow_strerror(st),
                    " (the limit must hold at least one segment)");
    }
    fraction_[device] = fraction;
    stow_torch_memory_fraction(fraction, device); /* kept for a pool created later */
}

void StowageAllocator::cacheInfo(c10::DeviceIndex device, size_t *largestBlock)
{
    check_device(device);
    if (*largestBlock == 0) {
        /* What a new segment could get: the device's free memory, within the limit. */
        size_t free_bytes = 0, total_bytes = 0;
        device_memory(device, &free_bytes, &total_bytes);
        stow_stats_t s = stats_of(stow_torch_pool(device));
        if (s.limit_bytes) {
            uint64_t room = s.limit_bytes > s.reserved_bytes[STOW_POOL_ALL].current
                                ? s.limit_bytes - s.reserved_bytes[STOW_POOL_ALL].current
                                : 0;
            free_bytes = std::min<size_t>(free_bytes, static_cast<size_t>(room));
        }
        *largestBlock = free_bytes;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (stow_pool_t *pool : device_pools_locked(device)) {
        size_t cached = static_cast<size_t>(stats_of(pool).largest_free_block_bytes);
        *largestBlock = std::max(*largestBlock, cached);
    }
}

void *StowageAllocator::getBaseAllocation(void *ptr, size_t *size)
{
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<stow_pool_t *> all;
    for (auto &entry : pools_)
        all.push_back(entry.second->pool);
    uint64_t mask = devices_used_.load();
    for (int d = 0; d < kMaxDevices; d++)
        if ((mask >> d) & 1)
            all.push_back(stow_torch_pool(d));
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (stow_pool_t *pool : all) {
        if (!pool || stow_pool_block_size(pool, ptr, nullptr, nullptr) != STOW_OK)
            continue;
        for (const auto &seg : picture_of(pool).segments) {
            if (p >= seg.addr && p < seg.addr + seg.size_bytes) {
                *size = static_cast<size_t>(seg.size_bytes);
                return reinterpret_cast<void *>(seg.addr);
            }
        }
    }
    TORCH_CHECK(false, "Stowage: ", ptr, " is not a live block of Stowage's pools");
}

void StowageAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access)
{
    TORCH_CHECK(!sim_, "Stowage: the simulated device has no peers");
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
    else
        C10_CUDA_CHECK(err);
}

cudaError_t StowageAllocator::memcpyAsync(void *dst, int dstDevice, const void *src,
                                          int srcDevice, size_t count, cudaStream_t stream,
                                          bool p2p_enabled)
{
    (void)p2p_enabled;
    if (dstDevice == srcDevice)
        return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    /* Page-mapped memory is mapped for its own device only: a peer copy works
     * for every pool whatever peer access was granted. */
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
}

/* ---- private pools: CUDA graphs and torch.cuda.MemPool ---- */

PrivatePool *StowageAllocator::find_pool_locked(int device, MempoolId_t id)
{
    auto it = pools_.find({device, id});
    return it == pools_.end() ? nullptr : it->second.get();
}

PrivatePool *StowageAllocator::create_pool_locked(int device, MempoolId_t id)
{
    auto pp = std::make_unique<PrivatePool>();
    pp->device = device;
    pp->id = id;
    /* The device pool's configuration, less what a capture must not do:
     * release memory while growing (it would wait for the device), remap
     * pages or serve planned steps. */
    stow_config_t cfg;
    char err[256] = "";
    stow_config_default(&cfg);
    if (stow_config_from_env(&cfg, err, sizeof err) != STOW_OK)
        stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_CLASSIC;
    cfg.release_idle_on_grow = false;
    cfg.planned_steps = false;
    cfg.record_events = 0;
    if (fraction_[device] > 0.0)
        cfg.memory_fraction = fraction_[device];

    char why[512] = "";
    stow_status_t st;
    if (sim_) {
        stow_sim_config_t sc;
        stow_sim_config_default(&sc);
        sc.capacity_bytes = env_size("STOWAGE_SIM_CAPACITY");
        auto sim = std::make_unique<ShiftedSim>();
        st = stow_sim_create(&sc, &sim->inner);
        if (st == STOW_OK) {
            stow_backend_t &v = sim->view;
            std::memset(&v, 0, sizeof v);
            v.abi_version = STOW_BACKEND_ABI;
            v.name = "sim";
            v.ctx = sim.get();
            v.granularity_bytes = sim->inner->granularity_bytes;
            v.reserve = shifted_reserve;
            v.release = shifted_release;
            v.mem_info = shifted_mem_info;
            v.synchronize = shifted_synchronize;
            if (sim->inner->event_record) {
                v.event_record = shifted_event_record;
                v.event_query = shifted_event_query;
                v.event_destroy = shifted_event_destroy;
            }
            sim->shift = static_cast<uintptr_t>(next_shift_++) << 50;
            pp->backend = &sim->view;
            pp->sim = std::move(sim);
        } else {
            std::snprintf(why, sizeof why, "simulated device: %s", stow_strerror(st));
        }
    } else {
        st = stow_cuda_backend_create(device, &pp->backend, why, sizeof why);
    }
    TORCH_CHECK(st == STOW_OK, "Stowage: cannot create private pool ", pool_name(id),
                " on device ", device, ": ", why);
    st = stow_pool_create(&cfg, pp->backend, &pp->pool);
    if (st != STOW_OK) {
        if (pp->sim)
            (void)stow_sim_destroy(pp->sim->inner);
        else
            stow_cuda_backend_destroy(pp->backend);
        TORCH_CHECK(false, "Stowage: cannot create private pool ", pool_name(id), " on device ",
                    device, ": stow_pool_create: ", stow_strerror(st));
    }
    pp->source = next_source_++;
    if (history_on_.load())
        start_recording_locked(pp->pool, &pp->recording);
    PrivatePool *raw = pp.get();
    pools_[{device, id}] = std::move(pp);
    private_count_.fetch_add(1);
    return raw;
}

void StowageAllocator::create_or_incref_locked(int device, MempoolId_t id)
{
    TORCH_CHECK(id != kDefaultPool,
                "Stowage: pool id (0, 0) is the device pool, not a private one");
    if (PrivatePool *pp = find_pool_locked(device, id)) {
        TORCH_CHECK(pp->use_count > 0, "Stowage: private pool ", pool_name(id),
                    " was released by all its users and cannot be used again");
        pp->use_count++;
        return;
    }
    create_pool_locked(device, id);
}

/* Destroys a private pool no one uses once it holds no block (never while a
 * capture is under way on its device: releasing memory waits for it). */
void StowageAllocator::retire_if_done_locked(PrivatePool *pp)
{
    if (pp->use_count > 0 || captures_[pp->device].load() != 0)
        return;
    stow_stats_t s = stats_of(pp->pool);
    if (s.active[STOW_POOL_ALL].current != 0)
        return;
    CDA::DeviceStats gone;
    add_stats(gone, s);
    /* Destroying it returns its segments: count them freed. */
    for_each_array(gone, [](c10::CachingAllocator::Stat &st) {
        st.freed += st.current;
        st.current = 0;
    });
    gone.num_device_free += static_cast<int64_t>(s.segment[STOW_POOL_ALL].current);
    CDA::DeviceStats &r = retired_[pp->device];
    for (int k = 0; k < STOW_POOL_KINDS; k++) {
#define STOW_FOLD_(name, label)                      \
    r.name[k].peak += gone.name[k].peak;             \
    r.name[k].allocated += gone.name[k].allocated;   \
    r.name[k].freed += gone.name[k].freed;
        STOW_STAT_ARRAY_FIELDS(STOW_FOLD_)
#undef STOW_FOLD_
    }
    r.num_alloc_retries += gone.num_alloc_retries;
    r.num_ooms += gone.num_ooms;
    r.num_sync_all_streams += gone.num_sync_all_streams;
    r.num_device_alloc += gone.num_device_alloc;
    r.num_device_free += gone.num_device_free;
#if STOW_TORCH_2_15
    auto &mine = retired_by_pool_[pp->device][pp->id];
    for (int k = 0; k < STOW_POOL_KINDS; k++) {
        mine[k].peak += gone.reserved_bytes[k].peak;
        mine[k].allocated += gone.reserved_bytes[k].allocated - pp->reserved_base[k];
        mine[k].freed += gone.reserved_bytes[k].freed;
    }
#endif
    if (history_on_.load()) {
        /* Destroying it returns its segments unrecorded: returned first, they
         * have their segment_free entries (its last blocks may be freed after
         * its release emptied it). Its segment events would go with it: keep
         * them as history. */
        (void)stow_empty_cache(pp->pool);
        std::vector<Trace> kept;
        add_segment_traces_locked(kept, pp->pool, pp->device, pp->id, pp->source,
                                  pp->history_from);
        for (auto &t : kept)
            traces_[pp->device].push_back(std::move(t));
    }
    if (stow_pool_destroy(pp->pool) != STOW_OK)
        stow_pool_destroy_force(pp->pool);
    if (pp->sim)
        (void)stow_sim_destroy(pp->sim->inner);
    else
        stow_cuda_backend_destroy(pp->backend);
    pools_.erase({pp->device, pp->id});
    private_count_.fetch_sub(1);
}

void StowageAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                                          std::shared_ptr<CCA::CUDAAllocator> allocator)
{
    check_device(device);
    TORCH_CHECK(!allocator, "Stowage does not serve a torch.cuda.MemPool with an allocator of "
                            "its own (pool ", pool_name(mempool_id), "): under Stowage every "
                            "pool's memory comes from Stowage; create the MemPool without one");
    std::lock_guard<std::mutex> lock(mu_);
    create_or_incref_locked(device, mempool_id);
}

void StowageAllocator::beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                                           std::function<bool(cudaStream_t)> filter)
{
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto &c : captures_list_)
        TORCH_CHECK(!(c.device == device && c.id == mempool_id),
                    "beginAllocateToPool: already allocating to pool ", pool_name(mempool_id));
    create_or_incref_locked(device, mempool_id);
    captures_list_.push_back(Capture{device, mempool_id, std::move(filter)});
    captures_[device].fetch_add(1);
    captures_total_.fetch_add(1);
}

void StowageAllocator::endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id)
{
    check_device(device);
    std::vector<void *> held;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = std::find_if(captures_list_.begin(), captures_list_.end(),
                               [&](const Capture &c) {
                                   return c.device == device && c.id == mempool_id;
                               });
        TORCH_CHECK(it != captures_list_.end(), "endAllocateToPool: not allocating to pool ",
                    pool_name(mempool_id), " on device ", static_cast<int>(device));
        captures_list_.erase(it);
        captures_[device].fetch_sub(1);
        if (captures_total_.fetch_sub(1) == 1)
            held.swap(deferred_);
    }
    for (void *ptr : held)
        free_ptr(ptr);
}

void StowageAllocator::releasePool(c10::DeviceIndex device, MempoolId_t mempool_id)
{
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    PrivatePool *pp = find_pool_locked(device, mempool_id);
    TORCH_CHECK(pp, "Stowage: releasePool of pool ", pool_name(mempool_id), " on device ",
                static_cast<int>(device), ", which does not exist");
    TORCH_CHECK(pp->use_count > 0, "Stowage: pool ", pool_name(mempool_id),
                " released more often than used");
    if (--pp->use_count > 0)
        return;
    if (captures_[device].load() == 0) {
        stow_status_t st = stow_empty_cache(pp->pool);
        if (st != STOW_OK)
            TORCH_WARN("Stowage: returning the memory of pool ", pool_name(mempool_id),
                       " failed: ", stow_strerror(st));
    }
    retire_if_done_locked(pp);
}

int StowageAllocator::getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id)
{
    std::lock_guard<std::mutex> lock(mu_);
    PrivatePool *pp = find_pool_locked(device, mempool_id);
    return pp ? pp->use_count : 0;
}

void StowageAllocator::setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id,
                                   bool use_on_oom)
{
    std::lock_guard<std::mutex> lock(mu_);
    PrivatePool *pp = find_pool_locked(device, mempool_id);
    if (!pp) {
        /* ~MemPool turns it off; the pool may be gone by then. */
        TORCH_CHECK(!use_on_oom, "Stowage: no private pool ", pool_name(mempool_id),
                    " on device ", static_cast<int>(device));
        return;
    }
    pp->use_on_oom = use_on_oom;
}

std::vector<std::pair<uintptr_t, size_t>> StowageAllocator::live_blocks_locked(
    stow_pool_t *pool, std::map<uintptr_t, CheckpointBlock> *made)
{
    std::vector<std::pair<uintptr_t, size_t>> out;
    for (const auto &b : picture_of(pool).blocks) {
        if (b.state != STOW_SNAP_ALLOCATED)
            continue;
        out.emplace_back(static_cast<uintptr_t>(b.addr), static_cast<size_t>(b.size_bytes));
        if (made)
            (*made)[static_cast<uintptr_t>(b.addr)] =
                CheckpointBlock{static_cast<size_t>(b.requested_bytes), b.stream};
    }
    std::sort(out.begin(), out.end());
    return out;
}

bool StowageAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                                const std::unordered_set<void *> &expected)
{
    std::lock_guard<std::mutex> lock(mu_);
    PrivatePool *pp = find_pool_locked(device, mempool_id);
    TORCH_CHECK(pp, "Stowage: no private pool ", pool_name(mempool_id), " on device ",
                static_cast<int>(device));
    auto live = live_blocks_locked(pp->pool);
    if (live.size() != expected.size())
        return false;
    for (const auto &b : live)
        if (!expected.count(reinterpret_cast<void *>(b.first)))
            return false;
    return true;
}

std::shared_ptr<CCA::AllocatorState> StowageAllocator::getCheckpointState(c10::DeviceIndex device,
                                                                          MempoolId_t id)
{
    std::lock_guard<std::mutex> lock(mu_);
    PrivatePool *pp = find_pool_locked(device, id);
    TORCH_CHECK(pp, "Stowage: no private pool ", pool_name(id), " on device ",
                static_cast<int>(device), " to checkpoint");
    TORCH_CHECK(pp->use_count > 0, "Stowage: pool ", pool_name(id),
                " is released; a released pool is not checkpointed");
    auto state = std::make_shared<PoolState>();
    state->device = device;
    state->id = id;
    state->live = live_blocks_locked(pp->pool, &state->made);
    return state;
}

/* PyTorch's allocator frees the pool's blocks and allocates the checkpoint's
 * again at their addresses. Stowage keeps the blocks live at the checkpoint
 * that still are, frees the others, and makes those freed since again at
 * their addresses. */
CCA::CheckpointDelta StowageAllocator::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<CCA::AllocatorState> pps)
{
    auto state = std::dynamic_pointer_cast<PoolState>(pps);
    TORCH_CHECK(state, "Stowage: that checkpoint was not taken by Stowage");
    TORCH_CHECK(state->device == device, "Stowage: checkpoint of device ", state->device,
                " applied to device ", static_cast<int>(device));
    std::lock_guard<std::mutex> lock(mu_);
    PrivatePool *pp = find_pool_locked(device, state->id);
    TORCH_CHECK(pp, "Stowage: private pool ", pool_name(state->id), " is gone");
    std::map<uintptr_t, CheckpointBlock> now_made;
    auto now = live_blocks_locked(pp->pool, &now_made);
    std::vector<std::pair<uintptr_t, size_t>> missing;
    std::set_difference(state->live.begin(), state->live.end(), now.begin(), now.end(),
                        std::back_inserter(missing));
    /* The blocks live now and not at the checkpoint go first, so that the
     * checkpoint's blocks freed since can be made again at their addresses
     * (stow_pool_alloc_at); a restore that cannot make one undoes itself. */
    /* What the history keeps of each block the restore frees: the undo gives
     * it back with the block, whose later entries then name its stream and
     * its allocation's stack as before the restore. */
    std::unordered_map<uintptr_t, LiveBlock> kept;
    /* Makes block b of `from` again at its address, in the history too (with
     * what `kept` holds of it when undoing). */
    auto make_again = [&](const std::pair<uintptr_t, size_t> &b,
                          const std::map<uintptr_t, CheckpointBlock> &from, bool undoing) {
        auto it = from.find(b.first);
        CheckpointBlock cb = it != from.end() ? it->second : CheckpointBlock{b.second, 0};
        auto stream = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(cb.stream));
        void *p = reinterpret_cast<void *>(b.first);
        stow_status_t made_st = stow_pool_alloc_at(pp->pool, p,
                                                   cb.requested ? cb.requested : b.second,
                                                   reinterpret_cast<stow_stream_t>(stream));
        if (made_st != STOW_OK || !history_on_.load())
            return made_st;
        auto k = undoing ? kept.find(b.first) : kept.end();
        LiveBlock lb = k != kept.end() ? k->second : LiveBlock{nullptr, stream, device, pp->id};
        trace_locked(Action::ALLOC, device, b.first, cb.requested, stream, pp->id,
                     when_ >= CCA::RecordContext::ALLOC ? lb.context : nullptr);
        if (when_ != CCA::RecordContext::NEVER)
            live_[p] = std::move(lb);
        return made_st;
    };
    std::vector<std::pair<uintptr_t, size_t>> freed, made;
    std::pair<uintptr_t, size_t> failed{0, 0};
    const char *failed_to = "";
    stow_status_t st = STOW_OK;
    for (const auto &b : now) {
        if (std::binary_search(state->live.begin(), state->live.end(), b))
            continue;
        void *p = reinterpret_cast<void *>(b.first);
        auto lb = live_.find(p);
        if (lb != live_.end())
            kept[b.first] = lb->second;
        if (!free_in_locked(pp->pool, p, device, pp->id, now_made[b.first].requested)) {
            st = STOW_ENOTOWNED;
            failed = b;
            failed_to = "freed";
            break;
        }
        /* Freed here, not through free_slow: no later free of this address
         * is one of a block used on other streams. */
        if (stream_used_.erase(p))
            stream_used_count_.store(static_cast<int>(stream_used_.size()));
        freed.push_back(b);
    }
    for (size_t i = 0; st == STOW_OK && i < missing.size(); i++) {
        st = make_again(missing[i], state->made, false);
        if (st == STOW_OK) {
            made.push_back(missing[i]);
        } else {
            failed = missing[i];
            failed_to = "made again at its address: its bytes are not one free block its "
                        "stream may take (another block or a use on another stream holds them, "
                        "or the pool gave them back to the device)";
        }
    }
    if (st != STOW_OK) {
        for (const auto &m : made)
            (void)free_in_locked(pp->pool, reinterpret_cast<void *>(m.first), device, pp->id,
                                 state->made[m.first].requested);
        size_t undone = 0;
        for (const auto &f : freed)
            undone += make_again(f, now_made, true) == STOW_OK;
        TORCH_CHECK(false, "Stowage cannot restore private pool ", pool_name(state->id),
                    " to its checkpoint: the block of ", failed.second, " bytes at ",
                    reinterpret_cast<void *>(failed.first), " cannot be ", failed_to,
                    undone == freed.size() ? "; the pool is as it was"
                                           : "; blocks freed for the restore stay freed");
    }
    CCA::CheckpointDelta delta;
    c10::Device dev(c10::DeviceType::CUDA, device);
    for (const auto &b : now) {
        void *p = reinterpret_cast<void *>(b.first);
        delta.ptrs_freed.push_back(p);
        if (std::binary_search(state->live.begin(), state->live.end(), b))
            delta.dataptrs_allocd.emplace_back(p, p, &adapter_delete, dev);
    }
    for (const auto &m : made) {
        void *p = reinterpret_cast<void *>(m.first);
        delta.dataptrs_allocd.emplace_back(p, p, &adapter_delete, dev);
    }
    return delta;
}

/* ---- history and snapshots ---- */

std::shared_ptr<c10::GatheredContext> StowageAllocator::gather_context(CCA::RecordContext level)
{
    CCA::CreateContextFn fn;
    CCA::RecordContext when;
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn = recorder_;
        when = when_;
    }
    /* Outside the lock: the recorder takes the GIL. */
    if (!fn || when < level)
        return nullptr;
    return fn();
}

/* Adds an entry to device's history unless its action is skipped; whether it did.
 * Its seq, unless given, is the count of the pool's events when it is added:
 * after the pool call of an allocation (whose segment events come first). */
bool StowageAllocator::trace_locked(Action action, int device, size_t addr, size_t size,
                                    cudaStream_t stream, MempoolId_t pool,
                                    std::shared_ptr<c10::GatheredContext> context,
                                    int64_t time_us, uint64_t seq)
{
    if (!history_on_.load() || skip_.count(static_cast<int>(action)))
        return false;
    stow_pool_t *from = nullptr;
    uint64_t source = 0;
    if (pool == kDefaultPool) {
        from = stow_torch_pool(device);
    } else if (PrivatePool *pp = find_pool_locked(device, pool)) {
        from = pp->pool;
        source = pp->source;
    }
    if (seq == kSeqNow)
        seq = recorded_events(from);
    std::deque<Trace> &ring = traces_[device];
    ring.push_back(Trace{action, device, addr, size, stream, pool,
                         time_us >= 0 ? time_us : now_us(), source, seq, std::move(context),
                         tl_compile_context.empty() ? std::string() : tl_compile_context.back(),
                         user_metadata()});
    while (ring.size() > max_entries_)
        ring.pop_front();
    return true;
}

/* Starts a pool's recording for its segment events, unless it records already. */
void StowageAllocator::start_recording_locked(stow_pool_t *pool, bool *started)
{
    size_t count = 0;
    if (!pool || *started || stow_record_read(pool, nullptr, 0, &count, nullptr) == STOW_OK)
        return;
    size_t cap = std::min<size_t>(std::max<size_t>(4 * max_entries_, 1024), STOW_RECORD_EVENTS_MAX);
    *started = stow_record_start(pool, cap) == STOW_OK;
}

void StowageAllocator::recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                                     size_t alloc_trace_max_entries, CCA::RecordContext when,
                                     bool clearHistory,
                                     const std::vector<std::string> &skip_actions)
{
    static const std::pair<const char *, Action> names[] = {
        {"alloc", Action::ALLOC},
        {"free_requested", Action::FREE_REQUESTED},
        {"free_completed", Action::FREE_COMPLETED},
        {"segment_alloc", Action::SEGMENT_ALLOC},
        {"segment_free", Action::SEGMENT_FREE},
        {"segment_map", Action::SEGMENT_MAP},
        {"segment_unmap", Action::SEGMENT_UNMAP},
        {"snapshot", Action::SNAPSHOT},
        {"oom", Action::OOM},
#if STOW_TORCH_2_15
        {"annotate", Action::ANNOTATE},
#endif
    };
    std::set<int> skip;
    for (const auto &s : skip_actions) {
        auto it = std::find_if(std::begin(names), std::end(names),
                               [&](const auto &n) { return s == n.first; });
        TORCH_CHECK(it != std::end(names), "Unknown TraceEntry action: ", s);
        skip.insert(static_cast<int>(it->second));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (clearHistory || (enabled && !history_on_.load())) {
        for (auto &ring : traces_)
            ring.clear();
        annotations_.clear();
    }
    recorder_ = enabled ? context_recorder : nullptr;
    when_ = enabled ? when : CCA::RecordContext::NEVER;
    /* A stop keeps the history as the recording held it: its max_entries
     * and skipped actions stay, not the stop call's (PyTorch's defaults, no
     * limit and none skipped, would let the pools' recordings add segment
     * entries the recording had dropped or skipped). */
    if (enabled) {
        max_entries_ = std::max<size_t>(alloc_trace_max_entries, 1);
        skip_ = std::move(skip);
        uint64_t mask = devices_used_.load();
        for (int d = 0; d < kMaxDevices; d++)
            if ((mask >> d) & 1)
                start_recording_locked(stow_torch_pool(d), &recording_[d]);
        for (auto &entry : pools_)
            start_recording_locked(entry.second->pool, &entry.second->recording);
        if (!history_on_.load() || clearHistory) {
            /* A pool that recorded before the history began (or was cleared)
             * keeps its earlier events out of it; a recording started here or
             * later counts from 0. */
            for (int d = 0; d < kMaxDevices; d++)
                history_from_[d] = recorded_events(stow_torch_pool(d));
            for (auto &entry : pools_)
                entry.second->history_from = recorded_events(entry.second->pool);
        }
        history_on_.store(true);
        return;
    }
    if (history_on_.load() && !clearHistory) {
        /* The pools' segment events join the history before their recordings stop. */
        for (int d = 0; d < kMaxDevices; d++) {
            std::vector<Trace> all(traces_[d].begin(), traces_[d].end());
            add_device_segment_traces_locked(all, d);
            if (all.empty())
                continue;
            order_history(all);
            traces_[d].assign(all.begin(), all.end());
            while (traces_[d].size() > max_entries_)
                traces_[d].pop_front();
        }
    }
    history_on_.store(false);
    live_.clear();
    for (int d = 0; d < kMaxDevices; d++) {
        if (recording_[d] && stow_torch_pool(d))
            (void)stow_record_start(stow_torch_pool(d), 0);
        recording_[d] = false;
    }
    for (auto &entry : pools_) {
        if (entry.second->recording)
            (void)stow_record_start(entry.second->pool, 0);
        entry.second->recording = false;
    }
}

void StowageAllocator::recordAnnotation(const std::vector<std::pair<std::string, std::string>> &md)
{
    if (!history_on_.load())
        return;
    int device = 0;
    try {
        device = current_device();
    } catch (const c10::Error &) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    annotations_.push_back(Annotation{device, now_us(), md});
    while (annotations_.size() > max_entries_)
        annotations_.pop_front();
}

#if STOW_TORCH_2_15
/* An annotate entry for a live block: at its address, the annotation as its
 * metadata, the stack of the caller; nothing while no history is kept. */
void StowageAllocator::annotateMemory(const void *ptr, const std::string &metadata)
{
    if (!history_on_.load())
        return;
    auto context = gather_context(CCA::RecordContext::ALLOC);
    void *p = const_cast<void *>(ptr);
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::tuple<stow_pool_t *, int, MempoolId_t>> owners;
    for (auto &entry : pools_)
        owners.emplace_back(entry.second->pool, entry.second->device, entry.second->id);
    uint64_t mask = devices_used_.load();
    for (int d = 0; d < kMaxDevices; d++)
        if ((mask >> d) & 1)
            owners.emplace_back(stow_torch_pool(d), d, kDefaultPool);
    for (const auto &[pool, device, id] : owners) {
        size_t block = 0, requested = 0;
        if (!pool || stow_pool_block_size(pool, p, &block, &requested) != STOW_OK)
            continue;
        auto it = live_.find(p);
        cudaStream_t stream = it != live_.end() ? it->second.stream : nullptr;
        if (trace_locked(Action::ANNOTATE, device, reinterpret_cast<size_t>(p), requested,
                         stream, id, std::move(context)))
            traces_[device].back().user_metadata = metadata;
        return;
    }
    TORCH_CHECK(false, "Stowage: annotateMemory: no live allocation at ", ptr);
}
#endif

/* The segment events of a recording pool from its event number `from` on,
 * each with its number in the recording as its seq. */
void StowageAllocator::add_segment_traces_locked(std::vector<Trace> &out, stow_pool_t *pool,
                                                 int device, MempoolId_t id, uint64_t source,
                                                 uint64_t from)
{
    /* The kept events are the last `kept` of `recorded`, oldest first. The
     * device pool allocates outside mu_, so the counts are read around the
     * copy until none came between; failing that, the copy was taken at some
     * count between the two readings. */
    std::vector<stow_recorded_event_t> events;
    size_t count = 0;
    uint64_t start_ns = 0, first = 0;
    for (int tries = 0;; tries++) {
        uint64_t recorded = 0, kept = 0, recorded_after = 0, kept_after = 0;
        stow_record_counts(pool, &recorded, &kept);
        if (kept == 0)
            return;
        events.resize(static_cast<size_t>(kept) + 64);
        if (stow_record_read(pool, events.data(), events.size(), &count, &start_ns) != STOW_OK)
            return;
        stow_record_counts(pool, &recorded_after, &kept_after);
        if (recorded_after == kept_after) {
            first = 0; /* the ring never wrapped: event i is number i */
            break;
        }
        if ((recorded_after == recorded && count == kept) || tries == 3) {
            first = recorded > count ? recorded - count : 0;
            break;
        }
    }
    events.resize(std::min(count, events.size()));
    for (size_t i = 0; i < events.size(); i++) {
        const stow_recorded_event_t &e = events[i];
        uint64_t seq = first + i;
        Action a;
        switch (e.kind) {
        case STOW_EVENT_SEGMENT_RESERVE: a = Action::SEGMENT_ALLOC; break;
        case STOW_EVENT_SEGMENT_RELEASE: a = Action::SEGMENT_FREE; break;
        case STOW_EVENT_MAP: a = Action::SEGMENT_MAP; break;
        case STOW_EVENT_UNMAP: a = Action::SEGMENT_UNMAP; break;
        default: continue;
        }
        if (seq < from || skip_.count(static_cast<int>(a)))
            continue;
        out.push_back(Trace{a, device, static_cast<size_t>(e.addr),
                            static_cast<size_t>(e.size_bytes),
                            reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(e.stream)), id,
                            static_cast<int64_t>((start_ns + e.time_ns) / 1000), source, seq,
                            nullptr, std::string(), std::string()});
    }
}

/* The segment events of device's recording pools, the device pool's and the private ones'. */
void StowageAllocator::add_device_segment_traces_locked(std::vector<Trace> &out, int device)
{
    if (stow_pool_t *pool = stow_torch_pool(device))
        add_segment_traces_locked(out, pool, device, kDefaultPool, 0, history_from_[device]);
    for (auto &entry : pools_) {
        PrivatePool *pp = entry.second.get();
        if (pp->device == device)
            add_segment_traces_locked(out, pp->pool, device, pp->id, pp->source,
                                      pp->history_from);
    }
}

void StowageAllocator::add_segments_locked(CCA::SnapshotInfo &info, stow_pool_t *pool,
                                           int device, MempoolId_t id)
{
    PoolPicture pic = picture_of(pool);
    for (const auto &seg : pic.segments) {
        CDA::SegmentInfo si;
        si.device = static_cast<c10::DeviceIndex>(device);
        si.address = static_cast<size_t>(seg.addr);
        si.total_size = static_cast<size_t>(seg.size_bytes);
        si.is_large = seg.pool_kind == STOW_POOL_LARGE;
        si.is_expandable = seg.mapped_run != 0;
        si.owner_private_pool_id = id;
        for (uint64_t i = seg.first_block; i < seg.first_block + seg.block_count; i++) {
            if (i >= pic.blocks.size())
                break;
            const stow_snap_block_t &b = pic.blocks[i];
            CDA::BlockInfo bi;
            bi.size = static_cast<size_t>(b.size_bytes);
            bi.requested_size = static_cast<size_t>(b.requested_bytes);
            bi.allocated = b.state == STOW_SNAP_ALLOCATED;
            bi.active = b.state != STOW_SNAP_INACTIVE;
            if (bi.allocated) {
                si.allocated_size += bi.size;
                auto it = live_.find(reinterpret_cast<void *>(b.addr));
                if (it != live_.end())
                    bi.context_when_allocated = it->second.context;
            }
            if (bi.active) {
                si.active_size += bi.size;
                if (!si.stream)
                    si.stream = reinterpret_cast<void *>(static_cast<uintptr_t>(b.stream));
            }
            si.requested_size += bi.requested_size;
            si.blocks.push_back(std::move(bi));
        }
        info.segments.push_back(std::move(si));
    }
}

CCA::SnapshotInfo StowageAllocator::snapshot(MempoolId_t mempool_id, bool include_traces)
{
    CCA::SnapshotInfo info;
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t mask = devices_used_.load();
    int devices = 0;
    for (int d = 0; d < kMaxDevices; d++) {
        if (!((mask >> d) & 1) || !stow_torch_pool(d))
            continue;
        devices = d + 1;
        if (mempool_id == kDefaultPool)
            add_segments_locked(info, stow_torch_pool(d), d, kDefaultPool);
    }
    for (auto &entry : pools_) {
        PrivatePool *pp = entry.second.get();
        devices = std::max(devices, pp->device + 1);
        if (mempool_id == kDefaultPool || pp->id == mempool_id)
            add_segments_locked(info, pp->pool, pp->device, pp->id);
    }
    if (include_traces) {
        for (int d = 0; d < kMaxDevices; d++)
            if (!traces_[d].empty())
                devices = std::max(devices, d + 1);
        info.device_traces.resize(static_cast<size_t>(devices));
        for (int d = 0; d < devices; d++) {
            std::vector<Trace> merged(traces_[d].begin(), traces_[d].end());
            if (history_on_.load()) {
                /* Segment events come from the pools' own recordings. Once the
                 * history stops, traces_ holds them, in order already. */
                add_device_segment_traces_locked(merged, d);
                order_history(merged);
            }
            if (merged.size() > max_entries_) {
                auto drop = static_cast<std::ptrdiff_t>(merged.size() - max_entries_);
                merged.erase(merged.begin(), merged.begin() + drop);
            }
            auto &out = info.device_traces[static_cast<size_t>(d)];
            for (auto &t : merged) {
                CDA::TraceEntry te(t.action, static_cast<c10::DeviceIndex>(d), t.addr, t.size,
                                   t.stream, t.pool, 0, t.context, t.compile_context,
                                   t.user_metadata);
                te.time_.t_ = static_cast<time_t>(t.time_us);
                out.push_back(std::move(te));
            }
        }
        for (const auto &a : annotations_) {
            CDA::AnnotationEntry ae(static_cast<c10::DeviceIndex>(a.device), 0);
            ae.time_.t_ = static_cast<time_t>(a.time_us);
            for (const auto &kv : a.metadata)
                ae.recordUserMetadata(kv.first, kv.second);
            info.external_annotations.push_back(std::move(ae));
        }
    }
    stow_config_t cfg;
    char err[256];
    stow_config_default(&cfg);
    if (stow_config_from_env(&cfg, err, sizeof err) != STOW_OK)
        stow_config_default(&cfg);
    /* A device pool's configuration names the policy it took (auto resolves there). */
    for (int d = 0; d < kMaxDevices; d++)
        if (((mask >> d) & 1) && stow_torch_pool(d)) {
            stow_pool_config(stow_torch_pool(d), &cfg);
            break;
        }
    const char *conf = std::getenv("STOWAGE_CONF");
    info.config_metadata.last_allocator_settings = conf ? conf : "";
    info.config_metadata.garbage_collection_threshold = cfg.garbage_collection_threshold;
    info.config_metadata.max_split_size = cfg.max_split_size_bytes;
    info.config_metadata.expandable_segments = cfg.policy == STOW_POLICY_VMM;
    info.config_metadata.pinned_num_register_threads = 1;
    info.config_metadata.release_lock_on_malloc = false;
    info.config_metadata.pinned_use_host_register = false;
    info.config_metadata.graph_capture_record_stream_reuse = false;
#if STOW_TORCH_2_15
    /* The pinned host allocator's settings: that allocator stays PyTorch's. */
    using AAC = c10::CachingAllocator::AcceleratorAllocatorConfig;
    info.config_metadata.max_round_threshold = AAC::pinned_max_round_threshold();
    info.config_metadata.max_cached_size = AAC::pinned_max_cached_size();
#endif
    for (unsigned v : cfg.roundup_power2_divisions)
        info.config_metadata.roundup_power2_divisions.push_back(v);
    return info;
}

/* ---- for tests: back to the state after install ---- */

void StowageAllocator::reset_for_tests()
{
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &entry : pools_) {
        PrivatePool *pp = entry.second.get();
        stow_pool_destroy_force(pp->pool);
        if (pp->sim)
            (void)stow_sim_destroy(pp->sim->inner);
        else
            stow_cuda_backend_destroy(pp->backend);
    }
    pools_.clear();
    private_count_.store(0);
    captures_list_.clear();
    for (auto &c : captures_)
        c.store(0);
    captures_total_.store(0);
    stream_used_.clear();
    stream_used_count_.store(0);
    deferred_.clear();
    observers_.clear();
    user_metadata().clear();
#if STOW_TORCH_2_15
    graph_captures_.store(0);
#endif
    history_on_.store(false);
    recorder_ = nullptr;
    when_ = CCA::RecordContext::NEVER;
    skip_.clear();
    live_.clear();
    annotations_.clear();
    for (int d = 0; d < kMaxDevices; d++) {
        traces_[d].clear();
        recording_[d] = false;
        history_from_[d] = 0;
        fraction_[d] = 0.0;
        retired_[d] = CDA::DeviceStats();
#if STOW_TORCH_2_15
        retired_by_pool_[d].clear();
#endif
        reset_base_[d] = CDA::DeviceStats();
    }
    devices_used_.store(0);
    stow_torch_shutdown();
}

/* The installed adapter, never destroyed: tensors freed while the process
 * exits still reach it. */
std::shared_ptr<StowageAllocator> *g_holder = nullptr;

/* Copies text into why (when given) and returns status. */
int report(int status, char *why, size_t why_len, const std::string &text)
{
    if (why && why_len)
        std::snprintf(why, why_len, "%s", text.c_str());
    return status;
}

/* "2.11.0+cu130" -> "2.11" */
std::string major_minor(const std::string &v)
{
    size_t dot = v.find('.');
    if (dot == std::string::npos)
        return v;
    size_t end = v.find_first_not_of("0123456789", dot + 1);
    return v.substr(0, end == std::string::npos ? v.size() : end);
}

} // namespace

/* ======================================================================
 * The C ABI (python/stowage/torch.py). Every call returns a stow_status_t
 * value and writes the reason of a failure into why; none throws.
 * ====================================================================== */

/* The torch version whose interface this build implements ("2.11.0"). */
STOW_ADAPTER_API const char *stow_torch_adapter_torch_version(void) { return STOW_ADAPTER_TORCH; }

/*
 * Makes Stowage PyTorch's CUDA allocator. runtime_version is torch.__version__
 * of the process: a version whose major.minor differs from the build's is
 * refused (the interface's layout changes between minor versions). Refused
 * too once PyTorch's allocator has served (CUDA initialised). Pools on the
 * simulated device when STOWAGE_BACKEND=sim (tests: device and stream then
 * come from stow_torch_adapter_sim_select, never from CUDA).
 * Errors: STOW_EINVAL (version, already initialised), STOW_EBUSY (installed
 * already), STOW_EBACKEND (PyTorch refused).
 */
STOW_ADAPTER_API int stow_torch_adapter_install(const char *runtime_version, char *why,
                                                size_t why_len)
{
    std::string built = STOW_ADAPTER_TORCH;
    std::string runtime = runtime_version ? runtime_version : "";
    if (major_minor(runtime) != major_minor(built))
        return report(STOW_EINVAL, why, why_len,
                      "this Stowage adapter was built for torch " + built +
                          " and implements that version's CUDAAllocator interface; this process "
                          "runs torch " + runtime + ". Reinstall stowage against this torch "
                          "(pip install --no-build-isolation ./python)");
    if (g_holder)
        return report(STOW_EBUSY, why, why_len, "the Stowage adapter is installed already");
    try {
        CCA::CUDAAllocator *current = CCA::allocator.load();
        if (current && current->initialized())
            return report(STOW_EINVAL, why, why_len,
                          "PyTorch's CUDA allocator has already served (CUDA is initialised): "
                          "install Stowage before the first CUDA tensor");
        bool sim = std::strcmp(stow_torch_backend_name(), "sim") == 0;
        auto adapter = std::make_shared<StowageAllocator>(sim);
        g_adapter = adapter.get();
        torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(adapter);
        /* Code that asks c10 for the CUDA allocator (torch.accelerator,
         * storages made from Python) gets the same one. */
        c10::SetAllocator(c10::DeviceType::CUDA, adapter.get(), /*priority=*/1);
        g_holder = new std::shared_ptr<StowageAllocator>(std::move(adapter));
        return STOW_OK;
    } catch (const std::exception &e) {
        g_adapter = nullptr;
        return report(STOW_EBACKEND, why, why_len, e.what());
    }
}

/* 1 when installed in this process. */
STOW_ADAPTER_API int stow_torch_adapter_installed(void) { return g_holder ? 1 : 0; }

/*
 * Test hooks, on the simulated device only (STOW_EINVAL otherwise).
 * sim_select: the device and stream of the calling thread's next allocations.
 * record_history: recordHistory without stacks (PyTorch's
 * _record_memory_history initialises CUDA first, which a machine without a
 * GPU cannot); when: 0 never, 1 state, 2 alloc, 3 all; skip: comma-separated
 * action names or NULL.
 * hold / drop: a DataPtr from allocate(), kept in slot k until drop destroys
 * it (its deleter frees the block); record_stream: recordStream on slot k.
 * call: one method of the interface by name, through PyTorch's current
 * allocator (c10::cuda::CUDACachingAllocator::get()), for the methods no
 * Python binding reaches without a GPU; a, b: its arguments; the result, or
 * the error's text, in out.
 * reset: destroys every pool and forgets everything but the installation.
 */
STOW_ADAPTER_API int stow_torch_adapter_sim_select(int device, void *stream)
{
    if (!g_adapter || !g_adapter->sim())
        return STOW_EINVAL;
    g_adapter->select_sim(device, static_cast<cudaStream_t>(stream));
    return STOW_OK;
}

STOW_ADAPTER_API int stow_torch_adapter_record_history(int enabled, size_t max_entries, int when,
                                                       const char *skip, char *why,
                                                       size_t why_len)
{
    if (!g_adapter || !g_adapter->sim())
        return report(STOW_EINVAL, why, why_len, "not installed on the simulated device");
    std::vector<std::string> skips;
    for (const char *p = skip; p && *p;) {
        const char *comma = std::strchr(p, ',');
        skips.emplace_back(p, comma ? static_cast<size_t>(comma - p) : std::strlen(p));
        p = comma ? comma + 1 : nullptr;
    }
    try {
        g_adapter->recordHistory(enabled != 0, nullptr, max_entries,
                                 static_cast<CCA::RecordContext>(when), false, skips);
        return STOW_OK;
    } catch (const std::exception &e) {
        return report(STOW_EINVAL, why, why_len, e.what());
    }
}

namespace {
constexpr int kHeld = 64;
std::atomic<int> g_observed{0};          /* calls of the test observer */
std::string g_observed_args;             /* its last arguments */
c10::DataPtr *g_held = new c10::DataPtr[kHeld]; /* never destroyed, as g_holder */
#if STOW_TORCH_2_15
std::atomic<int> g_rejections{0};        /* calls of the test's rejection observer */
/* A stack recorder for the tests: an empty context, told apart from none. */
std::shared_ptr<c10::GatheredContext> test_context()
{
    return std::make_shared<c10::GatheredContext>();
}
#endif
} // namespace

STOW_ADAPTER_API int stow_torch_adapter_hold(int slot, size_t size, void **ptr_out, char *why,
                                             size_t why_len)
{
    if (!g_adapter || !g_adapter->sim() || slot < 0 || slot >= kHeld || !ptr_out)
        return report(STOW_EINVAL, why, why_len, "bad slot, or not on the simulated device");
    try {
        g_held[slot] = g_adapter->allocate(size);
        *ptr_out = g_held[slot].get();
        return STOW_OK;
    } catch (const c10::OutOfMemoryError &e) {
        return report(STOW_ENOMEM, why, why_len, e.what_without_backtrace());
    } catch (const std::exception &e) {
        return report(STOW_EBACKEND, why, why_len, e.what());
    }
}

STOW_ADAPTER_API int stow_torch_adapter_drop(int slot)
{
    if (!g_adapter || !g_adapter->sim() || slot < 0 || slot >= kHeld)
        return STOW_EINVAL;
    g_held[slot].clear();
    return STOW_OK;
}

STOW_ADAPTER_API int stow_torch_adapter_record_stream(int slot, void *stream, char *why,
                                                      size_t why_len)
{
    if (!g_adapter || !g_adapter->sim() || slot < 0 || slot >= kHeld)
        return report(STOW_EINVAL, why, why_len, "bad slot, or not on the simulated device");
    try {
        g_adapter->recordStream(g_held[slot],
                                c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream),
                                                                 g_held[slot].device().index()));
        return STOW_OK;
    } catch (const std::exception &e) {
        return report(STOW_EBACKEND, why, why_len, e.what());
    }
}

STOW_ADAPTER_API int stow_torch_adapter_reset(void)
{
    if (!g_adapter || !g_adapter->sim())
        return STOW_EINVAL;
    for (int k = 0; k < kHeld; k++)
        g_held[k].clear();
    g_adapter->reset_for_tests();
    return STOW_OK;
}

STOW_ADAPTER_API int stow_torch_adapter_call(const char *method, uint64_t a, uint64_t b, char *out,
                                             size_t out_len)
{
    if (!g_adapter || !g_adapter->sim() || !method)
        return report(STOW_EINVAL, out, out_len, "not installed on the simulated device");
    CCA::CUDAAllocator *alloc = CCA::get();
    auto dev = static_cast<c10::DeviceIndex>(a);
    MempoolId_t id{0, b};
    std::string m = method, result;
    try {
        if (m == "name") {
            result = alloc->name();
        } else if (m == "cacheInfo") {
            size_t largest = static_cast<size_t>(b);
            alloc->cacheInfo(dev, &largest);
            result = std::to_string(largest);
        } else if (m == "getBaseAllocation") {
            size_t size = 0;
            void *base = alloc->getBaseAllocation(reinterpret_cast<void *>(a), &size);
            result = std::to_string(reinterpret_cast<uintptr_t>(base)) + " " + std::to_string(size);
        } else if (m == "emptyCache") {
            alloc->emptyCache(id);
        } else if (m == "getPoolUseCount") {
            result = std::to_string(alloc->getPoolUseCount(dev, id));
        } else if (m == "createOrIncrefPool") {
            alloc->createOrIncrefPool(dev, id, nullptr);
        } else if (m == "createOrIncrefPoolWithAllocator") {
            alloc->createOrIncrefPool(dev, id, *g_holder);
        } else if (m == "setUseOnOOM") {
            alloc->setUseOnOOM(dev, id, true);
        } else if (m == "setNoSplit") {
            alloc->setNoSplit(dev, id);
        } else if (m == "shareIpcHandle") {
            (void)alloc->shareIpcHandle(reinterpret_cast<void *>(a));
        } else if (m == "getIpcDevPtr") {
            (void)alloc->getIpcDevPtr("handle");
        } else if (m == "attachAllocatorTraceTracker") {
            alloc->attachAllocatorTraceTracker([](const CDA::TraceEntry &) {});
        } else if (m == "enable") {
            alloc->enable(a != 0);
            result = alloc->isEnabled() ? "enabled" : "disabled";
        } else if (m == "initialized") {
            result = alloc->initialized() ? "1" : "0";
        } else if (m == "getExpandableSegmentSizes") {
            result = std::to_string(alloc->getExpandableSegmentSizes(dev).size());
        } else if (m == "getMemoryInfo") {
            auto info = alloc->getMemoryInfo(dev);
            result = std::to_string(info.first) + " " + std::to_string(info.second);
        } else if (m == "copy_data") {
            alloc->copy_data(nullptr, nullptr, 0);
        } else if (m == "enablePeerAccess") {
            alloc->enablePeerAccess(dev, static_cast<c10::DeviceIndex>(b));
        } else if (m == "raw_deleter") {
            result = alloc->raw_deleter() == &adapter_delete ? "adapter" : "other";
        } else if (m == "c10::GetAllocator") {
            result = c10::GetAllocator(c10::DeviceType::CUDA) == alloc ? "adapter" : "other";
        } else if (m == "isHistoryEnabled") {
            result = alloc->isHistoryEnabled() ? "1" : "0";
        } else if (m == "compileContext") {
            std::string ctx = "compiled_fn";
            alloc->pushCompileContext(ctx);
            void *p = alloc->raw_alloc_with_stream(static_cast<size_t>(b), nullptr);
            alloc->popCompileContext();
            alloc->raw_delete(p);
        } else if (m == "userMetadata") {
            alloc->setUserMetadata("step=" + std::to_string(b));
            result = alloc->getUserMetadata();
        } else if (m == "attachOutOfMemoryObserver") {
            alloc->attachOutOfMemoryObserver([](int64_t d, size_t size, size_t total, size_t free) {
                g_observed_args = std::to_string(d) + " " + std::to_string(size) + " " +
                                  std::to_string(total) + " " + std::to_string(free);
                g_observed.fetch_add(1);
            });
        } else if (m == "observed") {
            result = std::to_string(g_observed.load()) + " " + g_observed_args;
        } else if (m == "annotation") {
            alloc->recordAnnotation({{"name", "phase"}, {"stage", "START"}});
#if STOW_TORCH_2_15
        } else if (m == "markCaptureBegin") {
            alloc->markCaptureBegin(dev);
        } else if (m == "markCaptureEnd") {
            alloc->markCaptureEnd(dev);
        } else if (m == "recordHistoryWithContext") {
            alloc->recordHistory(true, &test_context, 10000, CCA::RecordContext::ALL, false, {});
        } else if (m == "getContextForPointer") {
            result = alloc->getContextForPointer(reinterpret_cast<void *>(a)) ? "context" : "none";
        } else if (m == "attachOomRejectionObserver") {
            alloc->attachOomRejectionObserver(
                [](int64_t, size_t, size_t, size_t) { g_rejections.fetch_add(1); });
        } else if (m == "rejections") {
            result = std::to_string(g_rejections.load());
        } else if (m == "allocateWithAddress") {
            /* Held in the last slot (stow_torch_adapter_drop frees it). */
            g_held[kHeld - 1] =
                alloc->allocateWithAddress(static_cast<size_t>(b), reinterpret_cast<void *>(a));
            result = std::to_string(reinterpret_cast<uintptr_t>(g_held[kHeld - 1].get()));
#endif
        } else {
            return report(STOW_EINVAL, out, out_len, "unknown method " + m);
        }
        return report(STOW_OK, out, out_len, result);
    } catch (const c10::Error &e) {
        return report(STOW_EBACKEND, out, out_len, e.what_without_backtrace());
    } catch (const std::exception &e) {
        return report(STOW_EBACKEND, out, out_len, e.what());
    }
}
