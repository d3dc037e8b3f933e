"""batchscope's own kernels: Triton on CUDA (paged attention, the KV write, RMSNorm with and without the residual add,
rotary, SiLU*up, few-row GEMMs, fused MoE experts, merged projections) and oneDNN-packed linears on the CPU. Each
module holds one kernel and the check that installs it only where a model's code is, op for op, what it
reproduces; common.py holds what they share."""
