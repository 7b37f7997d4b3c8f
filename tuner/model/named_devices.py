"""The device a name stands for, for the model: a table's or `tune suggest --device`'s name.

A deployment predicts for the device its table was tuned on, which need not be the visible
one (or there may be none); `tune suggest` for the one asked for. Both go from a name to the
model's DeviceSpec here, with nothing but the model and torch imported.
"""
from __future__ import annotations

import torch
import triton

from tuner.devices import HOPPER_SMEM_PER_BLOCK, DeviceInfo, gpu_info
from tuner.model.predict import DeviceSpec, device_spec

DEFAULT_DEVICE = "NVIDIA H100 80GB HBM3"


def named_device(name: str | None) -> DeviceInfo:
    """The device to model: the named one, else the visible GPU, else an H100 SXM.

    A name the model does not know is modelled as a Hopper part with 132 SMs."""
    if name is None and torch.cuda.is_available():
        return gpu_info(0)
    return DeviceInfo(name=name or DEFAULT_DEVICE, compute_capability="9.0", sm_count=132,
                      smem_per_block=HOPPER_SMEM_PER_BLOCK, driver="none", cuda="none",
                      torch_version=str(torch.__version__),
                      triton_version=str(triton.__version__))


def device_and_spec(name: str | None) -> tuple[DeviceInfo, DeviceSpec]:
    """named_device(name) and the model's spec of it."""
    info = named_device(name)
    return info, device_spec(info)


def named_spec(name: str | None) -> DeviceSpec:
    """The model's spec of named_device(name)."""
    return device_and_spec(name)[1]


def known_device_error(name: str) -> str | None:
    """Why the model has no figures of its own for a device named `name` (one line naming the
    parts it knows), or None where it has: what `tune suggest --device` checks, so that a
    typo is not silently modelled as a scaled Hopper part."""
    from tuner.model.predict import _KNOWN_PARTS

    if any(part in name for part, _ in _KNOWN_PARTS):
        return None
    parts = ", ".join(part for part, _ in _KNOWN_PARTS)
    return (f"no model of a GPU named {name!r}; expected a name containing one of {parts} "
            "(e.g. 'NVIDIA H200')")
