#!/usr/bin/env bash
# SkyRL GRPO on harnessrl episodes, one node with 8 GPUs (colocated FSDP policy + vLLM engines).
# Needs: skyrl[fsdp] (vLLM), Docker with harnessrl's images built (scripts/setup.sh), the
# harness installed (scripts/install_harnesses.sh mini-swe-agent). Run from the repo root.
set -euo pipefail
DATA="${DATA:-$HOME/data/harnessrl/train.jsonl}"
MODEL="${MODEL:-Qwen/Qwen3-8B}"
python examples/skyrl/prepare_dataset.py --suite "${SUITE:-builtin}" --out "$DATA"
python examples/skyrl/main_harnessrl.py \
  data.train_data="['$DATA']" \
  trainer.policy.model.path="$MODEL" \
  generator.inference_engine.backend=vllm \
  generator.inference_engine.num_engines=4 \
  generator.inference_engine.tensor_parallel_size=2 \
  generator.inference_engine.engine_init_kwargs.max_model_len=32768 \
  trainer.strategy=fsdp \
  trainer.placement.colocate_all=true \
  trainer.placement.policy_num_gpus_per_node=8 \
  trainer.placement.ref_num_gpus_per_node=8 \
  trainer.algorithm.advantage_estimator=grpo \
  trainer.algorithm.loss_reduction=token_mean \
  trainer.algorithm.max_seq_len=32768 \
  trainer.train_batch_size=16 \
  trainer.policy_mini_batch_size=16 \
  trainer.micro_forward_batch_size_per_gpu=1 \
  trainer.micro_train_batch_size_per_gpu=1 \
  trainer.eval_interval=-1 \
  trainer.logger="${LOGGER:-console}" \
  generator.batched=false \
  generator.n_samples_per_prompt=8 \
  generator.sampling_params.max_generate_length=4096 \
  generator.step_wise_trajectories=true \
  harnessrl.harness=mini-swe-agent \
  harnessrl.sandbox=docker \
  harnessrl.max_concurrency=32 \
  harnessrl.episode.max_calls=30 \
  "$@"
