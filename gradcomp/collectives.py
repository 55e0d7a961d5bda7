"""Collectives over ``torch.distributed`` (gloo on CPU, NCCL on GPUs) for compressed payloads.

- ``allgather_payloads``: every rank's payload (a list of tensors with the same shapes on all ranks) packed into
  one byte buffer, so one all-gather moves values and indices together; raw bytes, never pickled.
- ``gtopk``: global top-k by log2(P) rounds of pairwise exchange (Shi et al.); world sizes that are not a power
  of two fold the extra ranks into the lower ones first and get the result back at the end.
- ``node_groups``: the two process groups hierarchical top-k needs (``communicators.hierarchical``).
- ``all_gather_flat`` / ``reduce_scatter_flat``: tensor-in, tensor-out collectives under either torch spelling.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradcomp import futures

# torch 2.13 renamed the tensor-in/tensor-out collectives; older releases only have the old names.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

__all__ = [
    "pack",
    "unpack",
    "allgather_payloads",
    "gtopk",
    "merge_topk",
    "node_groups",
    "all_gather_flat",
    "reduce_scatter_flat",
]


def pack(payload: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate the payload tensors' raw bytes into one flat uint8 tensor."""
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in payload])


def unpack(buf: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Split ``buf`` back into tensors with the dtypes and shapes of ``like``."""
    need = sum(t.numel() * t.element_size() for t in like)
    if need != buf.numel():
        raise ValueError(f"payload layout mismatch: {buf.numel()} bytes received, layout needs {need}")
    out, offset = [], 0
    for t in like:
        n = t.numel() * t.element_size()
        piece = buf[offset : offset + n]
        if piece.storage_offset() % t.element_size():
            # A view as a wider dtype needs an aligned start in the storage, not just in ``buf``: a peer's
            # payload is a slice of the all-gather output that starts wherever the previous one ended.
            piece = piece.clone()
        out.append(piece.view(t.dtype).reshape(t.shape))
        offset += n
    return out


def allgather_payloads(
    payload: list[torch.Tensor], group: dist.ProcessGroup | None = None, async_op: bool = False
) -> list[list[torch.Tensor]] | torch.futures.Future:
    """All ranks' payloads, in rank order (a Future of that list when ``async_op``)."""
    buf = pack(payload)
    world = dist.get_world_size(group)
    out = torch.empty(world * buf.numel(), dtype=torch.uint8, device=buf.device)
    n = buf.numel()

    def split(_: object = None) -> list[list[torch.Tensor]]:
        return [unpack(out[r * n : (r + 1) * n], payload) for r in range(world)]

    work = all_gather_flat(out, buf, group=group, async_op=async_op)
    if async_op:
        return futures.then(work.get_future(), split, keep=(buf, out))
    return split()


def merge_topk(
    idx_a: torch.Tensor, val_a: torch.Tensor, idx_b: torch.Tensor, val_b: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by magnitude of the sum of two sparse vectors; symmetric in (a, b), result sorted by index.

    Symmetry matters: both partners of a round compute it and must agree bit for bit.
    """
    idx = torch.cat([idx_a, idx_b])
    val = torch.cat([val_a, val_b])
    uniq, inverse = torch.unique(idx, return_inverse=True)
    summed = torch.zeros(uniq.numel(), dtype=val.dtype, device=val.device).index_add_(0, inverse, val)
    keep = torch.topk(summed.abs(), min(k, uniq.numel()), sorted=False).indices.sort().values
    return uniq[keep], summed[keep]


def _exchange(idx: torch.Tensor, val: torch.Tensor, peer: int, group: dist.ProcessGroup | None) -> tuple:
    buf = pack([idx, val])
    rbuf = torch.empty_like(buf)
    gpeer = peer if group is None else dist.get_global_rank(group, peer)
    req = dist.isend(buf, gpeer, group=group)
    dist.recv(rbuf, gpeer, group=group)
    req.wait()
    r_idx, r_val = unpack(rbuf, [idx, val])
    return r_idx, r_val


def gtopk(
    idx: torch.Tensor, val: torch.Tensor, k: int, group: dist.ProcessGroup | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global top-k of the sum over ranks of each rank's sparse ``(idx, val)`` (exactly k entries each).

    Returns the same ``(indices, summed values)`` on every rank, sorted by index. Cost: about
    ``alpha log P + 2 k beta log P`` instead of the all-gather's ``2 (P - 1) k beta``.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    idx = idx.long()
    if world == 1:
        return merge_topk(idx, val, idx[:0], val[:0], k)
    p2 = 1 << (world.bit_length() - 1)  # largest power of two <= world
    # The r >= p2 ranks hand their vector to r - p2, which merges it before the power-of-two rounds.
    if rank >= p2:
        gpeer = rank - p2 if group is None else dist.get_global_rank(group, rank - p2)
        dist.send(pack([idx, val]), gpeer, group=group)
        out = torch.empty_like(pack([idx, val]))
        dist.recv(out, gpeer, group=group)
        r_idx, r_val = unpack(out, [idx, val])
        return r_idx, r_val
    if rank + p2 < world:
        gpeer = rank + p2 if group is None else dist.get_global_rank(group, rank + p2)
        rbuf = torch.empty_like(pack([idx, val]))
        dist.recv(rbuf, gpeer, group=group)
        o_idx, o_val = unpack(rbuf, [idx, val])
        idx, val = merge_topk(idx, val, o_idx, o_val, k)
    step = 1
    while step < p2:
        o_idx, o_val = _exchange(idx, val, rank ^ step, group)
        idx, val = merge_topk(idx, val, o_idx, o_val, k)
        step <<= 1
    if rank + p2 < world:
        gpeer = rank + p2 if group is None else dist.get_global_rank(group, rank + p2)
        dist.send(pack([idx, val]), gpeer, group=group)
    return idx, val


def node_groups(local_size: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(ranks of my node, ranks with my local rank on the other nodes); every rank must call this together."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if local_size < 1 or world % local_size:
        raise ValueError(f"local_size={local_size} must divide the world size {world}")
    intra = inter = None
    for node in range(world // local_size):
        g = dist.new_group(list(range(node * local_size, (node + 1) * local_size)))
        if rank // local_size == node:
            intra = g
    for local in range(local_size):
        g = dist.new_group(list(range(local, world, local_size)))
        if rank % local_size == local:
            inter = g
    assert intra is not None and inter is not None
    return intra, inter
