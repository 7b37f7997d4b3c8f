"""The device header every exported file carries, written and read here alone.

A table's `device` block names the device and software stack that measured (or that the
model priced, for `tune suggest`); FlagGems' files say the same in a `# device: NAME (...)`
comment line, which the runtime reads back to price configs for that GPU. The block is built
from anything with tuner.devices.DeviceInfo's fields: a DeviceInfo, or the database's Device.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone

from tuner.devices import DeviceInfo

_DEVICE_COMMENT = re.compile(r"^#\s*device\s*[:=]\s*(?P<name>[^;,(\n]*[^;,(\s])", re.I | re.M)


def device_block(device, fingerprint: str | None = None, **overrides) -> dict:
    """The header of `device` (DeviceInfo's fields): name, the fingerprint where one is
    given, compute capability, SM count and the software stack; `overrides` replace fields or
    add ones after them."""
    block = {"name": str(device.name),
             **({} if fingerprint is None else {"fingerprint": str(fingerprint)}),
             "compute_capability": str(device.compute_capability),
             "sm_count": int(device.sm_count), "driver": str(device.driver),
             "cuda": str(device.cuda), "torch": str(device.torch_version),
             "triton": str(device.triton_version)}
    return block | overrides


def device_info(block: Mapping) -> DeviceInfo:
    """The DeviceInfo a header describes (unknown fields empty), for the model's spec."""
    return DeviceInfo(
        str(block.get("name", "")), str(block.get("compute_capability", "none")),
        int(block.get("sm_count") or 0), int(block.get("smem_per_block") or 0),
        str(block.get("driver", "")), str(block.get("cuda", "")),
        str(block.get("torch", "")), str(block.get("triton", "")))


def is_interpreter(block: Mapping) -> bool:
    """Whether a header is the CPU interpreter's (tuner.execution.backends)."""
    return str(block.get("compute_capability")) == "none"


def comment_lines(block: Mapping, source: str, launch: str) -> list[str]:
    """The header as a FlagGems file's comment lines: the device and versions (the line
    header_device reads back), when, from what and for which launch mode."""
    lines = [f"# device: {block.get('name')} (compute capability "
             f"{block.get('compute_capability')}, {block.get('sm_count')} SMs, fingerprint "
             f"{block.get('fingerprint')}); torch {block.get('torch')}, triton "
             f"{block.get('triton')}, CUDA {block.get('cuda')}, driver {block.get('driver')}",
             f"# written {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
             f"{source}; winners chosen for {launch} launch"]
    if is_interpreter(block):
        lines.append("# WARNING: CPU interpreter results: no GPU timing, not for deployment")
    return lines


def header_device(text: str) -> str | None:
    """The device a file's `# device: NAME` comment line names, or None."""
    match = _DEVICE_COMMENT.search(text)
    return match["name"].strip() if match else None
