"""The short table of bench/gpu/torch_routes.py's results (run.sh part 8).

    python3 bench/gpu/routes_report.py DIR     # DIR/routes_mempool.json, routes_global.json
"""

import json
import os
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "out-gpu/results"
MiB = 1 << 20
rows = []
for route in ("mempool", "global"):
    try:
        with open(os.path.join(d, "routes_%s.json" % route)) as f:
            r = json.load(f)
    except OSError:
        rows.append((route, "(no results)", "", ""))
        continue
    for name, verdict in r["checks"].items():
        fig = dict(r["figures"].get(name, {}))
        seconds = fig.pop("seconds", "")
        keep = []
        for k in ("segments", "stowage_reserved", "stowage_segments_for_graphs", "replay_ms",
                  "eager_ms", "first_call_s", "steady_ms", "stowage_segments_during",
                  "max_abs_diff", "stowage_reserved_after_empty_cache",
                  "slot_closed_after_pool_end", "torch_snapshot", "plain", "explained",
                  "outcome", "viz_cli_stats_rc", "six_calls_s"):
            if k in fig:
                v = fig[k]
                if k.startswith("stowage_reserved"):
                    v = "%.0f MiB" % (v / MiB)
                keep.append("%s=%s" % (k, v))
        rows.append((route, name, verdict[:60], "%ss %s" % (seconds, ", ".join(keep))))
print("\n== PyTorch routes (bench/gpu/torch_routes.py; docs/torch.md)")
for route, name, verdict, figs in rows:
    print("  %-8s %-36s %-22s %s" % (route, name, verdict, figs))
