#!/usr/bin/env python3
"""bench/synth_loops.py: two training loops of the shapes planned steps are for,
written as traces (docs/trace_format.md), with or without step markers.

    python3 bench/synth_loops.py OUTDIR [--steps 40] [--markers KEY] [--seed 0]

- ckpt_llama.rep: a decoder of 8 layers (hidden 2048, FFN 5632, bf16, batch 4 x
  2048 tokens) with gradient checkpointing and AdamW: weights, gradients and two
  optimizer states stay; per step each layer's input is kept, the layer is run
  again in backward (its activations allocated, then freed in reverse), and the
  weight gradients are accumulated into blocks that stay.
- varlen_bert.rep: a BERT-base masked-LM step (12 layers, hidden 768, fp32)
  whose sequence length L is drawn every step from 32-512 (seeded), with batch =
  12288 // L: the activations are about the same size every step, the
  attention scores (batch x 12 heads x L x L) change with L; gradients are
  freed at the step's end (zero_grad with set_to_none).

With --markers KEY, `m KEY` comes before each step's first event, as a loop
that calls stowage.torch.step(KEY) at the top of each iteration records it.
These are the runs the goals of docs/planned.md were checked on besides the
shared traces; their sizes are from the models' shapes, not from a recording.
"""
import argparse
import os
import random
import sys


class Trace:
    def __init__(self, marker):
        self.lines, self.next_id, self.marker = [], 0, marker

    def alloc(self, size):
        i = self.next_id
        self.next_id += 1
        self.lines.append("a %d %d 0" % (i, max(1, int(size))))
        return i

    def free(self, i):
        self.lines.append("f %d" % i)

    def step(self):
        if self.marker:
            self.lines.append("m %s" % self.marker)

    def write(self, path):
        events = sum(1 for l in self.lines if l[0] in "af")
        with open(path, "w") as f:
            f.write("%d %d\n" % (self.next_id, events))
            f.write("\n".join(self.lines) + "\n")


def ckpt_llama(steps, marker):
    t = Trace(marker)
    hid, ffn, layers, vocab, tokens, bf16 = 2048, 5632, 8, 32000, 4 * 2048, 2
    shapes = []
    for _ in range(layers):
        shapes += [hid * 3 * hid, hid * hid, hid * ffn * 2, ffn * hid, hid, hid]
    shapes += [vocab * hid, hid]
    weights = [t.alloc(n * bf16) for n in shapes]
    grads = [t.alloc(n * 4) for n in shapes]      # fp32 gradient accumulators
    adam = [t.alloc(n * 4) for n in shapes for _ in range(2)]
    act = tokens * hid * bf16
    for _ in range(steps):
        t.step()
        x = t.alloc(tokens * 8)                   # input ids
        h = t.alloc(act)
        kept = []
        for _ in range(layers):                   # forward: only each layer's input stays
            kept.append(h)
            tmp = [t.alloc(act * 3), t.alloc(tokens * 16 * 4 * 4), t.alloc(act),
                   t.alloc(tokens * ffn * bf16 * 2), t.alloc(tokens * ffn * bf16)]
            h = t.alloc(act)
            for b in reversed(tmp):
                t.free(b)
        logits = t.alloc(tokens * vocab * bf16)
        loss = t.alloc(4)
        dlogits = t.alloc(tokens * vocab * bf16)
        t.free(logits)
        dh = t.alloc(act)
        t.free(dlogits)
        t.free(h)
        for layer in reversed(range(layers)):     # backward: recompute, then gradients
            re = [t.alloc(act * 3), t.alloc(tokens * 16 * 4 * 4), t.alloc(act),
                  t.alloc(tokens * ffn * bf16 * 2), t.alloc(tokens * ffn * bf16)]
            g = [t.alloc(tokens * ffn * bf16 * 2), t.alloc(tokens * ffn * bf16),
                 t.alloc(act * 3)]
            for w in range(6):                    # a weight gradient, added to its block
                tmp = t.alloc(shapes[layer * 6 + w] * bf16)
                t.free(tmp)
            for b in reversed(g):
                t.free(b)
            for b in reversed(re):
                t.free(b)
            ndh = t.alloc(act)
            t.free(dh)
            dh = ndh
            t.free(kept.pop())
        t.free(dh)
        t.free(loss)
        t.free(x)
        for n in shapes[::7]:                     # AdamW's temporaries (foreach chunks)
            tmp = t.alloc(n * 4)
            t.free(tmp)
    for b in weights + grads + adam:
        t.free(b)
    return t


def varlen_bert(steps, marker, seed):
    rng = random.Random(seed)
    t = Trace(marker)
    hid, ffn, layers, heads, vocab, f32 = 768, 3072, 12, 12, 30522, 4
    shapes = []
    for _ in range(layers):
        shapes += [hid * 3 * hid, 3 * hid, hid * hid, hid, hid * ffn, ffn, ffn * hid, hid,
                   hid, hid, hid, hid]
    shapes += [vocab * hid, 512 * hid, hid]
    weights = [t.alloc(n * f32) for n in shapes]
    adam = [t.alloc(n * f32) for n in shapes for _ in range(2)]
    for _ in range(steps):
        length = rng.randint(32, 512)
        batch = 12288 // length
        tok = batch * length
        t.step()
        ids = t.alloc(tok * 8)
        h = t.alloc(tok * hid * f32)
        saved = []
        for _ in range(layers):
            qkv = t.alloc(tok * 3 * hid * f32)
            scores = t.alloc(batch * heads * length * length * f32)
            probs = t.alloc(batch * heads * length * length * f32)
            ctx = t.alloc(tok * hid * f32)
            a = t.alloc(tok * hid * f32)
            f1 = t.alloc(tok * ffn * f32)
            f2 = t.alloc(tok * ffn * f32)
            out = t.alloc(tok * hid * f32)
            t.free(scores)
            saved.append([qkv, probs, ctx, a, f1, f2, h])
            h = out
        logits = t.alloc(tok * vocab * f32 // 8)  # masked positions only
        dlog = t.alloc(tok * vocab * f32 // 8)
        t.free(logits)
        grads = []
        dh = t.alloc(tok * hid * f32)
        t.free(dlog)
        t.free(h)
        for layer in reversed(range(layers)):
            d1 = t.alloc(tok * ffn * f32)
            d2 = t.alloc(tok * hid * f32)
            dsc = t.alloc(batch * heads * length * length * f32)
            for w in range(12):
                grads.append(t.alloc(shapes[layer * 12 + w] * f32))
            t.free(dsc)
            t.free(d1)
            for b in reversed(saved.pop()):
                t.free(b)
            t.free(dh)
            dh = d2
        t.free(dh)
        t.free(ids)
        for g in grads:                           # zero_grad(set_to_none=True)
            t.free(g)
    for b in weights + adam:
        t.free(b)
    return t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--markers", metavar="KEY")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps: at least 1, not %d" % args.steps)
    os.makedirs(args.outdir, exist_ok=True)
    ckpt_llama(args.steps, args.markers).write(os.path.join(args.outdir, "ckpt_llama.rep"))
    varlen_bert(args.steps, args.markers, args.seed).write(
        os.path.join(args.outdir, "varlen_bert.rep"))
    print("wrote ckpt_llama.rep and varlen_bert.rep to %s" % args.outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
