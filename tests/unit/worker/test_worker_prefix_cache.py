"""The prefix cache's radix tree on its own: which slot holds which prefix, written vs claimed
tokens, splitting and trimming paths, LRU eviction and flushes."""

from __future__ import annotations

from maskgate.worker.engine.prefix_cache import PrefixCache


def hold(cache: PrefixCache, tokens: list[int]) -> int:
    """A sequence takes a slot, writes all of `tokens` and ends: the slot is cached."""
    slot = cache.take()
    cache.claim(slot, tokens)
    cache.set_written(slot, len(tokens))
    cache.retire(slot, tokens, keep=True)
    return slot


def test_match_finds_the_longest_written_prefix_across_slots() -> None:
    cache = PrefixCache(4)
    a = hold(cache, [1, 2, 3, 4, 5])
    b = hold(cache, [1, 2, 3, 9])
    assert cache.match([1, 2, 3, 4, 5, 6], 6, exclude=-1).length == 5
    m = cache.match([1, 2, 3, 4, 5, 6], 6, exclude=-1)
    assert m.slot == a
    m = cache.match([1, 2, 3, 9, 9], 5, exclude=-1)
    assert (m.length, m.slot) == (4, b)
    m = cache.match([1, 2, 7], 3, exclude=-1)
    assert m.length == 2 and m.slot in (a, b)
    assert cache.match([7, 1, 2], 3, exclude=-1).length == 0
    # The limit caps the match, and a slot can be left out (a sequence's own).
    assert cache.match([1, 2, 3, 4, 5], 3, exclude=-1).length == 3
    assert cache.match([1, 2, 3, 9], 4, exclude=b).length == 3


def test_claimed_tokens_count_only_once_written() -> None:
    cache = PrefixCache(2)
    slot = cache.take()
    cache.claim(slot, [5, 6, 7, 8])
    m = cache.match([5, 6, 7, 8, 1], 5, exclude=-1)
    assert (m.length, m.slot) == (0, None)
    assert (m.pending, m.pending_slot) == (4, slot)  # a running prefill will write them
    cache.set_written(slot, 2)
    m = cache.match([5, 6, 7, 8, 1], 5, exclude=-1)
    assert (m.length, m.slot, m.pending) == (2, slot, 4)


def test_a_retired_slot_keeps_what_it_wrote_and_its_outputs() -> None:
    cache = PrefixCache(2)
    slot = cache.take()
    cache.claim(slot, [1, 2, 3])
    cache.set_written(slot, 5)  # prompt of 3, then two fed output tokens
    cache.retire(slot, [1, 2, 3, 40, 41, 42], keep=True)
    assert cache.match([1, 2, 3, 40, 41, 42, 43], 7, exclude=-1).length == 5
    # An aborted prefill: only the written part stays.
    other = cache.take()
    cache.claim(other, [9, 8, 7, 6])
    cache.set_written(other, 2)
    cache.retire(other, [9, 8, 7, 6], keep=True)
    m = cache.match([9, 8, 7, 6], 4, exclude=-1)
    assert (m.length, m.pending) == (2, 2)


def test_eviction_takes_the_least_recently_used_cached_slot() -> None:
    cache = PrefixCache(2)
    a = hold(cache, [1, 1, 1])
    b = hold(cache, [2, 2, 2])
    cache.touch(a)  # a copy read it: b is now the older one
    assert cache.take() == b
    assert cache.match([2, 2, 2], 3, exclude=-1).length == 0
    assert cache.match([1, 1, 1], 3, exclude=-1).length == 3
    assert cache.take() == a
    assert cache.match([1, 1, 1], 3, exclude=-1).length == 0
    assert cache.root.children == {}  # nothing left behind


def test_evicting_one_slot_keeps_the_shared_part_for_the_other() -> None:
    cache = PrefixCache(3)
    a = hold(cache, [1, 2, 3, 4])
    b = hold(cache, [1, 2, 5])
    cache.touch(b)
    assert cache.take() not in (a, b)  # a free slot first
    assert cache.take() == a
    m = cache.match([1, 2, 3, 4], 4, exclude=-1)
    assert (m.length, m.slot) == (2, b)


def test_an_error_frees_the_slot_instead_of_caching_it() -> None:
    cache = PrefixCache(1)
    slot = cache.take()
    cache.claim(slot, [3, 3, 3])
    cache.set_written(slot, 3)
    cache.retire(slot, [3, 3, 3], keep=False)
    assert list(cache.free) == [slot] and cache.num_cached == 0
    assert cache.match([3, 3, 3], 3, exclude=-1).length == 0


def test_flush_forgets_everything_and_running_slots_end_free() -> None:
    cache = PrefixCache(3)
    hold(cache, [1, 2, 3])
    running = cache.take()
    cache.claim(running, [1, 2, 3, 4])
    cache.set_written(running, 4)
    cache.flush([running])
    assert cache.num_cached == 0 and len(cache.free) == 2
    assert cache.match([1, 2, 3, 4], 4, exclude=-1) == cache.match([], 0, exclude=-1)
    cache.set_written(running, 6)  # still running on the old K/V: never shared again
    cache.retire(running, [1, 2, 3, 4, 5, 6], keep=True)
    assert len(cache.free) == 3 and cache.num_cached == 0
    assert cache.match([1, 2, 3, 4], 4, exclude=-1).length == 0


def test_take_over_keeps_the_shared_part_in_place() -> None:
    cache = PrefixCache(2)
    a = hold(cache, [1, 2, 3, 4, 5])
    cache.take_over(a, [1, 2, 3, 7, 7], 3)
    assert cache.num_cached == 0 and cache.written[a] == 3
    m = cache.match([1, 2, 3, 7, 7], 5, exclude=-1)
    assert (m.length, m.slot, m.pending) == (3, a, 5)
    assert cache.match([1, 2, 3, 4], 4, exclude=-1).length == 3  # 4, 5 are gone
