"""bench/gpu/record_unseen.py: record workloads the PyTorch models were never tuned on.

usage: python3 bench/gpu/record_unseen.py WORKLOAD CONFIG OUTDIR
    WORKLOAD  one of WORKLOADS below (or "list" to print them)
    CONFIG    native: PyTorch's default allocator, with its allocation history recorded;
              writes OUTDIR/WORKLOAD.rep (the trace format of docs/trace_format.md),
              OUTDIR/WORKLOAD.native.json and OUTDIR/WORKLOAD.pickle.gz (the memory snapshot,
              without stack frames or free requests: PyTorch's own cudaMalloc calls, for
              bench/snapshot_check.py)
              expandable: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, no history;
              writes OUTDIR/WORKLOAD.expandable.json
Each JSON holds the workload, config, torch version and PyTorch's own max_memory_reserved and
max_memory_allocated. bench/model_check.py then replays every WORKLOAD.rep under the `pytorch` and
`pytorch-expandable` models and compares their peak reserved bytes with these (the models
must hold within 1% on traces they were not tuned on); bench/snapshot_check.py compares
the `pytorch` model with each WORKLOAD.pickle.gz call by call.

The five shared traces (../shared/traces) are GPT-2 small training at batch 8 x 1024, ResNet-50
at 128 x 224, multiscale ResNet-50, ViT-B/16 at 64 and GPT-2 generation; the workloads here
differ in model, shape or schedule. One workload per process: the recorded trace starts from an
empty allocator.
"""
import gzip
import json
import os
import pickle
import random
import sys
import time

AUTOCAST = dict(device_type="cuda", dtype=None)  # dtype set once torch is imported
HISTORY_ENTRIES = 4_000_000
# Step markers (docs/trace_format.md): (microseconds since the epoch, key) at the top of each
# training iteration, the clock PyTorch's device trace stamps its events with (time_us).
STEP_MARKS = []


def mark_step(key):
    STEP_MARKS.append((time.time_ns() // 1000, key))


def _train(model, batches, steps, optimizer):
    import torch
    for step in range(steps):
        mark_step("train")
        x, y = batches(step)
        with torch.autocast(**AUTOCAST):
            loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _lm_train(model, vocab, batch, tokens, steps=4):
    """A language model trained on random tokens (labels = inputs), AdamW."""
    import torch
    m = model.cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def batches(_):
        x = torch.randint(0, vocab, (batch, tokens), device="cuda")
        return x, x
    _train(lambda x, y: m(input_ids=x, labels=y).loss, batches, steps, opt)


def gpt2_medium_train():
    """GPT-2 medium (24 layers, 1024 wide), batch 2 x 1024 tokens, AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel
    _lm_train(GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16)), 50257, 2, 1024)


def gpt2_short_train():
    """GPT-2 small at batch 16 x 256 tokens (the shared trace is 8 x 1024), AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel
    _lm_train(GPT2LMHeadModel(GPT2Config()), 50257, 16, 256)


def bert_train():
    """BERT-base masked LM from its config, batch 16 x 256 tokens, AdamW."""
    from transformers import BertConfig, BertForMaskedLM
    _lm_train(BertForMaskedLM(BertConfig()), 30522, 16, 256)


def convnext_train():
    """timm ConvNeXt-Tiny, batch 96 at 224, channels_last, SGD with momentum."""
    import timm
    import torch
    m = timm.create_model("convnext_tiny", pretrained=False).cuda().to(
        memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    def batch(_):
        x = torch.randn(96, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        return x, torch.randint(0, 1000, (96,), device="cuda")
    _train(lambda x, y: torch.nn.functional.cross_entropy(m(x), y), batch, 4, opt)


def resnet101_multiscale_train():
    """torchvision ResNet-101, a new batch size and image size every step (seeded)."""
    import torch
    import torchvision
    m = torchvision.models.resnet101().cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    rng = random.Random(11)

    def batch(_):
        s, b = rng.choice(range(128, 321, 32)), rng.choice([16, 24, 40])
        x = torch.randn(b, 3, s, s, device="cuda")
        return x, torch.randint(0, 1000, (b,), device="cuda")
    _train(lambda x, y: torch.nn.functional.cross_entropy(m(x), y), batch, 8, opt)


def gpt2_generate_batches():
    """GPT-2 small in fp16 generating with other batch sizes, prompts and lengths (seed 7)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config()).cuda().eval().half()
    rng = random.Random(7)
    with torch.no_grad():
        for _ in range(5):
            b, p, n = rng.choice([2, 6, 12, 24]), rng.randint(32, 384), rng.randint(48, 160)
            x = torch.randint(0, 50257, (b, p), device="cuda")
            m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                       min_new_tokens=n, do_sample=False, pad_token_id=0)


WORKLOADS = {f.__name__: f for f in (gpt2_medium_train, gpt2_short_train, bert_train,
                                     convnext_train, resnet101_multiscale_train,
                                     gpt2_generate_batches)}


def write_rep(events, path, marks=()):
    """PyTorch's device trace as a replay file: 'a ID SIZE STREAM' and 'f ID', dense ids.

    An allocation is live from its 'alloc' event to its 'free_completed' one (PyTorch frees a
    block for reuse there; 'free_requested' only starts waiting for other streams). Blocks
    still live at the end are left live, as the replay expects. marks: (time_us, key) step
    markers, in time order; each becomes 'm KEY' before the first event stamped at or after it
    (events without a time_us stamp get no marker). Returns the counts and the peak of the live
    bytes.
    """
    ids, sizes, streams, lines = {}, {}, {}, []
    live = peak = 0
    marks = list(marks)
    for e in events:
        while marks and "time_us" in e and e["time_us"] >= marks[0][0]:
            lines.append(f"m {marks.pop(0)[1]}")
        action = e.get("action")
        if action == "alloc":
            i = len(sizes)
            ids[e["addr"]] = i
            sizes[i] = e["size"]
            s = streams.setdefault(e.get("stream", 0), len(streams))
            lines.append(f"a {i} {e['size']} {s}")
            live += e["size"]
            peak = max(peak, live)
        elif action == "free_completed" and e["addr"] in ids:
            i = ids.pop(e["addr"])
            lines.append(f"f {i}")
            live -= sizes[i]
    events_written = sum(1 for line in lines if line[0] in "af")
    with open(path, "w") as f:
        f.write(f"{len(sizes)} {events_written}\n")
        f.write("\n".join(lines) + "\n")
    return dict(events=events_written, allocations=len(sizes), streams=len(streams),
                trace_peak_live_bytes=peak)


def write_snapshot(snapshot, path):
    """The snapshot as bench/snapshot_check.py reads it, gzip'ed, without what it does not use:
    stack frames, times and 'free_requested' entries (the trace has 'free_completed')."""
    entry_keys = ("action", "addr", "size", "stream")
    traces = [[{k: e[k] for k in entry_keys if k in e} for e in (t or [])
               if e.get("action") != "free_requested"]
              for t in snapshot.get("device_traces") or []]
    segments = []
    for s in snapshot.get("segments") or []:
        seg = {k: s[k] for k in ("device", "address", "total_size", "stream", "segment_type",
                                 "segment_pool_id", "is_expandable") if k in s}
        seg["blocks"] = [{k: b[k] for k in ("address", "size", "requested_size", "state")
                          if k in b} for b in s.get("blocks") or []]
        segments.append(seg)
    with gzip.open(path, "wb") as f:
        pickle.dump({"segments": segments, "device_traces": traces}, f, protocol=4)


def main(argv):
    if len(argv) == 2 and argv[1] == "list":
        print("\n".join(WORKLOADS))
        return 0
    if len(argv) != 4 or argv[1] not in WORKLOADS or argv[2] not in ("native", "expandable"):
        print(__doc__, file=sys.stderr)
        return 2
    name, config, outdir = argv[1:]
    if config == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch
    AUTOCAST["dtype"] = torch.bfloat16
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    result = dict(workload=name, config=config, torch=torch.__version__)
    if config == "native":
        try:  # no stack context: what the trace needs, at the least cost
            torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                     max_entries=HISTORY_ENTRIES)
        except TypeError:  # older signature
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
    torch.cuda.synchronize()
    t0 = time.time()
    WORKLOADS[name]()
    torch.cuda.synchronize()
    result["wall_s"] = round(time.time() - t0, 2)
    result["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    result["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    if config == "native":
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        traces = snapshot.get("device_traces") or [[]]
        result.update(write_rep(traces[torch.cuda.current_device()],
                                os.path.join(outdir, f"{name}.rep"), STEP_MARKS))
        # The history ring holds max_entries events: a full ring lost the first ones.
        result["history_full"] = len(traces[torch.cuda.current_device()]) >= HISTORY_ENTRIES
        try:  # the trace and the peaks above matter more: keep them if this fails
            write_snapshot(snapshot, os.path.join(outdir, f"{name}.pickle.gz"))
        except Exception as exc:  # noqa: BLE001
            result["snapshot_error"] = repr(exc)
    with open(os.path.join(outdir, f"{name}.{config}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{name} {config}: max reserved {result['max_reserved_bytes']} B, "
          f"max allocated {result['max_allocated_bytes']} B, {result['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
