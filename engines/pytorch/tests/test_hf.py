"""The optimizer file's bytes do not depend on the process that wrote it: safetensors writes a
header's metadata in a hash map's order, which changes from process to process, and ranks on
two machines (or a rank redone) must commit the same checkpoint bytes."""

import os
import subprocess
import sys
import tempfile
import unittest

WRITE = """
import sys, torch
from safetensors.torch import save_file
from moerl_pytorch.hf import order_metadata
metadata = {"format": "moerl-adamw", "version": "1", "step": "7"}
tensors = {"m.layers.0.w": torch.arange(6.0).reshape(2, 3), "v.layers.0.w": torch.ones(2, 3)}
save_file(tensors, sys.argv[1], metadata=metadata)
order_metadata(sys.argv[1], metadata)
"""


class OptimizerFile(unittest.TestCase):
    def test_the_same_bytes_from_every_process(self):
        with tempfile.TemporaryDirectory() as d:
            written = set()
            for i in range(5):  # 3 metadata keys, 6 orders: the same one 5 times by chance 1 in 6^4
                path = os.path.join(d, f"optimizer-{i}.moerl")
                subprocess.run([sys.executable, "-c", WRITE, path], check=True)
                with open(path, "rb") as f:
                    written.add(f.read())
            self.assertEqual(len(written), 1)
            from safetensors import safe_open
            with safe_open(path, "pt") as f:
                self.assertEqual(f.metadata(), {"format": "moerl-adamw", "version": "1", "step": "7"})


if __name__ == "__main__":
    unittest.main()
