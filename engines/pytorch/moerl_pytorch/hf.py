"""Hugging Face model directories in and out (checked first by hfdir.HfDir): loaded with
transformers in float32, written back in the dtype the source's config.json names, with the
source's tokenizer and generation files beside them and the source's config.json last, as
`moe_hf export` does; the AdamW state beside them."""

import json
import os
import shutil
import tempfile

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from .errors import BadInput
from .hfdir import HfDir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The files beside the weights that serving needs, copied from the source (hf_side_files).
SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt",
              "tokenizer.model", "added_tokens.json")
# The AdamW state: safetensors bytes under a name HF weight loaders do not glob (*.safetensors).
OPTIMIZER_FILE = "optimizer.moerl"
OPTIMIZER_FORMAT = "moerl-adamw"


def load_model(d: HfDir, device: torch.device, attn_implementation: str):
    """The model in float32 and eval mode (no dropout, no router jitter: the loss is a function
    of the weights and the batch). Missing, unexpected or mis-shaped tensors are bad input."""
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            d.path, dtype=torch.float32, attn_implementation=attn_implementation,
            output_loading_info=True, local_files_only=True)
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:
        raise BadInput(f"{d.flag} {d.path}: transformers cannot load it: {e}")
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        names = [str(k) for k in info.get(key, [])]
        if names:
            problems.append(f"{key.replace('_', ' ')}: {', '.join(sorted(names)[:10])}"
                            + (f" (+{len(names) - 10} more)" if len(names) > 10 else ""))
    if problems:
        raise BadInput(f"{d.flag} {d.path}: the weights do not fit config.json: {'; '.join(problems)}")
    model.to(device)
    model.eval()
    return model


def num_experts(config) -> int:
    """E: transformers 5 says num_local_experts for both families, transformers 4 num_experts."""
    n = getattr(config, "num_local_experts", None)
    return int(n if n is not None else config.num_experts)


def moe_layers(model) -> list[int]:
    """Ids of the decoder layers with a router (the others have a dense MLP)."""
    return [i for i, layer in enumerate(model.model.layers)
            if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_hf(model, state_dict: dict[str, torch.Tensor], source: HfDir, out_dir: str,
            max_shard_bytes: int, optimizer_state: dict[str, torch.Tensor], optimizer_step: int) -> None:
    """Writes out_dir: the weights (state_dict, full tensors, cast to the source's dtype) as
    save_pretrained shards them, the source's side files, the AdamW state, and the source's
    config.json last. A stale config.json goes first, so a half-written directory never looks
    complete; stale weight shards go too."""
    os.makedirs(out_dir, exist_ok=True)
    config_path = os.path.join(out_dir, "config.json")
    if os.path.exists(config_path):
        os.remove(config_path)
    for name in os.listdir(out_dir):
        if name.startswith("model") and (name.endswith(".safetensors") or name.endswith(".index.json")):
            os.remove(os.path.join(out_dir, name))
    staging = tempfile.mkdtemp(prefix=".staging-", dir=out_dir)
    try:
        weights = {k: v.to(DTYPES[source.dtype_name]) for k, v in state_dict.items()}
        model.save_pretrained(staging, state_dict=weights, max_shard_size=max_shard_bytes,
                              safe_serialization=True)
        for name in os.listdir(staging):
            if name.startswith("model") and (name.endswith(".safetensors") or name.endswith(".index.json")):
                with open(os.path.join(staging, name), "rb") as f:
                    os.fsync(f.fileno())
                os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for name in SIDE_FILES:
        src = os.path.join(source.path, name)
        if os.path.isfile(src):
            with open(src, "rb") as f:
                _write_atomic(os.path.join(out_dir, name), f.read())
    opt_path = os.path.join(out_dir, OPTIMIZER_FILE)
    metadata = {"format": OPTIMIZER_FORMAT, "version": "1", "step": str(optimizer_step)}
    save_file({k: v.contiguous() for k, v in optimizer_state.items()}, f"{opt_path}.tmp", metadata=metadata)
    order_metadata(f"{opt_path}.tmp", metadata)
    with open(f"{opt_path}.tmp", "rb") as f:
        os.fsync(f.fileno())
    os.replace(f"{opt_path}.tmp", opt_path)
    _fsync_dir(out_dir)
    _write_atomic(config_path, source.config_bytes)
    _fsync_dir(out_dir)


def order_metadata(path: str, metadata: dict[str, str]) -> None:
    """Rewrites the safetensors header of `path` with its metadata in the order of `metadata`.
    safetensors writes the metadata from a hash map, in an order that changes from process to
    process, and a checkpoint's bytes must not (ranks on two machines commit the same file)."""
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        header["__metadata__"] = dict(metadata)  # same keys and values: same length, same place
        text = json.dumps(header, separators=(",", ":")).encode()
        assert len(text) <= size, f"{path}: the reordered header outgrew its {size} bytes"
        f.seek(8)
        f.write(text + b" " * (size - len(text)))


def read_optimizer_state(d: HfDir, names: dict[str, tuple[int, ...]]):
    """(step, {"m.<param>": tensor, "v.<param>": tensor}) from the directory's AdamW state, or
    (0, None) when it has none (a model that no moerl PyTorch update wrote: Adam starts fresh).
    `names` maps each parameter name to its full shape; a state that does not match is bad input."""
    path = os.path.join(d.path, OPTIMIZER_FILE)
    if not os.path.isfile(path):
        return 0, None
    try:
        with safe_open(path, "pt") as h:
            meta = h.metadata() or {}
            if meta.get("format") != OPTIMIZER_FORMAT or meta.get("version") != "1":
                raise BadInput(f"{path}: not a {OPTIMIZER_FORMAT} version 1 file")
            step = int(meta.get("step", "x"))
            state = {}
            for name, shape in names.items():
                for kind in ("m", "v"):
                    key = f"{kind}.{name}"
                    if key not in h.keys():
                        raise BadInput(f"{path}: no tensor {key}")
                    t = h.get_tensor(key)
                    if tuple(t.shape) != shape or t.dtype != torch.float32:
                        raise BadInput(f"{path}: {key} is {t.dtype} {list(t.shape)}, the model needs "
                                       f"float32 {list(shape)}")
                    state[key] = t
    except (SafetensorError, OSError, ValueError) as e:
        raise BadInput(f"{path}: cannot read the AdamW state ({e})")
    return step, state
