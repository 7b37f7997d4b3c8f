"""The facts of a device that measures: its hardware and software stack (`DeviceInfo`),
reading them off this process's GPU or Triton's interpreter, and which devices a `--device`
selector names (`device_matches`).

The database keys every result by `DeviceInfo.fingerprint`, the model predicts from it, and
both the tuning side and the deployment side (online tuning) read it; so it lives here, apart
from either. Importing this module imports neither torch nor triton: reading a DeviceInfo back
needs no GPU stack, and building one imports them on call.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import asdict, dataclass

# Hopper's opt-in shared memory per block: the interpreter applies the same feasibility
# check as an H100/H200, so a space behaves alike on both backends.
HOPPER_SMEM_PER_BLOCK = 232448


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


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def gpu_info(index: int) -> DeviceInfo:
    """The CUDA device `index` of this process (torch must see it)."""
    import torch
    import triton

    props = torch.cuda.get_device_properties(index)
    smem = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return DeviceInfo(
        name=props.name, compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count, smem_per_block=smem, driver=_driver_version(),
        cuda=torch.version.cuda or "unknown", torch_version=torch.__version__,
        triton_version=triton.__version__)


def interpreter_info() -> DeviceInfo:
    """Triton's interpreter on this machine's CPU cores, with a Hopper's shared memory."""
    import torch
    import triton

    return DeviceInfo(
        name="cpu-interpreter", compute_capability="none", sm_count=os.cpu_count() or 1,
        smem_per_block=HOPPER_SMEM_PER_BLOCK, driver="none", cuda="none",
        torch_version=torch.__version__, triton_version=triton.__version__)


def device_matches(name: str, fingerprint: str, selector: str | None) -> bool:
    """Whether a `--device` selector names this device: part of its name or a prefix of its
    fingerprint, either case; no selector names every device. Every command that takes
    --device asks this, so they agree on which devices a selector means."""
    if selector is None:
        return True
    s = selector.lower()
    return s in name.lower() or fingerprint.lower().startswith(s)
