"""How close the cost model comes to published step times, over every public set of published measurements.

Every row is evaluated with its PUBLISHED configuration pinned, never with the planner's best plan.

``megatron2021``: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21, arXiv 2104.04473), Table 1 reports achieved TFLOP/s per GPU for ten GPT models on up to
3072 A100-80GB GPUs. Their FLOP count F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) includes full activation
recomputation, so the measured step time is F / (TFLOP/s per GPU * GPUs). For each row this module evaluates the
published tp and pp with dp = gpus/(tp*pp), fp16, full recomputation, no sequence parallelism (it came in 2022),
ZeRO 0, no flash attention (2022), the tensor-parallel backward's input-gradient all-reduces synchronous (the
asynchronous form, --async-tensor-model-parallel-allreduce, came after the paper's runs), fp16 gradient buffers
(Megatron-LM's default with fp16: --accumulate-allreduce-grads-in-fp32 is opt-in), reduced after the backward
(the paper's LocalDDP all-reduced each model chunk's buffer once the pipeline's backward ended; overlap came with
megatron-core) and an even layer split. The paper does not give the micro-batch size or the
interleaving per row and says both were tuned, so the best fitting choice among mbs in {1, 2, 4, 8} and, when
pp > 2, the interleaved schedule with vpp in {2, 4}, is taken.

``public``: profiles/published/published-runs-public.csv, a copy of the project's shared published-runs file:
NVIDIA dgxc-benchmarking (NeMo on DGX H100, Llama 3.1 8B/70B/405B, BF16 and FP8), torchtitan's benchmarks (H100
96 GB HBM2e Grand Teton hosts, one H200 set), Megatron-LM's Llama examples and two MoE runs from Megatron-Bridge.
Each dense pretraining row becomes a ModelSpec, HardwareSpec, JobSpec and Plan from its columns; every knob the
row does not publish follows one written rule (RULES, printed in the report's header); a layout check_plan
rejects is replaced by the nearest valid one, with a note on the row; a row that cannot be represented is
listed as skipped with the reason.

One figure of the cost model is fitted to these rows: ``attention_bwd_ratio`` (backward over forward speed of
fused attention) of the H100-class hardware files, fitted to the dgxc-benchmarking rows and the three
Megatron-LM-example H100 rows (Transformer Engine's cuDNN attention) by the least MAPE over a fixed grid
(fit_attention_bwd_ratio). Every other efficiency comes from public microbenchmarks and datasheets. The in-sample
column uses the shipped hardware files as they are; the leave-one-family-out (LOFO) column refits the ratio
without each model family (Llama 3.1 8B, 70B, 405B) and predicts that family's rows with it;
`public_report(fit=...)` takes any other fitting hook the same way.

Run: ``python -m autotune.reports.accuracy [--set megatron2021|public|all] [--json]`` (``make accuracy``).

Modules: common (the data files, reading, the summary figures both sets share), megatron2021 (Table 1),
rules (a public row as the cost model's inputs: RULES and Case), fit (the one fitted figure and LOFO), public
(the public report and its text) and __main__ (the command line).
"""
