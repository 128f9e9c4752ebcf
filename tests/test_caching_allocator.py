"""The caching-allocator simulator against allocator facts worked out by hand from the rules of
``c10/cuda/CUDACachingAllocator.cpp`` (every expected figure is computed in a comment, never by
the simulator)."""

from __future__ import annotations

import random

import pytest

from heptstudy.estimate.caching_allocator import (
    AllocatorPeaks,
    AllocatorTraceError,
    CachingAllocator,
    round_size,
    segment_size,
)

KIB = 1024
MIB = 1024**2


def replay(events, expandable_segments: bool = False) -> AllocatorPeaks:
    """The peaks of an ordered ``("alloc" | "free", block_id, nbytes)`` trace."""
    alloc = CachingAllocator(expandable_segments=expandable_segments)
    for kind, block_id, nbytes in events:
        if kind == "alloc":
            alloc.malloc(block_id, nbytes)
        else:
            alloc.free(block_id)
    return alloc.peaks()


def _alloc_free_alloc(first_mib, n_first, then_mib, n_then, expandable=False):
    events = [("alloc", i, first_mib * MIB) for i in range(n_first)]
    events += [("free", i, 0) for i in range(n_first)]
    events += [("alloc", 100 + i, then_mib * MIB) for i in range(n_then)]
    return replay(events, expandable_segments=expandable)


def test_rounding_and_segment_sizes():
    # 1 B and 512 B -> 512 B; 513 B -> 1,024 B
    assert (round_size(1), round_size(512), round_size(513)) == (512, 512, 1024)
    # <= 1 MiB: a 2 MiB small segment; 1 MiB + 512 B .. < 10 MiB: 20 MiB; 10 MiB: its own
    # 10 MiB; 10 MiB + 512 B rounded up to 2 MiB: 12 MiB
    assert segment_size(1 * MIB) == 2 * MIB
    assert segment_size(1 * MIB + 512) == 20 * MIB
    assert segment_size(10 * MIB - 512) == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB
    assert segment_size(10 * MIB + 512) == 12 * MIB


def test_freed_small_blocks_cannot_hold_larger_requests_natively():
    # 8 x 16 MiB: each >= 10 MiB, its own 16 MiB segment -> 128 MiB reserved; all freed, the
    # eight 16 MiB free blocks sit in eight segments and never merge; 4 x 32 MiB fit none of
    # them: four new 32 MiB segments -> 128 + 128 = 256 MiB reserved; allocated at the end
    # 4 x 32 = 128 MiB, peak allocated 128 MiB (both phases hold 128 MiB)
    p = _alloc_free_alloc(16, 8, 32, 4)
    assert p.reserved == p.peak_reserved == 256 * MIB
    assert p.allocated == p.peak_allocated == 128 * MIB
    assert p.segments == 12


def test_larger_blocks_first_are_split_for_smaller_requests():
    # reverse order: 4 x 32 MiB segments = 128 MiB; freed; each 16 MiB request best-fits a
    # free 32 MiB block and splits it (remainder 16 MiB > 1 MiB): 8 x 16 MiB in the 4 segments,
    # reserved stays 128 MiB
    p = _alloc_free_alloc(32, 4, 16, 8)
    assert p.reserved == 128 * MIB
    assert p.allocated == 128 * MIB
    assert p.segments == 4


def test_small_requests_pack_into_2_mib_segments():
    # 10 x 200 KiB (small pool): a 2 MiB segment = 2,048 KiB holds 10 x 200 = 2,000 KiB with
    # 48 KiB left (each split leaves >= 512 B), so one segment, reserved 2 MiB; the 11th
    # (200 KiB > 48 KiB) opens a second 2 MiB segment: 4 MiB
    a = CachingAllocator()
    for i in range(10):
        a.malloc(i, 200 * KIB)
    assert (a.reserved, a.segments, a.allocated) == (2 * MIB, 1, 2000 * KIB)
    a.malloc(10, 200 * KIB)
    assert (a.reserved, a.segments) == (4 * MIB, 2)


def test_small_pool_splits_down_to_512_bytes():
    # 1 MiB in a 2 MiB segment: remainder 1 MiB, split; then 1 MiB - 512 B: remainder 512 B
    # >= 512 B, split again (allocated 2 MiB - 512 B, not 2 MiB); a 100 B request (rounded to
    # 512 B) takes that last 512 B: still one 2 MiB segment, allocated 2 MiB
    a = CachingAllocator()
    a.malloc(1, 1 * MIB)
    a.malloc(2, 1 * MIB - 512)
    assert a.allocated == 2 * MIB - 512
    a.malloc(3, 100)
    assert (a.allocated, a.reserved, a.segments) == (2 * MIB, 2 * MIB, 1)


def test_medium_requests_take_a_20_mib_segment():
    # 1 MiB + 1 B rounds to 1 MiB + 512 B > 1 MiB: large pool, under 10 MiB: a 20 MiB segment;
    # the remainder (20 MiB - 1 MiB - 512 B > 1 MiB) is split off; a second 5 MiB request fits
    # in that remainder: still 20 MiB reserved, allocated 1 MiB + 512 B + 5 MiB
    a = CachingAllocator()
    a.malloc(1, 1 * MIB + 1)
    assert (a.reserved, a.allocated) == (20 * MIB, 1 * MIB + 512)
    a.malloc(2, 5 * MIB)
    assert (a.reserved, a.allocated, a.segments) == (20 * MIB, 6 * MIB + 512, 1)


def test_large_blocks_split_only_with_more_than_1_mib_left():
    # 9 MiB: a 20 MiB segment, split (11 MiB left > 1 MiB): allocated 9 MiB; 10 MiB from the
    # 11 MiB block leaves exactly 1 MiB, not > 1 MiB: no split, the whole 11 MiB block is
    # handed out: allocated 9 + 11 = 20 MiB (not 19); nothing free is left, so a 2 MiB request
    # opens a second 20 MiB segment: reserved 40 MiB
    a = CachingAllocator()
    a.malloc(1, 9 * MIB)
    assert a.allocated == 9 * MIB
    a.malloc(2, 10 * MIB)
    assert (a.allocated, a.reserved) == (20 * MIB, 20 * MIB)
    a.malloc(3, 2 * MIB)
    assert (a.reserved, a.segments) == (40 * MIB, 2)
    # freeing the 11 MiB block gives its 11 MiB back to allocated: 20 - 11 + 2 = 11 MiB
    a.free(2)
    assert a.allocated == 11 * MIB


def test_free_blocks_merge_with_neighbours_in_the_same_segment():
    # one 20 MiB segment: A = 4 MiB at 0, B = 4 MiB at 4, C = 4 MiB at 8, 8 MiB free at 12.
    # Free A and C: C merges with the 8 MiB tail -> free 4 MiB (A) and 12 MiB (C + tail).
    # Free B: A + B + (C + tail) merge into the whole 20 MiB; a 19 MiB request fits it (1 MiB
    # left, no split): no new segment, reserved 20 MiB, allocated 20 MiB (the whole block)
    a = CachingAllocator()
    for i in range(3):
        a.malloc(i, 4 * MIB)
    a.free(0)
    a.free(2)
    a.malloc(10, 12 * MIB)  # fits C + tail exactly (12 MiB): no new segment
    assert (a.reserved, a.segments) == (20 * MIB, 1)
    a.free(10)
    a.free(1)
    a.malloc(11, 19 * MIB)
    assert (a.reserved, a.segments, a.allocated) == (20 * MIB, 1, 20 * MIB)


def test_free_blocks_of_different_segments_never_merge():
    # two 16 MiB segments (adjacent addresses in the simulator), both freed: 32 MiB is free but
    # in two segments; a 32 MiB request needs a third segment: 16 + 16 + 32 = 64 MiB
    a = CachingAllocator()
    a.malloc(1, 16 * MIB)
    a.malloc(2, 16 * MIB)
    a.free(1)
    a.free(2)
    a.malloc(3, 32 * MIB)
    assert (a.reserved, a.segments) == (64 * MIB, 3)


def test_best_fit_takes_the_smallest_free_block_that_fits():
    # free blocks of 30, 12 and 16 MiB (three segments); an 11 MiB request takes the 12 MiB
    # one (remainder 1 MiB: not split -> allocated 12 MiB); then 15 MiB takes the 16 MiB one
    # (remainder 1 MiB: allocated 12 + 16 = 28 MiB); reserved stays 30 + 12 + 16 = 58 MiB
    a = CachingAllocator()
    for i, mib in enumerate((30, 12, 16)):
        a.malloc(i, mib * MIB)
    for i in range(3):
        a.free(i)
    a.malloc(10, 11 * MIB)
    assert a.allocated == 12 * MIB
    a.malloc(11, 15 * MIB)
    assert (a.allocated, a.reserved) == (28 * MIB, 58 * MIB)


def test_expandable_segments_map_20_mib_pages_for_the_large_pool():
    # one segment; each 16 MiB request maps just enough 20 MiB pages at its end: 8 x 16 =
    # 128 MiB occupy the first 128 MiB of the range, so ceil(128 / 20) = 7 pages = 140 MiB are
    # mapped; freed, the 140 MiB merge into one block (one segment), which holds 4 x 32 =
    # 128 MiB: reserved stays 140 MiB (native: 256 MiB). With 2 MiB pages this would be exactly
    # 128 MiB: PyTorch's large-pool page is kLargeBuffer = 20 MiB.
    p = _alloc_free_alloc(16, 8, 32, 4, expandable=True)
    assert p.reserved == p.peak_reserved == 140 * MIB
    assert p.allocated == 128 * MIB
    assert p.segments == 1
    # reverse order: 4 x 32 = 128 MiB -> also 7 pages = 140 MiB, and 8 x 16 fit in them
    p = _alloc_free_alloc(32, 4, 16, 8, expandable=True)
    assert p.reserved == 140 * MIB


def test_expandable_segments_grow_the_free_block_at_the_end():
    # 10 MiB maps one 20 MiB page (10 MiB left free at the end of the mapped range); 15 MiB
    # does not fit that 10 MiB block, which grows by ceil((15 - 10) / 20) = 1 page: 40 MiB
    # mapped. Natively: a 10 MiB segment and a 16 MiB one (15 MiB rounded to 2 MiB) = 26 MiB
    a = CachingAllocator(expandable_segments=True)
    a.malloc(1, 10 * MIB)
    assert a.reserved == 20 * MIB
    a.malloc(2, 15 * MIB)
    assert a.reserved == 40 * MIB
    b = CachingAllocator()
    b.malloc(1, 10 * MIB)
    b.malloc(2, 15 * MIB)
    assert b.reserved == 26 * MIB


def test_expandable_small_pool_maps_2_mib_pages():
    # 5 x 768 KiB = 3,840 KiB in the small pool's one segment: ceil(3840 / 2048) = 2 pages =
    # 4 MiB. Natively a 2 MiB segment holds two (2 x 768 = 1,536 KiB, 512 KiB left < 768 KiB),
    # so five take three segments: 6 MiB
    events = [("alloc", i, 768 * KIB) for i in range(5)]
    assert replay(events, expandable_segments=True).reserved == 4 * MIB
    assert replay(events).reserved == 6 * MIB


def test_expandable_reuses_a_freed_hole_before_mapping_more():
    # page 1: A = 8 MiB at 0, B = 4 MiB at 8, C = 8 MiB at 12 (fills the page); D = 2 MiB maps
    # page 2: D at 20, 18 MiB free at 22. Free B (4 MiB hole). 3 MiB takes the hole (smallest
    # fit; the 1 MiB left is split off: expandable segments split down to 512 B): allocated
    # 8 + 8 + 2 + 3 = 21 MiB, reserved 40 MiB. Freed again (the hole is 4 MiB again), a 5 MiB
    # request fits only the 18 MiB end block, which is split: allocated 8 + 8 + 2 + 5 = 23 MiB,
    # still 40 MiB mapped
    a = CachingAllocator(expandable_segments=True)
    a.malloc(1, 8 * MIB)
    a.malloc(2, 4 * MIB)
    a.malloc(3, 8 * MIB)
    a.malloc(4, 2 * MIB)
    assert a.reserved == 40 * MIB
    a.free(2)
    a.malloc(5, 3 * MIB)
    assert (a.allocated, a.reserved) == (21 * MIB, 40 * MIB)
    a.free(5)
    a.malloc(6, 5 * MIB)
    assert (a.reserved, a.allocated) == (40 * MIB, 23 * MIB)


def test_expandable_segments_split_large_blocks_down_to_512_bytes():
    # 19.5 MiB: natively its own segment, rounded up to 20 MiB, 0.5 MiB left: not split (needs
    # > 1 MiB), so 20 MiB allocated; with expandable segments one 20 MiB page, and the 0.5 MiB
    # left is split off (>= 512 B): 19.5 MiB allocated
    request = 19 * MIB + 512 * KIB
    assert replay([("alloc", 1, request)]).allocated == 20 * MIB
    assert replay([("alloc", 1, request)], expandable_segments=True).allocated == request


def test_expandable_best_fit_skips_the_end_block_when_another_fits():
    # one 20 MiB page: A = 2 MiB at 0, B = 10 MiB at 2, C = 2 MiB at 12, 6 MiB free at 14 (the
    # end block). Free B. A 5 MiB request: by size the 6 MiB end block fits best, but it counts
    # as 6 MiB + the unmapped rest, so B is taken and split (5 MiB left > 1 MiB). A 6 MiB
    # request then fits the end block exactly and a 5 MiB one B's remainder: 2 + 5 + 2 + 6 + 5
    # = 20 MiB allocated in the one page. (Plain best fit would have given the end block to the
    # first 5 MiB, B to the 6 MiB (4 MiB left) and mapped a second page for the last: 40 MiB.)
    a = CachingAllocator(expandable_segments=True)
    a.malloc(1, 2 * MIB)
    a.malloc(2, 10 * MIB)
    a.malloc(3, 2 * MIB)
    a.free(2)
    a.malloc(4, 5 * MIB)
    a.malloc(5, 6 * MIB)
    a.malloc(6, 5 * MIB)
    assert (a.reserved, a.allocated) == (20 * MIB, 20 * MIB)


def test_peaks_reset_to_the_current_bytes():
    # 30 MiB (own 30 MiB segment), freed, then 10 MiB into that block (20 MiB left: split):
    # after reset_peak the peaks are the current 10 MiB allocated / 30 MiB reserved
    a = CachingAllocator()
    a.malloc(1, 30 * MIB)
    a.free(1)
    a.reset_peak()
    assert (a.peak_allocated, a.peak_reserved) == (0, 30 * MIB)
    a.malloc(2, 10 * MIB)
    assert (a.peak_allocated, a.peak_reserved) == (10 * MIB, 30 * MIB)
    a.malloc(3, 25 * MIB)  # 20 MiB free < 25 MiB: a new 26 MiB segment
    a.free(3)
    a.reset_peak()
    assert (a.peak_allocated, a.peak_reserved) == (10 * MIB, 56 * MIB)


def test_zero_byte_storages_never_reach_the_allocator():
    p = replay([("alloc", 1, 0), ("free", 1, 0)])
    assert (p.peak_allocated, p.peak_reserved, p.segments) == (0, 0, 0)


@pytest.mark.parametrize(
    "events, words",
    [
        ([("free", 7, 0)], "free of block 7, which is not allocated"),
        ([("alloc", 1, 512), ("alloc", 1, 512)], "still allocated"),
        ([("alloc", 1, -1)], "sizes are >= 0"),
    ],
)
def test_impossible_traces_are_refused_by_name(events, words):
    with pytest.raises(AllocatorTraceError, match=words):
        replay(events)


@pytest.mark.parametrize("expandable", [False, True])
def test_bookkeeping_stays_consistent_on_a_random_trace(expandable):
    """Allocated is the sum of live blocks, reserved the sum of all blocks, no two free
    neighbours are left unmerged, and the trace's own freeing returns allocated to zero."""
    rng = random.Random(3)
    a = CachingAllocator(expandable_segments=expandable)
    live, next_id = [], 0
    for _ in range(3000):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            a.malloc(next_id, rng.choice((100, 700 * KIB, 3 * MIB, 12 * MIB + 5)))
            live.append(next_id)
            next_id += 1
    blocks = {id(b): b for b, _ in a._live.values()}
    for free_at in a._free_at:
        blocks.update({id(b): b for b in free_at.values()})
    assert a.allocated == sum(b.size for b, _ in a._live.values())
    assert a.reserved == sum(b.size for b in blocks.values())
    for b in blocks.values():
        if b.next is not None:
            assert b.next.prev is b and b.next.addr == b.addr + b.size
            assert b.allocated or b.next.allocated
    for i in live:
        a.free(i)
    assert a.allocated == 0
