"""The torch path of `kernels.sample` (CPU tensors, and the Triton path's twin in tests).

torch_path   sample_torch: a sorted prefix a row, longer prefixes or a full sort when it
             cannot decide, the draw and the CSR masks
decide       the support size from a sorted prefix (the decision rule of triton/decide.py)
"""
