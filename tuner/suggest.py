"""`tune suggest`: the analytical model's config per shape, with no GPU and no trials.

For a deployment that cannot tune yet (no GPU at hand, a new model to ship today), the model
(tuner.model.predict) ranks every feasible config of each bucketed key's search space for its
representative shape, and the best-ranked one is exported like a tuned winner, in either
format, with the prediction as provenance instead of measurements.
"""
from __future__ import annotations

from tuner.devices import DeviceInfo
from tuner.export.picks import Pick
from tuner.formats.device import device_block
from tuner.kernels import KERNELS
from tuner.model.named_devices import device_and_spec
from tuner.model.predict import DeviceSpec, predicted_tflops, rank_configs
from tuner.reporting import STDERR, Reporter
from tuner.search.planning import KeyPlan
from tuner.space import SearchSpace


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
    """The table's device header for suggestions: what was modelled, marked as such."""
    return device_block(info, "model", sm_count=spec.sm_count, driver="none", cuda="none",
                        model=spec.name)


def write_suggestions(shapes: list, space_paths, device_name: str | None, fmt: str,
                      output, reporter: Reporter = STDERR) -> None:
    """`tune suggest`: write the model's config per planned key of the shapes to `output`, as
    the expand YAML (fmt "expand") or the table; notes name the keys it has none for."""
    from tuner.export.writers import EXPAND, expand_text, table_document
    from tuner.formats.files import write_atomic, write_text_atomic
    from tuner.kernels import kernel_for, source_hashes
    from tuner.objective import GRAPH
    from tuner.search.planning import plan_studies
    from tuner.tuning import load_spaces

    spaces = load_spaces(space_paths)
    plans = plan_studies(shapes, spaces, kernel_for)
    info, spec = device_and_spec(device_name)
    picks, missing = suggested_picks(plans, spaces, spec)
    for label in missing:
        reporter.note(f"note: no modelled config for {label}")
    if fmt == EXPAND:
        write_text_atomic(output, expand_text(picks))
    else:  # the model predicts kernel time, with no host cost: a graph-mode choice
        write_atomic(output, table_document(model_device_block(info, spec), picks,
                                            source_hashes(), GRAPH))
    reporter.note(f"wrote {len(picks)} suggested configs for {spec.name} to {output} ({fmt})")
