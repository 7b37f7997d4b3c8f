"""What identifies a device that measured: its hardware and software stack, torch-free.

The database keys every result by `DeviceInfo.fingerprint`; the backends that build one
(tuner.execution.backends) need torch and triton, reading one back does not.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: str
    sm_count: int
    smem_per_block: int
    driver: str
    cuda: str
    torch_version: str
    triton_version: str

    @property
    def fingerprint(self) -> str:
        """Same hardware and software stack, same fingerprint: results are comparable."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def device_matches(name: str, fingerprint: str, selector: str | None) -> bool:
    """Whether a `--device` selector names this device: part of its name or a prefix of its
    fingerprint, either case; no selector names every device. Every command that takes
    --device asks this, so they agree on which devices a selector means."""
    if selector is None:
        return True
    s = selector.lower()
    return s in name.lower() or fingerprint.lower().startswith(s)
