#!/usr/bin/env bash
# ATR-GRPO on Qwen3 with verl: the paper's protocol (Table 4, §6.1) mapped onto verl's PPO trainer, with the ATR
# rule from this package's verl plugin (loss_mode=atr_grpo.atr) and δ from the DELTA variable.
#
#   TRAIN_FILES=/data/dapo-math-17k.parquet VAL_FILES=/data/aime-2024.parquet \
#   DELTA=0.07 NNODES=2 GPUS_PER_NODE=8 bash examples/verl/run_atr_qwen3.sh [extra Hydra overrides]
#
# Run it on the Ray head node, from an environment built with verl and this package (docs/scaling.md,
# "verl"). The files are verl-format parquet (chat `prompt`, `reward_model.ground_truth`, `data_source`, which
# picks verl's scorer). DRY_RUN=1 prints the command instead of running it. Extra arguments are appended as
# Hydra overrides, e.g. `actor_rollout_ref.model.path=Qwen/Qwen3-8B`.
set -euo pipefail

: "${TRAIN_FILES:?set TRAIN_FILES to verl-format training parquet file(s)}"
: "${VAL_FILES:?set VAL_FILES to verl-format validation parquet file(s)}"
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-Qwen/Qwen3-1.7B}          # §6.1 (Qwen/Qwen3-8B for the larger model)
DELTA=${DELTA:-0.07}                     # ATR's trust-region threshold δ, §6.4
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MAX_PROMPT=${MAX_PROMPT:-512}
MAX_RESPONSE=${MAX_RESPONSE:-1536}       # 2048 - MAX_PROMPT (Table 4); also Dr.GRPO's constant L
# Table 4: 8 completions x 4 accumulation steps = 32 completions (4 prompts x G = 8) per optimizer step. One
# rollout of 8 prompts feeds 2 optimizer steps, as `rollout=reuse2` does, so every second update is off-policy.
TRAIN_BATCH=${TRAIN_BATCH:-8}            # prompts per rollout
MINI_BATCH=${MINI_BATCH:-4}              # prompts per optimizer step
STEPS=${STEPS:-500}                      # rollouts: 1,000 optimizer steps (§6.1)
LORA_RANK=${LORA_RANK:-32}               # Table 4 (r 32, α 64); LORA_RANK=0 trains the full weights
NAME=${NAME:-verl__atr__d${DELTA}}
OUT_DIR=${OUT_DIR:-results/verl/${NAME}}

overrides=(
  algorithm.adv_estimator=grpo
  algorithm.norm_adv_by_std_in_grpo=false             # Dr.GRPO: no std scaling
  algorithm.use_kl_in_reward=false                    # β = 0 (App. B)
  data.train_files="${TRAIN_FILES}"
  data.val_files="${VAL_FILES}"
  data.train_batch_size="${TRAIN_BATCH}"
  data.max_prompt_length="${MAX_PROMPT}"
  data.max_response_length="${MAX_RESPONSE}"
  data.filter_overlong_prompts=true
  actor_rollout_ref.model.path="${MODEL}"
  actor_rollout_ref.model.lora_rank="${LORA_RANK}"
  actor_rollout_ref.model.lora_alpha=$((2 * LORA_RANK))
  actor_rollout_ref.model.target_modules=all-linear
  actor_rollout_ref.actor.optim.lr=5e-6               # Table 4
  actor_rollout_ref.actor.optim.weight_decay=1e-3     # Table 4
  actor_rollout_ref.actor.optim.betas=[0.9,0.99]
  actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
  actor_rollout_ref.actor.optim.lr_scheduler_type=cosine  # verl has constant or cosine; the paper decays linearly
  actor_rollout_ref.actor.ppo_mini_batch_size="${MINI_BATCH}"
  actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.use_dynamic_bsz=true
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$((4 * (MAX_PROMPT + MAX_RESPONSE)))
  actor_rollout_ref.actor.use_kl_loss=false
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.policy_loss._target_=atr_grpo.integrations.verl.ATRPolicyLossConfig
  actor_rollout_ref.actor.policy_loss.loss_mode=atr_grpo.atr
  +actor_rollout_ref.actor.policy_loss.delta="${DELTA}"
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm  # = dr_grpo with L = loss_scale_factor
  actor_rollout_ref.actor.loss_scale_factor="${MAX_RESPONSE}"
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=8                       # group size G, Table 4
  actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.top_p=1.0
  actor_rollout_ref.rollout.top_k=-1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true
  actor_rollout_ref.rollout.val_kwargs.do_sample=true  # evaluation sampling of §6.1: Mean@8 at T 0.3, top-p 0.95
  actor_rollout_ref.rollout.val_kwargs.temperature=0.3
  actor_rollout_ref.rollout.val_kwargs.top_p=0.95
  actor_rollout_ref.rollout.val_kwargs.n=8
  trainer.nnodes="${NNODES}"
  trainer.n_gpus_per_node="${GPUS_PER_NODE}"
  trainer.total_training_steps="${STEPS}"
  trainer.save_freq=25                                # every 50 optimizer steps
  trainer.test_freq=25
  trainer.project_name=atr-grpo
  trainer.experiment_name="${NAME}"
  trainer.default_local_dir="${OUT_DIR}"
  trainer.logger=[console]
)
if [ "${LORA_RANK}" -gt 0 ]; then
  overrides+=(actor_rollout_ref.rollout.load_format=safetensors)  # vLLM loads the base weights, then the adapter
fi

command=("${PYTHON}" -m verl.trainer.main_ppo "${overrides[@]}" "$@")
if [ -n "${DRY_RUN:-}" ]; then
  printf '%q ' "${command[@]}"
  printf '\n'
  exit 0
fi
# verl loads its plugins quietly (a plugin that fails to import only shows up later as an unknown loss_mode):
# import ours here first, so that a broken or missing install fails now, with its error
"${PYTHON}" -c 'import atr_grpo.integrations.verl as plugin; from importlib.metadata import entry_points as eps
assert "atr_grpo" in {ep.name for ep in eps(group="verl.plugins")}, "install this package here: pip install --no-deps -e ."
plugin.register_policy_losses()'
exec "${command[@]}"
