"""A Hugging Face model directory, checked before anything loads it: config.json (a supported
model_type, a supported dtype), the safetensors files it needs (headers readable). Bad input
names the directory and what is wrong. No torch here, so bad input fails fast."""

import json
import os

from safetensors import SafetensorError, safe_open

from .errors import BadInput

SUPPORTED_MODEL_TYPES = ("qwen3_moe", "mixtral")
DTYPES = ("float32", "bfloat16", "float16")


class HfDir:
    """A checked HF model directory: its config and the weight files it names."""

    def __init__(self, path: str, flag: str):
        self.path, self.flag = path, flag
        where = f"{flag} {path}"
        if not os.path.isdir(path):
            raise BadInput(f"{where}: not a directory")
        config_path = os.path.join(path, "config.json")
        if not os.path.isfile(config_path):
            raise BadInput(f"{where}: no config.json, so not a Hugging Face model directory")
        with open(config_path, "rb") as f:
            self.config_bytes = f.read()
        try:
            self.config = json.loads(self.config_bytes)
        except ValueError as e:
            raise BadInput(f"{config_path}: malformed JSON: {e}")
        if not isinstance(self.config, dict):
            raise BadInput(f"{config_path}: expected a JSON object")
        model_type = self.config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise BadInput(f"{config_path}: model_type {model_type} is not supported "
                           f"({', '.join(SUPPORTED_MODEL_TYPES)})")
        dtype_name = self.config.get("dtype", self.config.get("torch_dtype", "float32"))
        if dtype_name not in DTYPES:
            raise BadInput(f"{config_path}: dtype {dtype_name} is not supported ({', '.join(DTYPES)})")
        self.dtype_name = dtype_name
        self.weight_files = self._weight_files()

    def _weight_files(self) -> list[str]:
        index = os.path.join(self.path, "model.safetensors.index.json")
        single = os.path.join(self.path, "model.safetensors")
        if os.path.isfile(index):
            try:
                with open(index, encoding="utf-8") as f:
                    names = sorted(set(json.load(f)["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise BadInput(f"{index}: not a safetensors index ({e})")
            files = [os.path.join(self.path, n) for n in names]
        elif os.path.isfile(single):
            files = [single]
        else:
            raise BadInput(f"{self.flag} {self.path}: no model.safetensors or model.safetensors.index.json")
        for f in files:
            if not os.path.isfile(f):
                raise BadInput(f"{f} is missing: the index names it")
            try:
                with safe_open(f, "np") as h:
                    h.keys()
            except (SafetensorError, OSError) as e:
                raise BadInput(f"{f}: not a safetensors file ({e})")
        return files

    @property
    def max_len(self) -> int:
        return int(self.config.get("max_position_embeddings", 1 << 30))

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])
