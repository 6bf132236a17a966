"""Counting a zip's members from its central directory (frontends/zip_directory.py), before any zip
reader builds an object per entry."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest

from trainmem.errors import ModelRefError
from trainmem.frontends.zip_directory import count_members


def _archive(members: int, comment: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for index in range(members):
            archive.writestr(f"archive/data/{index}", b"\0" * index)
        archive.comment = comment
    return buffer.getvalue()


def _as_zip64(data: bytes) -> bytes:
    """The same archive with its directory's size and place moved to a zip64 end record, as a writer
    does past 4 GiB (the 32-bit fields read 0xFFFFFFFF)."""
    at = data.rfind(b"PK\x05\x06")
    entries, size, offset = struct.unpack_from("<HII", data, at + 10)
    record = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, size, offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, at, 1)
    end = bytearray(data[at:])
    struct.pack_into("<II", end, 12, 0xFFFFFFFF, 0xFFFFFFFF)
    return data[:at] + record + locator + bytes(end)


@pytest.mark.parametrize("shape", ["plain", "with-comment", "zip64"])
def test_members_are_counted_as_zipfile_lists_them(tmp_path, shape):
    data = {"plain": _archive(7), "with-comment": _archive(7, b"c" * 1000), "zip64": _as_zip64(_archive(7))}[shape]
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    assert count_members(path, 100) == len(zipfile.ZipFile(path).infolist()) == 7


def test_more_members_than_the_bound_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "many.pt"
    path.write_bytes(_archive(11))
    with pytest.raises(ModelRefError, match=r"at most 10 members") as refused:
        count_members(path, 10)
    assert "many.pt" in str(refused.value)


def test_a_file_without_an_end_record_is_left_to_the_zip_reader(tmp_path):
    path = tmp_path / "cut.pt"
    path.write_bytes(_archive(3)[:-30])
    assert count_members(path, 100) == -1


def test_a_checkpoint_with_more_members_than_the_bound_is_refused_before_torch_reads_it(tmp_path, monkeypatch):
    import torch

    from trainmem import estimate
    from trainmem.frontends import checkpoint

    path = tmp_path / "model.pt"
    torch.save({f"layer{index}.weight": torch.zeros(2) for index in range(20)}, path)
    monkeypatch.setattr(checkpoint, "MAX_ZIP_MEMBERS", 10)
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: pytest.fail("torch.load called"))
    with pytest.raises(ModelRefError, match=r"model\.pt: expected a checkpoint archive of at most 10 members"):
        estimate(str(path))
