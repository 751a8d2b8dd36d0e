"""Device tensors on their way to the host while the device may still compute them: on CUDA,
non-blocking copies into pinned memory and an event, so that reading them waits for those copies
only, not for the steps queued after them (a synchronous copy would wait for the whole stream)."""

from __future__ import annotations

import torch


class HostCopy:
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        """Queue the copies (a CPU has the tensors already)."""
        self._event: torch.cuda.Event | None = None
        if not tensors or tensors[0].device.type != "cuda":
            self._host = tensors
            return
        self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for host, device in zip(self._host, tensors, strict=True):
            host.copy_(device, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def wait(self) -> list[torch.Tensor]:
        """The tensors on the host, once copied."""
        if self._event is not None:
            self._event.synchronize()
        return self._host
