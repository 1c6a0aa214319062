"""maskgate: a reverse proxy that serves LLM sampling masks from a dedicated worker pool.

Subpackages, with imports pointing one way:
- `maskgate.protocol`: the request contract the gateway and the worker share (error codes and
  their rendering, request field names, the mask-policy checks, settings loading). No torch.
- `maskgate.gateway`: the reverse proxy; imports protocol only.
- `maskgate.kernels`: the sampling-mask kernels (torch, Triton).
- `maskgate.worker`: the model server; imports protocol and kernels.
- `maskgate.cli`: the `maskgate` command; imports each subcommand's package when it runs.
"""
