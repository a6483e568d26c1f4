/*
 * bench/gpu/sampler.c: a sampling profiler to preload, for machines without
 * perf (the GPU machine has none), so that where the host time goes can be
 * compared across machines (docs/benchmarks.md, GPU runs).
 *
 *   gcc -O2 -fPIC -shared bench/gpu/sampler.c -o sampler.so -lrt
 *   STOW_SAMPLER_OUT=prof.txt STOW_SAMPLER_HZ=20000 LD_PRELOAD=./sampler.so PROGRAM...
 *
 * A POSIX timer on CLOCK_MONOTONIC (high resolution, unlike ITIMER_PROF's
 * scheduler ticks) signals the main thread STOW_SAMPLER_HZ times a second
 * (10,000 by default, 1 to 100,000; anything else is refused, no sampling);
 * the handler stores the interrupted instruction pointer in a fixed buffer
 * (nothing else: it runs inside the allocator). At exit the buffer goes to
 * STOW_SAMPLER_OUT as "pc HEX" lines, after the process's /proc/self/maps as
 * "map LINE" lines, so that bench/gpu/profile_report.py can resolve the
 * addresses on another machine against the same binaries (addr2line).
 * Wall-clock sampling of one busy thread: a sample is a slice of its time,
 * whatever it waits on (cache misses included, which is the point).
 * x86-64 Linux only.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define MAX_SAMPLES (1u << 22)

static uintptr_t *samples;
static volatile size_t sample_count;
static volatile size_t samples_dropped;
static timer_t timer;
static const char *out_path;

static void on_tick(int sig, siginfo_t *info, void *uc_void)
{
    (void)sig;
    (void)info;
    ucontext_t *uc = uc_void;
    size_t n = sample_count;
    if (n < MAX_SAMPLES) {
        samples[n] = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
        sample_count = n + 1;
    } else {
        samples_dropped = samples_dropped + 1;
    }
}

static void write_out(void)
{
    timer_delete(timer);
    FILE *f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "sampler: cannot write %s: ", out_path);
        perror(NULL);
        return;
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps))
        fprintf(f, "map %s", line);
    if (maps)
        fclose(maps);
    for (size_t i = 0; i < sample_count; i++)
        fprintf(f, "pc %lx\n", (unsigned long)samples[i]);
    if (fclose(f) != 0) {
        fprintf(stderr, "sampler: writing %s failed: ", out_path);
        perror(NULL);
        return;
    }
    fprintf(stderr, "sampler: %zu samples -> %s\n", (size_t)sample_count, out_path);
    if (samples_dropped)
        fprintf(stderr, "sampler: %zu more samples dropped (buffer full)\n",
                (size_t)samples_dropped);
}

__attribute__((constructor)) static void start(void)
{
    out_path = getenv("STOW_SAMPLER_OUT");
    if (!out_path)
        return;
    const char *hz_text = getenv("STOW_SAMPLER_HZ");
    char *end = NULL;
    long hz = hz_text ? strtol(hz_text, &end, 10) : 10000;
    if (hz_text && (end == hz_text || *end || hz < 1 || hz > 100000)) {
        fprintf(stderr, "sampler: STOW_SAMPLER_HZ '%s' is not 1..100000; not sampling\n", hz_text);
        return;
    }
    samples = calloc(MAX_SAMPLES, sizeof *samples);
    if (!samples) {
        fprintf(stderr, "sampler: no memory for the sample buffer; not sampling\n");
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_tick;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, NULL);
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer) != 0) {
        perror("sampler: timer_create");
        return;
    }
    long period_ns = 1000000000L / hz;
    struct itimerspec its = {{0, period_ns}, {0, period_ns}};
    timer_settime(timer, 0, &its, NULL);
    atexit(write_out);
}
