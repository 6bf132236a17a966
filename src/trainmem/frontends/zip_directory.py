"""How many members a zip archive holds, counted from its central directory before any zip reader
parses it.

Python's zipfile builds an object for every entry of the central directory (about 20 µs and 600 bytes
each here), and torch's miniz reads them all again: a 30 MB checkpoint listing 300,000 empty members
took 32 s and 175 MB before torch.load said it held no tensors. The end-of-central-directory record
(the last 22 bytes, before an optional comment) gives where the directory lies and how large it is;
walking its entries needs only each entry's three length fields (APPNOTE.TXT 4.3.12 and 4.3.16; zip64
archives keep the directory's place in a zip64 record, 4.3.14-4.3.15). No torch here.
"""

from __future__ import annotations

import struct
from pathlib import Path

from trainmem.errors import ModelRefError, short

_END_OF_DIRECTORY = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_END_OF_DIRECTORY = b"PK\x06\x06"
_DIRECTORY_ENTRY = b"PK\x01\x02"
_ENTRY_FIXED_BYTES = 46
# the end record is 22 bytes followed by a comment of at most 65,535
_TAIL_BYTES = 22 + 65_535
# A central directory is read whole to be walked. An entry is 46 bytes plus its name (torch names them
# ARCHIVE/data/KEY, ARCHIVE being the file's stem: under 300 bytes); 64 MiB is over 200,000 such
# entries, more than any checkpoint the member bound below lets through.
MAX_DIRECTORY_BYTES = 64 << 20


def count_members(path: Path, max_members: int) -> int:
    """The number of entries of the zip at `path`'s central directory, refusing (one line naming the
    file) a directory larger than MAX_DIRECTORY_BYTES or one listing more than `max_members` entries.
    Returns -1 where no end record is found (not a zip, or cut short): zipfile then says what is wrong."""
    where = short(str(path))
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        handle.seek(max(0, size - _TAIL_BYTES))
        tail = handle.read()
        at = tail.rfind(_END_OF_DIRECTORY)
        if at < 0 or len(tail) - at < 22:
            return -1
        directory_bytes, directory_offset = struct.unpack_from("<II", tail, at + 12)
        locator = at - 20
        if (0xFFFFFFFF in (directory_bytes, directory_offset) and locator >= 0
                and tail[locator:locator + 4] == _ZIP64_LOCATOR):
            (record_offset,) = struct.unpack_from("<Q", tail, locator + 8)
            handle.seek(record_offset)
            record = handle.read(56)
            if len(record) < 56 or not record.startswith(_ZIP64_END_OF_DIRECTORY):
                return -1
            directory_bytes, directory_offset = struct.unpack_from("<QQ", record, 40)
        if directory_bytes > MAX_DIRECTORY_BYTES:
            raise ModelRefError(f"expected a checkpoint archive whose directory lists at most {max_members:,} members "
                                f"({MAX_DIRECTORY_BYTES // 2**20} MiB), got a directory of {directory_bytes:,} bytes",
                                where=where)
        handle.seek(directory_offset)
        directory = handle.read(directory_bytes)
    members, offset = 0, 0
    while offset + _ENTRY_FIXED_BYTES <= len(directory) and directory.startswith(_DIRECTORY_ENTRY, offset):
        name, extra, comment = struct.unpack_from("<HHH", directory, offset + 28)
        offset += _ENTRY_FIXED_BYTES + name + extra + comment
        members += 1
        if members > max_members:
            raise ModelRefError(f"expected a checkpoint archive of at most {max_members:,} members (one per tensor "
                                "storage, a few records and TorchScript's code), got more", where=where)
    return members
