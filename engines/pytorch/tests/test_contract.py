"""The rank contract's environment, and the engine's pins against the reference environment's."""

import os
import unittest

from moerl_pytorch.contract import read_contract
from moerl_pytorch.errors import BadInput

HERE = os.path.dirname(os.path.abspath(__file__))


def pins(path):
    with open(path, encoding="utf-8") as f:
        return {line.split("==")[0]: line.strip() for line in f if "==" in line and not line.startswith("#")}


class Contract(unittest.TestCase):
    def test_defaults_are_one_rank(self):
        c = read_contract({})
        self.assertEqual((c.rank, c.world_size, c.timeout_s), (0, 1, 60.0))

    def test_ranks_and_coordinator(self):
        c = read_contract({"MOERL_RANK": "1", "MOERL_WORLD_SIZE": "2", "MOERL_COORDINATOR": "trainer-0.svc:29500",
                           "MOERL_TIMEOUT_S": "5", "MOERL_STARTUP_TIMEOUT_S": "300"})
        self.assertEqual((c.rank, c.world_size, c.host, c.port, c.timeout_s, c.startup_timeout_s),
                         (1, 2, "trainer-0.svc", 29500, 5.0, 300.0))

    def test_malformed_values_name_the_variable(self):
        cases = [({"MOERL_RANK": "x"}, "MOERL_RANK='x'"),
                 ({"MOERL_RANK": "2", "MOERL_WORLD_SIZE": "2"}, r"MOERL_RANK=2 must be in \[0, MOERL_WORLD_SIZE=2\)"),
                 ({"MOERL_WORLD_SIZE": "2"}, "MOERL_COORDINATOR='' must be host:port"),
                 ({"MOERL_WORLD_SIZE": "2", "MOERL_COORDINATOR": "h:0"}, "MOERL_COORDINATOR='h:0'"),
                 ({"MOERL_TIMEOUT_S": "-1"}, r"MOERL_TIMEOUT_S=-1 must be in \(0, 86400\]")]
        for env, pattern in cases:
            with self.assertRaisesRegex(BadInput, pattern):
                read_contract(env)


class Requirements(unittest.TestCase):
    def test_pinned_to_the_reference_environment(self):
        mine = pins(os.path.join(HERE, "..", "requirements.txt"))
        theirs = pins(os.path.join(HERE, "..", "..", "..", "scripts", "pyref", "requirements.txt"))
        self.assertTrue(mine)
        for name, pin in mine.items():
            self.assertEqual(pin, theirs.get(name), f"{name}: engines/pytorch {pin}, scripts/pyref {theirs.get(name)}")


if __name__ == "__main__":
    unittest.main()
