"""The rank contract's environment, and the engine's pins against the reference environment's."""

import os
import re
import stat
import tempfile
import unittest

from moerl_pytorch.contract import publish_port, published_port, read_contract
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
                 ({"MOERL_WORLD_SIZE": "2", "MOERL_COORDINATOR": "h:0"},
                  "MOERL_COORDINATOR='h:0' has port 0 .* but MOERL_COORDINATOR_PORT_FILE, where rank 0 "
                  "publishes it, is not set"),
                 ({"MOERL_WORLD_SIZE": "2", "MOERL_COORDINATOR": "h:65536"}, "MOERL_COORDINATOR='h:65536'"),
                 ({"MOERL_TIMEOUT_S": "-1"}, r"MOERL_TIMEOUT_S=-1 must be in \(0, 86400\]")]
        for env, pattern in cases:
            with self.assertRaisesRegex(BadInput, pattern):
                read_contract(env)


class PublishedPort(unittest.TestCase):
    """Port 0: rank 0 serves the store on a port the kernel picks and publishes it; the others
    read it (no port is chosen ahead for another local user to take first)."""

    def test_port_zero_with_the_port_file(self):
        c = read_contract({"MOERL_RANK": "1", "MOERL_WORLD_SIZE": "2", "MOERL_COORDINATOR": "127.0.0.1:0",
                           "MOERL_COORDINATOR_PORT_FILE": "/job/coordinator.port"})
        self.assertEqual((c.host, c.port, c.port_file), ("127.0.0.1", 0, "/job/coordinator.port"))

    def test_rank_zero_publishes_and_the_others_read(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "coordinator.port")
            publish_port(path, 41234)
            self.assertEqual(published_port(path, 1.0), 41234)
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
            self.assertEqual(os.listdir(d), ["coordinator.port"])

    def test_waiting_ends_at_the_start_up_deadline_naming_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "coordinator.port")
            with self.assertRaisesRegex(TimeoutError, re.escape(f"MOERL_COORDINATOR_PORT_FILE {path} within 0.2 s")):
                published_port(path, 0.2)


class Requirements(unittest.TestCase):
    def test_pinned_to_the_reference_environment(self):
        mine = pins(os.path.join(HERE, "..", "requirements.txt"))
        theirs = pins(os.path.join(HERE, "..", "..", "..", "scripts", "pyref", "requirements.txt"))
        self.assertTrue(mine)
        for name, pin in mine.items():
            self.assertEqual(pin, theirs.get(name), f"{name}: engines/pytorch {pin}, scripts/pyref {theirs.get(name)}")


if __name__ == "__main__":
    unittest.main()
