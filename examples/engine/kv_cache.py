"""Paged KV cache and its block allocator.

Each layer has a key and a value cache of shape ``[num_blocks, block_size, kv_heads,
head_dim]``. Token ``pos`` of a request lives in slot ``block_table[r, pos // block_size] *
block_size + pos % block_size`` (the slot formula of docs/design.md). The last block is
never handed out: writes to ``PAD_SLOT = -1`` (padding tokens of a static batch) are
redirected there, so the forward pass needs no data-dependent branch.
"""

from __future__ import annotations

import torch


class OutOfBlocksError(RuntimeError):
    """The allocator has fewer free blocks than a request needs."""


class BlockAllocator:
    """A free list of block ids ``[0, num_blocks)``; allocation and freeing are O(blocks)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        # Pop from the end, so low ids go out first (easier to read in a debugger).
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocksError(f"need {n} KV blocks, {len(self._free)} free")
        if n <= 0:
            return []
        out = self._free[-n:][::-1]
        del self._free[-n:]
        return out

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class PagedKVCache:
    """Per-layer K/V block pools plus the allocator for the usable blocks.

    ``num_blocks`` usable blocks are allocated, plus one padding block (id
    ``num_blocks``) that absorbs writes to ``PAD_SLOT``. The pools start zeroed, so a
    gathered but masked-out position is finite (``0 * NaN`` would poison the output).
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pad_block = num_blocks
        self.pad_slot = num_blocks * block_size
        shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.allocator = BlockAllocator(num_blocks)

    @staticmethod
    def blocks_needed(num_positions: int, block_size: int) -> int:
        return -(-num_positions // block_size)
