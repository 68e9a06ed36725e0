"""SpilledTensors (ES's θ0 on a CPU): what goes into the file comes back, whole or a chunk at a time, and a
rewrite replaces one tensor alone."""
import pytest
import torch

from minies.runtime.spilled import SpilledTensors


def test_tensors_come_back_whole_and_in_chunks():
    torch.manual_seed(0)
    tensors = [torch.randn(5, 3), torch.randn(0), torch.randn(7).to(torch.bfloat16), torch.randn(2, 2, 2)]
    spilled = SpilledTensors(tensors)
    assert len(spilled) == 4
    for i, t in enumerate(tensors):
        assert spilled.tensor(i).dtype == torch.float32 and torch.equal(spilled.tensor(i), t.float())
        chunks = [c.clone() for c in spilled.chunks(i, 4)]  # a shorter last chunk; none for the empty tensor
        assert [len(c) for c in chunks] == [4] * (t.numel() // 4) + ([t.numel() % 4] if t.numel() % 4 else [])
        assert torch.equal(torch.cat(chunks) if chunks else torch.empty(0), t.float().reshape(-1))
    assert all(torch.equal(a, b.float()) for a, b in zip(spilled, tensors))  # iterating: each one whole
    spilled.write(0, torch.ones(5, 3))
    assert torch.equal(spilled.tensor(0), torch.ones(5, 3)) and torch.equal(spilled.tensor(3), tensors[3])
    with pytest.raises(ValueError, match=r"shape \(5, 3\), not \(3, 5\)"):
        spilled.write(0, torch.ones(3, 5))


def test_the_process_keeps_none_of_it(tmp_path, monkeypatch):
    """The file has no name: the temporary directory stays empty while it holds the tensors."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    spilled = SpilledTensors([torch.ones(1000)])
    assert list(tmp_path.iterdir()) == [] and spilled.tensor(0).sum() == 1000


def test_no_room_for_the_file_is_one_line(monkeypatch):
    """A full temporary directory (or a file-size limit) ends in a UserError naming the directory and what to do."""
    import tempfile

    from minies import UserError

    class Full:
        def write(self, data):
            raise OSError(28, "No space left on device")

        def seek(self, offset):
            pass

        def flush(self):
            pass

    monkeypatch.setattr(tempfile, "TemporaryFile", Full)
    with pytest.raises(UserError, match=r"θ0 \(4 MB\) in a temporary file in .*No space left on device.*TMPDIR"):
        SpilledTensors([torch.ones(1_000_000)])
