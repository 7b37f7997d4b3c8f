"""`tune suggest`: the analytical model's config per shape, with no GPU and no trials.

For a deployment that cannot tune yet (no GPU at hand, a new model to ship today), the model
(tuner.model.predict) ranks every feasible config of each bucketed key's search space for its
representative shape, and the best-ranked one is exported like a tuned winner, in either
format, with the prediction as provenance instead of measurements.
"""
from __future__ import annotations

import torch
import triton

from tuner.execution.backends import HOPPER_SMEM_PER_BLOCK, DeviceInfo
from tuner.export import Pick
from tuner.kernels import KERNELS
from tuner.model.predict import DeviceSpec, device_spec, predicted_tflops, rank_configs
from tuner.search.planning import KeyPlan
from tuner.space import SearchSpace

DEFAULT_DEVICE = "NVIDIA H100 80GB HBM3"


def named_device(name: str | None) -> DeviceInfo:
    """The device to suggest for: the named one, else the visible GPU, else an H100 SXM.

    A name the model does not know is modelled as a Hopper part with 132 SMs."""
    if name is None and torch.cuda.is_available():
        from tuner.execution.backends import gpu_backend
        return gpu_backend(0).info
    return DeviceInfo(name=name or DEFAULT_DEVICE, compute_capability="9.0", sm_count=132,
                      smem_per_block=HOPPER_SMEM_PER_BLOCK, driver="none", cuda="none",
                      torch_version=str(torch.__version__),
                      triton_version=str(triton.__version__))


def suggested_picks(plans: list[KeyPlan], spaces: dict[str, SearchSpace],
                    spec: DeviceSpec) -> tuple[list[Pick], list[str]]:
    """The model's best config per plan, and the labels of plans it has none for."""
    picks, missing = [], []
    for plan in plans:
        ranked = rank_configs(plan.shape, spaces[plan.kernel], KERNELS[plan.kernel], spec, k=1)
        if not ranked:
            missing.append(plan.label)
            continue
        ms, config = ranked[0]
        picks.append(Pick(plan.kernel, plan.key, config, dict(spaces[plan.kernel].strategy), {
            "tuned_shape": str(plan.shape),
            "predicted_ms": ms,
            "predicted_tflops": predicted_tflops(plan.shape, ms),
            "source": f"analytical model ({spec.name}), not measured",
            "space_hash": spaces[plan.kernel].hash,
        }))
    return picks, missing


def model_device_block(info: DeviceInfo, spec: DeviceSpec) -> dict:
    """The table's device block for suggestions: what was modelled, marked as such."""
    return {"name": info.name, "fingerprint": "model", "compute_capability":
            info.compute_capability, "sm_count": spec.sm_count, "driver": "none", "cuda": "none",
            "torch": info.torch_version, "triton": info.triton_version,
            "model": spec.name}


def suggest_device(name: str | None) -> tuple[DeviceInfo, DeviceSpec]:
    info = named_device(name)
    return info, device_spec(info)
