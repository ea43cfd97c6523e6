#!/usr/bin/env python3
"""Compares two Hugging Face model directories tensor by tensor (numpy, float64; float32 and
float16 weights):

  compare.py A B [--before O]

prints {"tensors":n, "missing":[names in one only], "max_rel_l2":x, "worst":name} with
x = max over tensors of |A - B| / |B| (L2), and with --before the same for the updates
A - O against B - O ("max_update_rel_l2", "worst_update", "changed": tensors whose update is
non-zero)."""

import argparse
import json
import os

import numpy as np
from safetensors.numpy import load_file


def tensors(path: str) -> dict[str, np.ndarray]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        out.update({k: v.astype(np.float64) for k, v in load_file(os.path.join(path, name)).items()})
    return out


def rel_l2(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--before")
    args = p.parse_args()
    a, b = tensors(args.a), tensors(args.b)
    common = sorted(set(a) & set(b))
    out = {"tensors": len(common), "missing": sorted(set(a) ^ set(b)), "max_rel_l2": 0.0, "worst": ""}
    for k in common:
        d = rel_l2(a[k], b[k]) if a[k].shape == b[k].shape else float("inf")
        if d > out["max_rel_l2"]:
            out["max_rel_l2"], out["worst"] = d, k
    if args.before:
        o = tensors(args.before)
        out.update({"max_update_rel_l2": 0.0, "worst_update": "", "changed": 0})
        for k in common:
            da, db = a[k] - o[k], b[k] - o[k]
            if not np.any(db) and not np.any(da):
                continue
            out["changed"] += 1
            d = rel_l2(da, db)
            if d > out["max_update_rel_l2"]:
                out["max_update_rel_l2"], out["worst_update"] = d, k
    print(json.dumps(out))


if __name__ == "__main__":
    main()
