"""Belady's MIN (the store's foresight cache) against an exhaustive referee."""

import functools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlcc_adjoint.storage._belady import (
    NEVER,
    ForesightCache,
    belady_misses,
    next_use_times,
    prefetch_order,
)


def _brute_force_min_misses(trace, capacity):
    """The fewest misses any policy achieves with unit-size entries: at every
    miss try every choice (bypass, insert into free room, or evict any one
    entry), memoised on (position, cache contents)."""

    @functools.cache
    def best(i, held):
        if i == len(trace):
            return 0
        key = trace[i]
        if key in held:
            return best(i + 1, held)
        options = [best(i + 1, held)]  # bypass
        if len(held) < capacity:
            options.append(best(i + 1, held | {key}))
        for victim in held:
            options.append(best(i + 1, (held - {victim}) | {key}))
        return 1 + min(options)

    return best(0, frozenset())


def test_belady_miss_count_equals_brute_force_optimum_on_random_traces():
    rng = random.Random(20240601)
    for _ in range(600):
        length = rng.randint(8, 10)
        keys = rng.randint(2, 5)
        capacity = rng.randint(2, 3)
        trace = [rng.randrange(keys) for _ in range(length)]
        misses, peak = belady_misses(trace, capacity)
        assert misses == _brute_force_min_misses(trace, capacity), (trace, capacity)
        assert peak <= capacity


def test_next_use_times_link_each_access_to_the_next_of_the_same_key():
    assert next_use_times("abca") == [3, NEVER, NEVER, NEVER]


@settings(max_examples=150, deadline=None)
@given(
    trace=st.lists(st.integers(0, 7), min_size=1, max_size=40),
    sizes=st.lists(st.integers(1, 9), min_size=8, max_size=8),
    capacity=st.integers(0, 25),
)
def test_belady_never_exceeds_the_byte_budget_with_variable_sizes(trace, sizes, capacity):
    misses, peak = belady_misses(trace, capacity, dict(enumerate(sizes)))
    assert peak <= capacity
    assert len(set(trace)) <= misses <= len(trace)


@settings(max_examples=150, deadline=None)
@given(
    trace=st.lists(st.integers(0, 7), min_size=1, max_size=30),
    sizes=st.lists(st.integers(1, 9), min_size=8, max_size=8),
    capacity=st.integers(0, 25),
    preload=st.integers(0, 7),
)
def test_prefetch_never_evicts_what_is_needed_sooner_and_respects_the_budget(
    trace, sizes, capacity, preload
):
    firsts = {}
    for i, key in enumerate(trace):
        firsts.setdefault(key, i)
    cache = ForesightCache(capacity)
    pinned = set()
    # Some entries already held, some of them pinned, some never used again.
    for key in range(preload):
        if cache.fits(sizes[key]):
            cache.insert(key, sizes[key], firsts.get(key, NEVER))
            if key % 3 == 0:
                cache.pin(key)
                pinned.add(key)
    before = {k: cache.next_use(k) for k in cache}
    upcoming = [(k, sizes[k], t) for k, t in sorted(firsts.items(), key=lambda kv: kv[1])]
    decisions = prefetch_order(upcoming, cache)
    assert cache.used_bytes <= capacity
    assert cache.peak_bytes <= capacity
    for key, victims in decisions:
        for v in victims:
            assert before[v] > firsts[key]  # only entries needed later than the fetch
            assert v not in pinned
    fetched = [k for k, _ in decisions]
    assert fetched == sorted(fetched, key=lambda k: firsts[k])
    assert all(k in cache for k in pinned)


def test_victims_are_farthest_first_and_never_needed_sooner():
    cache = ForesightCache(10)
    cache.insert("a", 4, 5)
    cache.insert("b", 3, 50)
    cache.insert("c", 3, NEVER)
    assert cache.victims_for(3, 10) == ["c"]
    assert cache.victims_for(6, 10) == ["c", "b"]
    assert cache.victims_for(7, 10) is None  # would need "a", needed at 5 < 10
    assert cache.victims_for(11, 0) is None  # bigger than the budget
    cache.pin("c")
    assert cache.victims_for(3, 10) == ["b"]
    cache.unpin("c")
    assert cache.victims_for(1, 10) == ["c"]
    cache.remove("c")
    assert cache.victims_for(3, 10) == []  # fits in the free room
    with pytest.raises(ValueError, match="does not fit"):
        cache.insert("d", 4, 1)


def test_insert_refuses_to_exceed_and_remove_returns_bytes():
    cache = ForesightCache(4)
    cache.insert(1, 4, 3)
    with pytest.raises(ValueError, match="evict first"):
        cache.insert(2, 1, 1)
    assert cache.remove(1) == 4
    assert cache.used_bytes == 0 and cache.peak_bytes == 4
