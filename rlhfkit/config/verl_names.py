"""The leaf keys of verl's PPO and SFT trainer configs (names only; what rlhfkit does with each is in config/verl.py).
Read from verl's verl/trainer/config/_generated_ppo_trainer.yaml (FSDP, the default) and
_generated_ppo_megatron_trainer.yaml (`--config-name ppo_megatron_trainer`), and sft_trainer.yaml with its optim
group (optim/fsdp.yaml) for `verl.trainer.fsdp_sft_trainer`; verl's main branch of January 2026.
"""
VERL_PPO_KEYS = tuple("""
    actor_rollout_ref.actor._target_ actor_rollout_ref.actor.calculate_entropy
    actor_rollout_ref.actor.calculate_sum_pi_squared actor_rollout_ref.actor.checkpoint._target_
    actor_rollout_ref.actor.checkpoint.async_save actor_rollout_ref.actor.checkpoint.load_contents
    actor_rollout_ref.actor.checkpoint.save_contents actor_rollout_ref.actor.clip_ratio
    actor_rollout_ref.actor.clip_ratio_c actor_rollout_ref.actor.clip_ratio_high
    actor_rollout_ref.actor.clip_ratio_low actor_rollout_ref.actor.data_loader_seed
    actor_rollout_ref.actor.entropy_checkpointing actor_rollout_ref.actor.entropy_coeff
    actor_rollout_ref.actor.entropy_from_logits_with_chunking actor_rollout_ref.actor.freeze_vision_tower
    actor_rollout_ref.actor.fsdp_config._target_ actor_rollout_ref.actor.fsdp_config.dtype
    actor_rollout_ref.actor.fsdp_config.entropy_checkpointing
    actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking
    actor_rollout_ref.actor.fsdp_config.forward_only actor_rollout_ref.actor.fsdp_config.forward_prefetch
    actor_rollout_ref.actor.fsdp_config.fsdp_size actor_rollout_ref.actor.fsdp_config.full_determinism
    actor_rollout_ref.actor.fsdp_config.model_dtype actor_rollout_ref.actor.fsdp_config.offload_policy
    actor_rollout_ref.actor.fsdp_config.optimizer_offload actor_rollout_ref.actor.fsdp_config.param_offload
    actor_rollout_ref.actor.fsdp_config.reshard_after_forward actor_rollout_ref.actor.fsdp_config.seed
    actor_rollout_ref.actor.fsdp_config.strategy
    actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size
    actor_rollout_ref.actor.fsdp_config.use_orig_params actor_rollout_ref.actor.fsdp_config.use_torch_compile
    actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params actor_rollout_ref.actor.grad_clip
    actor_rollout_ref.actor.kl_loss_coef actor_rollout_ref.actor.kl_loss_type
    actor_rollout_ref.actor.loss_agg_mode actor_rollout_ref.actor.loss_scale_factor
    actor_rollout_ref.actor.optim._target_ actor_rollout_ref.actor.optim.betas
    actor_rollout_ref.actor.optim.clip_grad actor_rollout_ref.actor.optim.lr
    actor_rollout_ref.actor.optim.lr_scheduler_type actor_rollout_ref.actor.optim.lr_warmup_steps
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio actor_rollout_ref.actor.optim.min_lr_ratio
    actor_rollout_ref.actor.optim.num_cycles actor_rollout_ref.actor.optim.optimizer
    actor_rollout_ref.actor.optim.optimizer_impl actor_rollout_ref.actor.optim.override_optimizer_config
    actor_rollout_ref.actor.optim.total_training_steps actor_rollout_ref.actor.optim.warmup_style
    actor_rollout_ref.actor.optim.weight_decay actor_rollout_ref.actor.policy_loss._target_
    actor_rollout_ref.actor.policy_loss.clip_cov_lb actor_rollout_ref.actor.policy_loss.clip_cov_ratio
    actor_rollout_ref.actor.policy_loss.clip_cov_ub actor_rollout_ref.actor.policy_loss.kl_cov_ratio
    actor_rollout_ref.actor.policy_loss.loss_mode actor_rollout_ref.actor.policy_loss.ppo_kl_coef
    actor_rollout_ref.actor.ppo_epochs actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    actor_rollout_ref.actor.ppo_micro_batch_size actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    actor_rollout_ref.actor.ppo_mini_batch_size actor_rollout_ref.actor.profiler._target_
    actor_rollout_ref.actor.profiler.all_ranks actor_rollout_ref.actor.profiler.enable
    actor_rollout_ref.actor.profiler.ranks actor_rollout_ref.actor.profiler.save_path
    actor_rollout_ref.actor.profiler.tool actor_rollout_ref.actor.profiler.tool_config.npu._target_
    actor_rollout_ref.actor.profiler.tool_config.npu.analysis
    actor_rollout_ref.actor.profiler.tool_config.npu.contents
    actor_rollout_ref.actor.profiler.tool_config.npu.discrete
    actor_rollout_ref.actor.profiler.tool_config.npu.level
    actor_rollout_ref.actor.profiler.tool_config.nsys._target_
    actor_rollout_ref.actor.profiler.tool_config.nsys.discrete
    actor_rollout_ref.actor.profiler.tool_config.torch._target_
    actor_rollout_ref.actor.profiler.tool_config.torch.contents
    actor_rollout_ref.actor.profiler.tool_config.torch.discrete
    actor_rollout_ref.actor.profiler.tool_config.torch_memory._target_
    actor_rollout_ref.actor.profiler.tool_config.torch_memory.stack_depth
    actor_rollout_ref.actor.profiler.tool_config.torch_memory.trace_alloc_max_entries
    actor_rollout_ref.actor.rollout_n actor_rollout_ref.actor.router_replay._target_
    actor_rollout_ref.actor.router_replay.mode actor_rollout_ref.actor.router_replay.record_file
    actor_rollout_ref.actor.router_replay.replay_file actor_rollout_ref.actor.shuffle
    actor_rollout_ref.actor.strategy actor_rollout_ref.actor.sum_pi_squared_checkpointing
    actor_rollout_ref.actor.tau_neg actor_rollout_ref.actor.tau_pos
    actor_rollout_ref.actor.ulysses_sequence_parallel_size actor_rollout_ref.actor.use_dynamic_bsz
    actor_rollout_ref.actor.use_fused_kernels actor_rollout_ref.actor.use_kl_loss
    actor_rollout_ref.actor.use_prefix_grouper actor_rollout_ref.actor.use_remove_padding
    actor_rollout_ref.actor.use_torch_compile actor_rollout_ref.hybrid_engine actor_rollout_ref.model._target_
    actor_rollout_ref.model.custom_chat_template actor_rollout_ref.model.enable_activation_offload
    actor_rollout_ref.model.enable_gradient_checkpointing actor_rollout_ref.model.exclude_modules
    actor_rollout_ref.model.external_lib actor_rollout_ref.model.fused_kernel_options.impl_backend
    actor_rollout_ref.model.hf_config_path actor_rollout_ref.model.lora_adapter_path
    actor_rollout_ref.model.lora_alpha actor_rollout_ref.model.lora_rank actor_rollout_ref.model.mtp._target_
    actor_rollout_ref.model.mtp.detach_encoder actor_rollout_ref.model.mtp.enable
    actor_rollout_ref.model.mtp.enable_rollout actor_rollout_ref.model.mtp.enable_train
    actor_rollout_ref.model.mtp.method actor_rollout_ref.model.mtp.mtp_loss_scaling_factor
    actor_rollout_ref.model.mtp.num_speculative_tokens actor_rollout_ref.model.mtp.speculative_algorithm
    actor_rollout_ref.model.mtp.speculative_eagle_topk actor_rollout_ref.model.mtp.speculative_num_draft_tokens
    actor_rollout_ref.model.mtp.speculative_num_steps actor_rollout_ref.model.override_config
    actor_rollout_ref.model.path actor_rollout_ref.model.target_modules
    actor_rollout_ref.model.tiled_mlp.enabled actor_rollout_ref.model.tiled_mlp.num_shards
    actor_rollout_ref.model.tokenizer_path actor_rollout_ref.model.trust_remote_code
    actor_rollout_ref.model.use_fused_kernels actor_rollout_ref.model.use_liger
    actor_rollout_ref.model.use_remove_padding actor_rollout_ref.model.use_shm actor_rollout_ref.nccl_timeout
    actor_rollout_ref.ref._target_ actor_rollout_ref.ref.entropy_checkpointing
    actor_rollout_ref.ref.entropy_from_logits_with_chunking actor_rollout_ref.ref.fsdp_config._target_
    actor_rollout_ref.ref.fsdp_config.dtype actor_rollout_ref.ref.fsdp_config.entropy_checkpointing
    actor_rollout_ref.ref.fsdp_config.entropy_from_logits_with_chunking
    actor_rollout_ref.ref.fsdp_config.forward_only actor_rollout_ref.ref.fsdp_config.forward_prefetch
    actor_rollout_ref.ref.fsdp_config.fsdp_size actor_rollout_ref.ref.fsdp_config.full_determinism
    actor_rollout_ref.ref.fsdp_config.model_dtype actor_rollout_ref.ref.fsdp_config.offload_policy
    actor_rollout_ref.ref.fsdp_config.optimizer_offload actor_rollout_ref.ref.fsdp_config.param_offload
    actor_rollout_ref.ref.fsdp_config.reshard_after_forward actor_rollout_ref.ref.fsdp_config.seed
    actor_rollout_ref.ref.fsdp_config.strategy actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size
    actor_rollout_ref.ref.fsdp_config.use_orig_params actor_rollout_ref.ref.fsdp_config.use_torch_compile
    actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu actor_rollout_ref.ref.log_prob_micro_batch_size
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu actor_rollout_ref.ref.log_prob_use_dynamic_bsz
    actor_rollout_ref.ref.profiler._target_ actor_rollout_ref.ref.profiler.all_ranks
    actor_rollout_ref.ref.profiler.enable actor_rollout_ref.ref.profiler.ranks
    actor_rollout_ref.ref.profiler.save_path actor_rollout_ref.ref.profiler.tool
    actor_rollout_ref.ref.profiler.tool_config.npu._target_
    actor_rollout_ref.ref.profiler.tool_config.npu.analysis
    actor_rollout_ref.ref.profiler.tool_config.npu.contents
    actor_rollout_ref.ref.profiler.tool_config.npu.discrete actor_rollout_ref.ref.profiler.tool_config.npu.level
    actor_rollout_ref.ref.profiler.tool_config.nsys._target_
    actor_rollout_ref.ref.profiler.tool_config.nsys.discrete
    actor_rollout_ref.ref.profiler.tool_config.torch._target_
    actor_rollout_ref.ref.profiler.tool_config.torch.contents
    actor_rollout_ref.ref.profiler.tool_config.torch.discrete
    actor_rollout_ref.ref.profiler.tool_config.torch_memory._target_
    actor_rollout_ref.ref.profiler.tool_config.torch_memory.stack_depth
    actor_rollout_ref.ref.profiler.tool_config.torch_memory.trace_alloc_max_entries
    actor_rollout_ref.ref.rollout_n actor_rollout_ref.ref.router_replay._target_
    actor_rollout_ref.ref.router_replay.mode actor_rollout_ref.ref.router_replay.record_file
    actor_rollout_ref.ref.router_replay.replay_file actor_rollout_ref.ref.strategy
    actor_rollout_ref.ref.ulysses_sequence_parallel_size actor_rollout_ref.ref.use_torch_compile
    actor_rollout_ref.rollout._target_ actor_rollout_ref.rollout.agent._target_
    actor_rollout_ref.rollout.agent.agent_loop_config_path
    actor_rollout_ref.rollout.agent.custom_async_server._target_
    actor_rollout_ref.rollout.agent.custom_async_server.name
    actor_rollout_ref.rollout.agent.custom_async_server.path actor_rollout_ref.rollout.agent.default_agent_loop
    actor_rollout_ref.rollout.agent.num_workers actor_rollout_ref.rollout.calculate_log_probs
    actor_rollout_ref.rollout.checkpoint_engine._target_ actor_rollout_ref.rollout.checkpoint_engine.backend
    actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes
    actor_rollout_ref.rollout.cudagraph_capture_sizes actor_rollout_ref.rollout.data_parallel_size
    actor_rollout_ref.rollout.disable_log_stats actor_rollout_ref.rollout.do_sample
    actor_rollout_ref.rollout.dtype actor_rollout_ref.rollout.enable_chunked_prefill
    actor_rollout_ref.rollout.enable_prefix_caching actor_rollout_ref.rollout.enable_rollout_routing_replay
    actor_rollout_ref.rollout.enforce_eager actor_rollout_ref.rollout.engine_kwargs.sglang
    actor_rollout_ref.rollout.engine_kwargs.trtllm actor_rollout_ref.rollout.engine_kwargs.vllm
    actor_rollout_ref.rollout.expert_parallel_size actor_rollout_ref.rollout.free_cache_engine
    actor_rollout_ref.rollout.gpu_memory_utilization actor_rollout_ref.rollout.ignore_eos
    actor_rollout_ref.rollout.layered_summon actor_rollout_ref.rollout.load_format
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu actor_rollout_ref.rollout.log_prob_micro_batch_size
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz actor_rollout_ref.rollout.logprobs_mode
    actor_rollout_ref.rollout.max_model_len actor_rollout_ref.rollout.max_num_batched_tokens
    actor_rollout_ref.rollout.max_num_seqs actor_rollout_ref.rollout.mode actor_rollout_ref.rollout.mtp
    actor_rollout_ref.rollout.multi_stage_wake_up actor_rollout_ref.rollout.multi_turn._target_
    actor_rollout_ref.rollout.multi_turn.enable actor_rollout_ref.rollout.multi_turn.format
    actor_rollout_ref.rollout.multi_turn.interaction_config_path
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns
    actor_rollout_ref.rollout.multi_turn.max_parallel_calls
    actor_rollout_ref.rollout.multi_turn.max_tool_response_length
    actor_rollout_ref.rollout.multi_turn.max_user_turns actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts
    actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode
    actor_rollout_ref.rollout.multi_turn.tool_config_path
    actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side
    actor_rollout_ref.rollout.multi_turn.use_inference_chat_template actor_rollout_ref.rollout.n
    actor_rollout_ref.rollout.name actor_rollout_ref.rollout.over_sample_rate
    actor_rollout_ref.rollout.pipeline_model_parallel_size actor_rollout_ref.rollout.profiler._target_
    actor_rollout_ref.rollout.profiler.all_ranks actor_rollout_ref.rollout.profiler.enable
    actor_rollout_ref.rollout.profiler.ranks actor_rollout_ref.rollout.profiler.save_path
    actor_rollout_ref.rollout.profiler.tool actor_rollout_ref.rollout.profiler.tool_config
    actor_rollout_ref.rollout.prometheus._target_ actor_rollout_ref.rollout.prometheus.enable
    actor_rollout_ref.rollout.prometheus.file actor_rollout_ref.rollout.prometheus.port
    actor_rollout_ref.rollout.prometheus.served_model_name actor_rollout_ref.rollout.prompt_length
    actor_rollout_ref.rollout.quantization actor_rollout_ref.rollout.quantization_config_file
    actor_rollout_ref.rollout.response_length actor_rollout_ref.rollout.scheduling_policy
    actor_rollout_ref.rollout.skip_dump_dir actor_rollout_ref.rollout.skip_rollout
    actor_rollout_ref.rollout.skip_tokenizer_init actor_rollout_ref.rollout.temperature
    actor_rollout_ref.rollout.tensor_model_parallel_size actor_rollout_ref.rollout.top_k
    actor_rollout_ref.rollout.top_p actor_rollout_ref.rollout.trace._target_
    actor_rollout_ref.rollout.trace.backend actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker
    actor_rollout_ref.rollout.trace.token2text actor_rollout_ref.rollout.val_kwargs._target_
    actor_rollout_ref.rollout.val_kwargs.do_sample actor_rollout_ref.rollout.val_kwargs.n
    actor_rollout_ref.rollout.val_kwargs.temperature actor_rollout_ref.rollout.val_kwargs.top_k
    actor_rollout_ref.rollout.val_kwargs.top_p algorithm._target_ algorithm.adv_estimator algorithm.gamma
    algorithm.kl_ctrl._target_ algorithm.kl_ctrl.horizon algorithm.kl_ctrl.kl_coef algorithm.kl_ctrl.target_kl
    algorithm.kl_ctrl.type algorithm.kl_penalty algorithm.lam algorithm.norm_adv_by_std_in_grpo
    algorithm.pf_ppo.reweight_method algorithm.pf_ppo.weight_pow algorithm.rollout_correction.bypass_mode
    algorithm.rollout_correction.loss_type algorithm.rollout_correction.rollout_is
    algorithm.rollout_correction.rollout_is_batch_normalize algorithm.rollout_correction.rollout_is_threshold
    algorithm.rollout_correction.rollout_rs algorithm.rollout_correction.rollout_rs_threshold
    algorithm.use_kl_in_reward algorithm.use_pf_ppo critic._target_ critic.checkpoint._target_
    critic.checkpoint.async_save critic.checkpoint.load_contents critic.checkpoint.save_contents
    critic.cliprange_value critic.data_loader_seed critic.enable critic.forward_max_token_len_per_gpu
    critic.forward_micro_batch_size critic.forward_micro_batch_size_per_gpu critic.grad_clip
    critic.loss_agg_mode critic.model._target_ critic.model.enable_activation_offload
    critic.model.enable_gradient_checkpointing critic.model.external_lib critic.model.fsdp_config._target_
    critic.model.fsdp_config.dtype critic.model.fsdp_config.entropy_checkpointing
    critic.model.fsdp_config.entropy_from_logits_with_chunking critic.model.fsdp_config.forward_only
    critic.model.fsdp_config.forward_prefetch critic.model.fsdp_config.fsdp_size
    critic.model.fsdp_config.full_determinism critic.model.fsdp_config.model_dtype
    critic.model.fsdp_config.offload_policy critic.model.fsdp_config.optimizer_offload
    critic.model.fsdp_config.param_offload critic.model.fsdp_config.reshard_after_forward
    critic.model.fsdp_config.seed critic.model.fsdp_config.strategy
    critic.model.fsdp_config.ulysses_sequence_parallel_size critic.model.fsdp_config.use_orig_params
    critic.model.fsdp_config.use_torch_compile critic.model.fsdp_config.wrap_policy.min_num_params
    critic.model.lora_alpha critic.model.lora_rank critic.model.override_config critic.model.path
    critic.model.target_modules critic.model.tiled_mlp.enabled critic.model.tiled_mlp.num_shards
    critic.model.tokenizer_path critic.model.trust_remote_code critic.model.use_remove_padding
    critic.model.use_shm critic.optim._target_ critic.optim.betas critic.optim.clip_grad critic.optim.lr
    critic.optim.lr_scheduler_type critic.optim.lr_warmup_steps critic.optim.lr_warmup_steps_ratio
    critic.optim.min_lr_ratio critic.optim.num_cycles critic.optim.optimizer critic.optim.optimizer_impl
    critic.optim.override_optimizer_config critic.optim.total_training_steps critic.optim.warmup_style
    critic.optim.weight_decay critic.ppo_epochs critic.ppo_max_token_len_per_gpu critic.ppo_micro_batch_size
    critic.ppo_micro_batch_size_per_gpu critic.ppo_mini_batch_size critic.profiler._target_
    critic.profiler.all_ranks critic.profiler.enable critic.profiler.ranks critic.profiler.save_path
    critic.profiler.tool critic.profiler.tool_config.npu._target_ critic.profiler.tool_config.npu.analysis
    critic.profiler.tool_config.npu.contents critic.profiler.tool_config.npu.discrete
    critic.profiler.tool_config.npu.level critic.profiler.tool_config.nsys._target_
    critic.profiler.tool_config.nsys.discrete critic.profiler.tool_config.torch._target_
    critic.profiler.tool_config.torch.contents critic.profiler.tool_config.torch.discrete
    critic.profiler.tool_config.torch_memory._target_ critic.profiler.tool_config.torch_memory.stack_depth
    critic.profiler.tool_config.torch_memory.trace_alloc_max_entries critic.rollout_n critic.shuffle
    critic.strategy critic.ulysses_sequence_parallel_size critic.use_dynamic_bsz custom_reward_function.name
    custom_reward_function.path data.apply_chat_template_kwargs data.custom_cls.name data.custom_cls.path
    data.datagen.name data.datagen.path data.dataloader_num_workers data.filter_overlong_prompts
    data.filter_overlong_prompts_workers data.image_key data.image_patch_size data.max_prompt_length
    data.max_response_length data.prompt_key data.return_full_prompt data.return_multi_modal_inputs
    data.return_raw_chat data.return_raw_input_ids data.reward_fn_key data.sampler.class_name
    data.sampler.class_path data.seed data.shuffle data.tokenizer data.tool_config_path data.train_batch_size
    data.train_files data.train_max_samples data.truncation data.trust_remote_code data.use_shm
    data.val_batch_size data.val_files data.val_max_samples data.validation_shuffle data.video_key
    global_profiler._target_ global_profiler.global_tool_config.nsys._target_
    global_profiler.global_tool_config.nsys.controller_nsight_options.cuda-graph-trace
    global_profiler.global_tool_config.nsys.controller_nsight_options.cuda-memory-usage
    global_profiler.global_tool_config.nsys.controller_nsight_options.trace
    global_profiler.global_tool_config.nsys.discrete
    global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range
    global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range-end
    global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-graph-trace
    global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-memory-usage
    global_profiler.global_tool_config.nsys.worker_nsight_options.kill
    global_profiler.global_tool_config.nsys.worker_nsight_options.trace
    global_profiler.global_tool_config.torch_memory.context
    global_profiler.global_tool_config.torch_memory.kw_args
    global_profiler.global_tool_config.torch_memory.stack_depth
    global_profiler.global_tool_config.torch_memory.stacks
    global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries
    global_profiler.profile_continuous_steps global_profiler.save_path global_profiler.steps
    global_profiler.tool ray_kwargs.ray_init.num_cpus ray_kwargs.timeline_json_file reward_manager._target_
    reward_manager.module._target_ reward_manager.module.name reward_manager.module.path reward_manager.name
    reward_manager.source reward_model.enable reward_model.enable_resource_pool
    reward_model.forward_max_token_len_per_gpu reward_model.launch_reward_fn_async reward_model.max_length
    reward_model.micro_batch_size reward_model.micro_batch_size_per_gpu reward_model.model.external_lib
    reward_model.model.fsdp_config._target_ reward_model.model.fsdp_config.forward_prefetch
    reward_model.model.fsdp_config.fsdp_size reward_model.model.fsdp_config.param_offload
    reward_model.model.fsdp_config.reshard_after_forward
    reward_model.model.fsdp_config.wrap_policy.min_num_params reward_model.model.input_tokenizer
    reward_model.model.override_config reward_model.model.path reward_model.model.trust_remote_code
    reward_model.model.use_fused_kernels reward_model.model.use_remove_padding reward_model.model.use_shm
    reward_model.n_gpus_per_node reward_model.nnodes reward_model.num_workers reward_model.profiler._target_
    reward_model.profiler.all_ranks reward_model.profiler.enable reward_model.profiler.ranks
    reward_model.profiler.save_path reward_model.profiler.tool reward_model.profiler.tool_config
    reward_model.reward_loop_class_name reward_model.reward_loop_module_path reward_model.reward_loop_source
    reward_model.reward_manager reward_model.rollout._target_ reward_model.rollout.cudagraph_capture_sizes
    reward_model.rollout.data_parallel_size reward_model.rollout.disable_log_stats reward_model.rollout.dtype
    reward_model.rollout.enable_chunked_prefill reward_model.rollout.enable_prefix_caching
    reward_model.rollout.enforce_eager reward_model.rollout.engine_kwargs
    reward_model.rollout.expert_parallel_size reward_model.rollout.free_cache_engine
    reward_model.rollout.gpu_memory_utilization reward_model.rollout.limit_images
    reward_model.rollout.load_format reward_model.rollout.max_model_len
    reward_model.rollout.max_num_batched_tokens reward_model.rollout.max_num_seqs reward_model.rollout.name
    reward_model.rollout.prompt_length reward_model.rollout.response_length
    reward_model.rollout.skip_tokenizer_init reward_model.rollout.tensor_model_parallel_size
    reward_model.sandbox_fusion.max_concurrent reward_model.sandbox_fusion.memory_limit_mb
    reward_model.sandbox_fusion.url reward_model.strategy reward_model.ulysses_sequence_parallel_size
    reward_model.use_dynamic_bsz reward_model.use_reward_loop trainer.balance_batch trainer.critic_warmup
    trainer.default_hdfs_dir trainer.default_local_dir trainer.del_local_ckpt_after_load trainer.device
    trainer.esi_redundant_time trainer.experiment_name trainer.log_val_generations trainer.logger
    trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep trainer.n_gpus_per_node trainer.nnodes
    trainer.project_name trainer.ray_wait_register_center_timeout trainer.resume_from_path trainer.resume_mode
    trainer.rollout_data_dir trainer.save_freq trainer.test_freq trainer.total_epochs
    trainer.total_training_steps trainer.use_legacy_worker_impl trainer.val_before_train trainer.val_only
    trainer.validation_data_dir transfer_queue.enable
""".split())
VERL_MEGATRON_KEYS = tuple("""
    actor_rollout_ref.actor.load_weight actor_rollout_ref.actor.megatron._target_
    actor_rollout_ref.actor.megatron.context_parallel_size
    actor_rollout_ref.actor.megatron.dist_checkpointing_path
    actor_rollout_ref.actor.megatron.dist_checkpointing_prefix actor_rollout_ref.actor.megatron.dtype
    actor_rollout_ref.actor.megatron.expert_model_parallel_size
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size actor_rollout_ref.actor.megatron.forward_only
    actor_rollout_ref.actor.megatron.grad_offload actor_rollout_ref.actor.megatron.optimizer_offload
    actor_rollout_ref.actor.megatron.override_ddp_config
    actor_rollout_ref.actor.megatron.override_mcore_model_config
    actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_modules
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers
    actor_rollout_ref.actor.megatron.param_offload actor_rollout_ref.actor.megatron.pipeline_model_parallel_size
    actor_rollout_ref.actor.megatron.seed actor_rollout_ref.actor.megatron.sequence_parallel
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size
    actor_rollout_ref.actor.megatron.use_dist_checkpointing
    actor_rollout_ref.actor.megatron.use_distributed_optimizer actor_rollout_ref.actor.megatron.use_mbridge
    actor_rollout_ref.actor.megatron.use_remove_padding actor_rollout_ref.actor.megatron.vanilla_mbridge
    actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size
    actor_rollout_ref.actor.optim.lr_decay_steps actor_rollout_ref.actor.optim.lr_decay_style
    actor_rollout_ref.actor.optim.lr_warmup_init actor_rollout_ref.actor.optim.lr_wsd_decay_steps
    actor_rollout_ref.actor.optim.lr_wsd_decay_style actor_rollout_ref.actor.optim.min_lr
    actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler
    actor_rollout_ref.actor.optim.weight_decay_incr_style actor_rollout_ref.model.lora.a2a_experimental
    actor_rollout_ref.model.lora.adapter_path actor_rollout_ref.model.lora.alpha
    actor_rollout_ref.model.lora.dropout actor_rollout_ref.model.lora.dropout_position
    actor_rollout_ref.model.lora.dtype actor_rollout_ref.model.lora.exclude_modules
    actor_rollout_ref.model.lora.freeze_language_model actor_rollout_ref.model.lora.freeze_vision_model
    actor_rollout_ref.model.lora.freeze_vision_projection actor_rollout_ref.model.lora.lora_A_init_method
    actor_rollout_ref.model.lora.lora_B_init_method actor_rollout_ref.model.lora.merge
    actor_rollout_ref.model.lora.rank actor_rollout_ref.model.lora.target_modules
    actor_rollout_ref.model.lora.type actor_rollout_ref.model.override_config.model_config
    actor_rollout_ref.model.override_config.moe_config.freeze_moe_router actor_rollout_ref.ref.load_weight
    actor_rollout_ref.ref.megatron._target_ actor_rollout_ref.ref.megatron.context_parallel_size
    actor_rollout_ref.ref.megatron.dist_checkpointing_path
    actor_rollout_ref.ref.megatron.dist_checkpointing_prefix actor_rollout_ref.ref.megatron.dtype
    actor_rollout_ref.ref.megatron.expert_model_parallel_size
    actor_rollout_ref.ref.megatron.expert_tensor_parallel_size actor_rollout_ref.ref.megatron.forward_only
    actor_rollout_ref.ref.megatron.grad_offload actor_rollout_ref.ref.megatron.optimizer_offload
    actor_rollout_ref.ref.megatron.override_ddp_config
    actor_rollout_ref.ref.megatron.override_mcore_model_config
    actor_rollout_ref.ref.megatron.override_transformer_config actor_rollout_ref.ref.megatron.param_offload
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size actor_rollout_ref.ref.megatron.seed
    actor_rollout_ref.ref.megatron.sequence_parallel actor_rollout_ref.ref.megatron.tensor_model_parallel_size
    actor_rollout_ref.ref.megatron.use_dist_checkpointing
    actor_rollout_ref.ref.megatron.use_distributed_optimizer actor_rollout_ref.ref.megatron.use_mbridge
    actor_rollout_ref.ref.megatron.use_remove_padding actor_rollout_ref.ref.megatron.vanilla_mbridge
    actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size
    actor_rollout_ref.rollout.layer_name_map.gate_proj_layer_name
    actor_rollout_ref.rollout.layer_name_map.qkv_layer_name critic.load_weight critic.megatron._target_
    critic.megatron.context_parallel_size critic.megatron.dist_checkpointing_path
    critic.megatron.dist_checkpointing_prefix critic.megatron.dtype critic.megatron.expert_model_parallel_size
    critic.megatron.expert_tensor_parallel_size critic.megatron.forward_only critic.megatron.grad_offload
    critic.megatron.optimizer_offload critic.megatron.override_ddp_config
    critic.megatron.override_mcore_model_config critic.megatron.override_transformer_config.attention_backend
    critic.megatron.override_transformer_config.recompute_granularity
    critic.megatron.override_transformer_config.recompute_method
    critic.megatron.override_transformer_config.recompute_modules
    critic.megatron.override_transformer_config.recompute_num_layers critic.megatron.param_offload
    critic.megatron.pipeline_model_parallel_size critic.megatron.seed critic.megatron.sequence_parallel
    critic.megatron.tensor_model_parallel_size critic.megatron.use_dist_checkpointing
    critic.megatron.use_distributed_optimizer critic.megatron.use_mbridge critic.megatron.use_remove_padding
    critic.megatron.vanilla_mbridge critic.megatron.virtual_pipeline_model_parallel_size
    critic.model.lora.a2a_experimental critic.model.lora.adapter_path critic.model.lora.alpha
    critic.model.lora.dropout critic.model.lora.dropout_position critic.model.lora.dtype
    critic.model.lora.exclude_modules critic.model.lora.freeze_language_model
    critic.model.lora.freeze_vision_model critic.model.lora.freeze_vision_projection
    critic.model.lora.lora_A_init_method critic.model.lora.lora_B_init_method critic.model.lora.rank
    critic.model.lora.target_modules critic.model.lora.type critic.model.override_config.model_config
    critic.model.override_config.moe_config.freeze_moe_router critic.nccl_timeout critic.optim.lr_decay_steps
    critic.optim.lr_decay_style critic.optim.lr_warmup_init critic.optim.lr_wsd_decay_steps
    critic.optim.lr_wsd_decay_style critic.optim.min_lr critic.optim.use_checkpoint_opt_param_scheduler
    critic.optim.weight_decay_incr_style reward_model.load_weight reward_model.megatron._target_
    reward_model.megatron.context_parallel_size reward_model.megatron.dist_checkpointing_path
    reward_model.megatron.dist_checkpointing_prefix reward_model.megatron.dtype
    reward_model.megatron.expert_model_parallel_size reward_model.megatron.expert_tensor_parallel_size
    reward_model.megatron.override_transformer_config reward_model.megatron.param_offload
    reward_model.megatron.pipeline_model_parallel_size reward_model.megatron.seed
    reward_model.megatron.sequence_parallel reward_model.megatron.tensor_model_parallel_size
    reward_model.megatron.use_dist_checkpointing reward_model.megatron.use_distributed_optimizer
    reward_model.megatron.use_mbridge reward_model.megatron.use_remove_padding
    reward_model.megatron.vanilla_mbridge reward_model.megatron.virtual_pipeline_model_parallel_size
    reward_model.nccl_timeout
""".split())
VERL_SFT_KEYS = tuple("""
    data.apply_chat_template_kwargs data.balance_dp_token data.chat_template data.custom_cls.name
    data.custom_cls.path data.max_length data.micro_batch_size data.micro_batch_size_per_gpu
    data.multiturn.enable data.multiturn.enable_thinking_key data.multiturn.messages_key
    data.multiturn.tools_key data.prompt_dict_keys data.prompt_key data.response_dict_keys data.response_key
    data.train_batch_size data.train_files data.train_max_samples data.truncation data.use_shm data.val_files
    data.val_max_samples model.enable_gradient_checkpointing model.external_lib model.fsdp_config.cpu_offload
    model.fsdp_config.model_dtype model.fsdp_config.offload_params model.fsdp_config.wrap_policy.min_num_params
    model.lora_alpha model.lora_rank model.partial_pretrain model.strategy model.target_modules
    model.trust_remote_code model.use_liger model.use_shm optim._target_ optim.betas optim.clip_grad optim.lr
    optim.lr_scheduler optim.lr_scheduler_type optim.lr_warmup_steps optim.lr_warmup_steps_ratio
    optim.min_lr_ratio optim.num_cycles optim.optimizer optim.optimizer_impl optim.override_optimizer_config
    optim.total_training_steps optim.warmup_style optim.weight_decay trainer.checkpoint.load_contents
    trainer.checkpoint.save_contents trainer.default_hdfs_dir trainer.default_local_dir trainer.device
    trainer.experiment_name trainer.logger trainer.max_ckpt_to_keep trainer.n_gpus_per_node trainer.nnodes
    trainer.project_name trainer.resume_from_path trainer.resume_mode trainer.save_freq trainer.seed
    trainer.test_freq trainer.total_epochs trainer.total_training_steps ulysses_sequence_parallel_size
    use_remove_padding
""".split())
