"""The rank contract's environment (docs/native-ep.md, "Rank env contract"), read and checked
as the native core reads it (transport::Config::from_env). No torch here."""

import os
import time
from dataclasses import dataclass

from .errors import BadInput


@dataclass
class RankContract:
    rank: int = 0
    world_size: int = 1
    host: str = ""
    port: int = 0  # 0: rank 0 takes a port the kernel picks and publishes it in port_file
    port_file: str = ""
    timeout_s: float = 60.0
    startup_timeout_s: float = 60.0


def _int(env, name: str, default: str) -> int:
    text = env.get(name, default)
    try:
        return int(text, 10)
    except ValueError:
        raise BadInput(f"{name}='{text}' is not an integer")


def _seconds(env, name: str, default: str, limit: float) -> float:
    text = env.get(name, default)
    try:
        s = float(text)
    except ValueError:
        raise BadInput(f"{name}='{text}' is not a number of seconds")
    if not 0.0 < s <= limit:
        raise BadInput(f"{name}={text} must be in (0, {limit:g}]")
    return s


def read_contract(env=os.environ) -> RankContract:
    """MOERL_RANK, MOERL_WORLD_SIZE, MOERL_COORDINATOR (host:port, required above one rank; port
    0 with MOERL_COORDINATOR_PORT_FILE), MOERL_TIMEOUT_S, MOERL_STARTUP_TIMEOUT_S; a malformed
    value is bad input naming it."""
    c = RankContract(rank=_int(env, "MOERL_RANK", "0"), world_size=_int(env, "MOERL_WORLD_SIZE", "1"))
    if not 1 <= c.world_size <= 65535:
        raise BadInput(f"MOERL_WORLD_SIZE={c.world_size} must be in [1, 65535]")
    if not 0 <= c.rank < c.world_size:
        raise BadInput(f"MOERL_RANK={c.rank} must be in [0, MOERL_WORLD_SIZE={c.world_size})")
    c.timeout_s = _seconds(env, "MOERL_TIMEOUT_S", "60", 86400.0)
    c.startup_timeout_s = _seconds(env, "MOERL_STARTUP_TIMEOUT_S", env.get("MOERL_TIMEOUT_S", "60"), 604800.0)
    if c.world_size > 1:
        coordinator = env.get("MOERL_COORDINATOR", "")
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise BadInput(f"MOERL_COORDINATOR='{coordinator}' must be host:port (port 0-65535) of "
                           "rank 0 when MOERL_WORLD_SIZE > 1")
        c.host, c.port, c.port_file = host, int(port), env.get("MOERL_COORDINATOR_PORT_FILE", "")
        if c.port == 0 and not c.port_file:
            raise BadInput(f"MOERL_COORDINATOR='{coordinator}' has port 0 (rank 0 takes a port the kernel "
                           "picks) but MOERL_COORDINATOR_PORT_FILE, where rank 0 publishes it, is not set")
    return c


def publish_port(path: str, port: int) -> None:
    """Rank 0's port as the native core writes it: "<port>\n" in a 0600 file beside `path`,
    renamed over it, so a reader sees the whole port or no file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def published_port(path: str, timeout_s: float) -> int:
    """The port rank 0 published in `path`, waited for up to `timeout_s` (the start-up deadline)."""
    until = time.monotonic() + timeout_s
    while True:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
            if text.isdigit() and 1 <= int(text) <= 65535:
                return int(text)
        except FileNotFoundError:
            pass
        if time.monotonic() >= until:
            raise TimeoutError(f"rank 0 has not published its port in MOERL_COORDINATOR_PORT_FILE {path} "
                               f"within {timeout_s:g} s")
        time.sleep(0.05)
