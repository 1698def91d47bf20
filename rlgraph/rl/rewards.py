"""Reward functions with verl's signature, and how `reward: {fn: ...}` finds them.

`compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float` (or a
dict with a `score`), so a verl user's function works unchanged. `fn` is `module:function`
or `path/to/file.py:function`. A function that raises or returns something that is not a
number stops the run with `RewardFnError`, naming the function and the sample.

A user's function runs in a child process of its own (`rlgraph.process.isolated`): a call
that takes longer than the node's `timeout_s` is stopped and fails the same way, and what it
prints is captured (capped) for the run dir instead of Ray's worker logs. The built-in
verifiers of this module run in the worker itself.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import numbers
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError, SpecError, clean_text

RewardFn = Callable[..., Any]
DEFAULT_FN = "rlgraph.rl.rewards:default_compute_score"
# The largest reward magnitude taken: rewards are float32, and GRPO squares their spread, so
# far below float32's 3.4e38 (1e308, or inf, would turn into NaN weights a step later).
MAX_ABS_REWARD = 1e6


DEFAULT_TIMEOUT_S = 60.0  # one call of a user's reward function (verl's sandboxes: 30-60 s)


class RewardFnError(RLGraphError):
    """A reward function failed on a sample; the message names both. `output`: what the
    function printed in the failing call's batch (the run writes it to reward.log)."""

    output: str = ""


def make_scorer(ref: str | None, key: Sequence[str | int], base_dir: Path | None) -> Any:
    """What `score_samples` calls: a built-in verifier as is, a user's function behind an
    `Isolated` child process (started now, so an import error is found at build time)."""
    from rlgraph.process.isolated import Isolated, IsolatedError

    ref = ref or DEFAULT_FN
    if ref.rpartition(":")[0] == __name__:
        return load_reward_fn(ref, key, base_dir)
    isolated = Isolated(ref, base_dir)
    try:
        isolated.start()
    except IsolatedError as exc:
        raise SpecError(clean_text(str(exc), 500), key) from None
    return isolated


def exact_match(data_source: str, solution_str: str, ground_truth: Any,
                extra_info: dict | None = None) -> float:
    """1.0 if the response equals the ground truth (surrounding whitespace ignored), else 0."""
    return float(str(solution_str).strip() == str(ground_truth).strip())


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number_match(data_source: str, solution_str: str, ground_truth: Any,
                      extra_info: dict | None = None) -> float:
    """1.0 if the last number in the response equals the ground truth (GSM8K-style answers)."""
    numbers = _NUMBER.findall(str(solution_str).replace(",", ""))
    return float(bool(numbers) and numbers[-1] == str(ground_truth).strip())


_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_score(data_source: str, solution_str: str, ground_truth: Any,
                extra_info: dict | None = None) -> float:
    """verl's GSM8K rule (verl/utils/reward_score/gsm8k.py): the answer after `#### ` when the
    response has one (strict), else its last number (flexible); commas dropped; 1.0 when it
    equals the ground truth, else 0."""
    text = str(solution_str)
    strict = _GSM8K_STRICT.findall(text)
    if strict:
        answer = strict[-1].replace(",", "").rstrip(".")
    else:
        numbers = _NUMBER.findall(text.replace(",", ""))
        answer = numbers[-1] if numbers else ""
    return float(bool(answer) and answer == str(ground_truth).replace(",", "").strip())


def length_credit(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict | None = None) -> float:
    """Partial credit for long answers: half for the length (1 - |len - n| / n, at least 0),
    half for the exact answer, so GRPO has signal before the answer is exact."""
    response, truth = str(solution_str).strip(), str(ground_truth).strip()
    n = max(len(truth), 1)
    return 0.5 * max(0.0, 1.0 - abs(len(response) - n) / n) + 0.5 * float(response == truth)


def final_line_match(data_source: str, solution_str: str, ground_truth: Any,
                     extra_info: dict | None = None) -> float:
    """1.0 if the response's last line (a multi-turn trajectory's final answer, after the
    tools' observations) equals the ground truth, else 0."""
    return exact_match(data_source, str(solution_str).rsplit("\n", 1)[-1], ground_truth)


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: dict | None = None) -> float:
    """The default verifier: length credit for the longtail task, exact match of the last
    line for calc (its final answer), exact match of the whole response for every other
    built-in task (dispatch on data_source, as verl's)."""
    if data_source == "longtail":
        return length_credit(data_source, solution_str, ground_truth, extra_info)
    if data_source == "calc":  # the answer is the last line (after any tool observations)
        return final_line_match(data_source, solution_str, ground_truth, extra_info)
    return exact_match(data_source, solution_str, ground_truth, extra_info)


def load_reward_fn(ref: str | None, key: Sequence[str | int] = (),
                   base_dir: Path | None = None) -> RewardFn:
    """Resolve `module:function` or `file.py:function` (relative to `base_dir` or the cwd)."""
    ref = ref or DEFAULT_FN
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise SpecError(f"reward fn '{ref}' is not 'module:function' or 'file.py:function'", key,
                        hint="e.g. rlgraph.rl.rewards:exact_match or score.py:compute_score")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_absolute() and not path.exists() and base_dir is not None:
            path = base_dir / path
        if not path.exists():
            raise SpecError(f"reward file '{target}' does not exist", key,
                            hint="give the path of a .py file, relative to graph.yaml")
        name = "rlgraph_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:
            raise SpecError(f"importing '{target}' failed: {type(exc).__name__}: {exc}",
                            key) from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise SpecError(f"cannot import module '{target}': {exc}", key,
                            hint="is it installed, or did you mean a file path ending in .py?"
                            ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SpecError(f"'{target}' has no function '{attr}'", key)
    return fn


def _as_score(value: Any) -> float | None:
    """verl accepts a number or a dict with 'score'; anything else (or NaN) is None. A number
    is returned as given, infinite or huge ones too (score_samples refuses those)."""
    if isinstance(value, dict):
        value = value.get("score")
    if not isinstance(value, numbers.Real) and hasattr(value, "item"):
        try:
            value = value.item()  # a one-element numpy array or torch tensor
        except (ValueError, RuntimeError):
            return None
    if isinstance(value, numbers.Real) and not math.isnan(float(value)):
        return float(value)
    return None


def score_samples(fn: Any, fn_name: str, data_sources: Sequence[str],
                  responses: Sequence[str], ground_truths: Sequence[Any],
                  extra_infos: Sequence[dict], uids: Sequence[str],
                  step: int | None = None, timeout_s: float | None = None) -> list[float]:
    """Score every sample with `fn` (a function, or an `Isolated` one whose calls may take
    `timeout_s` each); the first failure (an exception, a timeout, not a number, not finite
    or beyond MAX_ABS_REWARD) raises RewardFnError naming the fn, the step and the sample,
    its text one line (escape sequences removed, cut short)."""
    from rlgraph.process.isolated import Isolated, IsolatedError

    at_step = f" at step {step}" if step is not None else ""
    samples = list(zip(data_sources, responses, ground_truths, extra_infos, uids))
    calls = [{"data_source": source, "solution_str": response, "ground_truth": truth,
              "extra_info": extra} for source, response, truth, extra, _ in samples]

    def where(i: int) -> str:
        source, response, truth, _, uid = samples[i]
        return (f"reward fn {fn_name}{at_step} on sample {i} (prompt {uid}, data_source "
                f"{clean_text(repr(source), 100)}, response {clean_text(repr(str(response)), 200)}"
                f", ground_truth {clean_text(repr(str(truth)), 200)})")

    values = (fn.map(calls, timeout_s) if isinstance(fn, Isolated)
              else (fn(**call) for call in calls))
    scores: list[float] = []
    try:
        for value in values:
            i = len(scores)
            score = _as_score(value)
            if score is None:
                raise RewardFnError(f"{where(i)} returned {clean_text(repr(value), 200)}, not a "
                                    "number (return a float, or a dict with a 'score')")
            if not abs(score) <= MAX_ABS_REWARD:
                raise RewardFnError(f"{where(i)} returned {score!r}, not a finite reward within "
                                    f"+-{MAX_ABS_REWARD:g} (it would turn the weights into NaN;"
                                    " scale or clip the reward)")
            scores.append(score)
    except RewardFnError:
        raise
    except IsolatedError as exc:
        raise RewardFnError(f"{where(max(exc.index, 0))} {clean_text(str(exc))}") from None
    except Exception as exc:
        raise RewardFnError(f"{where(len(scores))} raised {type(exc).__name__}: "
                            f"{clean_text(str(exc))}") from exc
    return scores
