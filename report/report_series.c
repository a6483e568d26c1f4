/*
 * report/report_series.c: min/max downsampling of per-event series for the
 * report's charts (contract: report/report.h). A bucket keeps both extremes,
 * so a drawn curve never hides a peak however many events share a pixel.
 */
#include "report/report.h"

size_t stow__series_downsample(const uint64_t *values, size_t n, size_t max_buckets,
                               stow_bucket_t *out)
{
    if (!n || !max_buckets)
        return 0;
    size_t width = (n + max_buckets - 1) / max_buckets; /* ceil: never more buckets */
    size_t count = 0;
    for (size_t first = 0; first < n; first += width) {
        size_t end = first + width < n ? first + width : n;
        uint64_t lo = values[first], hi = values[first];
        for (size_t i = first + 1; i < end; i++) {
            if (values[i] < lo)
                lo = values[i];
            if (values[i] > hi)
                hi = values[i];
        }
        out[count++] = (stow_bucket_t){first, end - first, lo, hi};
    }
    return count;
}
