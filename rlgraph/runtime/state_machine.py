"""Per-node state machines of the runtime (the async-rl seed's design, states named once).

Every node of the graph is driven by one `NodeMachine` that walks its steps in order:

    IDLE ──arm──> WAITING_INPUT ──start──> PROCESSING ──finish──> WAITING_OUTPUT ──emit──> IDLE
      └──close──> DONE                        (WAITING_INPUT ──close──> DONE on a stop)
                                             (PROCESSING ──withdraw──> DONE: a stop recalled
                                              the step from its actor before it started)

- IDLE: the previous step's output left; the node has no step armed yet.
- WAITING_INPUT: step `t` is armed; it waits for its inputs in the channels, for the policy
  version it needs (generate: version >= t - max_lag) and for its groups to be free.
- PROCESSING: the worker runs step `t` on the node's actor; its groups are held.
- WAITING_OUTPUT: the work is done and the groups are free again, but the output waits for
  room in every out-channel (bounded queues: "queue not full" in the seed).
- DONE: every step the run asked for has left, or the run is stopping.

`TRANSITIONS` is the only place that says which move is legal; an illegal one is a bug in
the runtime and raises `IllegalTransition` at once instead of corrupting the schedule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class NodeState(enum.Enum):
    """Where a node stands with its current step."""

    IDLE = "idle"
    WAITING_INPUT = "waiting_input"
    PROCESSING = "processing"
    WAITING_OUTPUT = "waiting_output"
    DONE = "done"


class Event(enum.Enum):
    """What moves a node from one state to the next."""

    ARM = "arm"        # take the next step
    START = "start"    # inputs, version and groups are there: the worker starts
    FINISH = "finish"  # the worker returned
    EMIT = "emit"      # the output entered every out-channel
    CLOSE = "close"    # no further step (the run's last step left, or a stop)
    WITHDRAW = "withdraw"  # a stop recalled the step before its actor started it


TRANSITIONS: dict[tuple[NodeState, Event], NodeState] = {
    (NodeState.IDLE, Event.ARM): NodeState.WAITING_INPUT,
    (NodeState.IDLE, Event.CLOSE): NodeState.DONE,
    (NodeState.WAITING_INPUT, Event.START): NodeState.PROCESSING,
    (NodeState.WAITING_INPUT, Event.CLOSE): NodeState.DONE,
    (NodeState.PROCESSING, Event.FINISH): NodeState.WAITING_OUTPUT,
    (NodeState.PROCESSING, Event.WITHDRAW): NodeState.DONE,
    (NodeState.WAITING_OUTPUT, Event.EMIT): NodeState.IDLE,
}


class IllegalTransition(RuntimeError):
    """A move the state machine does not allow: a runtime bug, never a user error."""


@dataclass
class NodeMachine:
    """One node's state, its current step and the output waiting to leave."""

    name: str
    kind: str
    occupies: tuple[str, ...]
    state: NodeState = NodeState.IDLE
    step: int = -1
    output: Any = None
    history: list[tuple[NodeState, Event, NodeState, int]] = field(default_factory=list)

    def fire(self, event: Event) -> NodeState:
        """Apply `event`; raises IllegalTransition when the table has no such move."""
        target = TRANSITIONS.get((self.state, event))
        if target is None:
            raise IllegalTransition(
                f"{self.name}: no transition from {self.state.value} on {event.value} "
                f"(step {self.step})"
            )
        self.history.append((self.state, event, target, self.step))
        self.state = target
        return target

    def arm(self, step: int) -> None:
        """IDLE -> WAITING_INPUT for `step`."""
        self.fire(Event.ARM)
        self.step = step

    def start(self) -> None:
        """WAITING_INPUT -> PROCESSING."""
        self.fire(Event.START)

    def finish(self, output: Any) -> None:
        """PROCESSING -> WAITING_OUTPUT, holding the output until the channels take it."""
        self.fire(Event.FINISH)
        self.output = output

    def emit(self) -> Any:
        """WAITING_OUTPUT -> IDLE; returns the output that left."""
        self.fire(Event.EMIT)
        out, self.output = self.output, None
        return out

    def close(self) -> None:
        """IDLE or WAITING_INPUT -> DONE."""
        self.fire(Event.CLOSE)

    def withdraw(self) -> None:
        """PROCESSING -> DONE for a step that never started: `step` goes back to the last
        step done (what a checkpoint reads as the node's progress)."""
        self.fire(Event.WITHDRAW)
        self.step -= 1
