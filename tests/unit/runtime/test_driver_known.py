"""Tasks the driver completes without an actor call, fused calls (how they are sent, how a
failure or an actor death inside one is reported), a stop's recall, and the start-up thread
choice."""

from __future__ import annotations

import pytest
import torch
from rl_support import MICRO, make_spec
from transformers import AutoConfig, AutoModelForCausalLM

from rlgraph.runtime.executor import DriverKnown, RayExecutor, RemoteTraceback, WorkerError
from rlgraph.runtime.tasks import NotRun, Pending, Task, TaskFailure
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


class _Method:
    """Records an actor method's calls; `.options(num_returns=n).remote(...)` gives n refs."""

    def __init__(self, log: list, name: str) -> None:
        self.log, self.name, self.returns = log, name, 1

    def options(self, num_returns: int = 1, **options) -> _Method:
        self.returns, self.options_given = num_returns, options
        return self

    def remote(self, *args, **kwargs) -> list[str]:
        self.log.append((self.name, args, kwargs))
        call = len(self.log)
        return [f"ref{call}.{i}" for i in range(self.returns)]


class _Actor:
    def __init__(self, log: list) -> None:
        self.run, self.run_chain = _Method(log, "run"), _Method(log, "run_chain")
        self.recall = _Method(log, "recall")


def test_chained_tasks_on_one_actor_go_out_as_one_call() -> None:
    log: list = []
    actor, other = _Actor(log), _Actor(log)
    actors = {"generate": actor, "reward": actor, "train": actor, "logp": actor,
              "judge": other}
    executor = RayExecutor(actors, {}, keep={"reward": 1}, known=_known(max_lag=0))
    gen = Task("generate", "generate", 0, ("g",), {"prompts": "p-ref"})
    logp = Task("logp", "logp", 0, ("g",), {"generate": Pending("generate", 0)},
                ("generate", 0), fuse=True)
    reward = Task("reward", "reward", 0, ("g",), {"generate": Pending("generate", 0)},
                  ("logp", 0), fuse=True)
    train = Task("train", "train", 0, ("g",), {"generate": Pending("generate", 0),
                                               "reward": Pending("reward", 0),
                                               "logp": Pending("logp", 0)},
                 ("reward", 0), fuse=True)
    judge = Task("judge", "reward", 0, ("h",), {"generate": Pending("generate", 0)})
    for task in (gen, logp, reward, train, judge):
        executor.submit(task)
    assert not log and len(executor) == 5  # buffered until the loop sends them
    executor.flush()
    (name, args, _), (other_name, other_args, _) = log
    assert name == "run_chain" and other_name == "run"
    chain, *batches = args
    # generate's input from the channel; reward and train take earlier outputs in memory
    # (logp, known to the driver, is generate's batch); reward's output stays (keep)
    assert [c[:2] for c in chain] == [("generate", 0), ("reward", 0), ("train", 0)]
    assert batches == ["p-ref"] and chain[0][3] == [0]
    assert chain[1][3] == [-1] and chain[1][4] == 1
    assert chain[2][3] == [-1, -2, -1]
    assert other_args[3] == "ref1.0"  # another actor gets generate's output reference
    # every task completes with its own output reference; logp's is generate's
    assert executor.refs[("train", 0)][0] == "ref1.4"
    (known,) = executor.wait(timeout=0)
    assert known.task is logp and known.output == "ref1.0"


def test_a_task_not_marked_fuse_is_a_call_of_its_own() -> None:
    log: list = []
    actor = _Actor(log)
    executor = RayExecutor({"generate": actor, "train": actor}, {}, fuse=True)
    executor.submit(Task("generate", "generate", 0, ("g",), {"prompts": "p"}))
    executor.submit(Task("train", "train", 0, ("g",), {"generate": Pending("generate", 0)},
                         ("generate", 0)))
    executor.flush()
    assert [name for name, *_ in log] == ["run", "run"]
    assert log[1][1][3] == "ref1.0"  # queued behind it on its output reference


def _fused_chain(log: list) -> tuple[RayExecutor, list[Task]]:
    """generate -> reward -> train of step 0, sent as one fused call (refs ref1.0 .. ref1.5)."""
    actor = _Actor(log)
    executor = RayExecutor({"generate": actor, "reward": actor, "train": actor}, {})
    gen = Task("generate", "generate", 0, ("g",), {"prompts": "p"})
    reward = Task("reward", "reward", 0, ("g",), {"generate": Pending("generate", 0)},
                  ("generate", 0), fuse=True)
    train = Task("train", "train", 0, ("g",), {"generate": Pending("generate", 0),
                                               "reward": Pending("reward", 0)},
                 ("reward", 0), fuse=True)
    for task in (gen, reward, train):
        executor.submit(task)
    executor.flush()
    assert [name for name, *_ in log] == ["run_chain"]
    return executor, [gen, reward, train]


def test_a_failure_inside_a_fused_call_keeps_the_tasks_before_it(monkeypatch) -> None:
    """The tasks of the call that finished complete; the failed one raises, at the next
    flush, as its own call would (node, step, cause; the remote traceback as its cause);
    the one after it comes back as not run."""
    ray = pytest.importorskip("ray")
    executor, (gen, _, train) = _fused_chain([])
    infos = {"ref1.1": {"start": 0.0, "end": 1.0, "summary": {}},
             "ref1.3": TaskFailure.of("reward", 0, ZeroDivisionError("no samples")),
             "ref1.5": NotRun("an earlier task of its fused call did not finish")}
    monkeypatch.setattr(ray, "wait", lambda refs, **_: (list(refs), []))
    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: (
        [infos[r] for r in refs] if isinstance(refs, list) else infos[refs]))
    done = executor.wait(timeout=0)
    assert [(d.task, d.recalled) for d in done] == [(gen, False), (train, True)]
    assert done[0].output == "ref1.0"
    executor.submit(Task("generate", "generate", 1, ("g",), {"prompts": "p"}))
    with pytest.raises(WorkerError) as err:
        executor.flush()
    assert str(err.value) == "reward failed at step 0: ZeroDivisionError: no samples"
    assert isinstance(err.value.__cause__, RemoteTraceback)
    assert "no samples" in str(err.value.__cause__)


def test_an_actor_dying_in_a_fused_call_names_every_task_it_ran(monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    executor, _ = _fused_chain([])

    def dead(ref, timeout=None):
        raise ray.exceptions.RayActorError()

    monkeypatch.setattr(ray, "wait", lambda refs, **_: (list(refs), []))
    monkeypatch.setattr(ray, "get", dead)
    executor.wait(timeout=0)
    with pytest.raises(WorkerError) as err:
        executor.wait(timeout=0)
    message = str(err.value)
    assert message.startswith("the actor running one of generate(0), reward(0), train(0) "
                              "(one fused call) died at step 0"), message


def test_a_stop_recalls_the_halted_tasks_but_never_a_weight_update(monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    log: list = []
    trainer, rollout = _Actor(log), _Actor(log)
    route = Route("param_update", trainer, rollout, 1.0)
    executor = RayExecutor({"logp": trainer, "train": trainer, "generate": rollout},
                           {"param_update": route})
    for task in (Task("train", "train", 2, ("t",), {"b": "x"}),
                 Task("logp", "logp", 3, ("t",), {"b": "y"}, ("train", 2)),
                 Task("generate", "generate", 4, ("r",), {"p": "z"})):
        executor.submit(task)
    executor.flush()
    executor.pending["info-pu"] = (Task("param_update", "param_update", 2, ("t",)), None, 0.0)
    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: [None] * len(refs))
    executor.recall(lambda node, step: step >= 3)
    calls = [(entry[1][0], entry[0]) for entry in log if entry[0] == "recall"]
    assert calls == [([("logp", 3)], "recall"), ([("generate", 4)], "recall")]
    assert trainer.recall.options_given == {"concurrency_group": "control"}
