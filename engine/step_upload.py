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


def wait_for(event: torch.cuda.Event | None) -> None:
    """Blocks until `event` has happened; no synchronizing call when it has (query first)."""
    if event is not None and not event.query():
        event.synchronize()


class HostTurns:
    """Two host buffers (pinned on CUDA) taken in turn for copies to the device: each is given
    out again only once the copies queued from it last time are done."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """This turn's buffer, free to fill, of at least `nbytes` bytes (uint8)."""
        wait_for(self._copied[self._turn])
        buffer = self._buffers[self._turn]
        if buffer is None or buffer.numel() < nbytes:
            buffer = torch.empty(_grown(nbytes), dtype=torch.uint8, pin_memory=self.pin)
            self._buffers[self._turn] = buffer
        return buffer

    def copied(self) -> None:
        """The copies from this turn's buffer are queued: the next take gets the other."""
        if self.pin:
            event = self._copied[self._turn] = torch.cuda.Event()
            event.record()
        self._turn ^= 1


class StepUpload:
    def __init__(self, device: torch.device, packed: bool | None = None) -> None:
        self.device = device
        self.packed = device.type == "cuda" if packed is None else packed
        self._host = HostTurns(pin=device.type == "cuda")
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
        host = self._host.take(total)
        for t, offset, size in zip(tensors, offsets, sizes, strict=True):
            if size:
                host[offset : offset + size].copy_(t.contiguous().view(-1).view(torch.uint8))
        device = self._device_buffer
        if device is None or device.numel() < total:
            device = self._device_buffer = torch.empty(
                _grown(total), dtype=torch.uint8, device=self.device
            )
        device[:total].copy_(host[:total], non_blocking=True)
        self._host.copied()
        return [
            device[offset : offset + size].view(t.dtype).view(t.shape)
            for t, offset, size in zip(tensors, offsets, sizes, strict=True)
        ]


def _grown(total: int) -> int:
    """Capacity for `total` bytes: the next power of two, at least 64 KiB (few regrowths)."""
    return max(1 << 16, 1 << (total - 1).bit_length())
