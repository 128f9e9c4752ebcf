"""A simulator of PyTorch's CUDA caching allocator: allocated and reserved bytes of an ordered
trace of allocations and frees, without a GPU.

It follows ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x, one device, one stream, default
settings, no ``empty_cache``; sizes and the split rule at the constants and ``malloc``): best fit
by size, then lowest address; a remainder too small to split is handed out with the block and
*counted as allocated*; a freed block merges with its free neighbours in its segment. Native
mode: a new segment when nothing fits, never released; addresses increase, so "lowest address"
is "oldest segment" (real placement only matters for ties between equal free blocks).
``expandable_segments``: one segment per pool grown by mapping pages at its end, extending the
free block there (see ``_best_fit``); nothing is unmapped: reserved = mapped bytes.

Not simulated: several streams, CUDA graphs' pools, the out-of-memory retry, other settings, and
memory allocated outside the caching allocator (cuBLAS/cuDNN handles, the CUDA context).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from heptstudy.errors import HeptstudyError
from heptstudy.units import MIB

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MIB  # kSmallSize: requests up to this size use the small pool
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: small-pool segment (and expandable page) size
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: segment for 1-10 MiB requests; large expandable page
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: from here a request gets its own segment
ROUND_LARGE = 2 * MIB  # kRoundLarge: such a segment is rounded up to this

_SMALL, _LARGE = 0, 1
_ADDR_BITS = 64
_ADDR_MASK = (1 << _ADDR_BITS) - 1
# Expandable segments reserve a large virtual range per pool; the two ranges must not overlap.
_POOL_BASE = (0, 1 << 56)


class AllocatorTraceError(HeptstudyError, ValueError):
    """A trace that no allocator could have produced (a free of an unknown block, ...)."""


def round_size(nbytes: int) -> int:
    """The size the allocator actually looks for (``round_size``)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)


def segment_size(size: int) -> int:
    """The native segment ``cudaMalloc``'d for a rounded request (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


class _Block:
    __slots__ = ("addr", "size", "prev", "next", "allocated")

    def __init__(self, addr: int, size: int, prev: _Block | None, nxt: _Block | None):
        self.addr = addr
        self.size = size
        self.prev = prev
        self.next = nxt
        self.allocated = False


@dataclass(frozen=True)
class AllocatorPeaks:
    """Bytes held now and the peaks since the last ``reset_peak``."""

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    segments: int

    @property
    def peak_allocated_mib(self) -> float:
        return self.peak_allocated / MIB

    @property
    def peak_reserved_mib(self) -> float:
        return self.peak_reserved / MIB


class CachingAllocator:
    """One device's caching allocator; block ids are unique while live."""

    def __init__(self, expandable_segments: bool = False):
        self.expandable_segments = bool(expandable_segments)
        # per pool: the free blocks' keys (size << 64 | addr), sorted, and the blocks by address
        self._free_keys: tuple[list[int], list[int]] = ([], [])
        self._free_at: tuple[dict[int, _Block], dict[int, _Block]] = ({}, {})
        self._live: dict[int, tuple[_Block, int]] = {}
        self._zero: set[int] = set()
        self._next_addr = 0
        # expandable mode: the block at the end of each pool's mapped range, and that end
        self._last: list[_Block | None] = [None, None]
        self._mapped_end = list(_POOL_BASE)
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments = 0

    def reset_peak(self) -> None:
        """``torch.cuda.reset_peak_memory_stats``: the peaks restart from the current bytes."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def peaks(self) -> AllocatorPeaks:
        return AllocatorPeaks(
            self.allocated, self.reserved, self.peak_allocated, self.peak_reserved, self.segments
        )

    def _insert_free(self, pool: int, b: _Block) -> None:
        b.allocated = False
        insort(self._free_keys[pool], (b.size << _ADDR_BITS) | b.addr)
        self._free_at[pool][b.addr] = b

    def _remove_free(self, pool: int, b: _Block) -> None:
        keys = self._free_keys[pool]
        i = bisect_left(keys, (b.size << _ADDR_BITS) | b.addr)
        del keys[i]
        del self._free_at[pool][b.addr]

    def _best_fit(self, pool: int, size: int) -> _Block | None:
        keys = self._free_keys[pool]
        i = bisect_left(keys, size << _ADDR_BITS)
        if i == len(keys):
            return None
        free_at = self._free_at[pool]
        if self.expandable_segments:
            # get_free_block: the block at the end of the mapped range "is" as large as it can
            # grow, so the next larger block is taken instead whenever there is one
            last = self._last[pool]
            while i + 1 < len(keys) and free_at[keys[i] & _ADDR_MASK] is last:
                i += 1
        b = free_at[keys[i] & _ADDR_MASK]
        self._remove_free(pool, b)
        return b

    def _new_segment(self, pool: int, size: int) -> _Block:
        seg = segment_size(size)
        b = _Block(self._next_addr, seg, None, None)
        self._next_addr += seg
        self.segments += 1
        self._grow_reserved(seg)
        return b

    def _expand(self, pool: int, size: int) -> _Block:
        """Map pages at the end of the pool's segment until a free block there holds ``size``."""
        page = SMALL_BUFFER if pool == _SMALL else LARGE_BUFFER
        last = self._last[pool]
        if last is None and self._mapped_end[pool] == _POOL_BASE[pool]:
            self.segments += 1
        if last is not None and not last.allocated:
            self._remove_free(pool, last)
            missing = size - last.size
            block = last
        else:
            missing = size
            block = _Block(self._mapped_end[pool], 0, last, None)
            if last is not None:
                last.next = block
        mapped = page * ((missing + page - 1) // page)
        block.size += mapped
        self._mapped_end[pool] += mapped
        self._last[pool] = block
        self._grow_reserved(mapped)
        return block

    def _grow_reserved(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def malloc(self, block_id: int, nbytes: int) -> None:
        if block_id in self._live or block_id in self._zero:
            raise AllocatorTraceError(
                f"malloc of block {block_id!r} ({nbytes} bytes), which is still allocated; a "
                "trace must free a block before it reuses its id"
            )
        if nbytes < 0:
            raise AllocatorTraceError(
                f"malloc of block {block_id!r} with {nbytes} bytes; sizes are >= 0"
            )
        if nbytes == 0:  # the allocator is never called for an empty storage
            self._zero.add(block_id)
            return
        size = round_size(nbytes)
        pool = _SMALL if size <= SMALL_SIZE else _LARGE
        b = self._best_fit(pool, size)
        if b is None:
            b = (
                self._expand(pool, size)
                if self.expandable_segments
                else self._new_segment(pool, size)
            )
        remaining = b.size - size
        # should_split: with expandable segments every pool splits down to 512 B
        if (
            remaining >= MIN_BLOCK
            if pool == _SMALL or self.expandable_segments
            else remaining > SMALL_SIZE
        ):
            rest = _Block(b.addr + size, remaining, b, b.next)
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = size
            if self._last[pool] is b:
                self._last[pool] = rest
            self._insert_free(pool, rest)
        b.allocated = True
        self._live[block_id] = (b, pool)
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, block_id: int) -> None:
        entry = self._live.pop(block_id, None)
        if entry is None:
            if block_id in self._zero:
                self._zero.discard(block_id)
                return
            raise AllocatorTraceError(
                f"free of block {block_id!r}, which is not allocated (never allocated, or "
                "freed twice); every free in a trace must follow the malloc of the same id"
            )
        b, pool = entry
        self.allocated -= b.size
        prev, nxt = b.prev, b.next
        if prev is not None and not prev.allocated:
            self._remove_free(pool, prev)
            prev.size += b.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            if self._last[pool] is b:
                self._last[pool] = prev
            b = prev
        if nxt is not None and not nxt.allocated:
            self._remove_free(pool, nxt)
            b.size += nxt.size
            b.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = b
            if self._last[pool] is nxt:
                self._last[pool] = b
        self._insert_free(pool, b)
