"""The switch-offs: each names one feature's entry point, what it is replaced by (a no-op, or the
feature's default), and the tests that must fail when it is. `python -m tests.switchoff.harness`
runs them (tests/switchoff/test_switch_offs.py does in the default suite) and prints the table.

Targets are "module:attribute" or "module:Class.method"; `make(original)` returns the replacement.
Test ids are pytest node ids relative to the repository root; keep them fast (unit tests, tiny
loops): the whole table runs in a few minutes on 2 cores."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

REPORT_KEY = "switch_offs"  # the user property of the test's report holding the table (tests/switchoff/conftest.py)


@dataclasses.dataclass(frozen=True)
class SwitchOff:
    name: str
    """The feature, as a user names it."""
    target: str
    """The entry point replaced: "module:attribute" or "module:Class.method"."""
    make: Callable
    """`make(original) -> replacement`."""
    tests: tuple[str, ...]
    """Node ids that must pass as they are and fail with the feature switched off."""
    how: str
    """What the replacement does, in a few words (the table's column)."""


def torchs_clip(original):
    import torch

    return torch.nn.utils.clip_grad_norm_


def noop(original):
    return lambda *args, **kwargs: None


def nothing_changed(original):
    return lambda model: 0


def version_bump_only(original):
    def update_weights(self, state, version):
        self._version = version
    return update_weights


def stays_put(original):
    @contextlib.contextmanager
    def on_device(model, device):
        yield model
    return on_device


def identity_model(original):
    return lambda model, *args, **kwargs: model


def quantized_state(original):
    def parts(self, bucket_bytes):
        yield self.model.state_dict()
    return parts


def no_loss_scale(original):
    def init(self, *args, **kwargs):
        original(self, *args, **{**kwargs, "loss_scale": None})  # every Learner as without float16
    return init


def no_optimizer_step(original):
    def step(self):
        self.optimizer.step = lambda *args, **kwargs: None  # the clip, scheduler and EMA still run
        try:
            return original(self)
        finally:
            del self.optimizer.step
    return step


def no_center_penalty(original):
    return lambda chosen, rejected: chosen.sum() * 0


def nll_only(original):
    return lambda *args, dft=False, **kwargs: original(*args, **kwargs)


def zero_penalty(original):
    import torch

    return lambda lengths, *args, **kwargs: torch.zeros(len(lengths))


def nothing_kept(original):
    return lambda self, key, prompt, version: None  # every turn prefilled in full


def unpenalized(original):
    return lambda logits, seen, penalty: logits


def never_rebuilt(original):
    return lambda self: (0,)  # the same stamp whatever the weights: the copy is never rebuilt


def no_residual_upcast(original):
    return lambda model: True  # says it added the hook, adds nothing


def no_stop_penalty(original):
    return lambda rewards, truncated, coef: rewards


def unweighted_blend(original):
    return lambda sizes, probs, seed: original(sizes, None, seed)  # concatenated


def keep_all_groups(original):
    import torch

    def keep(group_ids, scores, low, high):
        return torch.ones_like(group_ids, dtype=torch.bool)
    return keep


def ones_weights(original):
    def weigh(old_logp, rollout_logp, loss_mask, kind, low, high):
        _, metrics = original(old_logp, rollout_logp, loss_mask, kind, low, high)
        return loss_mask.to(old_logp.dtype), metrics
    return weigh


def gamma_one(original):
    return lambda *args, **kwargs: original(*args, **{**kwargs, "gamma": 1.0})


def hard_labels(original):
    return lambda *args, **kwargs: [float(round(x)) for x in original(*args, **kwargs)]


def packing_off(original):
    return lambda samples, pad_id, packing: original(samples, pad_id, False)


def padded_layout(original):
    return lambda model, batch: batch.padded()


def unpooled(original):
    def call(self, queries, prompts, labels, **kwargs):
        return self.reward_fn(queries, prompts, labels, **kwargs)
    return call


def untruncated(original):
    return lambda self, text: self.tokenizer(text, add_special_tokens=False)["input_ids"]


def unit_normalization(original):
    return lambda model: (0.0, 1.0)


def engine_keeps_its_version(original):
    return lambda engine: engine.version


def no_token_budget(original):
    return lambda self, *args: original(dataclasses.replace(self, max_tokens=None), *args)


def reads_no_number(original):
    return lambda *args, **kwargs: None


def never_equal(original):
    return lambda *args, **kwargs: False


def kl_not_in_loss(original):
    return lambda self, exp, rows, layout, kl_coef, counts: original(self, exp, rows, layout, 0.0, counts)


def kl_not_in_reward(original):
    return lambda *args, **kwargs: original(*args, **{**kwargs, "kl_in_reward": False})


def freezes_nothing(original):
    return lambda model, projector=False: 1  # says it froze a parameter


def no_images(original):
    return lambda model, batch, device: {}


def scores_without_images(original):
    def batch_scores(model, batch):
        return original(model, dataclasses.replace(batch, vision=None))  # the ids alone (image tokens unfilled)
    return batch_scores


def no_images_for_rewards(original):
    return lambda prompts: {}


def no_images_counted(original):
    return lambda vision: 0


def no_prompt_images(original):
    return lambda prompts: {}


def no_images_sent(original):
    return lambda vision: {}  # the engine gets the prompts' ids alone


def images_not_put_back(original):
    return lambda trajs, vision, n: trajs


def language_layers_only(original):
    return lambda base: list(base.language_model.layers)  # the tower's blocks go with the base model's unit


def nothing_held_whole(original):
    return lambda model: set()  # fully_shard shards the 4-bit weights too


def head_only(original):
    return lambda path: ("lm_head",)  # the tower and projector quantized too


def text_request(original):
    return lambda ids, vision, image_prompt: {"prompt_token_ids": [int(t) for t in ids]}  # no images sent


def spans_kept(original):
    return lambda ids, prompt: ([int(t) for t in ids], sum(int(t) == prompt.boi_id for t in ids))  # sent expanded


def no_processor_given(original):
    return lambda processor, max_images, *executors: None  # the executors keep processor None


def served_as_text(original):
    return lambda model: None  # the folder served as a text model


def tools_ignored(original):
    return lambda self, tools: original(self, None)  # the template without the request's tools


def nothing_forced(original):
    return lambda tt, choice: ""  # tool_choice "required" / a named function: no call opening appended


def no_call_images(original):
    return lambda self, ids, data, placeholders: (None, ())  # the engine call without its images


def text_model_steps(original):
    from rlhfkit.rollout.hf import HFEngine

    return lambda self, s: HFEngine._uncached_logits(self, s)  # the ids alone: no image, plain positions


def concatenated(original):
    import torch

    return lambda tensors: torch.cat(tensors)  # rows of per-prompt tensors as they are: no padding


def whole_prefix(original):
    return lambda input_ids, prompt_lengths: original(input_ids, None)  # the response typed 0 with the prompt


def per_token_as_given(original):
    return lambda tensor, length: tensor  # the prompt's rows only, zero-padded across rows


def no_decode_extra(original):
    return lambda self, s: None  # decode steps without the per-token image inputs


def names_as_given(original):
    return lambda model, targets, tower=False: targets  # peft matches the names anywhere, the tower included


def text_decoder(original):
    return lambda model: model.get_decoder()  # the language model alone: no image reaches it


def adam_only(original):
    return lambda named: [False] * len(named)  # no parameter goes to Muon


def actor_always_trained(original):
    return lambda self, exp, kl_coef, train_actor=True: original(self, exp, kl_coef)


def oldest_alone(original):
    def take(self):
        with self.lock:
            return [self.pending.pop(0)] if self.pending else []
    return take


def replays_nothing(original):
    import torch

    from rlhfkit.models.moe import ReplayCounts

    @contextlib.contextmanager
    def replay_routing(model, codes):
        zero = torch.zeros((), dtype=torch.float64)
        yield ReplayCounts(zero.clone(), zero.clone(), zero.clone())  # no router hooked: each keeps its own top-k
    return replay_routing



def no_entries(original):
    return lambda spec: []


def last_tag(original):
    from reasoning_gym.utils import extract_answer

    return extract_answer


def never_holds(original):
    return lambda answer, oracle: False


def credit_kept(original):
    return lambda score: score


def observations_dropped(original):
    return lambda self, obs, method: [] if method == "step" else original(self, obs, method)


def unnamed(original):
    return lambda spec: (spec, None)


def never_cut(original):
    return lambda *args, **kwargs: None


def folder_config(original):
    return lambda config, overrides, where="": None


def ratio_only(original):
    return lambda steps, ratio, total_opt: int(ratio * total_opt)

STAGES = "tests/unit/trainers/test_stages.py"
LOSS_SCALE = "tests/unit/trainers/test_loss_scale.py"
KL = "tests/unit/trainers/test_kl_placement.py"
OFFPOLICY = "tests/unit/trainers/test_offpolicy.py"
LEVERS = "tests/integration/test_levers_observed.py"
PARTIAL = "tests/unit/distributed/test_partial_rollout_worker.py"
VLLM = "tests/unit/rollout/test_vllm_colocated.py"
DYNAMIC = "tests/unit/trainers/test_dynamic_sampling.py"
DEVICES = "tests/integration/test_devices_and_levers.py"
AGENTS = "tests/integration/test_agent_loop.py"
ENVLIBS = "tests/integration/test_env_libraries.py"
RG_REWARD = "tests/unit/rewards/test_reasoning_gym_reward.py"
VISION = "tests/unit/rollout/test_vision_engine.py"
VISION_TOOLS = "tests/unit/agents/test_vision_tools.py"
VISION_LORA = "tests/unit/models/test_vision_lora.py"
FSDP_QLORA = "tests/unit/distributed/test_fsdp_qlora.py"
VISION_WORKER = "tests/unit/distributed/test_vision_worker.py"
VISION_EVAL = "tests/integration/test_vision_eval.py"
VISION_EXECUTE = "tests/unit/agents/test_vision_execute.py"
TOOL_CHOICE = "tests/unit/agents/test_endpoint_toolchoice.py"
FORCED = "test_a_forced_call_opens_the_turn_in_the_prompt_and_only_the_sampled_tokens_train"
CUT = "test_parallel_tool_calls_false_cuts_the_turn_after_its_first_call"
VISION_RM = "tests/integration/test_vision_reward_model.py"
MIX = "tests/unit/api/test_prompt_mix.py"
ORL_RL = "tests/integration/test_openrlhf_rl_options.py"
MUON = "tests/unit/trainers/test_muon.py"
WARMUP = "tests/unit/trainers/test_critic_warmup.py"
REPLAY = "tests/unit/models/test_routing_replay.py"
SERVED_RM = "tests/integration/test_serve_reward_model.py"
SERVED_PRM = "tests/integration/test_serve_prm.py"
FLIPPED = "test_replay_undoes_a_router_choice_that_flipped_between_rollout_and_training"

SWITCH_OFFS = (
    SwitchOff("vision tower frozen (--actor.freeze_visual_encoder)", "rlhfkit.models.vision:freeze_visual_encoder",
              freezes_nothing,
              (f"{VISION}::test_freeze_visual_encoder_leaves_the_tower_bit_identical_and_trains_the_rest[qwen2_vl]",),
              "freezes nothing"),
    SwitchOff("vision tower frozen in train sft, rm, dpo and kto (--model.freeze_visual_encoder)",
              "rlhfkit.models.vision:freeze_visual_encoder", freezes_nothing,
              (f"{VISION_RM}::test_freeze_visual_encoder_keeps_the_tower_as_loaded_and_trains_the_rest[rm-True]",
               f"{VISION_RM}::test_freeze_visual_encoder_keeps_the_tower_as_loaded_and_trains_the_rest[sft-True]"),
              "freezes nothing"),
    SwitchOff("images in a reward model over images' scores (train rm, --reward.model_name_or_path)",
              "rlhfkit.models.reward:batch_scores", scores_without_images,
              ("tests/unit/models/test_vision_reward.py::"
               "test_the_score_is_the_head_on_the_base_models_hidden_state_at_the_last_token[qwen2_vl]",
               "tests/unit/rewards/test_vision_reward_fn.py::test_changing_the_image_changes_the_score",
               f"{VISION_RM}::test_training_ranks_the_held_out_pairs_by_the_images_colour[gemma3]"),
              "scored from the ids alone"),
    SwitchOff("the prompt's images reach RL's reward functions (a reward model over images)",
              "rlhfkit.rewards.reward_model:prompt_images", no_images_for_rewards,
              (f"{VISION_RM}::test_an_rl_step_is_rewarded_with_the_reward_models_scores_of_each_prompts_image",),
              "no prompt_images= passed"),
    SwitchOff("images in the training forward (vision-language models)", "rlhfkit.models.vision:vision_kwargs",
              no_images, (f"{VISION}::test_rollout_logprobs_equal_the_trainers_forward[llava]",
                          f"{VISION}::test_the_images_change_the_logprobs[gemma3]"), "no image tensors"),
    SwitchOff("weights loaded on sync (HF engine, partial rollouts)", "rlhfkit.rollout.hf:HFEngine.update_weights",
              version_bump_only, (f"{PARTIAL}::test_weights_staged_mid_generation_are_used_for_the_rest_of_it",),
              "stamps the version, loads nothing"),
    SwitchOff("weights loaded on sync (vLLM engine)", "rlhfkit.rollout.vllm:VLLMEngine.update_weights",
              version_bump_only, (f"{VLLM}::test_bytes_path_delivers_every_tensor_bit_for_bit",
                                  f"{VLLM}::test_a_colocated_rl_step_wakes_weights_to_load_them_then_the_kv_cache_to_generate"),
              "stamps the version, loads nothing"),
    SwitchOff("sync after the update", "rlhfkit.trainers.rl.sync:sync_weights", engine_keeps_its_version,
              (f"{STAGES}::test_sync_weights_bumps_the_engine_version",
               f"{VLLM}::test_a_colocated_rl_step_wakes_weights_to_load_them_then_the_kv_cache_to_generate"),
              "no-op"),
    SwitchOff("gradient checkpointing", "rlhfkit.models.precision:enable_gradient_checkpointing", noop,
              (f"{LEVERS}::test_gradient_checkpointing_recomputes_each_layer_in_backward",
               f"{LEVERS}::test_gradient_checkpointing_saves_fewer_tensors_for_backward"), "no-op"),
    SwitchOff("reference / reward model offload", "rlhfkit.models.precision:on_device", stays_put,
              (f"{LEVERS}::test_an_offloaded_reference_moves_to_the_device_for_its_pass_and_back",), "nothing moves"),
    SwitchOff("optimizer step", "rlhfkit.trainers.learner:Learner.step", no_optimizer_step,
              (f"{STAGES}::test_update_moves_the_weights_towards_the_positive_advantage",
               "tests/gpu/test_device_vs_cpu.py::test_one_rl_step_matches_the_cpu[cpu]"), "optimizer.step a no-op"),
    SwitchOff("float16 dynamic loss scaling", "rlhfkit.trainers.learner:Learner.__init__", no_loss_scale,
              (f"{LOSS_SCALE}::test_an_overflow_skips_the_step_lowers_the_scale_and_leaves_the_weights",
               f"{LOSS_SCALE}::test_the_scale_keeps_gradients_below_float16s_range",
               f"{LOSS_SCALE}::test_unscaled_once_per_step_and_clipped_as_the_float32_learner"),
              "loss_scale None: unscaled"),
    SwitchOff("the loss scale restored on resume", "rlhfkit.trainers.loss_scale:DynamicLossScale.load_state_dict",
              noop, ("tests/integration/test_supervised_resume.py::test_fp16_loss_scale_resumes_exactly[sft]",),
              "no-op: the first scale again"),
    SwitchOff("token-budget micro-batches (dynamic batch)", "rlhfkit.trainers.rl.batching:MicroBatcher.cut",
              no_token_budget,
              ("tests/unit/trainers/test_token_budget.py::test_micro_batches_are_cut_by_the_token_budget",),
              "max_tokens ignored"),
    SwitchOff("EMA of the policy", "rlhfkit.core.ema:ema_update", noop,
              ("tests/unit/core/test_ema.py::test_ema_one_step_by_hand",
               "tests/unit/trainers/test_learner.py::test_ema_tracks_parameters"), "no-op"),
    SwitchOff("off-policy correction (TIS / ICEPOP)", "rlhfkit.core.losses:is_weights", ones_weights,
              (f"{OFFPOLICY}::test_perturbed_rollout_logprobs_weigh_the_loss_by_hand[tis]",
               f"{OFFPOLICY}::test_perturbed_rollout_logprobs_weigh_the_loss_by_hand[icepop]"), "weights 1"),
    SwitchOff("dynamic filtering", "rlhfkit.core.filtering:keep_groups_in_range", keep_all_groups,
              ("tests/unit/core/test_filtering.py", f"{DYNAMIC}::test_dropped_groups_are_topped_up_from_new_prompts"),
              "keeps every group"),
    SwitchOff("overlong shaping", "rlhfkit.core.shaping:overlong_penalty", zero_penalty,
              ("tests/unit/core/test_shaping.py::test_overlong_penalty_example",
               f"{DYNAMIC}::test_overlong_penalty_under_its_reward_flag"),
              "penalty 0"),
    SwitchOff("stop-properly penalty", "rlhfkit.core.shaping:stop_properly_penalty", no_stop_penalty,
              ("tests/unit/core/test_shaping.py::test_stop_properly_penalty_by_hand",
               f"{STAGES}::test_scorer_applies_the_stop_properly_penalty_after_the_overlong_one_by_hand",
               f"{ORL_RL}::test_two_prompt_files_mixed_by_their_probabilities_and_truncated_samples_penalised"),
              "rewards unchanged"),
    SwitchOff("prompt mixing probabilities (--data.prompt_probs)", "rlhfkit.data.records:blend_order",
              unweighted_blend, (f"{MIX}::test_the_mix_of_a_fixed_seed_by_hand",
                                 f"{MIX}::test_the_proportions_over_many_draws_follow_the_probabilities",
                                 f"{ORL_RL}::test_two_prompt_files_mixed_by_their_probabilities_and_truncated_samples_"
                                 "penalised"),
              "datasets concatenated"),
    SwitchOff("Muon for the hidden matrices (--actor.optim muon, --train.optim muon)",
              "rlhfkit.trainers.learner:muon_mask", adam_only,
              (f"{MUON}::test_a_muon_step_is_torch_muon_on_the_matrices_plus_adamw_on_the_rest",
               f"{MUON}::test_the_update_of_a_rank_one_gradient_by_hand",
               f"{MUON}::test_switched_off_adam_and_muon_give_different_matrices_and_the_same_rest"),
              "AdamW for every parameter"),
    SwitchOff("critic warm-up (--actor.freezing_steps)", "rlhfkit.trainers.rl.update:PolicyUpdate.__call__",
              actor_always_trained, (f"{WARMUP}::test_a_frozen_update_trains_the_critic_alone_then_the_actor_trains",
                                     f"{WARMUP}::test_the_critic_trains_the_same_whether_the_actor_is_frozen_or_not"),
              "the actor trains every step"),
    SwitchOff("discounting (gamma)", "rlhfkit.core.advantages:compute_advantages", gamma_one,
              (f"{STAGES}::test_a_new_estimator_trains_through_the_loop_with_only_its_table_entries",), "gamma 1"),
    SwitchOff("KL in the reward", "rlhfkit.trainers.rl.experience:make_experience", kl_not_in_reward,
              (f"{KL}::test_kl_in_the_reward_is_a_per_token_penalty_summed_into_the_returns",), "kl_in_reward False"),
    SwitchOff("KL in the loss", "rlhfkit.trainers.rl.update:PolicyUpdate.micro_step", kl_not_in_loss,
              (f"{KL}::test_kl_in_the_loss_adds_its_gradient_and_leaves_the_returns_alone",), "KL coefficient 0"),
    SwitchOff("LoRA", "rlhfkit.models.lora:add_lora", identity_model,
              (f"{DEVICES}::test_lora_in_rl_trains_the_adapters_only_against_the_base_model",), "the model unchanged"),
    # the built-in environments are loaded from their files (fresh modules): switched off through what they import
    SwitchOff("built-in guess environment: reading the guess", "rlhfkit.rewards.math:extract_first_integer",
              reads_no_number, (f"{AGENTS}::test_builtin_environments_run[guess]",), "no number found"),
    SwitchOff("built-in calculator environment: checking the answer", "rlhfkit.rewards.math:answers_equal",
              never_equal, (f"{AGENTS}::test_builtin_environments_run[calculator]",), "never equal"),
    SwitchOff("PRM soft labels", "rlhfkit.data.steps:label_targets", hard_labels,
              ("tests/integration/test_prm.py::test_soft_labels_from_python",), "rounded to 0 / 1"),
    SwitchOff("packed micro-batches in `train prm` (--ds.packing_samples)",
              "rlhfkit.trainers.supervised.prm:step_batch", packing_off,
              ("tests/unit/trainers/test_prm.py::test_packed_loss_and_gradients_equal_padded",), "padded rows"),
    SwitchOff("packed micro-batches in `train rm` (--ds.packing_samples)",
              "rlhfkit.models.reward:packable_layout", padded_layout,
              ("tests/unit/trainers/test_rm_packing.py::test_packed_loss_and_gradients_equal_padded",
               "tests/unit/trainers/test_rm_packing.py::test_packed_scores_of_a_classifier_equal_the_padded_ones[llama]"),
              "padded rows"),
    SwitchOff("concurrent requests sharing a served reward model's passes (`serve-reward`)",
              "rlhfkit.rewards.server:PooledReward.__call__", unpooled,
              (f"{SERVED_RM}::test_concurrent_requests_share_forward_passes_of_batch_size_queries",
               f"{SERVED_RM}::test_pooled_calls_get_their_own_rows_or_the_error"),
              "each request its own call"),
    SwitchOff("a process reward model's step rewards over HTTP (`serve-reward` of a PRM, `--reward.remote_url`)",
              "rlhfkit.trainers.rl.scoring:Scorer.placed_steps", lambda original: lambda self, out, trajs: (None, out),
              (f"{SERVED_PRM}::test_the_served_steps_land_where_the_in_process_ones_do[#]",
               f"{SERVED_PRM}::test_the_served_steps_land_where_the_in_process_ones_do[#%]",
               f"{SERVED_PRM}::test_an_rl_run_over_http_is_the_in_process_prm_run"),
              "the aggregate as the scalar reward"),
    SwitchOff("a served reward model's query truncation (`serve-reward --data.max_len`)",
              "rlhfkit.rewards.reward_model:RewardModelFn.tokens", untruncated,
              (f"{SERVED_RM}::test_max_len_scores_the_first_tokens_of_a_long_query",
               f"{SERVED_RM}::test_a_left_truncating_tokenizer_keeps_the_last_tokens"), "whole queries"),
    SwitchOff("a served reward model's normalisation (`serve-reward --reward.normalize_enable`)",
              "rlhfkit.models.reward:normalization", unit_normalization,
              (f"{SERVED_RM}::test_served_scores_are_the_in_process_scores[True]",), "mean 0, std 1"),
    SwitchOff("images in requests to a served reward model over images (`--reward.remote_url http://...`)",
              "rlhfkit.rewards.remote:image_fields", lambda original: lambda kwargs: {},
              ("tests/integration/test_serve_vision_reward_model.py::"
               "test_the_rl_clients_requests_are_scored_as_in_process",), "requests without the images"),
    SwitchOff("QLoRA's 4-bit base (--ds.load_in_4bit)", "rlhfkit.models.loading:nf4_config", noop,
              ("tests/integration/test_qlora.py::test_sft_trains_adapters_over_4bit_linear_layers",
               "tests/integration/test_vision_qlora.py::test_sft_and_dpo_train_adapters_over_a_4bit_language_model[sft]"),
              "no quantization config"),
    SwitchOff("a VLM's vision tower and projector kept out of 4-bit (QLoRA)",
              "rlhfkit.models.vision:unquantized_parts", head_only,
              ("tests/integration/test_vision_qlora.py::test_rl_samples_and_trains_with_the_same_4bit_weights_and_images",),
              "only the LM head kept"),
    SwitchOff("bitsandbytes' CPU repacking of the 4-bit base kept off (QLoRA)",
              "rlhfkit.models.loading:keep_4bit_layout",
              identity_model, (("tests/integration/test_vision_qlora.py::"
                                "test_rl_samples_and_trains_with_the_same_4bit_weights_and_images"),
                               ("tests/unit/models/test_qlora_layout.py::"
                                "test_the_gradient_reaches_a_4bit_layers_input_after_a_no_grad_forward"),
                               ("tests/unit/models/test_qlora_layout.py::"
                                "test_state_dict_leaves_the_frozen_4bit_base_as_it_was")),
              "the model unchanged"),
    SwitchOff("QLoRA's base dequantized for the vLLM engine", "rlhfkit.models.lora:DequantizedState.parts",
              quantized_state,
              (("tests/unit/rollout/test_vllm_qlora.py::test_the_first_sync_loads_the_dequantized_base_with_the_"
                "adapters_merged"),
               ("tests/unit/rollout/test_vllm_qlora.py::test_the_synced_float_model_computes_what_the_trainers_"
                "4bit_policy_computes")),
              "the 4-bit state as it is"),
    SwitchOff("re-rendered episodes in segments (--agent.on_rerender segment)",
              "rlhfkit.agents.tools.agent:ToolExecutor._split", noop,
              ("tests/unit/agents/test_tool_segments.py::test_segment_splits_where_the_template_rerenders_the_history",
               "tests/unit/agents/test_tool_segments.py::test_tool_episodes_in_non_thinking_mode_split_too"),
              "no split: the sampled tokens kept"),
    SwitchOff("an episode's image limit (--data.max_images_per_prompt)", "rlhfkit.agents.executor:_images",
              no_images_counted, ("tests/unit/agents/test_vision_agent.py::"
                                  "test_feedback_images_past_the_image_limit_end_the_episode_without_them",),
              "counts no image"),
    SwitchOff("images in agent episodes' engine calls (tools, environments)", "rlhfkit.agents.tools.agent:image_kwargs",
              no_prompt_images,
              (f"{VISION_TOOLS}::test_a_tool_call_episode_with_images_matches_the_trainers_forward[False]",),
              "engine calls without the images"),
    SwitchOff("images at every step of a VLM decoded without a KV cache",
              "rlhfkit.rollout.vision:VisionEngine._uncached_logits", text_model_steps,
              (f"{VISION}::test_a_vlm_decoded_without_a_cache_feeds_its_images_at_every_step",),
              "steps over the ids alone"),
    SwitchOff("per-prompt image tensors padded across rows (SmolVLM / Idefics3 sub-images)",
              "rlhfkit.models.vision:_cat_padded", concatenated,
              ("tests/unit/models/test_vision_families.py::"
               "test_smolvlm_rows_with_different_sub_image_counts_are_padded_as_its_processor_pads_them",
               f"{VISION}::test_rollout_logprobs_equal_the_trainers_forward[smolvlm]"),
              "concatenated unpadded"),
    SwitchOff("a prefix LM's response typed as its suffix (PaliGemma's token_type_ids)",
              "rlhfkit.models.vision:prefix_lm_types", whole_prefix,
              (f"{VISION}::test_rollout_logprobs_equal_the_trainers_forward[paligemma]",
               f"{VISION}::test_paligemma_types_its_prompt_as_the_prefix_and_its_response_as_the_suffix",
               f"{VISION}::test_paligemma_decoded_without_a_cache_types_its_response_as_the_suffix"),
              "the whole sequence typed as the prefix"),
    SwitchOff("per-token image inputs over the response (Llama 3.2 Vision's cross-attention mask)",
              "rlhfkit.models.vision:per_token", per_token_as_given,
              (f"{VISION}::test_rollout_logprobs_equal_the_trainers_forward[mllama]",),
              "the prompt's rows only"),
    SwitchOff("per-token image inputs at each cached decode step (Llama 3.2 Vision)",
              "rlhfkit.rollout.vision:VisionEngine._decode_extra", no_decode_extra,
              (f"{VISION}::test_rollout_logprobs_equal_the_trainers_forward[mllama]",),
              "decode steps without them"),
    SwitchOff("images on Ray rollout workers (vision-language models)", "rlhfkit.distributed.worker:engine_images",
              no_images_sent, (f"{VISION_WORKER}::test_worker_samples_from_the_images_as_the_trainers_engine_does[0]",
                               f"{VISION_WORKER}::test_worker_samples_from_the_images_as_the_trainers_engine_does[2]"),
              "the engine gets no image tensors"),
    SwitchOff("images put back on the Ray pool's trajectories", "rlhfkit.distributed.pool:with_images",
              images_not_put_back, (f"{VISION_WORKER}::test_pool_helpers_shard_the_images_and_put_the_trainers_back",),
              "trajectories without images"),
    SwitchOff("vision tower sharded block by block (--fsdp.enable)", "rlhfkit.distributed.fsdp:vision_blocks",
              language_layers_only, ("tests/unit/distributed/test_fsdp_vision.py::"
                                     "test_sharded_vlm_samples_and_scores_as_the_unsharded_one[qwen2_vl]",),
              "the language model's layers only"),
    SwitchOff("float16 compute over FSDP's float32 shards (--actor.dtype float16 --fsdp.enable)",
              "rlhfkit.distributed.fsdp:mp_policy", lambda original: lambda mixed_precision: original(True),
              ("tests/unit/distributed/test_fsdp_fp16.py::"
               "test_float32_shards_are_gathered_in_fp16_and_the_scaled_norm_is_the_whole_models",),
              "the shards gathered in bf16"),
    SwitchOff("QLoRA's 4-bit base held whole on every rank (--fsdp.enable)",
              "rlhfkit.distributed.fsdp:whole_4bit_weights", nothing_held_whole,
              (f"{FSDP_QLORA}::test_the_4bit_base_stays_whole_and_the_adapters_are_sharded",
               f"{FSDP_QLORA}::test_the_weight_stream_sends_the_dequantized_base_and_merged_adapters_of_one_process",
               f"{FSDP_QLORA}::test_sharded_checkpoints_leave_the_frozen_4bit_base_out"),
              "the 4-bit weights sharded like the rest"),
    SwitchOff("images in vLLM requests (vision-language models)", "rlhfkit.rollout.vllm:vllm_request", text_request,
              ("tests/unit/rollout/test_vllm_vision.py::test_requests_hold_one_placeholder_per_image_and_the_images_"
               "and_trajectories_the_tensors[llava]",), "the ids alone, no images"),
    SwitchOff("Gemma 3's image spans as vLLM's placeholders", "rlhfkit.rollout.vllm_images:unwrap_images", spans_kept,
              ("tests/unit/rollout/test_vllm_vision.py::test_requests_hold_one_placeholder_per_image_and_the_images_"
               "and_trajectories_the_tensors[gemma3-2images-newlines]",), "the HF processor's spans sent as they are"),
    SwitchOff("LoRA kept out of a frozen vision tower", "rlhfkit.models.vision:language_lora_targets", names_as_given,
              (f"{VISION_LORA}::test_peft_would_put_adapters_in_the_tower_and_the_names_keep_them_out",),
              "the target names as given"),
    SwitchOff("the critic of a VLM sees the images", "rlhfkit.models.critic:critic_backbone", text_decoder,
              ("tests/unit/api/test_vision_setup.py::test_the_reference_shares_the_frozen_tower[True]",),
              "the language model alone"),
    SwitchOff("an episode's KV cache kept across turns (--rollout.keep_kv_across_turns)",
              "rlhfkit.rollout.turns:TurnCaches.take", nothing_kept,
              ("tests/unit/rollout/test_kept_turns.py::"
               "test_kept_turns_equal_the_full_prefill_and_prefill_only_the_new_tokens[llama]",
               "tests/unit/agents/test_executor_kept_turns.py::"
               "test_agent_episodes_are_the_same_with_kept_turns_and_prefill_less"),
              "no kept cache used: every turn prefilled in full"),
    SwitchOff("images in `rlhfkit eval`'s samples (vision-language models)", "rlhfkit.trainers.evaluate:image_kwargs",
              no_prompt_images, (f"{VISION_EVAL}::test_eval_of_a_plain_image_dataset_with_a_verifier_sees_the_images",),
              "engine calls without the images"),
    SwitchOff("the processor reaches agents' executors (vision-language models)",
              "rlhfkit.api.vision:attach_processor", no_processor_given,
              (f"{VISION_EVAL}::test_eval_of_an_agent_function_that_sends_image_url_parts",
               f"{VISION_EXECUTE}::test_an_openrlhf_execute_with_images_records_the_trainers_logprobs"),
              "no executor gets it"),
    SwitchOff("`rlhfkit serve` of a vision-language model", "rlhfkit.cli.serve_model:served_processor",
              served_as_text, ("tests/integration/test_vision_serve.py::"
                               "test_the_reply_is_the_hf_engines_greedy_reply_for_the_same_images[colours0]",),
              "served as a text model"),
    SwitchOff("tools in an agent function's requests with images",
              "rlhfkit.agents.endpoint.handlers:Completions.template", tools_ignored,
              ("tests/unit/agents/test_endpoint_vision.py::"
               "test_tools_in_requests_with_images_are_rendered_parsed_and_recorded_as_the_trainer_computes",),
              "the request's tools ignored"),
    SwitchOff("an endpoint request's `tool_choice` \"required\" or named function forces a call",
              "rlhfkit.agents.endpoint.toolchoice:forced_text", nothing_forced,
              (f"{TOOL_CHOICE}::{FORCED}[False-qwen2_5]", f"{TOOL_CHOICE}::{FORCED}[True-mistral_v11]",
               f"{TOOL_CHOICE}::test_the_next_turn_continues_the_forced_call_token_for_token_and_stays_one_trajectory[True]",
               "tests/unit/agents/test_endpoint.py::"
               "test_a_forced_tool_call_is_sampled_after_its_opening_in_the_prompt_over_http"),
              "nothing forced: the model sampled as it is"),
    SwitchOff("an endpoint request's `parallel_tool_calls` false", "rlhfkit.agents.endpoint.toolchoice:first_call_end",
              noop, (f"{TOOL_CHOICE}::{CUT}[qwen2_5]", f"{TOOL_CHOICE}::{CUT}[mistral_v11]"),
              "no reply cut: every call kept"),
    SwitchOff("structured outputs: an endpoint request's `response_format` json_schema / json_object (constrained "
              "sampling)", "rlhfkit.rollout.constrained:Grammars.rows", noop,
              ("tests/unit/rollout/test_constrained_sampling.py::"
               "test_every_constrained_sample_is_json_of_the_schema_and_unconstrained_ones_are_not",
               "tests/unit/agents/test_endpoint_structured.py::"
               "test_response_format_replies_parse_and_validate_and_record_the_trainers_logprobs",
               "tests/unit/agents/test_endpoint_structured.py::"
               "test_the_responses_apis_text_format_is_the_chat_paths_response_format"),
              "no matchers: the model sampled as it is"),
    SwitchOff("images of an agent file's own engine calls (`execute()`, multi_modal_data)",
              "rlhfkit.agents.images:ImageEncoder.__call__", no_call_images,
              (f"{VISION_EXECUTE}::test_an_openrlhf_execute_with_images_records_the_trainers_logprobs",),
              "engine calls without the images"),
    SwitchOff("MoE routing replay (--actor.routing_replay)", "rlhfkit.models.moe:replay_routing", replays_nothing,
              (f"{REPLAY}::{FLIPPED}[qwen3_moe-padded]", f"{REPLAY}::{FLIPPED}[mixtral-packed]",
               f"{REPLAY}::{FLIPPED}[deepseek_v3-shared_prefix]",
               f"{REPLAY}::test_the_router_gets_the_gradient_of_the_recomputed_weights_by_hand[qwen3_moe]",
               f"{REPLAY}::test_agent_episodes_carry_the_experts_of_every_turn[kept_turns]",
               f"{REPLAY}::test_an_rl_step_replays_the_engines_experts_in_the_old_logprob_pass_and_the_update[mixtral]",
               "tests/integration/test_routing_replay.py::test_routing_replay_shrinks_the_rollout_trainer_logprob_gap"),
              "no router hooked: each keeps its own top-k"),
    SwitchOff("the HF engine's bf16 copy of the weights follows them", "rlhfkit.rollout.bf16_decode:Bf16Decoder._stamp",
              never_rebuilt, ("tests/unit/rollout/test_bf16_decode.py::"
                              "test_the_copy_follows_the_weights_and_is_freed_after_a_generation",),
              "the copy built once, never rebuilt"),
    SwitchOff("a float32 residual stream over bf16 parameters (--actor.dtype bfloat16)",
              "rlhfkit.models.precision:float32_residual", no_residual_upcast,
              ("tests/unit/trainers/test_bf16_masters.py::test_the_residual_stream_stays_float32_under_autocast",
               "tests/unit/api/test_bf16_params_setup.py::test_bf16_parameters_get_float32_norms_and_residual"),
              "no hook: the residual stream is bf16"),
    SwitchOff("GPU asks a local Ray cluster cannot place refused", "rlhfkit.distributed.launch:check_gpu_asks", noop,
              ("tests/unit/distributed/test_gpu_asks.py::test_asks_beyond_the_machine_are_refused",
               "tests/unit/distributed/test_gpu_asks.py::test_a_ray_run_asking_for_absent_gpus_stops_before_any_actor"),
              "nothing checked: the actors wait for GPUs forever"),
    SwitchOff("no multiply of gradients within the clipping norm (CPU)", "rlhfkit.trainers.learner:clip_grad_norm",
              torchs_clip, ("tests/unit/trainers/test_learner.py::"
                            "test_clip_grad_norm_leaves_gradients_within_the_norm_unwritten",),
              "torch's clip_grad_norm_: multiplies by the clamped coefficient always"),
    SwitchOff("freed memory kept for reuse (--train.keep_freed_memory)", "rlhfkit.models.host:keep_freed_memory", noop,
              ("tests/unit/models/test_host.py::test_freed_block_stays_with_the_process",),
              "glibc's defaults: large blocks mmapped and handed back"),
    SwitchOff("trained parameters copied out of the checkpoint's file mapping", "rlhfkit.models.host:own_memory", noop,
              ("tests/unit/models/test_host.py::"
               "test_the_learner_trains_parameters_of_its_own_and_leaves_frozen_ones_mapped",
               "tests/unit/models/test_host.py::test_the_hf_engine_copies_mapped_weights_before_loading_new_ones"),
              "left in the mapping: the first optimizer step copies it out page by page"),
    SwitchOff("the repetition penalty (--rollout.repetition_penalty)", "rlhfkit.rollout.sampling:penalize_repeats",
              unpenalized, ("tests/unit/rollout/test_rollout_hf_engine.py::test_repetition_penalty_by_hand",
                            "tests/unit/rollout/test_rollout_hf_engine.py::"
                            "test_greedy_with_a_repetition_penalty_equals_model_generate[1.3]"),
              "the logits unchanged"),
    SwitchOff("Tinker server: waiting requests of several clients batched",
              "rlhfkit.serving.tinker.queue:RequestQueue._take", oldest_alone,
              ("tests/unit/serving/test_tinker_queue.py::test_waiting_requests_group_and_each_client_keeps_its_order",
               "tests/integration/test_tinker_sdk.py::"
               "test_concurrent_clients_run_in_shared_calls_with_their_own_results"),
              "each request runs alone, in arrival order"),
    SwitchOff("the policy trained without its config's dropout (--actor.disable_dropout)",
              "rlhfkit.models.precision:disable_dropout", nothing_changed,
              ("tests/integration/test_dropout.py::test_the_update_runs_without_the_configs_dropout_unless_asked[gpt2]",
               "tests/integration/test_dropout.py::test_the_update_runs_without_the_configs_dropout_unless_asked[llama]"),
              "the config's dropout in every update forward"),
    SwitchOff("reasoning-gym prompts (--data.prompt_dataset reasoning_gym:TASK)",
              "rlhfkit.data.records:reasoning_gym_records", no_entries,
              ("tests/unit/data/test_procedural.py::test_leg_counting_entries_by_hand",
               f"{ENVLIBS}::test_reasoning_gym_prompts_scored_by_the_tasks_own_score_answer"), "no entries"),
    SwitchOff("builtin:reasoning_gym: exactly one answer tag", "rlhfkit.rewards.reasoning_gym:single_answer", last_tag,
              (f"{RG_REWARD}::test_single_answer_reads_one_non_empty_tag",
               f"{RG_REWARD}::test_builtin_reward_scores_leg_counting_with_its_own_score_answer"),
              "reasoning-gym's extract_answer: the last tag"),
    SwitchOff("builtin:reasoning_gym: no credit for a dump holding the answer",
              "rlhfkit.rewards.reasoning_gym:holds_oracle", never_holds,
              (f"{RG_REWARD}::test_containment_credit_is_taken_away_and_other_partial_credit_kept",
               f"{RG_REWARD}::test_builtin_reward_scores_leg_counting_with_its_own_score_answer",
               f"{RG_REWARD}::test_an_answer_holding_the_right_one_scores_0_even_where_the_task_gives_full_credit"),
              "the task's own credit kept"),
    SwitchOff("builtin:reasoning_gym: exact answers only (--reward.reasoning_gym.partial_credit false)",
              "rlhfkit.rewards.reasoning_gym:exact_only", credit_kept,
              (f"{RG_REWARD}::test_partial_credit_false_scores_a_constant_answer_0_and_the_right_one_1",),
              "the task's partial credit kept"),
    SwitchOff("SkyRL-Gym observations as chat turns (--agent.env skyrl:ENV_ID)",
              "rlhfkit.agents.textenv:SkyRLTextEnv._messages", observations_dropped,
              ("tests/unit/agents/test_textenv_skyrl.py::"
               "test_a_base_text_env_subclass_from_a_file_plays_through_chat_turns",
               f"{ENVLIBS}::test_a_skyrl_base_text_env_from_a_file_trains_on_its_turns"),
              "step's observations dropped: the episode ends"),
    SwitchOff("a reward file's function named (--reward.remote_url FILE.py:NAME)",
              "rlhfkit.rewards.resolve:split_function", unnamed,
              ("tests/unit/rewards/test_reward_loader.py::test_file_colon_name_picks_the_function_of_any_contract",
               "tests/integration/test_verl_inputs.py::"
               "test_a_reward_function_named_in_the_file_spec_is_the_one_that_scores",
               "tests/integration/test_verl_inputs.py::test_verl_overrides_name_the_reward_function"),
              "FILE.py:NAME read as a path"),
    SwitchOff("over-long prompts cut to fit (--data.truncation left|right|middle)",
              "rlhfkit.data.prompts:truncate_ids", never_cut,
              ("tests/unit/data/test_truncate.py::test_tokenize_prompts_skips_errs_or_cuts",
               "tests/unit/data/test_truncate.py::test_train_rl_reads_its_prompts_with_the_truncation_flag"),
              "never cut: skipped"),
    SwitchOff("reward centring (train rm --model.center_rewards_coef)",
              "rlhfkit.trainers.supervised.preference:center_penalty", no_center_penalty,
              ("tests/unit/trainers/test_supervised_options.py::"
               "test_center_rewards_adds_the_mean_squared_pair_sum_by_hand",),
              "no penalty"),
    SwitchOff("Dynamic Fine-Tuning's loss (train sft --model.loss_type dft)",
              "rlhfkit.trainers.supervised.sft:sft_loss", nll_only,
              ("tests/unit/trainers/test_supervised_options.py::"
               "test_dft_loss_weights_each_target_token_by_its_probability",),
              "the NLL"),
    SwitchOff("over-long SFT samples cut to fit (train sft --data.truncation left|right)",
              "rlhfkit.data.supervised:fit_sample", never_cut,
              ("tests/unit/data/test_sft_truncation.py::"
               "test_an_over_long_sample_is_skipped_or_cut_on_one_side_with_its_targets",
               "tests/unit/data/test_sft_truncation.py::test_verls_data_truncation_reaches_train_sfts_loader"),
              "never cut: skipped"),
    SwitchOff("warmup in optimizer steps (--actor.lr_warmup_steps)",
              "rlhfkit.config.plan:warmup_steps", ratio_only,
              ("tests/unit/config/test_plan.py::test_warmup_in_optimizer_steps_wins_over_the_ratio",),
              "the ratio only"),
    SwitchOff("model config overrides (--actor.config_overrides)",
              "rlhfkit.models.loading:apply_config_overrides", folder_config,
              ("tests/unit/models/test_config_overrides.py::test_the_weights_load_into_the_overridden_config",
               "tests/unit/models/test_config_overrides.py::test_train_rl_builds_the_policy_and_reference_with_them"),
              "the folder's config"),
)
BY_NAME = {s.name: s for s in SWITCH_OFFS}
