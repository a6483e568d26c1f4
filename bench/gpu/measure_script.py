"""Runs a PyTorch script unmodified on the GPU and prints, as the last line of standard output,
one JSON object of its peaks at exit:

    python3 bench/gpu/measure_script.py SCRIPT [ARGS...]
    {"script": ..., "peak_allocated_bytes": N, "peak_reserved_bytes": N, "alloc_conf": ...,
     "device": ..., "seconds": S}

The script runs as __main__ (runpy, its own sys.argv and sys.path[0]), under whatever
PYTORCH_CUDA_ALLOC_CONF the environment sets; the figures are torch.cuda.max_memory_allocated()
and max_memory_reserved() once it returns. Exit status 1 (no figures) if it raised.
"""

import json
import os
import runpy
import sys
import time


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2 if not argv else 0
    script = argv[0]
    if not os.path.isfile(script):
        sys.stderr.write("measure_script: %s: no such file\n" % script)
        return 2
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    t0 = time.time()
    runpy.run_path(script, run_name="__main__")
    seconds = time.time() - t0
    import torch
    torch.cuda.synchronize()
    sys.stdout.flush()
    print(json.dumps({"script": script,
                      "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                      "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                      "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                      "device": torch.cuda.get_device_name(0),
                      "seconds": round(seconds, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
