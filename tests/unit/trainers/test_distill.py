"""trainers.rl.opd's teacher stage on hand-worked numbers: the per-token rewards of on-policy
distillation, their sum with a task's token rewards, the logged KL; and train opd's flags."""

import math

import pytest
import torch

from rlhfkit.config.opd import OPDConfig
from rlhfkit.core.advantages import compute_advantages
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import check_same_vocab
from rlhfkit.trainers.rl.opd import TeacherScorer
from rlhfkit.trainers.rl.scoring import Scored


class TaskScorer:
    """A task reward of 1 and 2 for the two samples (and, when given, process rewards)."""

    tokenizer = None

    def __init__(self, token_rewards=None):
        self.token_rewards = token_rewards

    def __call__(self, prompts, trajs):
        return Scored(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), self.token_rewards, {"reward": 1.5})


class FixedTeacher(TeacherScorer):
    """The teacher's logprobs given by hand instead of a model's forward."""

    def teacher_logprobs(self, batch):
        return torch.tensor([[-1.0, -2.0, -0.5], [-0.5, -3.0, 0.0]])


def trajs():
    # sample 0: 3 action tokens; sample 1: 2 (the third position is padding)
    return [Trajectory(torch.tensor([5]), torch.tensor([1, 2, 3]), torch.tensor([True, True, True]),
                       torch.tensor([-2.0, -1.0, -0.5]), "stop", 0, 0),
            Trajectory(torch.tensor([5]), torch.tensor([4, 5]), torch.tensor([True, True]),
                       torch.tensor([-1.5, -1.0]), "stop", 0, 1)]


def scorer(topk=0, coef=1.0, estimator="k1", token_rewards=None):
    return FixedTeacher(TaskScorer(token_rewards), None, coef=coef, topk=topk, kl_estimator=estimator,
                        temperature=1.0, micro_batch_size=2, pad_id=0, autocast=None, device=torch.device("cpu"))


def test_sampled_token_rewards_are_the_teacher_minus_student_logprobs():
    out = scorer(coef=0.5)([None, None], trajs())
    # 0.5 * (teacher - student): (0.5, -0.5, 0), (0.5, -1, masked)
    assert out.token_rewards.tolist() == [[0.5, -0.5, 0.0], [0.5, -1.0, 0.0]]
    assert out.rewards.tolist() == [1.0, 2.0] and out.metrics["reward"] == 1.5
    # k1 = student - teacher over the 5 action tokens: (-1 + 1 + 0 - 1 + 2) / 5
    assert out.metrics["opd/kl"] == pytest.approx(0.2)
    assert out.metrics["opd/reward"] == pytest.approx((0.5 - 0.5 + 0.0 + 0.5 - 1.0) / 5)


def test_k3_metric_and_task_token_rewards_add():
    out = scorer(estimator="k3", token_rewards=torch.tensor([[0.0, 0.0, 1.0], [0.0, 3.0, 0.0]]))([None, None],
                                                                                             trajs())
    assert out.token_rewards.tolist() == [[1.0, -1.0, 1.0], [1.0, 1.0, 0.0]]
    k3 = [math.exp(r) - 1 - r for r in (1.0, -1.0, 0.0, 1.0, -2.0)]  # r = teacher - student
    assert out.metrics["opd/kl"] == pytest.approx(sum(k3) / 5, rel=1e-6)


def test_topk_mode_leaves_the_rewards_to_the_update():
    out = scorer(topk=5)([None, None], trajs())
    assert out.token_rewards is None and "opd/reward" not in out.metrics and "opd/kl" in out.metrics


def test_reinforce_with_gamma_0_makes_each_tokens_advantage_its_own_reward():
    out = scorer()([None, None], trajs())
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv, _ = compute_advantages("reinforce", torch.zeros(2), mask, torch.tensor([0, 1]), gamma=0.0,
                                whiten=False, dense_rewards=out.token_rewards)
    assert adv.tolist() == [[1.0, -1.0, 0.0], [1.0, -2.0, 0.0]]


def test_opd_flags_and_presets():
    cfg = OPDConfig.from_args(["--teacher.model_name_or_path", "t", "--model.model_name_or_path", "s",
                               "--opd.topk", "8", "--opd.kl_estimator", "k3", "--generate.max_new_tokens", "32",
                               "--generate.temperature", "0.7", "--teacher.offload"])
    assert (cfg.actor.model_name_or_path, cfg.algo.teacher_model_name_or_path) == ("s", "t")
    assert (cfg.algo.teacher_topk, cfg.algo.teacher_kl_estimator, cfg.algo.teacher_offload) == (8, "k3", True)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (32, 0.7)
    a = cfg.algo.advantage
    assert (a.estimator, a.gamma, a.whiten, cfg.rollout.n_samples_per_prompt) == ("reinforce", 0.0, "false", 1)
    assert cfg.ckpt.output_dir == "runs/opd" and cfg.train.batch_size == cfg.rollout.batch_size


@pytest.mark.parametrize("argv,needle", [
    ([], "--teacher.model_name_or_path is required"),
    (["--teacher.model_name_or_path", "t", "--generate.top_p", "0.9"], "--opd.topk 0 rewards the sampled tokens"),
    (["--teacher.model_name_or_path", "t", "--opd.topk", "-1"], "--algo.teacher_topk must be >= 0"),
    (["--teacher.model_name_or_path", "t", "--opd.kl_estimator", "k9"], "--algo.teacher_kl_estimator: unknown"),
])
def test_opd_refuses_bad_settings_in_one_line(argv, needle):
    with pytest.raises(ConfigError) as e:
        OPDConfig.from_args(argv)
    assert str(e.value).startswith(needle) and "\n" not in str(e.value)


def test_another_tokenizer_is_refused():
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

        def __len__(self):
            return len(self.vocab)

    check_same_vocab(Tok({"a": 0, "b": 1}), Tok({"a": 0, "b": 1}), "t")
    with pytest.raises(ConfigError, match="^the teacher t has another tokenizer \\(3 tokens, the student 2\\)"):
        check_same_vocab(Tok({"a": 0, "b": 1}), Tok({"a": 0, "b": 1, "c": 2}), "t")
