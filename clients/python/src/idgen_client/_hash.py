"""The strict-key hash of the Rust crate (client/src/nodes.rs), bit for
bit: FNV-1a 64 of the key, then a rendezvous score per node address
(splitmix64's finaliser over the pair). Every client computes it alike
(no per-process seed), so the same key goes to the same node from every
language."""

from __future__ import annotations

from typing import Iterable, Optional

_MASK = 0xFFFFFFFFFFFFFFFF


def key_hash(text: str) -> int:
    """FNV-1a 64 of the UTF-8 bytes of `text`."""
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & _MASK
    return h


def rendezvous(key: int, addr: str) -> int:
    """The score of node `addr` for key hash `key`: the highest serves it."""
    a = key_hash(addr)
    z = key ^ (((a << 29) | (a >> 35)) & _MASK)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def route(key: str, addrs: Iterable[str]) -> Optional[str]:
    """The node of strict key `key` among `addrs` (None when empty). A tie
    goes to the last address, as Rust's `max_by_key` does."""
    h = key_hash(key)
    best, best_score = None, -1
    for addr in addrs:
        score = rendezvous(h, addr)
        if score >= best_score:
            best, best_score = addr, score
    return best
