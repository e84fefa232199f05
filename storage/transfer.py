"""DeviceCopies: the tiers' copies between host memory and the KV pool's device.

On CUDA both directions run on a side stream of the calling thread, never on the engine's:
  snapshot   (engine thread) device blocks -> pinned host copies, started now; the engine's
             stream waits for them on the device (a block may be reused at once, no host sync),
             and the writer thread waits for them on the host before it encodes them
  to_device  (loader thread) host blocks -> the device, waited for on that thread only
On CPU a snapshot is a plain copy and to_device returns the blocks as they are
(copy_to_device clones them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

Ready = Callable[[], None]  # blocks the caller until the copies it stands for are complete


def ready_now() -> None:
    """A Ready for copies that are complete already."""
    return None


class DeviceCopies:
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._streams = threading.local()  # one side stream per thread

    def snapshot(self, kvs: list[torch.Tensor]) -> tuple[list[torch.Tensor], Ready]:
        """Host copies of `kvs` (views of the pool or fresh tensors), and how to wait for them."""
        if not self.cuda:
            return [torch.empty(kv.shape, dtype=kv.dtype).copy_(kv) for kv in kvs], ready_now
        current, side = torch.cuda.current_stream(self.device), self._side_stream()
        side.wait_stream(current)  # the blocks' contents are final on the engine's stream
        with torch.cuda.stream(side):
            host = []
            for kv in kvs:
                kv.record_stream(side)  # a fresh tensor (a quantized block) outlives its copy
                pinned = torch.empty(kv.shape, dtype=kv.dtype, pin_memory=True)
                host.append(pinned.copy_(kv, non_blocking=True))
        done = torch.cuda.Event()
        done.record(side)
        current.wait_event(done)  # whatever later reuses a block runs after its copy
        return host, done.synchronize

    def to_device(self, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
        """`blocks` on the device (on a CPU: themselves), complete when this returns."""
        return self.copy_to_device(blocks) if self.cuda else blocks

    def copy_to_device(self, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of `blocks` on the device, complete when this returns: they share no memory
        with `blocks` (pinned ones copy asynchronously up to the one wait at the end)."""
        if not self.cuda or not blocks:
            return [b.clone() for b in blocks]
        side = self._side_stream()
        # allocated on the default stream, the engine's: freed there after their install, they
        # are reused only after it (the side stream's own use is recorded)
        out = [torch.empty(b.shape, dtype=b.dtype, device=self.device) for b in blocks]
        with torch.cuda.stream(side):
            for dst, src in zip(out, blocks, strict=True):
                dst.record_stream(side)
                dst.copy_(src, non_blocking=True)
        side.synchronize()
        return out

    def _side_stream(self) -> torch.cuda.Stream:
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = torch.cuda.Stream(self.device)
        return stream
