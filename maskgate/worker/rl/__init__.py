"""RL weight updates: the weights' layout and copy, the sync sources (disk, a trainer's
broadcast group, shared tensors) and the restricted decoding of tensor payloads."""
