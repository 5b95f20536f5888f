"""The flags of OpenRLHF's training commands (names only; what rlhfkit does with each is in
config/openrlhf.py). Read from openrlhf/cli/<command>.py of the releases 0.8.0 to 0.11.0: flat names
up to 0.10.1, dotted ones from 0.10.2; train_kto and train_prm existed up to 0.9.x, train_kd up to
0.10.1 (flat names only).
"""
OPENRLHF_COMMANDS = {
    "train_ppo_ray": """
        ref_num_nodes ref_num_gpus_per_node reward_num_nodes reward_num_gpus_per_node colocate_actor_ref
        actor_num_nodes actor_num_gpus_per_node critic_num_nodes critic_num_gpus_per_node
        colocate_critic_reward colocate_all_models vllm_num_engines vllm_tensor_parallel_size
        vllm_sync_backend vllm_sync_with_ray enable_prefix_caching enforce_eager vllm_enable_sleep
        vllm_gpu_memory_utilization async_train eval_steps save_steps logging_steps ckpt_path
        save_hf_ckpt disable_ds_ckpt max_ckpt_num max_ckpt_mem load_checkpoint use_ds_universal_ckpt
        local_rank zero_stage gradient_checkpointing deepcompile bf16 enable_ema ema_beta zpg
        adam_offload actor_init_on_gpu flash_attn use_liger_kernel grad_accum_dtype overlap_comm
        gradient_checkpointing_use_reentrant disable_fast_tokenizer deepspeed_enable_sleep
        ds_tensor_parallel_size packing_samples load_in_4bit lora_rank lora_alpha target_modules
        lora_dropout save_path num_episodes rollout_batch_size micro_rollout_batch_size max_epochs
        prompt_max_len generate_max_len max_len max_samples max_norm l2 ptx_coef eps_clip value_clip
        lambd gamma micro_train_batch_size train_batch_size normalize_reward top_p temperature seed
        full_determinism freezing_actor_steps n_samples_per_prompt save_value_network
        actor_learning_rate critic_learning_rate lr_warmup_ratio kl_target kl_horizon init_kl_coef
        kl_estimator aux_loss_coef entropy_loss_coef adam_betas reward_clip_range advantage_estimator
        use_kl_loss no_advantage_std_norm ring_attn_size ring_head_stride pretrain reward_pretrain
        remote_rm_url critic_pretrain value_head_prefix ref_reward_offload agent_func_path prompt_data
        prompt_data_probs prompt_split eval_dataset eval_split eval_temperature
        eval_n_samples_per_prompt input_key label_key input_template apply_chat_template use_wandb
        wandb_org wandb_group wandb_project wandb_run_name use_tensorboard perf use_ms
        vllm_generate_batch_size dynamic_filtering dynamic_filtering_reward_range eps_clip_low_high
        lr_scheduler use_dynamic_batch rollout_max_tokens_per_gpu train_max_tokens_per_gpu dual_clip
        overlong_buffer_len overlong_penalty_factor policy_loss_type enable_vllm_is_correction
        vllm_is_truncated_threshold attn_implementation use_icepop async_queue_size param_dtype
        stop_properly_penalty_coef vllm_is_correction_type partial_rollout max_new_tokens
        best_metric_key dataloader_num_workers image_key max_images_per_prompt freeze_visual_encoder
        ref.num_nodes ref.num_gpus_per_node reward.num_nodes reward.num_gpus_per_node
        train.colocate_actor_ref actor.num_nodes actor.num_gpus_per_node critic.num_nodes
        critic.num_gpus_per_node train.colocate_critic_reward train.colocate_all vllm.num_engines
        vllm.tensor_parallel_size vllm.sync_backend vllm.sync_with_ray vllm.enable_prefix_caching
        vllm.enforce_eager vllm.enable_sleep vllm.gpu_memory_utilization
        algo.advantage.is_correction_enable algo.advantage.is_correction_threshold
        algo.advantage.is_correction_type train.async_enable train.async_queue_size
        train.partial_rollout_enable eval.steps ckpt.save_steps logger.logging_steps ckpt.path
        ckpt.save_hf ckpt.disable_ds ckpt.max_num ckpt.max_mem ckpt.load_enable ckpt.best_metric_key
        ds.use_universal_ckpt ds.zero_stage actor.gradient_checkpointing_enable ds.deepcompile
        ds.param_dtype train.enable_ema train.ema_beta ds.zpg ds.adam_offload ds.attn_implementation
        ds.experts_implementation ds.use_liger_kernel ds.grad_accum_dtype ds.overlap_comm
        actor.gradient_checkpointing_reentrant data.disable_fast_tokenizer data.dataloader_num_workers
        ds.enable_sleep ds.tensor_parallel_size ds.packing_samples train.dynamic_batch_enable
        rollout.max_tokens_per_gpu train.max_tokens_per_gpu ds.load_in_4bit ds.lora.rank ds.lora.alpha
        ds.lora.target_modules ds.lora.dropout ckpt.output_dir train.num_episodes rollout.batch_size
        rollout.vllm_generate_batch_size rollout.micro_batch_size train.max_epochs data.max_len
        rollout.max_new_tokens data.max_samples actor.eps_clip actor.eps_clip_low_high actor.dual_clip
        critic.value_clip algo.advantage.lambd algo.advantage.gamma train.micro_batch_size
        train.batch_size reward.normalize_enable rollout.top_p rollout.temperature train.seed
        train.full_determinism_enable critic.freezing_steps rollout.n_samples_per_prompt
        critic.save_value_network algo.kl.target algo.kl.horizon algo.kl.init_coef
        actor.policy_loss_type algo.kl.estimator actor.aux_loss_coef actor.entropy_coef
        reward.clip_range algo.advantage.estimator algo.kl.use_loss algo.advantage.no_std_norm
        reward.overlong_buffer_len reward.overlong_penalty_factor reward.stop_properly_penalty_coef
        ds.ring_attn_size ds.ring_attn_head_stride actor.model_name_or_path reward.model_name_or_path
        reward.remote_url critic.model_name_or_path ds.value_head_prefix ref.offload reward.offload
        train.agent_func_path data.prompt_dataset data.prompt_probs data.prompt_split eval.dataset
        eval.split eval.temperature eval.n_samples_per_prompt data.input_key data.label_key
        data.input_template data.apply_chat_template logger.wandb.key logger.wandb.org
        logger.wandb.group logger.wandb.project logger.wandb.run_name algo.dynamic_filtering_enable
        algo.dynamic_filtering_range data.image_key data.max_images_per_prompt
        actor.freeze_visual_encoder logger.tensorboard_dir actor.optim critic.optim actor.muon.lr
        critic.muon.lr actor.muon.momentum critic.muon.momentum actor.muon.ns_steps critic.muon.ns_steps
        actor.muon.nesterov critic.muon.nesterov actor.muon.no_nesterov critic.muon.no_nesterov
        actor.adam.lr critic.adam.lr actor.adam.betas critic.adam.betas actor.adam.eps critic.adam.eps
        actor.adam.weight_decay critic.adam.weight_decay actor.lr_scheduler critic.lr_scheduler
        actor.lr_warmup_ratio critic.lr_warmup_ratio actor.min_lr_ratio critic.min_lr_ratio
        actor.max_norm critic.max_norm
    """.split(),
    "train_sft": """
        save_path save_steps save_hf_ckpt disable_ds_ckpt logging_steps eval_steps ckpt_path
        max_ckpt_num max_ckpt_mem load_checkpoint use_ds_universal_ckpt micro_train_batch_size
        train_batch_size max_norm gradient_checkpointing deepcompile seed full_determinism local_rank
        zero_stage bf16 zpg adam_offload flash_attn use_liger_kernel grad_accum_dtype overlap_comm
        gradient_checkpointing_use_reentrant disable_fast_tokenizer ds_tensor_parallel_size max_epochs
        aux_loss_coef pretrain learning_rate lr_warmup_ratio pretrain_mode lr_scheduler l2 adam_betas
        ring_attn_size ring_head_stride load_in_4bit lora_rank lora_alpha target_modules lora_dropout
        packing_samples dataset dataset_probs eval_dataset dataset_split eval_split max_samples
        train_split multiturn input_key output_key input_template apply_chat_template
        tokenizer_chat_template max_len use_wandb wandb_org wandb_group wandb_project wandb_run_name
        use_tensorboard use_ms attn_implementation param_dtype dataloader_num_workers ckpt.output_dir
        ckpt.save_steps ckpt.save_hf ckpt.disable_ds logger.logging_steps eval.steps ckpt.path
        ckpt.max_num ckpt.max_mem ckpt.load_enable ds.use_universal_ckpt train.micro_batch_size
        train.batch_size model.gradient_checkpointing_enable ds.deepcompile train.seed
        train.full_determinism_enable ds.zero_stage ds.param_dtype ds.zpg ds.adam_offload
        ds.attn_implementation ds.experts_implementation ds.use_liger_kernel ds.grad_accum_dtype
        ds.overlap_comm model.gradient_checkpointing_reentrant data.disable_fast_tokenizer
        data.dataloader_num_workers ds.tensor_parallel_size train.max_epochs model.aux_loss_coef
        model.model_name_or_path model.pretrain_mode_enable optim muon.lr muon.momentum muon.ns_steps
        muon.nesterov muon.no_nesterov adam.lr adam.betas adam.eps adam.weight_decay min_lr_ratio
        ds.ring_attn_size ds.ring_attn_head_stride ds.load_in_4bit ds.lora.rank ds.lora.alpha
        ds.lora.target_modules ds.lora.dropout ds.packing_samples data.dataset data.dataset_probs
        eval.dataset data.dataset_split eval.split data.max_samples data.multiturn data.input_key
        data.output_key data.input_template data.apply_chat_template data.tokenizer_chat_template
        data.max_len logger.wandb.key logger.wandb.org logger.wandb.group logger.wandb.project
        logger.wandb.run_name logger.tensorboard_dir
    """.split(),
    "train_rm": """
        save_path save_steps logging_steps eval_steps ckpt_path max_ckpt_num max_ckpt_mem
        load_checkpoint use_ds_universal_ckpt disable_ds_ckpt save_hf_ckpt max_norm
        gradient_checkpointing deepcompile seed full_determinism local_rank zero_stage bf16 zpg
        adam_offload flash_attn grad_accum_dtype overlap_comm gradient_checkpointing_use_reentrant
        disable_fast_tokenizer ds_tensor_parallel_size pretrain value_head_prefix ring_attn_size
        ring_head_stride load_in_4bit lora_rank lora_alpha lora_dropout target_modules max_epochs
        aux_loss_coef compute_fp32_loss margin_loss learning_rate lr_warmup_ratio micro_train_batch_size
        train_batch_size loss l2 adam_betas packing_samples dataset dataset_probs eval_dataset
        dataset_split eval_split max_samples prompt_key chosen_key rejected_key input_template
        apply_chat_template tokenizer_chat_template max_len use_wandb wandb_org wandb_group
        wandb_project wandb_run_name use_tensorboard use_ms lr_scheduler attn_implementation param_dtype
        dataloader_num_workers ckpt.output_dir ckpt.save_steps ckpt.save_hf ckpt.disable_ds
        logger.logging_steps eval.steps ckpt.path ckpt.max_num ckpt.max_mem ckpt.load_enable
        ds.use_universal_ckpt model.gradient_checkpointing_enable ds.deepcompile train.seed
        train.full_determinism_enable ds.zero_stage ds.param_dtype ds.zpg ds.adam_offload
        ds.attn_implementation ds.experts_implementation ds.grad_accum_dtype ds.overlap_comm
        model.gradient_checkpointing_reentrant data.disable_fast_tokenizer data.dataloader_num_workers
        ds.tensor_parallel_size model.model_name_or_path ds.value_head_prefix ds.ring_attn_size
        ds.ring_attn_head_stride ds.load_in_4bit ds.lora.rank ds.lora.alpha ds.lora.dropout
        ds.lora.target_modules train.max_epochs model.aux_loss_coef model.compute_fp32_loss_enable
        model.margin_loss_enable train.micro_batch_size train.batch_size model.loss_type optim muon.lr
        muon.momentum muon.ns_steps muon.nesterov muon.no_nesterov adam.lr adam.betas adam.eps
        adam.weight_decay min_lr_ratio ds.packing_samples data.dataset data.dataset_probs eval.dataset
        data.dataset_split eval.split data.max_samples data.prompt_key data.chosen_key data.rejected_key
        data.input_template data.apply_chat_template data.tokenizer_chat_template data.max_len
        logger.wandb.key logger.wandb.org logger.wandb.group logger.wandb.project logger.wandb.run_name
        logger.tensorboard_dir
    """.split(),
    "train_dpo": """
        save_path save_steps save_hf_ckpt disable_ds_ckpt logging_steps eval_steps ckpt_path
        max_ckpt_num max_ckpt_mem use_ds_universal_ckpt micro_train_batch_size train_batch_size
        load_checkpoint max_norm gradient_checkpointing deepcompile seed full_determinism
        disable_fast_tokenizer local_rank zero_stage bf16 ref_offload learning_rate lr_warmup_ratio zpg
        adam_offload flash_attn use_liger_kernel grad_accum_dtype overlap_comm
        gradient_checkpointing_use_reentrant ds_tensor_parallel_size max_epochs l2 beta ipo
        label_smoothing aux_loss_coef nll_loss_coef adam_betas ring_attn_size ring_head_stride
        load_in_4bit lora_rank lora_alpha target_modules lora_dropout packing_samples pretrain
        ref_pretrain dataset dataset_probs eval_dataset dataset_split eval_split max_samples prompt_key
        chosen_key rejected_key input_template apply_chat_template max_len use_wandb wandb_org
        wandb_group wandb_project wandb_run_name use_tensorboard use_ms lr_scheduler min_lr_ratio
        attn_implementation tokenizer_chat_template param_dtype dataloader_num_workers ckpt.output_dir
        ckpt.save_steps ckpt.save_hf ckpt.disable_ds logger.logging_steps eval.steps ckpt.path
        ckpt.max_num ckpt.max_mem ds.use_universal_ckpt train.micro_batch_size train.batch_size
        ckpt.load_enable model.gradient_checkpointing_enable ds.deepcompile train.seed
        train.full_determinism_enable data.disable_fast_tokenizer data.dataloader_num_workers
        ds.zero_stage ds.param_dtype ref.offload ds.zpg ds.adam_offload ds.attn_implementation
        ds.experts_implementation ds.use_liger_kernel ds.grad_accum_dtype ds.overlap_comm
        model.gradient_checkpointing_reentrant ds.tensor_parallel_size train.max_epochs model.beta
        model.ipo_enable model.label_smoothing model.aux_loss_coef model.nll_loss_coef optim muon.lr
        muon.momentum muon.ns_steps muon.nesterov muon.no_nesterov adam.lr adam.betas adam.eps
        adam.weight_decay ds.ring_attn_size ds.ring_attn_head_stride ds.load_in_4bit ds.lora.rank
        ds.lora.alpha ds.lora.target_modules ds.lora.dropout ds.packing_samples model.model_name_or_path
        ref.model_name_or_path data.dataset data.dataset_probs eval.dataset data.dataset_split
        eval.split data.max_samples data.prompt_key data.chosen_key data.rejected_key
        data.input_template data.apply_chat_template data.tokenizer_chat_template data.max_len
        logger.wandb.key logger.wandb.org logger.wandb.group logger.wandb.project logger.wandb.run_name
        logger.tensorboard_dir
    """.split(),
    "train_kto": """
        save_path save_steps logging_steps eval_steps ckpt_path max_ckpt_num max_ckpt_mem
        load_checkpoint use_ds_universal_ckpt max_norm micro_train_batch_size train_batch_size
        gradient_checkpointing deepcompile seed full_determinism disable_fast_tokenizer local_rank
        zero_stage bf16 ref_offload zpg adam_offload flash_attn use_liger_kernel grad_accum_dtype
        overlap_comm gradient_checkpointing_use_reentrant load_in_4bit lora_rank lora_alpha
        target_modules lora_dropout max_epochs beta pretrain learning_rate lr_warmup_ratio l2
        aux_loss_coef adam_betas desirable_loss_weight undesirable_loss_weight dataset dataset_probs
        eval_dataset dataset_split eval_split max_samples input_key output_key label_key input_template
        apply_chat_template max_len use_wandb wandb_org wandb_group wandb_project wandb_run_name
        use_tensorboard use_ms lr_scheduler attn_implementation save_hf_ckpt disable_ds_ckpt param_dtype
    """.split(),
    "train_prm": """
        save_path save_steps save_hf_ckpt disable_ds_ckpt logging_steps eval_steps ckpt_path max_ckpt_num
        max_ckpt_mem load_checkpoint use_ds_universal_ckpt max_norm gradient_checkpointing deepcompile seed
        full_determinism local_rank zero_stage bf16 param_dtype zpg adam_offload flash_attn attn_implementation
        use_liger_kernel grad_accum_dtype overlap_comm gradient_checkpointing_use_reentrant disable_fast_tokenizer
        ds_tensor_parallel_size load_in_4bit lora_rank lora_alpha lora_dropout target_modules pretrain max_epochs
        aux_loss_coef learning_rate lr_warmup_ratio lr_scheduler micro_train_batch_size train_batch_size l2
        adam_betas placeholder_token reward_tokens packing_samples dataset dataset_probs eval_dataset
        dataset_split eval_split max_samples input_key label_key max_len use_wandb wandb_org wandb_group
        wandb_project wandb_run_name use_tensorboard use_ms
    """.split(),
    "train_kd": """
        save_path save_steps save_hf_ckpt disable_ds_ckpt logging_steps eval_steps ckpt_path
        max_ckpt_num max_ckpt_mem load_checkpoint use_ds_universal_ckpt micro_train_batch_size
        train_batch_size max_norm gradient_checkpointing deepcompile seed full_determinism local_rank
        zero_stage bf16 zpg adam_offload flash_attn use_liger_kernel aux_loss_coef grad_accum_dtype
        overlap_comm gradient_checkpointing_use_reentrant disable_fast_tokenizer ds_tensor_parallel_size
        load_in_4bit lora_rank lora_alpha target_modules lora_dropout pretrain teacher_model max_epochs
        kd_coef learning_rate lr_warmup_ratio pretrain_mode lr_scheduler l2 adam_betas teacher_offload
        dataset dataset_probs eval_dataset dataset_split eval_split max_samples input_key output_key
        input_template apply_chat_template max_len use_wandb wandb_org wandb_group wandb_project
        wandb_run_name use_tensorboard use_ms attn_implementation param_dtype
    """.split(),
}
