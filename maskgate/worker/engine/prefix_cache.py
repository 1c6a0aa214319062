"""The prefix cache: a radix tree over token ids that records which KV slot holds which prefix.

A KV slot holds one token sequence at positions 0..n-1 (maskgate/worker/engine/kv_cache.py), and the
K/V at position p depends only on tokens 0..p. So every slot is a path from the root of a
radix tree: each node is a run of tokens, and `node.slots` are the slots whose content runs
through the whole node. Two slots holding a common prefix share its nodes. A new sequence
matches its prompt against the tree and copies the longest prefix some slot holds
(device-to-device, `Runner.copy_kv`) instead of computing it again.

A slot is in one of three states:
- running: a sequence owns it. Its path is the tokens the sequence will write (its prefill
  ids); `written[slot]` says how many of them are already in the slot. Only written
  positions are ever copied from. A running slot is never evicted (its reference: the
  sequence that owns it).
- cached: its sequence ended; the slot keeps what was written, and its path is exactly that.
  Cached slots are the eviction candidates, least recently used first.
- free: holds nothing (at start, after eviction or a flush).

A flush (a weight update, /flush_cache, releasing the KV memory) empties the tree: cached
slots become free, and running slots become `stale`: they leave the tree, are never copied
from, and become free (not cached) when their sequence ends, since their K/V came from the
old weights.

Nothing here imports torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


class _Node:
    __slots__ = ("children", "parent", "slots", "start", "tokens")

    def __init__(self, tokens: tuple[int, ...], parent: _Node | None, start: int) -> None:
        self.tokens = tokens  # the run of tokens on the edge into this node
        self.parent = parent
        self.start = start  # depth (token position) where the run starts
        self.children: dict[int, _Node] = {}  # keyed by their first token
        self.slots: set[int] = set()

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def _common(run: tuple[int, ...], tokens: list[int], at: int, limit: int) -> int:
    """How many tokens of `run` equal tokens[at:limit], from the start."""
    n = min(len(run), limit - at)
    if run[:n] == tuple(tokens[at : at + n]):  # the usual case, compared in C
        return n
    i = 0
    while run[i] == tokens[at + i]:
        i += 1
    return i


@dataclass(frozen=True, slots=True)
class Match:
    length: int = 0  # tokens some slot holds written: copy them from `slot`
    slot: int | None = None
    pending: int = 0  # tokens some running slot will hold once its prefill writes them
    pending_slot: int | None = None


class PrefixCache:
    def __init__(self, num_slots: int) -> None:
        self.root = _Node((), None, 0)
        self.tip: dict[int, _Node] = {}  # slot -> deepest node of its path; absent: empty
        self.written = [0] * num_slots
        self.free: deque[int] = deque(range(num_slots))
        self.cached: dict[int, int] = {}  # cached slot -> last use (LRU order)
        self.stale: set[int] = set()  # running slots whose K/V predates the last flush
        self.clock = 0

    # --- slots -----------------------------------------------------------------------------

    def take(self) -> int:
        """A slot for a new sequence: a free one, else the least recently used cached one
        (evicted). The caller checks that one exists (fewer running sequences than slots)."""
        if self.free:
            return self.free.popleft()
        slot = min(self.cached, key=self.cached.__getitem__)
        del self.cached[slot]
        self._truncate(slot, 0)
        self.written[slot] = 0
        return slot

    def take_over(self, slot: int, tokens: list[int], n: int) -> None:
        """A new sequence takes the cached `slot`, whose first n tokens it shares and keeps
        (no copy needed), and will write the rest of `tokens` after them."""
        del self.cached[slot]
        self._truncate(slot, n)
        self._extend(slot, tokens, n)
        self.written[slot] = n

    def claim(self, slot: int, tokens: list[int]) -> None:
        """A sequence took `slot` and will write `tokens` into it (nothing is written yet)."""
        self._extend(slot, tokens, 0)

    def set_written(self, slot: int, n: int) -> None:
        if slot not in self.stale:
            self.written[slot] = n

    def touch(self, slot: int) -> None:
        self.clock += 1
        if slot in self.cached:
            self.cached[slot] = self.clock

    def retire(self, slot: int, content: list[int], keep: bool) -> None:
        """The slot's sequence ended. keep: `content` (its first written[slot] tokens are in
        the slot) stays cached; otherwise (an error, a stale slot) the slot is freed."""
        if not keep or slot in self.stale:
            self.stale.discard(slot)
            self._truncate(slot, 0)
            self.written[slot] = 0
            self.free.append(slot)
            return
        n = self.written[slot]
        if n == 0:
            self._truncate(slot, 0)
            self.free.append(slot)
            return
        tip = self.tip.get(slot)
        have = 0 if tip is None else tip.end
        if have > n:
            self._truncate(slot, n)
        elif have < n:
            self._extend(slot, content[:n], have)
        self.touch(slot)
        self.cached[slot] = self.clock

    def flush(self, running: list[int]) -> None:
        """Empty the tree: cached slots become free, running slots stale."""
        self.root = _Node((), None, 0)
        self.tip.clear()
        self.free.extend(self.cached)
        self.cached.clear()
        self.stale.update(running)
        for slot in range(len(self.written)):
            self.written[slot] = 0

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    @property
    def num_cached_tokens(self) -> int:
        return sum(self.written[s] for s in self.cached)

    # --- lookup ----------------------------------------------------------------------------

    def match(self, tokens: list[int], limit: int, exclude: int) -> Match:
        """The longest prefix of tokens[:limit] some slot other than `exclude` holds written
        (and the longest some running slot will hold once its prefill is done)."""
        path: list[tuple[_Node, int]] = []  # (node, tokens of the prefix matched through it)
        node, depth = self.root, 0
        while depth < limit:
            child = node.children.get(tokens[depth])
            if child is None:
                break
            common = _common(child.tokens, tokens, depth, limit)
            path.append((child, depth + common))
            if common < len(child.tokens):
                break
            node, depth = child, depth + common
        best, best_slot, pending, pending_slot = 0, None, 0, None
        for node, reach in reversed(path):
            if reach <= best and reach <= pending:
                break
            for s in node.slots:
                if s == exclude or s in self.stale:
                    continue
                usable = min(reach, self.written[s])
                if usable > best:
                    best, best_slot = usable, s
                if reach > pending:
                    pending, pending_slot = reach, s
        return Match(best, best_slot, pending, pending_slot)

    # --- the tree --------------------------------------------------------------------------

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut `node` after its first k tokens; returns the new upper part."""
        parent = node.parent
        assert parent is not None and 0 < k < len(node.tokens)
        upper = _Node(node.tokens[:k], parent, node.start)
        upper.slots = set(node.slots)
        parent.children[node.tokens[0]] = upper
        node.tokens = node.tokens[k:]
        node.start += k
        node.parent = upper
        upper.children[node.tokens[0]] = node
        return upper

    def _extend(self, slot: int, tokens: list[int], at: int) -> None:
        """Lengthen the slot's path (now `at` tokens long) by tokens[at:]."""
        node = self.tip.get(slot, self.root)
        assert node.end == at, "a slot's path grows from its end"
        i, n = at, len(tokens)
        while i < n:
            child = node.children.get(tokens[i])
            if child is None:
                child = _Node(tuple(tokens[i:]), node, i)
                node.children[tokens[i]] = child
                child.slots.add(slot)
                node = child
                break
            common = _common(child.tokens, tokens, i, n)
            if common < len(child.tokens):
                child = self._split(child, common)
            child.slots.add(slot)
            node, i = child, i + common
        if node is not self.root:
            self.tip[slot] = node

    def _truncate(self, slot: int, n: int) -> None:
        """Shorten the slot's path to its first n tokens."""
        node = self.tip.pop(slot, None)
        if node is None:
            return
        while node.parent is not None and node.start >= n:
            node.slots.discard(slot)
            parent = node.parent
            if not node.slots:  # no slot runs through it, so none through its children
                del parent.children[node.tokens[0]]
            node = parent
        if node.parent is None:
            return
        if node.end > n:
            upper = self._split(node, n - node.start)
            node.slots.discard(slot)
            if not node.slots:
                del upper.children[node.tokens[0]]
            node = upper
        self.tip[slot] = node
