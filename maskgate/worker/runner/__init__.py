"""The model runner: all device work of a step (batch assembly, forward, sampling, log-probs,
the mask ids' copy to the host), CUDA graphs, and releasing device memory."""
