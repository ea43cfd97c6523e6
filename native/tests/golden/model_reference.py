#!/usr/bin/env python3
"""Independent reference for the MoE policy: a scalar reverse-mode autograd in plain
Python (float64, no numpy) evaluates the model as written in docs/native-model.md and
writes parameters, inputs, logits, loss and every parameter gradient for a fixed tiny
config to model_tiny.golden. native/tests/model_golden_test.cc compares against it.

Usage: python3 model_reference.py [output path]   (default: next to this script)
"""
import math
import os
import sys

# ---------------------------------------------------------------------------
# scalar autograd


class V:
    __slots__ = ("v", "g", "parents")

    def __init__(self, v, parents=()):
        self.v = v
        self.g = 0.0
        self.parents = parents  # tuple of (node, local derivative)

    def __add__(self, o):
        o = o if isinstance(o, V) else V(o)
        return V(self.v + o.v, ((self, 1.0), (o, 1.0)))

    __radd__ = __add__

    def __mul__(self, o):
        o = o if isinstance(o, V) else V(o)
        return V(self.v * o.v, ((self, o.v), (o, self.v)))

    __rmul__ = __mul__

    def __neg__(self):
        return self * -1.0

    def __sub__(self, o):
        return self + (-o if isinstance(o, V) else V(-o))

    def __rsub__(self, o):
        return V(o) - self

    def __truediv__(self, o):
        o = o if isinstance(o, V) else V(o)
        return self * o.pow(-1.0)

    def pow(self, p):
        return V(self.v ** p, ((self, p * self.v ** (p - 1)),))

    def exp(self):
        e = math.exp(self.v)
        return V(e, ((self, e),))

    def log(self):
        return V(math.log(self.v), ((self, 1.0 / self.v),))


def vsum(xs):
    total = V(0.0)
    # one n-ary node keeps the graph shallow
    return V(sum(x.v for x in xs), tuple((x, 1.0) for x in xs)) if xs else total


def backward(root):
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for p, _ in node.parents:
            if id(p) not in seen:
                stack.append((p, False))
    root.g = 1.0
    for node in reversed(order):
        for p, d in node.parents:
            p.g += d * node.g


# ---------------------------------------------------------------------------
# the fixed tiny problem

CFG = dict(vocab_size=11, max_seq_len=8, dim=8, num_layers=2, num_heads=2, num_experts=4,
           top_k=2, expert_dim=6, norm_eps=1e-5)
B, T = 2, 6
TOKENS = [[1, 4, 7, 2, 9, 3], [5, 5, 10, 0, 0, 0]]
LENGTHS = [6, 3]
AUX_WEIGHT, Z_WEIGHT = 0.1, 0.01


def lcg_normals(seed):
    """Deterministic N(0,1) stream: 64-bit LCG + Box-Muller (own generator, no library)."""
    state = seed

    def uniform():
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return ((state >> 11) + 1) / float(1 << 53)

    while True:
        u1, u2 = uniform(), uniform()
        r = math.sqrt(-2.0 * math.log(u1))
        yield r * math.cos(2 * math.pi * u2)
        yield r * math.sin(2 * math.pi * u2)


def param_specs():
    V_, C, F, E = CFG["vocab_size"], CFG["dim"], CFG["expert_dim"], CFG["num_experts"]
    specs = [("wte", [V_, C]), ("wpe", [CFG["max_seq_len"], C])]
    for l in range(CFG["num_layers"]):
        p = "layers.%d." % l
        specs += [(p + "ln1", [C]), (p + "wqkv", [3 * C, C]), (p + "wo", [C, C]),
                  (p + "ln2", [C]), (p + "router", [E, C])]
        for e in range(E):
            q = p + "experts.%d." % e
            specs += [(q + "w1", [F, C]), (q + "w3", [F, C]), (q + "w2", [C, F])]
    specs += [("lnf", [C]), ("lm_head", [V_, C])]
    return specs


def make_params():
    normals = lcg_normals(1234)
    params = {}
    for name, shape in param_specs():
        n = 1
        for d in shape:
            n *= d
        base = 1.0 if name.split(".")[-1] in ("ln1", "ln2", "lnf") else 0.0
        # values rounded to float32 so the C++ side starts from exactly the same numbers
        vals = [float_to_f32(base + 0.5 * next(normals)) for _ in range(n)]
        params[name] = (shape, [V(x) for x in vals])
    return params


def float_to_f32(x):
    import struct
    return struct.unpack("f", struct.pack("f", x))[0]


# ---------------------------------------------------------------------------
# model


def matvec(W, shape, x):  # W [OC, IC] flat, x [IC] -> [OC]
    oc, ic = shape
    return [vsum([W[o * ic + i] * x[i] for i in range(ic)]) for o in range(oc)]


def rmsnorm(x, w, eps):
    ms = vsum([xi * xi for xi in x]) / len(x)
    r = (ms + eps).pow(-0.5)
    return [xi * r * wi for xi, wi in zip(x, w)]


def softmax(xs):
    m = max(x.v for x in xs)
    es = [(x - m).exp() for x in xs]
    s = vsum(es)
    return [e / s for e in es], (s.log() + m)


def silu(x):
    return x / (1.0 + (-x).exp())


def forward(params):
    C, H, E, K = CFG["dim"], CFG["num_heads"], CFG["num_experts"], CFG["top_k"]
    D = C // H
    eps = CFG["norm_eps"]
    P = lambda n: params[n][1]
    S = lambda n: params[n][0]
    xs = [[[P("wte")[TOKENS[b][t] * C + c] + P("wpe")[t * C + c] for c in range(C)]
           for t in range(T)] for b in range(B)]
    aux_total, z_total = [], []
    for l in range(CFG["num_layers"]):
        p = "layers.%d." % l
        for b in range(B):
            h = [rmsnorm(x, P(p + "ln1"), eps) for x in xs[b]]
            qkv = [matvec(P(p + "wqkv"), S(p + "wqkv"), hi) for hi in h]
            att = []
            for t in range(T):
                row = []
                for hd in range(H):
                    q = qkv[t][hd * D:(hd + 1) * D]
                    scores = []
                    for s in range(t + 1):
                        k = qkv[s][C + hd * D:C + (hd + 1) * D]
                        scores.append(vsum([qi * ki for qi, ki in zip(q, k)]) / math.sqrt(D))
                    pr, _ = softmax(scores)
                    for d in range(D):
                        row.append(vsum([pr[s] * qkv[s][2 * C + hd * D + d] for s in range(t + 1)]))
                att.append(row)
            xs[b] = [[xi + oi for xi, oi in zip(x, matvec(P(p + "wo"), S(p + "wo"), a))]
                     for x, a in zip(xs[b], att)]
            h = [rmsnorm(x, P(p + "ln2"), eps) for x in xs[b]]
            counts = [0] * E
            prob_sums = [V(0.0)] * E
            new_x = []
            for t in range(T):
                logits = matvec(P(p + "router"), S(p + "router"), h[t])
                probs, lse = softmax(logits)
                order = sorted(range(E), key=lambda e: (-probs[e].v, e))
                chosen = order[:K]
                gap = probs[order[K - 1]].v - probs[order[K]].v
                assert gap > 1e-4, "near tie in top-k; pick another seed"
                ssum = vsum([probs[e] for e in chosen])
                out = [V(0.0)] * C
                for e in chosen:
                    q = p + "experts.%d." % e
                    a1 = matvec(P(q + "w1"), S(q + "w1"), h[t])
                    a3 = matvec(P(q + "w3"), S(q + "w3"), h[t])
                    act = [silu(u) * v for u, v in zip(a1, a3)]
                    y = matvec(P(q + "w2"), S(q + "w2"), act)
                    w = probs[e] / ssum
                    out = [o + w * yi for o, yi in zip(out, y)]
                new_x.append([xi + oi for xi, oi in zip(xs[b][t], out)])
                if t < LENGTHS[b]:
                    for e in chosen:
                        counts[e] += 1
                    prob_sums = [ps + pe for ps, pe in zip(prob_sums, probs)]
                    z_total.append(lse * lse)
            xs[b] = new_x
            Tb = LENGTHS[b]
            aux_total.append(E * vsum([(counts[e] / (K * Tb)) * (prob_sums[e] / Tb)
                                       for e in range(E)]))
    logits = []
    for b in range(B):
        for t in range(T):
            hf = rmsnorm(xs[b][t], P("lnf"), eps)
            logits.append(matvec(P("lm_head"), S("lm_head"), hf))
    return logits, vsum(aux_total), vsum(z_total)


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "model_tiny.golden")
    params = make_params()
    logits, aux, z = forward(params)
    # next-token cross-entropy on valid positions, mean over targets
    targets, weights = [], []
    for b in range(B):
        for t in range(T):
            ok = t + 1 < LENGTHS[b]
            targets.append(TOKENS[b][t + 1] if ok else 0)
            weights.append(1.0 if ok else 0.0)
    n_targets = sum(weights)
    weights = [w / n_targets for w in weights]
    ce_terms = []
    for row, tgt, w in zip(logits, targets, weights):
        if w == 0.0:
            continue
        _, lse = softmax(row)
        ce_terms.append((lse - row[tgt]) * w)
    loss = vsum(ce_terms) + aux * AUX_WEIGHT + z * Z_WEIGHT
    backward(loss)

    def fmt(xs):
        return " ".join("%.10g" % x for x in xs)

    with open(out_path, "w") as f:
        f.write("# generated by model_reference.py; float64 reference of the tiny MoE policy\n")
        f.write("config " + " ".join("%s %s" % (k, v) for k, v in CFG.items()) + "\n")
        f.write("batch %d %d\n" % (B, T))
        f.write("tokens %s\n" % fmt(x for row in TOKENS for x in row))
        f.write("lengths %s\n" % fmt(LENGTHS))
        f.write("targets %s\n" % fmt(targets))
        f.write("weights %s\n" % fmt(weights))
        f.write("aux_weight %.10g\nz_weight %.10g\n" % (AUX_WEIGHT, Z_WEIGHT))
        f.write("loss %.12g\naux_sum %.12g\nz_sum %.12g\n" % (loss.v, aux.v, z.v))
        f.write("logits %s\n" % fmt(x.v for row in logits for x in row))
        for name, (shape, vals) in params.items():
            f.write("param %s %s\n" % (name, fmt(x.v for x in vals)))
        for name, (shape, vals) in params.items():
            f.write("grad %s %s\n" % (name, fmt(x.g for x in vals)))
    print("wrote %s: loss %.6f aux %.6f z %.6f" % (out_path, loss.v, aux.v, z.v))


if __name__ == "__main__":
    main()
