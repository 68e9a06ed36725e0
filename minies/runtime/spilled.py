"""Where ES keeps θ0: in a file instead of the process's memory on a CPU, in pinned memory for CUDA.

ES keeps θ0, the weights it started from, for one number a step (the drift ‖θ − θ0‖ in its log) and for its
checkpoints. Held in memory that is 4 bytes per perturbed weight, as much as a float32 model itself: on a CPU,
most of what lowrank ES adds to plain generation (SmolLM2-135M: 515 MiB, where plain generation of 64 rows
peaks at ~1,200 MiB; docs/speed.md). Here the tensors go into a temporary file that has no name (the system's
temporary directory, TMPDIR; nothing is left behind, even after kill -9) and come back a chunk at a time, read
into one reused buffer: the operating system's page cache holds them while memory is free, and gives the
memory back when a program needs it. With the masters on CUDA, θ0 stays in pinned host memory instead, from
which its chunks stream to the device (TensorsInMemory: the same methods, so ES and the drift never ask which).
"""
import tempfile

import torch

from minies import UserError


class SpilledTensors:
    """float32 CPU tensors in an unnamed temporary file: written whole (`write`), read back a chunk at a time
    (`chunks`) or whole (`tensor`, or by iterating: for a checkpoint)."""

    def __init__(self, tensors):
        self.shapes = [t.shape for t in tensors]
        self.offsets = [0]
        for t in tensors:
            self.offsets.append(self.offsets[-1] + 4 * t.numel())
        try:
            self.file = tempfile.TemporaryFile()
        except OSError as e:
            raise self.no_room(e) from None
        for i, t in enumerate(tensors):
            self.write(i, t)

    def no_room(self, error):
        """A full or read-only temporary directory, a file-size limit: one line saying what to do."""
        return UserError(f"cannot keep ES's starting weights θ0 ({self.offsets[-1] / 1e6:.0f} MB) in a temporary file "
                         f"in {tempfile.gettempdir()} ({error.strerror}); free space there, or set TMPDIR to a "
                         "directory with room")

    def __len__(self):
        return len(self.shapes)

    def __iter__(self):
        """Each tensor, whole, in memory (copies: writing into one changes nothing here)."""
        return (self.tensor(i) for i in range(len(self)))

    def write(self, i, tensor):
        """Tensor i's values, from `tensor` (of its shape, any dtype and device)."""
        if tensor.shape != self.shapes[i]:
            raise ValueError(f"tensor {i} has shape {tuple(self.shapes[i])}, not {tuple(tensor.shape)}")
        try:
            self.file.seek(self.offsets[i])
            for chunk in tensor.detach().reshape(-1).split(2**20):  # converted 4 MB at a time, not the whole tensor
                self.file.write(chunk.to("cpu", torch.float32).contiguous().numpy().data)
            self.file.flush()
        except OSError as e:
            raise self.no_room(e) from None

    def chunks(self, i, size):
        """Tensor i flattened, as float32 chunks of `size` elements (the last one shorter), each read into the
        same buffer: use a chunk before asking for the next."""
        buffer = torch.empty(size, dtype=torch.float32)
        self.file.seek(self.offsets[i])
        numel = self.shapes[i].numel()
        for start in range(0, numel, size):
            yield self._read_into(buffer[:min(size, numel - start)])

    def tensor(self, i):
        """Tensor i, whole, in memory."""
        self.file.seek(self.offsets[i])
        return self._read_into(torch.empty(self.shapes[i], dtype=torch.float32))

    def _read_into(self, out):
        """`out` (contiguous float32) filled from the file's position on."""
        view = memoryview(out.reshape(-1).numpy()).cast("B")
        if self.file.readinto(view) != len(view):
            raise OSError("the temporary file of ES's θ0 was cut short")
        return out


class TensorsInMemory(list):
    """A list of tensors with SpilledTensors' `write` and `chunks`: θ0 in pinned host memory when the masters
    are on CUDA, or any weights whose drift is measured (minies/analysis.py)."""

    def write(self, i, tensor):
        self[i].copy_(tensor)

    def chunks(self, i, size):
        return self[i].reshape(-1).split(size)
