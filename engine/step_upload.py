"""StepUpload: a step's host-built inputs (ids, positions, attention metadata, logit rows) to the
device in one copy, from pinned memory, that the host does not wait for.

Copied one by one from ordinary memory, each input would be a synchronous copy: the host would
wait at every one for the GPU to finish the work queued before it, so it could never run ahead
of the device. Packed, the step makes one asynchronous copy; the device buffer is reused by the
next step's copy only after this step's kernels (same stream), and each of the two pinned host
buffers is refilled only after its previous copy is done (an event, long complete by then: the
step between sampled tokens, which waits for the device).

On a CPU the tensors are used as they are; packed=True runs the packing there too (tests).
"""

from __future__ import annotations

import torch

ALIGN = 8  # bytes: every packed tensor starts at a multiple (int64 views need it)


class StepUpload:
    def __init__(self, device: torch.device, packed: bool | None = None) -> None:
        self.device = device
        self.packed = device.type == "cuda" if packed is None else packed
        self._pin = device.type == "cuda"
        self._host: list[torch.Tensor | None] = [None, None]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._device_buffer: torch.Tensor | None = None

    def __call__(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """CPU tensors -> the same on the device (views of one buffer when packed)."""
        if not self.packed:
            return [t.to(self.device) for t in tensors]
        sizes = [t.numel() * t.element_size() for t in tensors]
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += -(-size // ALIGN) * ALIGN
        host = self._host_buffer(total)
        for t, offset, size in zip(tensors, offsets, sizes, strict=True):
            if size:
                host[offset : offset + size].copy_(t.contiguous().view(-1).view(torch.uint8))
        device = self._device_buffer
        if device is None or device.numel() < total:
            device = self._device_buffer = torch.empty(
                _grown(total), dtype=torch.uint8, device=self.device
            )
        device[:total].copy_(host[:total], non_blocking=True)
        if self._pin:
            copied = self._copied[self._turn] = torch.cuda.Event()
            copied.record()
        self._turn ^= 1
        return [
            device[offset : offset + size].view(t.dtype).view(t.shape)
            for t, offset, size in zip(tensors, offsets, sizes, strict=True)
        ]

    def _host_buffer(self, total: int) -> torch.Tensor:
        """This turn's pinned buffer, once its previous copy is done, holding `total` bytes."""
        turn, copied = self._turn, self._copied[self._turn]
        if copied is not None and not copied.query():  # query: no wait when it is done
            copied.synchronize()
        host = self._host[turn]
        if host is None or host.numel() < total:
            host = torch.empty(_grown(total), dtype=torch.uint8, pin_memory=self._pin)
            self._host[turn] = host
        return host


def _grown(total: int) -> int:
    """Capacity for `total` bytes: the next power of two, at least 64 KiB (few regrowths)."""
    return max(1 << 16, 1 << (total - 1).bit_length())
