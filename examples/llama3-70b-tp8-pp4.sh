#!/bin/bash
# Llama-3-70B pretraining on 64 nodes x 8 H100 (512 GPUs): TP 8 inside a node, PP 4 (interleaved, 4 virtual
# stages per rank), DP 16 with the distributed optimizer. A hand-written Megatron-LM launch script, as teams
# keep them; `autotune check` reads it as is.
set -euo pipefail

# Cluster (Slurm sets these; the defaults are for a dry run)
NNODES=${SLURM_NNODES:-64}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NODE_RANK=${SLURM_NODEID:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}

# Parallelism
TP=${TP:-8}
PP=${PP:-4}
SEQ_LEN=${SEQ_LEN:-8192}
MICRO_BATCH=${MICRO_BATCH:-1}
GLOBAL_BATCH=${GLOBAL_BATCH:-512}

DATA_PATH=${DATA_PATH:-/lustre/data/redpajama/llama3_text_document}
TOKENIZER=${TOKENIZER:-meta-llama/Meta-Llama-3-70B}
CKPT_DIR=${CKPT_DIR:-/lustre/ckpt/llama3-70b}

MODEL_ARGS=(
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672
    --num-attention-heads 64 --group-query-attention --num-query-groups 8
    --seq-length $SEQ_LEN --max-position-embeddings $SEQ_LEN
    --position-embedding-type rope --rotary-base 500000
    --normalization RMSNorm --norm-epsilon 1e-5
    --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
    --attention-dropout 0.0 --hidden-dropout 0.0
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size $PP
    --num-layers-per-virtual-pipeline-stage 5   # 80 layers / pp 4 / 5 = 4 virtual stages per rank
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce --overlap-param-gather
)

TRAIN_ARGS=(
    --micro-batch-size $MICRO_BATCH --global-batch-size $GLOBAL_BATCH
    --bf16
    --recompute-activations          # selective recompute (the older spelling)
    --use-flash-attn
    --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --lr-warmup-iters 2000
    --train-iters 500000 --weight-decay 0.1 --clip-grad 1.0
    --adam-beta1 0.9 --adam-beta2 0.95
)

DATA_ARGS=(
    --data-path "$DATA_PATH" --split 99,1,0
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER"
)

LOG_ARGS=(
    --log-interval 10 --save-interval 1000 --eval-interval 1000 --eval-iters 10
    --save "$CKPT_DIR" --load "$CKPT_DIR"
    --tensorboard-dir "$CKPT_DIR/tb"
)

export CUDA_DEVICE_MAX_CONNECTIONS=1

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR --master_port $MASTER_PORT \
    pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" \
    "${TRAIN_ARGS[@]}" \
    "${DATA_ARGS[@]}" \
    "${LOG_ARGS[@]}"
