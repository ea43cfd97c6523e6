"""The rank contract's environment (docs/native-ep.md, "Rank env contract"), read and checked
as the native core reads it (transport::Config::from_env). No torch here."""

import os
from dataclasses import dataclass

from .errors import BadInput


@dataclass
class RankContract:
    rank: int = 0
    world_size: int = 1
    host: str = ""
    port: int = 0
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
    """MOERL_RANK, MOERL_WORLD_SIZE, MOERL_COORDINATOR (host:port, required above one rank),
    MOERL_TIMEOUT_S, MOERL_STARTUP_TIMEOUT_S; a malformed value is bad input naming it."""
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
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise BadInput(f"MOERL_COORDINATOR='{coordinator}' must be host:port (port 1-65535) of "
                           "rank 0 when MOERL_WORLD_SIZE > 1")
        c.host, c.port = host, int(port)
    return c
