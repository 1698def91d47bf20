"""Tasks the driver completes without an actor call, and the start-up thread choice."""

from __future__ import annotations

import torch
from rl_support import MICRO, make_spec
from transformers import AutoConfig, AutoModelForCausalLM

from rlgraph.runtime.executor import DriverKnown, RayExecutor
from rlgraph.runtime.tasks import Pending, Task
from rlgraph.runtime.threads import choose_threads
from rlgraph.runtime.weight_sync import Route

SAME, OTHER = object(), object()


def _known(max_lag: int, mini_batches: int = 1) -> DriverKnown:
    spec = make_spec(extra_nodes={"logp": {}, "validate": {"kind": "validate", "every": 3}},
                     train={"mini_batches": mini_batches}, max_lag=max_lag)
    return DriverKnown(spec, {"param_update": Route("param_update", SAME, SAME, 1.0)})


def _task(node: str, kind: str, step: int, behind: tuple[str, int] | None = None) -> Task:
    return Task(node, kind, step, ("g",), {}, behind)


def test_the_driver_knows_only_what_is_proven() -> None:
    known = _known(max_lag=0)
    batch = object()
    assert known.output(_task("logp", "logp", 4), [batch])[0] is batch
    assert known.output(_task("validate", "validate", 4), [batch])[0] == {"step": 4}
    assert known.output(_task("validate", "validate", 3), [batch]) is None  # a validation step
    assert known.output(_task("param_update", "param_update", 4), [])[1]["version"] == 5
    assert known.output(_task("train", "train", 4), [batch]) is None
    # off-policy (max_lag 1) or several updates: logp runs
    assert _known(max_lag=1).output(_task("logp", "logp", 4), [batch]) is None
    assert _known(max_lag=0, mini_batches=2).output(_task("logp", "logp", 4), [batch]) is None
    split = DriverKnown(make_spec(), {"param_update": Route("param_update", SAME, OTHER, 1.0)})
    assert split.output(_task("param_update", "param_update", 4), []) is None


def test_a_known_task_completes_at_once_with_the_running_tasks_output() -> None:
    executor = RayExecutor({}, {}, known=_known(max_lag=0))
    running = object()
    executor.refs[("generate", 2)] = (running, "info-ref", "generate")  # still running
    logp = Task("logp", "logp", 2, ("g",), {"generate": Pending("generate", 2)},
                ("generate", 2))
    validate = Task("validate", "validate", 2, ("g",), {"generate": Pending("generate", 2)},
                    ("generate", 2))
    executor.submit(logp)
    executor.submit(validate)
    assert len(executor) == 2
    first, second = executor.wait(timeout=0)  # no actor call, in submission order
    assert first.task is logp and first.output is running  # its output is generate's batch
    assert second.task is validate and second.output == {"step": 2}
    assert first.info["start"] == first.info["end"] and len(executor) == 0
    # a weight update waits for the train step it follows
    executor.refs[("train", 2)] = (object(), "info-ref", "train")
    executor.submit(Task("param_update", "param_update", 2, ("g",),
                         {"train": Pending("train", 2)}, ("train", 2)))
    executor.flush()  # submit buffers; the loop sends what it started together
    assert executor.local and all(not executor._may_complete(t) for t, *_ in executor.local)
    del executor.refs[("train", 2)]  # train finished
    (update,) = executor.wait(timeout=0)
    assert update.info["version"] == 3 and len(executor) == 0


def test_the_thread_choice_is_measured_and_applied() -> None:
    before = torch.get_num_threads()
    try:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**MICRO))
        threads, seconds = choose_threads(model, 2, rows=8, width=8)
        assert set(seconds) == {1, 2} and threads == min(seconds, key=seconds.get)
        assert torch.get_num_threads() == threads
        assert all(p.grad is None for p in model.parameters())  # the probe leaves no gradient
        assert choose_threads(model, 1, rows=8, width=8) == (1, {})
    finally:
        torch.set_num_threads(before)
