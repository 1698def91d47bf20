"""Environments for multi-turn, tool-using rollouts: the `env:` block of a generate node.

The contract an environment keeps (a class; one instance per trajectory):

    class Env:
        stop: tuple[str, ...] = ()        # optional: strings that end a model turn
        def __init__(self, **config): ...                        # the env block's other keys
        def reset(self, prompt: str, sample: dict) -> str: ...   # text after the prompt
        def step(self, action: str) -> tuple[str, float, bool]: ...  # observation, reward, done

`step` may return a fourth item, a dict, whose `tool_call: bool` says whether the turn
called a tool successfully (the `env/tool_success_rate` metric); `demonstration(prompt,
sample) -> list[str]` (optional) gives the turns a supervised warm start teaches; `reset`
and `step` may be coroutines (`async def`).

Modules: `spec` (the env block), `load` (finding the class), `host` (environments of many
trajectories and the checks on what they return), `pool` (Ray actors or threads, timeouts),
`trajectory` (tokens, masks, the batch layout), `rollout` (multi-turn decoding, partial
rollout's cache of trajectories); the built-ins `calculator`, `guess_number`, `delay`.
"""
