"""The algorithm families against hand-computed figures on tiny batches: each advantage
estimator, each loss aggregation, clip-higher, GSPO's sequence ratio, the critic's value
loss, learning-rate schedules, the per-family defaults and the graph checks."""

from __future__ import annotations

import math

import pytest
import torch
from rl_support import cost_spec, costs_of, make_spec

from rlgraph.config.algorithm import DEFAULTS, AlgorithmSpec, DynamicSamplingSpec
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph
from rlgraph.nodes.critic import value_loss
from rlgraph.nodes.dynamic_sampling import group_slices, informative_groups
from rlgraph.rl.advantages import (
    compute_advantages,
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    remax_advantages,
    rloo_advantages,
)
from rlgraph.rl.loss import aggregate, policy_loss
from rlgraph.rl.lr_schedule import lr_at

S = 1 / math.sqrt(2)


def close(a: torch.Tensor, b: list) -> None:
    assert torch.allclose(a.float(), torch.tensor(b, dtype=torch.float32), atol=1e-4), a


# ----------------------------------------------------------------- advantages


def test_grpo_and_dr_grpo_advantages_by_hand() -> None:
    rewards, group = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    close(grpo_advantages(rewards, group), [S, -S, 0, 0])  # (r - .5) / std .7071
    close(grpo_advantages(rewards, group, norm_std=False), [0.5, -0.5, 0, 0])


def test_rloo_is_reward_minus_the_others_mean() -> None:
    # verl: r * n/(n-1) - mean * n/(n-1): 1 * 1.5 - 1/3 * 1.5 = 1; 0 - 0.5 = -0.5
    close(rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 2.0]), torch.tensor([0, 0, 0, 1])),
          [1.0, -0.5, -0.5, 0.0])


def test_reinforce_pp_whitens_token_returns_over_the_batch() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # returns [[1, 1, -], [0, -, -]]: mean 2/3, unbiased std sqrt(1/3)
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask)
    k = math.sqrt(3)
    close(adv, [[k / 3, k / 3, 0], [-2 * k / 3, 0, 0]])
    # gamma < 1 discounts the earlier token of the first row: returns [.5, 1]
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask, gamma=0.5)
    assert adv[0, 0] < adv[0, 1]


def test_remax_subtracts_the_greedy_reward() -> None:
    close(remax_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.25, 0.25])),
          [0.75, -0.25])


def test_gae_by_hand() -> None:
    values, mask = torch.tensor([[0.5, 0.2]]), torch.ones(1, 2)
    # token rewards [0, 1]: delta1 = 1 - .2 = .8; delta0 = .2 - .5 = -.3; A0 = -.3 + .8
    adv, returns = gae_advantages(torch.tensor([1.0]), values, mask, gamma=1.0, lam=1.0)
    close(returns, [[1.0, 1.0]])
    close(adv, [[-S, S]])  # [.5, .8] whitened
    adv, returns = gae_advantages(torch.tensor([1.0]), values, mask, gamma=1.0, lam=0.5)
    close(returns, [[0.6, 1.0]])  # A0 = -.3 + .5 * .8 = .1


def test_gae_skips_padding() -> None:
    values = torch.tensor([[0.5, 0.2, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, returns = gae_advantages(torch.tensor([1.0]), values, mask)
    close(returns[:, :2], [[1.0, 1.0]])  # the padded value 9 never enters


def test_advantages_need_the_critic_or_baselines() -> None:
    batch = {"rewards": torch.tensor([1.0]), "group": torch.tensor([0])}
    with pytest.raises(ValueError, match="critic"):
        compute_advantages(AlgorithmSpec(name="ppo"), batch)
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_advantages(AlgorithmSpec(name="remax"), batch)


# ----------------------------------------------------------------- the loss


def test_loss_aggregations_by_hand() -> None:
    per_token = torch.tensor([[1.0, 2.0, 7.0], [3.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(per_token, mask, "token-mean")) == pytest.approx(2.0)  # 6 / 3
    assert float(aggregate(per_token, mask, "seq-mean-token-sum")) == pytest.approx(3.0)
    assert float(aggregate(per_token, mask, "seq-mean-token-mean")) == pytest.approx(2.25)
    assert float(aggregate(per_token, mask, "seq-mean-token-sum-norm", max_len=4)
                 ) == pytest.approx(0.75)  # 6 / (2 x 4)
    # two micro-batches with the whole batch's counts sum to the whole figure
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                 "seq-mean-token-sum-norm"):
        whole = aggregate(per_token, mask, mode, max_len=4)
        parts = sum(aggregate(per_token[i:i + 1], mask[i:i + 1], mode, tokens=3.0, seqs=2,
                              max_len=4) for i in range(2))
        assert float(parts) == pytest.approx(float(whole)), mode


def _family_loss(name: str, batch: dict, mask: torch.Tensor, max_len: int
                 ) -> tuple[float, torch.Tensor]:
    """A family's loss, on-policy (ratio 1), with its defaults: (value, d loss / d logp)."""
    algo = AlgorithmSpec(name=name)
    logp = torch.zeros(mask.shape, requires_grad=True)
    zeros = torch.zeros(mask.shape)
    terms = policy_loss(logp, zeros, zeros, compute_advantages(algo, batch), mask,
                        algo.clip_low, algo.is_truncation, zeros, algo.kl_coef, algo.kl_type,
                        clip_high=algo.clip_high, loss_agg=algo.loss_agg,
                        ratio_level=algo.ratio_level, max_len=max_len)
    terms.loss.backward()
    return float(terms.loss.detach()), logp.grad


def test_dr_grpo_loss_by_hand() -> None:
    # one group, rewards 1 and 0: advantages r - mean = +.5, -.5 (no std); token sums
    # -.5 x 2 tokens = -1 and +.5 x 1 token; divided by 2 sequences x max_len 4
    batch = {"rewards": torch.tensor([1.0, 0.0]), "group": torch.tensor([0, 0])}
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, grad = _family_loss("dr_grpo", batch, mask, max_len=4)
    assert loss == pytest.approx((-1.0 + 0.5) / 8)
    close(grad, [[-0.5 / 8, -0.5 / 8, 0], [0.5 / 8, 0, 0]])  # every token -A / (2 x 4)
    # GRPO on the same batch: advantages +-1/sqrt(2) (std of the group), token-mean of 3
    loss, grad = _family_loss("grpo", batch, mask, max_len=4)
    assert loss == pytest.approx((-2 * S + S) / 3, abs=1e-5)
    close(grad, [[-S / 3, -S / 3, 0], [S / 3, 0, 0]])


def test_remax_loss_by_hand() -> None:
    # prompt 0's greedy answer scored 0, prompt 1's scored 1: advantages r - b = 1, 0, -1,
    # -1 (no std); token-mean over 5 tokens, no KL term by default (verl's use_kl_loss False)
    batch = {"rewards": torch.tensor([1.0, 0.0, 0.0, 0.0]),
             "reward_baselines": torch.tensor([0.0, 0.0, 1.0, 1.0]),
             "group": torch.tensor([0, 0, 1, 1])}
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    assert AlgorithmSpec(name="remax").kl_coef == 0.0
    loss, grad = _family_loss("remax", batch, mask, max_len=2)
    assert loss == pytest.approx(-(1.0 + 1.0 + 0.0 - 1.0 - 1.0) / 5)
    close(grad, [[-0.2, -0.2], [0, 0], [0.2, 0], [0.2, 0]])


# two responses of 3 and 2 tokens: log-probs under the policy and the reference; k1 = their
# difference: [.2, -.5, 0] and [0, .5, -] (the third token of row 1 is padding)
KL_BATCH = {"behavior_logp": torch.tensor([[-0.5, -1.0, -0.2], [-0.3, -0.4, 0.0]]),
            "ref_logp": torch.tensor([[-0.7, -0.5, -0.2], [-0.3, -0.9, -5.0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
            "rewards": torch.tensor([1.0, 0.0]), "group": torch.tensor([0, 0])}


def test_remax_kl_in_reward_by_hand() -> None:
    # verl's use_kl_in_reward, beta .1: token rewards [-.02, .05, 1] and [0, -.05, -]; the
    # returns-to-go [1.03, 1.05, 1] and [-.05, -.05] minus the greedy rewards 0 and 1
    algo = AlgorithmSpec(name="remax", reward_kl_coef=0.1)
    assert AlgorithmSpec(name="remax").reward_kl_coef == 0.0  # verl's default: off
    batch = {**KL_BATCH, "reward_baselines": torch.tensor([0.0, 1.0])}
    close(compute_advantages(algo, batch), [[1.03, 1.05, 1.0], [-1.05, -1.05, 0.0]])
    # a logp node's proximal log-probs take the sampler's place: k1 [.1, -.5, 0] and [0, 0]
    old = torch.tensor([[-0.6, -1.0, -0.2], [-0.3, -0.9, 0.0]])
    close(compute_advantages(algo, {**batch, "old_logp": old}),
          [[1.04, 1.05, 1.0], [-1.0, -1.0, 0.0]])
    # off, the sequence-level advantage stays r - b
    close(compute_advantages(AlgorithmSpec(name="remax"), batch), [1.0, -1.0])


def test_kl_in_reward_enters_outcome_estimators_as_the_sequence_sum() -> None:
    # scores 1 - .1 * (.2 - .5) = 1.03 and 0 - .1 * .5 = -.05; Dr. GRPO: minus their mean .49
    algo = AlgorithmSpec(name="dr_grpo", reward_kl_coef=0.1)
    close(compute_advantages(algo, KL_BATCH), [0.54, -0.54])
    # k2 (verl's mse) x^2/2: sums .145 and .125 -> scores .9855 and -.0125
    algo = AlgorithmSpec(name="rloo", reward_kl_coef=0.1, reward_kl_type="k2")
    close(compute_advantages(algo, KL_BATCH), [0.998, -0.998])
    # abs: token rewards [-.02, -.05, 1] and [0, -.05]; REINFORCE++ whitens their returns
    # [.93, .95, 1] and [-.05, -.05]
    algo = AlgorithmSpec(name="reinforce_pp", reward_kl_coef=0.1, reward_kl_type="abs")
    returns = torch.tensor([0.93, 0.95, 1.0, -0.05, -0.05])
    whitened = ((returns - returns.mean()) / returns.std()).tolist()
    close(compute_advantages(algo, KL_BATCH), [whitened[:3], [*whitened[3:], 0.0]])


def test_kl_in_reward_needs_a_reference_and_no_critic() -> None:
    with pytest.raises(SpecError, match="no ref_logp node"):
        build_graph(make_spec(algorithm={"name": "remax", "reward_kl_coef": 0.001}))
    build_graph(make_spec(algorithm={"name": "remax", "reward_kl_coef": 0.001},
                          extra_nodes={"ref_logp": {"kind": "ref_logp"}}))
    with pytest.raises(SpecError, match="GAE"):
        build_graph(make_spec(algorithm={"name": "ppo", "reward_kl_coef": 0.001},
                              extra_nodes={"critic": {}, "ref_logp": {"kind": "ref_logp"}}))


def test_remax_with_kl_in_reward_runs_serially_and_reports_it() -> None:
    from rlgraph.runtime.serial import run_serial

    spec = make_spec(algorithm={"name": "remax", "reward_kl_coef": 0.5},
                     extra_nodes={"ref_logp": {"kind": "ref_logp"}}, train={"lr": 1e-2},
                     max_lag=0, steps=2)
    rows = [m["metrics"] for m in run_serial(spec, 2).metrics]
    assert [r["actor/reward_kl_penalty_coeff"] for r in rows] == [0.5, 0.5]
    # version 0 samples with the reference's own weights: no KL; version 1 has moved away
    assert abs(rows[0]["actor/reward_kl_penalty"]) < 1e-5 < abs(rows[1]["actor/reward_kl_penalty"])


def _loss(log_ratio: list[float], adv: float, **kw: object) -> float:
    logp = torch.tensor([log_ratio])
    zeros = torch.zeros_like(logp)
    terms = policy_loss(logp, zeros, zeros, torch.tensor([adv]), torch.ones_like(logp),
                        clip=kw.pop("clip", 0.2), is_truncation=2.0, **kw)  # type: ignore[arg-type]
    return float(terms.loss)


def test_clip_higher_bounds_each_side() -> None:
    up = math.log(1.5)
    assert _loss([up], 1.0, clip_high=0.28) == pytest.approx(-1.28)  # clipped at 1 + .28
    assert _loss([up], 1.0) == pytest.approx(-1.2)  # symmetric 0.2
    down = math.log(0.5)
    assert _loss([down], -1.0, clip_high=0.28) == pytest.approx(0.8)  # low side still 0.2


def test_gspo_uses_the_sequence_ratio() -> None:
    # token log-ratios .2 and .4: the sequence's is their mean, .3, on every token
    seq = _loss([0.2, 0.4], 1.0, clip=10.0, ratio_level="sequence")
    assert seq == pytest.approx(-math.exp(0.3))
    tok = _loss([0.2, 0.4], 1.0, clip=10.0)
    assert tok == pytest.approx(-(math.exp(0.2) + math.exp(0.4)) / 2)
    # GSPO's tiny clip range clips the whole sequence: no gradient
    logp = torch.tensor([[0.2, 0.4]], requires_grad=True)
    zeros = torch.zeros(1, 2)
    policy_loss(logp, zeros, zeros, torch.tensor([1.0]), torch.ones(1, 2), clip=3e-4,
                is_truncation=2.0, clip_high=4e-4, ratio_level="sequence").loss.backward()
    assert torch.all(logp.grad == 0)


def test_value_loss_by_hand() -> None:
    values, old = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]])
    returns, mask = torch.tensor([[2.0, 1.0]]), torch.ones(1, 2)
    # token 0: plain (1-2)^2 = 1, clipped (.5-2)^2 = 2.25 -> 2.25; token 1: 1 and 1 -> 1
    loss, frac = value_loss(values, old, returns, mask, clip=0.5, tokens=2.0)
    assert float(loss) == pytest.approx(0.5 * (2.25 + 1) / 2)
    assert frac == pytest.approx(0.5)


# ----------------------------------------------------------------- schedules and defaults


def test_lr_schedules() -> None:
    assert lr_at(1.0, 0, 100, warmup=4) == pytest.approx(0.2)
    assert lr_at(1.0, 50, 100) == 1.0
    assert lr_at(1.0, 50, 100, kind="cosine") == pytest.approx(0.5)
    assert lr_at(1.0, 100, 100, kind="cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_at(1.0, 25, 100, kind="linear") == pytest.approx(0.75)
    assert lr_at(1.0, 12, 100, warmup=10, kind="linear") == pytest.approx(1 - 2 / 90)


def test_family_defaults_and_overrides() -> None:
    dapo = AlgorithmSpec(name="dapo")
    assert (dapo.clip_low, dapo.clip_high, dapo.kl_coef) == (0.2, 0.28, 0.0)
    assert dapo.dynamic_sampling.enable and dapo.dynamic_sampling.max_draws == 10
    dr = AlgorithmSpec(name="dr_grpo")
    assert dr.loss_agg == "seq-mean-token-sum-norm" and not dr.norm_adv_by_std
    gspo = AlgorithmSpec(name="gspo")
    assert gspo.ratio_level == "sequence" and gspo.loss_agg == "seq-mean-token-mean"
    assert AlgorithmSpec(name="ppo").advantage == "gae"
    assert AlgorithmSpec(name="dapo", clip_high=0.3).clip_high == 0.3  # the user's wins
    assert AlgorithmSpec(name="dapo", dynamic_sampling={"max_draws": 3}
                         ).dynamic_sampling.enable  # a partial section keeps the family's
    old = AlgorithmSpec(clip=0.1)
    assert (old.clip_low, old.clip_high) == (0.1, 0.1)  # the single key sets both
    assert set(DEFAULTS) == {"grpo", "ppo", "rloo", "reinforce_pp", "remax", "dapo",
                             "dr_grpo", "gspo"}


def test_expected_draws_of_dynamic_sampling() -> None:
    spec = DynamicSamplingSpec(enable=True, expected_accuracy=0.5)
    assert spec.expected_draws(4) == pytest.approx(1 / (1 - 2 / 16))
    assert DynamicSamplingSpec(enable=True, expected_accuracy=0.99, max_draws=5
                               ).expected_draws(4) == 5.0  # capped
    assert DynamicSamplingSpec().expected_draws(4) == 1.0


def test_dynamic_sampling_keeps_groups_with_signal() -> None:
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    assert informative_groups(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), group) == [1]
    assert group_slices(group) == [slice(0, 2), slice(2, 4), slice(4, 6)]


# ----------------------------------------------------------------- the graph and its price


def test_ppo_needs_a_critic_and_dynamic_sampling_a_whole_batch() -> None:
    with pytest.raises(SpecError, match="critic") as err:
        build_graph(make_spec(algorithm={"name": "ppo"}))
    assert err.value.key == ("algorithm", "name")
    build_graph(make_spec(algorithm={"name": "ppo"}, extra_nodes={"critic": {}}))
    spec = make_spec(algorithm={"name": "dapo"})
    spec.schedule.partial_rollout = True
    with pytest.raises(SpecError, match="dynamic sampling"):
        build_graph(spec)


@pytest.mark.usefixtures("memory_unchecked")  # costs, not memory
def test_dynamic_sampling_and_critic_are_priced() -> None:
    base = costs_of(cost_spec())
    dapo = costs_of(cost_spec(algorithm={"dynamic_sampling": {"enable": True}}))
    draws = DynamicSamplingSpec(enable=True).expected_draws(4)
    # the model's figure times the draws (a constant weight-switch term is added once)
    assert dapo["generate"].seconds == pytest.approx(base["generate"].seconds * draws, rel=1e-3)
    assert dapo["reward"].seconds == pytest.approx(base["reward"].seconds * draws, rel=1e-6)
    groups = {"trainer": {"share": 0.5, "tasks": ["logp", "critic", "train"]},
              "rollout": {"share": 0.5, "tasks": ["generate"]}}
    nodes = {"generate": {}, "reward": {}, "logp": {}, "critic": {}, "train": {},
             "param_update": {}}
    spec = cost_spec(groups=groups, nodes=nodes, algorithm={"name": "ppo"})
    ppo = costs_of(spec)
    from rlgraph.compiler.memory import group_memory
    from rlgraph.presets.gpus import GPU_PRESETS

    mem = group_memory(spec, "trainer", ["logp", "critic", "train"], 4, GPU_PRESETS["H100"])
    assert mem.tasks["critic"].state == mem.tasks["train"].state  # a policy-sized trainee
    # a value forward and a forward + backward: between the train step's and 4/3 of it
    assert base["train"].seconds * 0.9 < ppo["critic"].seconds < base["train"].seconds * 1.5


def test_the_critic_is_checkpointed_with_its_workspace(tmp_path: object) -> None:
    from rl_support import MICRO

    from rlgraph.process.workspace import Workspace
    from rlgraph.runtime.checkpoint import checkpoint_files

    spec = make_spec(model={"hf_config": dict(MICRO)}, algorithm={"name": "ppo"},
                     extra_nodes={"critic": {}})
    ws = Workspace(spec, ["critic"])
    critic = ws.worker("critic")
    state = ws.state_for_checkpoint()
    assert set(state["workers"]["critic"]) == {"weights", "optimizer"}
    checkpoint_files({"step": 1, "policy_version": 1}, state, {}, {}, None)  # serialisable
    with torch.no_grad():
        for p in critic.model.parameters():
            p.add_(1.0)
    ws.load_checkpoint(state)
    restored = critic.model.state_dict()
    assert all(torch.equal(restored[k], v) for k, v in state["workers"]["critic"]["weights"]
               .items())
