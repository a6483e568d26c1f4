#!/usr/bin/env python3
"""bench/varlen_traces.py: BERT-like masked-LM training traces with a random sequence length
every step (seeded).

    python3 bench/varlen_traces.py OUTDIR [--seeds 0:10] [--steps 24] [--min-len 32]
                                   [--max-len 512] [--tokens 12288] [--pad-to N]
                                   [--markers KEY]

Each seed draws the sequence length of every step uniformly from MIN_LEN..MAX_LEN, and the
batch is TOKENS // length, so that a step holds about as many tokens whatever its length, as a
length-bucketed data loader does. The trace is what a BERT-base masked-LM step (HF's eager
attention, fp32, AdamW with foreach) asks of PyTorch's allocator, tensor by tensor:

- the weights (embeddings, 12 layers of hidden 768 / 12 heads / FFN 3072, the MLM head with
  its decoder tied to the word embeddings) are allocated first and stay;
- forward allocates every op's output and frees each input once no later op reads it and no
  backward saved it: activations of batch x length x hidden (and x FFN), attention scores of
  batch x heads x length^2 (the scores, their scaled and masked copies, the probabilities, the
  dropout mask), the logits of batch x length x vocab;
- backward, in reverse, allocates the gradient of each input (summed where a tensor fed two
  ops), frees the output's gradient and what the op saved, and allocates each weight's
  gradient the first time it gets one;
- AdamW allocates its two moments per weight at the first step (they stay), and every step the
  temporaries of its foreach update, freed at once; then the gradients are freed (zero_grad to
  None) and the batch's inputs with them.

With --pad-to N each step's length is padded up to a multiple of N, as a bucketed loader pads
its batches. --markers KEY writes `m KEY` before each step; `{len}` in KEY becomes the step's
length, a key per shape bucket (docs/planned.md).

Written as OUTDIR/bert_varlen_sSEED.rep (docs/trace_format.md), with the lengths of its steps
printed. The same seed writes the same trace.
"""
import argparse
import os
import random
import sys

from long_run import valid_key  # the step-key rule
from random_loops import seed_range  # the same FIRST:END argument

F32 = 4
I64 = 8


class Tape:
    """Allocation events and the tensors live on the device."""

    def __init__(self):
        self.lines = []
        self.next_id = 0

    def alloc(self, size):
        ident = self.next_id
        self.next_id += 1
        self.lines.append("a %d %d 0" % (ident, max(1, int(size))))
        return ident

    def free(self, ident):
        self.lines.append("f %d" % ident)


class Tensor:
    __slots__ = ("size", "ident", "uses", "saved", "grad", "param", "needs_grad")

    def __init__(self, size, ident, needs_grad, param=False):
        self.size, self.ident = size, ident  # ident None once freed
        self.uses = 0        # forward ops still to read it
        self.saved = 0       # ops whose backward still needs it
        self.grad = None     # id of its gradient while one is held
        self.param = param
        self.needs_grad = needs_grad


class Graph:
    """Forward ops recorded as they run, then run backward in reverse."""

    def __init__(self, tape):
        self.tape = tape
        self.ops = []  # (inputs, outputs, saved)

    def tensor(self, size, needs_grad=True):
        return Tensor(size, self.tape.alloc(size), needs_grad)

    def _release(self, t):
        if t.ident is not None and not t.param and t.uses == 0 and t.saved == 0:
            self.tape.free(t.ident)
            t.ident = None

    def op(self, inputs, out_sizes, saved=(), extra_saved=()):
        """Runs one forward op: allocates its outputs (and extra saved buffers such as a
        dropout mask), then drops each input it was the last reader of."""
        outs = []
        for size in out_sizes:
            outs.append(self.tensor(size))
        extras = []
        for size in extra_saved:
            extras.append(self.tensor(size, needs_grad=False))
        keep = list(saved) + extras
        for t in keep:
            t.saved += 1
        self.ops.append((list(inputs), outs, keep))
        for t in inputs:
            t.uses -= 1
            self._release(t)
        return outs

    def use(self, t, n):
        """t will be read by n more forward ops."""
        t.uses += n
        return t

    def backward(self, loss, weight_grads):
        tape = self.tape
        loss.grad = tape.alloc(F32)
        for inputs, outs, keep in reversed(self.ops):
            if any(o.grad is not None for o in outs):
                for t in inputs:
                    if not t.needs_grad:
                        continue
                    g = tape.alloc(t.size)
                    if t.param:
                        if t.ident in weight_grads:  # accumulate into .grad
                            tape.free(g)
                        else:
                            weight_grads[t.ident] = g
                    elif t.grad is None:
                        t.grad = g
                    else:  # a second consumer: the sum replaces both
                        s = tape.alloc(t.size)
                        tape.free(t.grad)
                        tape.free(g)
                        t.grad = s
            for o in outs:
                if o.grad is not None:
                    tape.free(o.grad)
                    o.grad = None
            for t in keep:
                t.saved -= 1
                self._release(t)
            for o in outs:  # an output nothing read (the loss) or saved
                self._release(o)


class Bert:
    def __init__(self, tape, layers=12, hidden=768, heads=12, ffn=3072, vocab=30522,
                 max_pos=512):
        self.tape, self.layers, self.h, self.heads, self.ffn, self.vocab = \
            tape, layers, hidden, heads, ffn, vocab
        self.params = []

        def p(*shape):
            n = 1
            for d in shape:
                n *= d
            t = Tensor(n * F32, tape.alloc(n * F32), True, param=True)
            self.params.append(t)
            return t

        h = hidden
        self.word, self.pos, self.type = p(vocab, h), p(max_pos, h), p(2, h)
        self.emb_ln = (p(h), p(h))
        self.blocks = []
        for _ in range(layers):
            self.blocks.append({
                "q": (p(h, h), p(h)), "k": (p(h, h), p(h)), "v": (p(h, h), p(h)),
                "o": (p(h, h), p(h)), "ln1": (p(h), p(h)),
                "i": (p(ffn, h), p(ffn)), "out": (p(h, ffn), p(h)), "ln2": (p(h), p(h)),
            })
        self.head_dense, self.head_ln, self.dec_bias = (p(h, h), p(h)), (p(h), p(h)), p(vocab)
        self.moments = None

    def step(self, batch, length):
        tape, g, h = self.tape, Graph(self.tape), self.h
        tokens = batch * length
        act, wide = tokens * h * F32, tokens * self.ffn * F32
        scores = batch * self.heads * length * length * F32
        inputs = [tape.alloc(tokens * I64) for _ in range(3)]  # ids, attention mask, labels
        ext_mask = tape.alloc(batch * length * F32)  # (1 - mask) * -10000, [B,1,1,L]

        def linear(x, wb, out_size, reads=1):
            w, b = wb
            g.use(w, 1), g.use(b, 1)
            (y,) = g.op([x, w, b], [out_size], saved=[x, w])
            return g.use(y, reads)

        def layer_norm(x, wb, reads=1):
            w, b = wb
            g.use(w, 1), g.use(b, 1)
            y, mean, rstd = g.op([x, w, b], [act, tokens * F32, tokens * F32], saved=[x, w])
            for t in (mean, rstd):  # saved statistics, nothing reads them forward
                t.needs_grad = False
                t.saved += 1
                g.ops[-1][2].append(t)
            return g.use(y, reads)

        def dropout(x, size, reads=1):
            (y,) = g.op([x], [size], extra_saved=[size // F32])  # bool mask
            return g.use(y, reads)

        def pointwise(xs, size, saved=(), reads=1):
            (y,) = g.op(xs, [size], saved=saved)
            return g.use(y, reads)

        # Embeddings.
        g.use(self.word, 2), g.use(self.type, 1), g.use(self.pos, 1)
        (we,) = g.op([self.word], [act])
        (te,) = g.op([self.type], [act])
        g.use(we, 1), g.use(te, 1)
        x = pointwise([we, te], act)
        (pe,) = g.op([self.pos], [length * h * F32])
        g.use(pe, 1)
        x = pointwise([x, pe], act)  # embeddings + position embeddings
        x = layer_norm(x, self.emb_ln)
        x = dropout(x, act, reads=3)
        for index, blk in enumerate(self.blocks):
            q = linear(x, blk["q"], act)
            k = linear(x, blk["k"], act)
            v = linear(x, blk["v"], act)
            s = pointwise([q, k], scores, saved=[q, k])  # q @ k^T
            s = pointwise([s], scores)  # / sqrt(head size)
            s = pointwise([s], scores)  # + extended attention mask
            s = pointwise([s], scores, reads=1)
            g.ops[-1][2].append(s)  # softmax saves its output
            s.saved += 1
            s = dropout(s, scores)
            ctx = pointwise([s, v], act, saved=[s, v])  # probs @ v
            ctx = pointwise([ctx], act)  # permute().contiguous()
            a = linear(ctx, blk["o"], act)
            a = dropout(a, act)
            g.use(x, 1)
            r = pointwise([a, x], act)
            y = layer_norm(r, blk["ln1"], reads=2)
            i = linear(y, blk["i"], wide)
            i = pointwise([i], wide, saved=[i])  # gelu
            o = linear(i, blk["out"], act)
            o = dropout(o, act)
            r = pointwise([o, y], act)
            # Read by the next layer's q, k and v, or once by the head.
            x = layer_norm(r, blk["ln2"], reads=3 if index + 1 < len(self.blocks) else 1)
        # Masked-LM head, decoder tied to the word embeddings.
        d = linear(x, self.head_dense, act)
        d = pointwise([d], act, saved=[d])  # gelu
        d = layer_norm(d, self.head_ln)
        logits = linear(d, (self.word, self.dec_bias), tokens * self.vocab * F32)
        lsm = pointwise([logits], tokens * self.vocab * F32, reads=1)  # log_softmax
        g.ops[-1][2].append(lsm)
        lsm.saved += 1
        (loss,) = g.op([lsm], [F32])
        weight_grads = {}
        g.backward(loss, weight_grads)
        self.adamw(weight_grads)
        for ident in weight_grads.values():  # zero_grad(set_to_none=True)
            tape.free(ident)
        tape.free(ext_mask)
        for ident in inputs:
            tape.free(ident)

    def adamw(self, weight_grads):
        tape = self.tape
        if self.moments is None:
            self.moments = [(tape.alloc(p.size), tape.alloc(p.size)) for p in self.params]
        # foreach: exp_avg_sq.sqrt() for every weight, divided in place, then freed.
        temps = [tape.alloc(p.size) for p in self.params]
        for t in temps:
            tape.free(t)
        del weight_grads  # read only


def padded(length, pad_to):
    """length padded up to a multiple of pad_to (1: as it is), at most BERT's 512."""
    return min(512, -(-length // pad_to) * pad_to)


def trace_lines(seed, steps, min_len=32, max_len=512, tokens=12288, pad_to=1):
    """The .rep lines (header first), the step lengths of seed's run (padded to a multiple
    of pad_to, as a bucketed data loader pads), and the number of events before each step's
    end."""
    rng = random.Random(seed)
    lengths = [padded(rng.randint(min_len, max_len), pad_to) for _ in range(steps)]
    tape = Tape()
    model = Bert(tape)
    ends = []
    for length in lengths:
        model.step(max(1, tokens // length), length)
        ends.append(len(tape.lines))
    return ["%d %d" % (tape.next_id, len(tape.lines))] + tape.lines, lengths, ends


def with_markers(lines, ends, key, lengths):
    """lines (header first) with a marker `m KEY` before each step's first event (step
    markers are not events: the header stays); `{len}` in KEY becomes the step's length,
    a key per shape bucket."""
    starts = {0: 0, **{end: i + 1 for i, end in enumerate(ends[:-1])}}
    out = [lines[0]]
    for i, line in enumerate(lines[1:]):
        if i in starts:
            out.append("m " + key.replace("{len}", str(lengths[starts[i]])))
        out.append(line)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--seeds", type=seed_range, default=range(0, 10),
                    help="FIRST:END, END excluded (default 0:10)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--min-len", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=12288)
    ap.add_argument("--pad-to", type=int, default=1, metavar="N",
                    help="pad each step's length up to a multiple of N (default 1: none)")
    ap.add_argument("--markers", metavar="KEY",
                    help="write a step marker 'm KEY' before each step; {len} in KEY "
                         "becomes the step's length (a key per shape bucket)")
    args = ap.parse_args(argv)
    if args.markers is not None and not valid_key(args.markers.replace("{len}", "512")):
        ap.error("--markers: '%s' is not a step key (1-64 of A-Za-z0-9_.:/-)" % args.markers)
    if args.steps < 1:
        ap.error("--steps: at least 1, not %d" % args.steps)
    if not 1 <= args.min_len <= args.max_len <= 512:
        ap.error("--min-len, --max-len: 1 <= MIN <= MAX <= 512 (BERT's positions)")
    if args.tokens < 1:
        ap.error("--tokens: at least 1")
    if args.pad_to < 1:
        ap.error("--pad-to: at least 1, not %d" % args.pad_to)
    os.makedirs(args.outdir, exist_ok=True)
    for seed in args.seeds:
        lines, lengths, ends = trace_lines(seed, args.steps, args.min_len, args.max_len,
                                           args.tokens, args.pad_to)
        if args.markers:
            lines = with_markers(lines, ends, args.markers, lengths)
        path = os.path.join(args.outdir, "bert_varlen_s%d.rep" % seed)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print("%s: lengths %s" % (path, " ".join(map(str, lengths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
