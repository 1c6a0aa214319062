"""The Triton path of `kernels.sample` (CUDA tensors; the CPU under TRITON_INTERPRET=1).

Importing this package loads no Triton: config.py is host arithmetic that the worker's
warm-up reads, and the modules with kernels import Triton themselves.

    launch      sample_triton: the buffers and the two or three launches, no host sync
    config      the launch shapes by vocabulary and batch, with the measurements behind them
    pass1       band_lanes_kernel, grid (B, segments): the one full read of the logits
    band        pass 1's end of segment: the band cut, the written candidates, the reread
    race        pass 1's Gumbel race for the rows nothing truncates
    resolve     resolve_kernel, grid (B,): one row a program, in named phases
    decide      the tiers' pick, sort, decision and draw; the mask slot
    rescue      a row the first tier leaves undecided: the second tier and the rescue
    whole_row   the whole-row fallback's draw and mask
    fallback    the whole-row fallback's search for the cut (fallback_support)
    thresholds  that search's thresholds a read
    reads       one program's reads of a row: counts, lists, gathers, the fallback's draw
    emit        the CSR packing: emit_kernel, and pack_row inside resolve
    sort        sorting a block of packed keys
    common      keys, keyed noise, scaling and reductions shared by the kernels
"""
