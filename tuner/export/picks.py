"""Which configs an export ships: `Pick`s, whatever the file.

A pick is one row of the exact table, or one config of a FlagGems op: a bucketed key of a
kernel, its config, the strategy it was chosen under, its provenance and the runner-up configs
the runtime's nearest fallback may choose among. They come from one device's tuned winners
under a launch mode (`winner_picks`), the buckets `tune buckets` chose (`bucket_picks`), a
table file (`picks_from_table`) or the analytical model (tuner.suggest), so every export of
the same choice ships the same configs.

Winners follow a launch mode (tuner.objective): each trial stores both figures, so a table
for the other mode than the run's is picked from the stored trials, without re-tuning, and
the table says which mode it holds.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tuner.bucketing.strategies import KEY_FIELDS
from tuner.db.models import Bucketing, Device, KernelVersion, Trial, Winner
from tuner.db.store import Store
from tuner.devices import device_matches
from tuner.export import ExportError
from tuner.formats.table import table_rows
from tuner.objective import DEFAULT_LAUNCH, FIGURES, GRAPH, ranked
from tuner.reporting import STDERR, Reporter
from tuner.shapes import Shape
from tuner.space import config_signature
from tuner.statuses import TrialStatus


@dataclass(frozen=True)
class Selection:
    """Which of the database's picks an export ships: the device (--device, needed only
    where several tuned), one row per tuned key even where `tune buckets` chose shared
    configs (`exact`), and the launch mode to pick winners by (None: the one they were tuned
    under)."""
    device: str | None = None
    exact: bool = False
    launch: str | None = None


def select_device(winners: list[Winner], selector: str | None,
                  stale: int = 0) -> tuple[Device, list[Winner]]:
    """The one device whose winners to export: the only one, or the one --device names.
    `stale`: how many winners were left out as measured with older kernel source (said when
    none is left)."""
    devices = {w.device.id: w.device for w in winners
               if device_matches(w.device.name, w.device.fingerprint, selector)}
    if not devices:
        device = f" for device {selector!r}" if selector else ""
        if stale:
            raise ExportError(
                f"no winners measured with this gemm-tuner's kernel source{device}: the "
                f"database holds {stale} winners measured with older kernel source, left out "
                "since the kernels changed; re-tune their shapes with `tune run --shapes ...`")
        raise ExportError(f"no winners in the database{device}" + (
            "" if selector else "; run `tune run` first"))
    if len(devices) > 1:
        listed = "; ".join(f"{d.name} [{d.fingerprint}]" for d in devices.values())
        raise ExportError(f"winners from {len(devices)} devices ({listed}); choose one with "
                          "--device NAME-or-FINGERPRINT")
    (device,) = devices.values()
    return device, [w for w in winners if w.device.id == device.id]


def current_only(winners: list[Winner], source_hashes: dict[str, str]) -> tuple[list[Winner], int]:
    """Winners measured with today's kernel source, and how many were left out as stale."""
    current = [w for w in winners if source_hashes.get(w.kernel.name) == w.kernel.source_hash]
    return current, len(winners) - len(current)


# How many runner-up configs a table entry carries per shape it answers, for the runtime's
# nearest fallback only (tuner.runtime). A shape never tuned is answered from the entries of
# nearby sizes, whose winners alone often lack the tile that suits it, while each study has
# measured other tiles too. One per shape: with it, each shape of shapes-dev answered from the
# others loses 7.9% (geomean) against 11.1% without (benchmarks/nearest_fallback.py, H200).
ALTERNATES_PER_SHAPE = 1


@dataclass(frozen=True)
class Pick:
    """One exported row: the config for a bucketed key of a kernel, and where it came from."""
    kernel: str
    key: dict
    config: dict
    strategy: dict  # the bucketing strategy of the space it was chosen in
    provenance: dict  # measured times and errors, or the model's prediction
    alternates: list[dict] = field(default_factory=list)  # runner_ups of its shapes' studies


def _tile(config: Mapping) -> tuple:
    return (config["variant"], config.get("BLOCK_M"), config.get("BLOCK_N"),
            config.get("BLOCK_K"))


# Trials whose device time an alternate may come from: correct, and measured in full or by
# the short measure of screening (a study that cuBLAS won by far screens every tile, and its
# fastest tile is still what a deployment without cuBLAS, or a neighbouring key, wants).
ALTERNATE_STATUSES = (TrialStatus.OK, TrialStatus.SCREENED)


def runner_up_trials(trials: Iterable[Trial], config: Mapping) -> list[Trial]:
    """The fastest correct trial of each tile (variant and BLOCK_M/N/K) other than
    `config`'s, by device time, fastest first, ALTERNATES_PER_SHAPE of them: what a study
    learnt besides its winner. Another tile, not another GROUP_M or stage count, since a
    neighbouring size wants a different tile far more often than a different pipeline depth
    of the same one."""
    taken, ups = {_tile(config)}, []
    for trial in sorted((t for t in trials if t.status in ALTERNATE_STATUSES and t.p50_ms),
                        key=lambda t: t.p50_ms):
        if len(ups) == ALTERNATES_PER_SHAPE:
            break
        if _tile(trial.params) not in taken:
            taken.add(_tile(trial.params))
            ups.append(trial)
    return ups


def runner_ups(trials: Iterable[Trial], config: Mapping) -> list[dict]:
    """The configs of runner_up_trials."""
    return [dict(t.params) for t in runner_up_trials(trials, config)]


def study_trials(store: Store, device: Device,
                 kernel: KernelVersion) -> Callable[[Shape], Sequence[Trial]]:
    """A shape's measured trials: those of its latest finished study of the device and
    kernel (none if it has none), where the picks' alternates come from."""
    def trials(shape: Shape) -> Sequence[Trial]:
        study = store.shape_study(device, kernel, shape)
        return () if study is None else study.trials
    return trials


def _no_trials(shape: Shape) -> Sequence[Trial]:
    return ()


def export_launch(requested: str | None, winners: list[Winner]) -> str:
    """The launch mode to export: the one asked for, else the one the winners' studies were
    run with (a study from before the choice optimised device time: graph), else
    DEFAULT_LAUNCH."""
    if requested is not None:
        return requested
    modes = {w.study.launch or GRAPH for w in winners}
    if len(modes) > 1:
        raise ExportError(f"the winners were tuned under launch modes {', '.join(sorted(modes))}"
                          "; choose one with --launch")
    return modes.pop() if modes else DEFAULT_LAUNCH


def exported_trial(winner: Winner, launch: str) -> Trial | None:
    """The trial to ship for a winner's key under `launch`: the stored winner where its study
    optimised that mode (its final side-by-side re-timing chose it, which no single trial's
    figure overrules: cuBLAS may win it from behind, its trial timed in a hotter power
    state), else the study's correct trial fastest by the mode's figure among those it may
    choose (objective.ranked); None where no trial has that figure (stored before it was
    measured)."""
    if (winner.study.launch or GRAPH) == launch:
        return winner.trial
    measured = ranked(winner.study.trials, launch)
    return measured[0] if measured else None


def winner_picks(winners: list[Winner], launch: str,
                 shape_trials: Callable[[Shape], Sequence[Trial]] = _no_trials) -> list[Pick]:
    """The tuned winners under `launch` as picks, with their measurements as provenance, and
    the runner-ups of their shapes' studies (shape_trials, e.g. study_trials) as alternates."""
    picks, unmeasured = [], []
    for w in winners:
        t, study = exported_trial(w, launch), w.study
        if t is None:
            unmeasured.append(study.shape_label)
            continue
        ups = runner_up_trials(shape_trials(study.shape), t.params)
        picks.append(Pick(w.kernel.name, w.key, dict(t.params), dict(study.space.strategy), {
            "tuned_shape": study.shape_label,
            "ms": t.p50_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
            "tflops": t.tflops,
            "loop_ms": t.loop_ms, "host_us": t.host_us,
            "cublas_ms": study.baseline_ms,
            # the alternates' kernel times here: how the runtime's fallback calibrates the
            # model where they answer other keys (tuner.formats.table.Measurement)
            **({"alternates_ms": [u.p50_ms for u in ups]} if ups else {}),
            "rel_error": t.rel_error,
            "timing": t.timing_method,
            "space_hash": study.space.hash,
            "tuned_at": t.created_at.isoformat(timespec="seconds"),
        }, [dict(u.params) for u in ups]))
    if unmeasured:  # only eager's figure can be missing: every correct trial has p50_ms
        raise ExportError(f"{len(unmeasured)} tuned shapes have no {FIGURES[launch]} figure "
                          f"(tuned before it was stored: {', '.join(unmeasured)}); export them "
                          f"with --launch {GRAPH}, or tune them again with `tune run --retune`")
    return picks


def bucket_picks(bucketing: Bucketing,
                 shape_trials: Callable[[Shape], Sequence[Trial]] = _no_trials) -> list[Pick]:
    """The buckets `tune buckets` chose, one pick each, with their members' regrets, and as
    alternates the runner-ups of each member's study (shape_trials) to the bucket's config."""
    picks = []
    for b in bucketing.buckets:
        alternates = {}
        for member in b["members"]:
            for config in runner_ups(shape_trials(Shape.from_label(member["shape"])),
                                     b["config"]):
                alternates.setdefault(config_signature(config), config)
        picks.append(Pick(bucketing.kernel.name, dict(zip(KEY_FIELDS, b["key"])), b["config"],
                          dict(bucketing.strategy), {
                              "members": b["members"],
                              "max_regret": max(m["regret"] for m in b["members"]),
                              "regret_budget": bucketing.max_regret,
                              "chosen_at": bucketing.created_at.isoformat(timespec="seconds"),
                          }, list(alternates.values())))
    return picks


def device_picks(store: Store, device: Device, winners: list[Winner], launch: str,
                 exact: bool) -> tuple[list[Pick], list[str]]:
    """What an export of one device ships, per kernel: the buckets of its latest `tune
    buckets` decision (unless `exact`), else its winners under `launch`; and a line for the
    user per kernel exported as buckets."""
    picks, notes = [], []
    for kernel in {w.kernel.name: w.kernel for w in winners}.values():
        bucketing = None if exact else store.latest_bucketing(device, kernel.name,
                                                               kernel.source_hash)
        trials = study_trials(store, device, kernel)
        if bucketing is None:
            picks += winner_picks([w for w in winners if w.kernel.name == kernel.name], launch,
                                  trials)
            continue
        picks += bucket_picks(bucketing, trials)
        # tune buckets weighs device time (tuner.execution.cross_timing), whatever the launch mode.
        by_device_time = "" if launch == GRAPH else (
            f", by device time (--exact: one row per key by the {launch} figure)")
        notes.append(f"{kernel.name}: {len(bucketing.buckets)} buckets chosen by `tune buckets` "
                     f"at {bucketing.created_at:%Y-%m-%d %H:%M}{by_device_time}")
    return picks, notes


def grouped(picks: list[Pick], op_of) -> dict[str, list[Pick]]:
    groups: dict[str, list[Pick]] = {}
    for pick in picks:
        groups.setdefault(op_of(pick), []).append(pick)
    return groups


def op_strategy(op: str, picks: list[Pick]) -> dict:
    strategies = {tuple(p.strategy[f] for f in KEY_FIELDS) for p in picks}
    if len(strategies) > 1:
        differ = [f for i, f in enumerate(KEY_FIELDS) if len({s[i] for s in strategies}) > 1]
        kernels = ", ".join(sorted({p.kernel for p in picks}))
        raise ExportError(f"{op} configs (kernels {kernels}) were chosen with "
                          f"{len(strategies)} different bucketing strategies (they differ in "
                          f"{', '.join(differ)}); one export holds one strategy per op: give "
                          "their search spaces the same strategy")
    return dict(zip(KEY_FIELDS, strategies.pop()))


def current_device_winners(store: Store, selector: str | None,
                           reporter: Reporter = STDERR) -> tuple[Device, list[Winner]]:
    """The winners of one device (select_device) measured with today's kernel source, with
    their studies' trials; a note says how many stale ones were left out."""
    from tuner.kernels import source_hashes

    winners, stale = current_only(store.winners(with_trials=True), source_hashes())
    if stale and winners:
        reporter.note(f"note: {stale} winners measured with older kernel source left out")
    return select_device(winners, selector, stale)


def chosen_picks(store: Store, selection: Selection, reporter: Reporter = STDERR
                 ) -> tuple[Device, list[Winner], str, list[Pick]]:
    """What `tune export` writes, whatever the format: the selected device's current winners
    (current_device_winners), the launch mode (export_launch) and their picks (device_picks),
    the notes on how they were chosen said."""
    device, winners = current_device_winners(store, selection.device, reporter)
    launch = export_launch(selection.launch, winners)
    picks, notes = device_picks(store, device, winners, launch, selection.exact)
    for line in notes:
        reporter.note(line)
    return device, winners, launch, picks


def picks_from_table(doc: Mapping) -> list[Pick]:
    """A table document's entries (tuner.formats.table) as picks, one op per kernel."""
    return [Pick(row.op, row.key, row.config, row.strategy, row.provenance, row.alternates)
            for row in table_rows(doc)]
