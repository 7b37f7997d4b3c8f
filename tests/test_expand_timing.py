"""`tune export expand --time-missing`: the answers a bounded expand file gives tuned
shapes where only the model priced them are timed beside the shapes' winners, and the lists
narrowed again; from a database the timings are stored for later exports. The loop on a
scripted timer; the CLI end to end on the CPU through Triton's interpreter."""
import math
import os

import pytest
from click.testing import CliRunner

from tests.factories import H100
from tests.test_store_export import config, db_url, ok, tune_fake
from tuner.cli import main
from tuner.db.session import session_factory
from tuner.db.store import Store
from tuner.export.cases import Tuned
from tuner.export.picks import Pick
from tuner.export.time_missing import narrowed_timing_missing
from tuner.kernels import KERNELS
from tuner.reporting import Silent
from tuner.shapes import Shape

MM_HASH = KERNELS["mm"].source_hash
H100_BLOCK = {"name": H100.name, "compute_capability": "9.0", "sm_count": 132,
              "smem_per_block": 232448}
STRATEGY = dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk"), "align32") | {
    "dtype": "default"}


def tuned_pair():
    """Two shapes whose winners differ in BLOCK_M only: one config must answer both."""
    a, b = Shape(4096, 4096, 4096, "bf16", "nn"), Shape(256, 4096, 4096, "bf16", "nn")
    wa, wb = config(128, 128, 64, 3, 8), config(64, 128, 64, 3, 8)
    picks = [Pick("mm", {}, wa, STRATEGY, {}), Pick("mm", {}, wb, STRATEGY, {})]
    return picks, [Tuned(a, "mm", wa, 0.5), Tuned(b, "mm", wb, 0.05)]


def answers(spaces):
    (space,) = spaces
    return space.narrowing


def test_model_filled_answers_are_timed_and_the_lists_narrowed_again():
    picks, tuned = tuned_pair()
    asked = []

    def timer(t, configs):  # the answer runs 30% slower than the shape's winner
        asked.append((str(t.shape), configs))
        return [1.3]

    spaces, _, done = narrowed_timing_missing(picks, tuned, H100_BLOCK, 1, False, timer,
                                              Silent())
    n = answers(spaces)
    assert n.product == 1 and len(asked) == 1 and done.configs == 1 and done.left == 0
    (label, configs), = asked
    loser = next(t for t in tuned if str(t.shape) == label)
    assert configs[0]["BLOCK_M"] != loser.winner["BLOCK_M"] and configs[0]["variant"] == "general"
    assert all(o.measured for o in n.outcomes.values())
    assert n.outcomes[label].regret == pytest.approx(0.3)
    assert n.max_regret == pytest.approx(0.3)


def test_an_answer_that_cannot_run_is_replaced_in_a_later_round():
    picks, tuned = tuned_pair()
    calls = []

    def timer(t, configs):  # the first answer cannot run its shape; the next costs 10%
        calls.append(configs[0])
        return [math.inf] if len(calls) == 1 else [1.1]

    spaces, _, done = narrowed_timing_missing(picks, tuned, H100_BLOCK, 1, False, timer,
                                              Silent())
    n = answers(spaces)
    assert done.rounds == 2 and done.configs == 2 and len(calls) == 2
    assert calls[0] != calls[1]
    assert all(o.measured for o in n.outcomes.values())
    assert n.max_regret == pytest.approx(0.1)


# -- end to end through the interpreter ---------------------------------------------------
def interpreter_info():
    from tuner.execution.backends import interpreter_backend
    return interpreter_backend().info


def shape_lines(text):
    return [line for line in text.splitlines() if line.startswith("#   ")]


def tune(tmp_path, *args):
    result = CliRunner().invoke(main, [*args, "--db", db_url(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="interpreter CLI tests run on CPU-only machines")
def test_time_missing_through_the_interpreter_from_a_database_and_a_table(tmp_path):
    store = Store(session_factory(db_url(tmp_path)))
    info = interpreter_info()
    for shape, winner in ((Shape(32, 32, 32, "fp16", "nn"), config(16, 16, 32, 2, 2)),
                          (Shape(64, 32, 32, "fp16", "nn"), config(32, 16, 32, 2, 2))):
        tune_fake(store, info, shape, [(winner, ok(0.01, 1.0))], MM_HASH)
    bounded = ("expand", "--max-configs", "1")
    before = tmp_path / "before.yaml"
    tune(tmp_path, "export", *bounded, "-o", str(before))
    assert any("model-predicted" in line for line in shape_lines(before.read_text()))

    timed = tmp_path / "timed.yaml"
    result = tune(tmp_path, "export", *bounded, "--time-missing", "--backend", "interpret",
                  "--jobs", "1", "-o", str(timed))
    assert "--time-missing round 1: timing 1 model-filled answers" in result.output
    text = timed.read_text()
    lines = shape_lines(text)
    assert len(lines) == 2 and not any("model-predicted" in line for line in lines)
    assert any("measured" in line for line in lines), lines
    # interpreter timings are noise: the first answer timed may lose, and another be timed
    assert "--time-missing timed " in text and "; 0 answers still model-predicted" in text
    regret = next(line for line in text.splitlines() if line.startswith("# mm_general_tma:"))

    # stored as cross timings: a later export weighs them as measured, at the same regret
    again = tmp_path / "again.yaml"
    tune(tmp_path, "export", *bounded, "-o", str(again))
    assert shape_lines(again.read_text()) == lines
    assert regret in again.read_text().splitlines()

    # from a table file: timed again (nothing stored), the answers measured
    table = tmp_path / "tuned.yaml"
    tune(tmp_path, "export", "table", "-o", str(table))
    from_table = tmp_path / "from_table.yaml"
    result = CliRunner().invoke(main, ["export", *bounded, "--table", str(table),
                                       "--time-missing", "--backend", "interpret", "--jobs",
                                       "1", "-o", str(from_table)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "round 1: timing 1" in result.output
    assert not any("model-predicted" in line for line in shape_lines(from_table.read_text()))

    refused = CliRunner().invoke(main, ["export", "table", "--time-missing", "-o",
                                        str(tmp_path / "t.yaml"), "--db", db_url(tmp_path)])
    assert refused.exit_code == 2 and "No such option '--time-missing'" in refused.output
