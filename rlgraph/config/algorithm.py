"""`algorithm:` of graph.yaml: which RL algorithm, and the switches verl users know.

`algorithm.name` picks a family and fills every switch the user leaves out with that family's
documented default in verl (the `DEFAULTS` table; the sources are cited beside each row). Any
switch written in graph.yaml wins over the table.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlgraph.nodes.base import StrictModel

AlgorithmName = Literal["grpo", "ppo", "rloo", "reinforce_pp", "remax", "dapo", "dr_grpo",
                        "gspo"]
LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm"]
ALGORITHMS: tuple[str, ...] = AlgorithmName.__args__  # type: ignore[attr-defined]

# Per family: the advantage estimator, the loss's switches and whether DAPO's group filter
# is on. Sources (verl): docs/algo/grpo.md (clip_ratio 0.2, loss_agg_mode token-mean, KL
# loss 0.001 low_var_kl; Dr.GRPO: seq-mean-token-sum-norm, norm_adv_by_std_in_grpo False,
# no KL loss), docs/algo/ppo.md (clip_ratio 0.2; gamma, lam of GAE: 1.0 and 1.0 in
# verl/trainer/config/algorithm.py AlgoConfig), docs/algo/dapo.md (clip_ratio_low 0.2,
# clip_ratio_high 0.28, token-mean, filter_groups with max_num_gen_batches 10; the DAPO
# recipe sets use_kl_loss False), the GSPO examples (policy_loss.loss_mode gspo,
# clip_ratio_low 3e-4, clip_ratio_high 4e-4, loss_agg_mode seq-mean-token-mean), and
# verl/trainer/ppo/core_algos.py for RLOO, REINFORCE++ and ReMax (token-mean, clip 0.2);
# ReMax's example (examples/remax_trainer) sets use_kl_loss False and puts a 0.001 KL in the
# reward instead (`reward_kl_coef: 0.001` with a ref_logp node here); verl's default
# (use_kl_in_reward False) is every family's default: no KL in the reward.
DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage": "group", "loss_agg": "token-mean", "clip_low": 0.2,
             "clip_high": 0.2, "norm_adv_by_std": True, "kl_coef": 0.001},
    "ppo": {"advantage": "gae", "loss_agg": "token-mean", "clip_low": 0.2, "clip_high": 0.2,
            "norm_adv_by_std": True, "kl_coef": 0.001},
    "rloo": {"advantage": "leave_one_out", "loss_agg": "token-mean", "clip_low": 0.2,
             "clip_high": 0.2, "norm_adv_by_std": True, "kl_coef": 0.001},
    "reinforce_pp": {"advantage": "reinforce_pp", "loss_agg": "token-mean", "clip_low": 0.2,
                     "clip_high": 0.2, "norm_adv_by_std": True, "kl_coef": 0.001},
    "remax": {"advantage": "greedy_baseline", "loss_agg": "token-mean", "clip_low": 0.2,
              "clip_high": 0.2, "norm_adv_by_std": True, "kl_coef": 0.0},
    "dapo": {"advantage": "group", "loss_agg": "token-mean", "clip_low": 0.2,
             "clip_high": 0.28, "norm_adv_by_std": True, "kl_coef": 0.0,
             "dynamic_sampling": {"enable": True}},
    "dr_grpo": {"advantage": "group", "loss_agg": "seq-mean-token-sum-norm", "clip_low": 0.2,
                "clip_high": 0.2, "norm_adv_by_std": False, "kl_coef": 0.0},
    "gspo": {"advantage": "group", "loss_agg": "seq-mean-token-mean", "clip_low": 3e-4,
             "clip_high": 4e-4, "norm_adv_by_std": True, "kl_coef": 0.001,
             "ratio_level": "sequence"},
}


class DynamicSamplingSpec(StrictModel):
    """DAPO's dynamic sampling (verl: algorithm.filter_groups): groups whose rewards are all
    equal carry no GRPO signal and are dropped; generate keeps drawing new prompts until the
    step's batch is full, at most `max_draws` batches of prompts."""

    enable: bool = False
    max_draws: int = Field(default=10, ge=1, le=1000, description="batches of prompts drawn "
                           "per step at most (verl: max_num_gen_batches); a batch still short "
                           "then is filled with dropped groups")
    expected_accuracy: float = Field(
        default=0.5, gt=0, lt=1, description="for the plan's price only: the expected "
        "fraction of correct samples; a group of n is dropped with probability p^n + (1-p)^n")

    def expected_draws(self, samples_per_prompt: int) -> float:
        """Prompt batches generate is expected to draw per step: 1 / the chance that a group
        keeps (binary rewards at `expected_accuracy`), at most `max_draws`; 1 when off."""
        if not self.enable:
            return 1.0
        p, n = self.expected_accuracy, samples_per_prompt
        keep = 1.0 - p**n - (1.0 - p) ** n
        return float(self.max_draws) if keep <= 0 else min(float(self.max_draws), 1.0 / keep)


class AlgorithmSpec(StrictModel):
    """The RL objective (verl: algorithm.* and actor.*_loss settings); unset switches take the
    family's default (`DEFAULTS`)."""

    name: AlgorithmName = "grpo"
    kl_coef: float = Field(default=0.001, ge=0, le=100,
                           description="KL(policy || reference) loss weight; needs a "
                           "ref_logp node (a value written above 0 without one is refused; "
                           "the family's default then goes unused)")
    kl_type: Literal["k3", "low_var_kl", "k1"] = "low_var_kl"
    reward_kl_coef: float = Field(
        default=0.0, ge=0, le=100, description="KL(policy || reference) penalty subtracted "
        "from each response token's reward before the advantages (verl: use_kl_in_reward "
        "with a fixed kl_ctrl.kl_coef); 0: off; needs a ref_logp node")
    reward_kl_type: Literal["k1", "abs", "k2", "low_var_kl"] = Field(
        default="k1", description="the reward's KL estimator (verl: kl_penalty; its kl is k1, "
        "mse is k2)")
    clip: float = Field(default=0.2, ge=1e-4, le=10, description="symmetric clip range: the "
                        "default of clip_low and clip_high where the family has none of its own")
    clip_low: float = Field(default=0.2, ge=1e-6, le=10,
                            description="the ratio is clipped below at 1 - clip_low")
    clip_high: float = Field(default=0.2, ge=1e-6, le=10,
                             description="the ratio is clipped above at 1 + clip_high (DAPO's "
                             "clip-higher)")
    loss_agg: LossAgg = Field(default="token-mean", description="how token losses reduce to "
                              "one (verl: loss_agg_mode)")
    ratio_level: Literal["token", "sequence"] = Field(
        default="token", description="sequence: GSPO's length-normalised sequence ratio")
    is_truncation: float = Field(default=2.0, ge=1e-3, le=1e6,
                                 description="decoupled-PPO weight cap")
    norm_adv_by_std: bool = Field(default=True, description="GRPO: divide by the group's std")
    gamma: float = Field(default=1.0, ge=0, le=1, description="discount (GAE, REINFORCE++)")
    lam: float = Field(default=1.0, ge=0, le=1, description="GAE lambda")
    advantage: Literal["group", "gae", "leave_one_out", "reinforce_pp", "greedy_baseline",
                       "batch"] = Field(default="group", description="the estimator; set by "
                                        "name")
    dynamic_sampling: DynamicSamplingSpec = Field(default_factory=DynamicSamplingSpec)

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        """Fill each switch the user left out with the family's default; `clip` alone sets
        both clip ranges (the older single key)."""
        if not isinstance(data, dict):
            return data
        table = DEFAULTS.get(data.get("name", "grpo"))
        if table is None:
            return data  # the name's own error follows
        filled = dict(data)
        for key, value in table.items():
            if key == "dynamic_sampling":
                given = filled.get(key)
                if isinstance(given, dict) or given is None:
                    filled[key] = {**value, **(given or {})}
            elif key in ("clip_low", "clip_high") and "clip" in data:
                filled.setdefault(key, data["clip"])
            else:
                filled.setdefault(key, value)
        return filled
