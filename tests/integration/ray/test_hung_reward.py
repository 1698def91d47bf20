"""A reward function that never returns, on the real runtime (tiny model, CPU, one cluster).

- a stop (what Ctrl-C and SIGTERM ask for) while it hangs returns within seconds with a
  checkpoint at the last trained step, and what the function printed is in reward.log;
- with `timeout_s` the run stops by itself: one line naming the sample and the timeout,
  a checkpoint kept, the function's output in the run dir.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.errors import RLGraphError  # noqa: E402
from rlgraph.runtime import checkpoint as ckpt  # noqa: E402
from rlgraph.runtime.runner import STOP_GRACE_S, Runner, RunOptions  # noqa: E402

pytestmark = pytest.mark.runtime

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"
SMALL = ["data.prompts_per_step=4", "data.samples_per_prompt=2",
         "data.response_len={mean: 4, max: 6}", "model.warm_start.steps=0"]
REWARD = '''\
import time
def score(data_source, solution_str, ground_truth, extra_info=None):
    print("scoring prompt", extra_info["index"], "\\x1b[31mred\\x1b[0m")
    if extra_info["index"] >= 4:  # the prompts of step 1 (4 a step): never returns
        time.sleep(600)
    return float(solution_str.strip() == str(ground_truth))
'''


def runner(tmp_path: Path, extra: list[str], on_step=None) -> Runner:
    (tmp_path / "hang.py").write_text(REWARD)
    spec = load_spec(QUICKSTART, [*SMALL, f"nodes.reward.fn={tmp_path / 'hang.py'}:score",
                                  *extra])
    options = RunOptions(out_dir=tmp_path / "run", steps=4, checkpoint_every=0,
                         checkpoint_every_s=0.0, tensorboard=False, on_step=on_step)
    return Runner(compile_plan(spec), options)


def test_a_stop_returns_within_seconds_while_the_reward_hangs(cluster, tmp_path):
    asked: list[float] = []
    run: Runner | None = None

    def on_step(row):
        if row["step"] == 0:
            def stop():
                asked.append(time.time())
                run.request_stop()

            threading.Timer(1.0, stop).start()

    run = runner(tmp_path, [], on_step)
    result = run.run()
    took = time.time() - asked[0]
    assert result.stopped and result.next_step == 1
    assert took < STOP_GRACE_S + 30, f"the stop took {took:.0f} s"
    assert ckpt.load_checkpoint(tmp_path / "run").step == 1
    log = (tmp_path / "run" / "reward.log").read_text()
    assert "scoring prompt 0" in log


def test_reward_timeout_stops_the_run_in_one_line_with_a_checkpoint(cluster, tmp_path):
    started = time.time()
    with pytest.raises(RLGraphError) as err:
        runner(tmp_path, ["nodes.reward.timeout_s=1"]).run()
    message = str(err.value)
    assert "\n" not in message and "\x1b" not in message, message
    assert "timeout_s=1 s" in message and "on sample 0" in message, message
    assert "progress kept: checkpoint at step 1" in message, message
    assert "reward.log" in message and time.time() - started < 300
    assert ckpt.load_checkpoint(tmp_path / "run").step == 1
    assert "scoring prompt 4" in (tmp_path / "run" / "reward.log").read_text()
