"""MATLAB Level 5 MAT-files, read in plain Python: what the ILSVRC2012 devkit's data/meta.mat
holds (a struct array of numbers and strings), not every MATLAB type.

Why not scipy.io.loadmat: the preprocessing node's venv has no SciPy (trainer/requirements.txt),
and adding it for one 1,860-row table would add tens of MB to that node and to the training
image's lock, which installs the same file. The format, from MathWorks' "MAT-File Format"
(https://www.mathworks.com/help/pdf_doc/matlab/matfile_format.pdf): a 128-byte header (text,
subsystem offset, version 0x0100, endian indicator "IM" written by a little-endian machine,
"MI" by a big-endian one), then data elements. Each element has an 8-byte tag, type and byte
count as two uint32s, or a 4-byte "small data element" tag whose upper 16 bits are the count
when the data fits in 4 bytes; data is padded to 8 bytes. miCOMPRESSED (15) elements hold a
zlib stream of one element; miMATRIX (14) holds an array: array flags (the class in the low
byte), dimensions, name, then its class's data: a numeric real part, a char array's characters,
a struct's field name length and names followed by each element's fields in column order, a
cell's elements. scipy.io.savemat writes the files the tests read with this.
Tested by: .venv/bin/python -m pytest tests/trainer/test_devkit.py
"""

from __future__ import annotations

import struct
import zlib

MI_MATRIX, MI_COMPRESSED = 14, 15
MI_UTF8, MI_UTF16, MI_UTF32 = 16, 17, 18
# miINT8 .. miUINT64: struct codes of the numeric data types.
NUMERIC = {1: "b", 2: "B", 3: "h", 4: "H", 5: "i", 6: "I", 7: "f", 9: "d", 12: "q", 13: "Q"}
MX_CELL, MX_STRUCT, MX_CHAR = 1, 2, 4
MX_NUMERIC = range(6, 16)  # mxDOUBLE_CLASS .. mxUINT64_CLASS
HEADER_BYTES = 128


class MatError(ValueError):
    """Not a MAT-file this reader reads; the message says what was found."""


def read_mat(data: bytes) -> dict[str, object]:
    """Every variable of a Level 5 MAT-file by name: numeric arrays as flat lists (column-major),
    char arrays as a str (a list of rows when several), struct arrays as lists of dicts, cell
    arrays as lists."""
    if len(data) < HEADER_BYTES:
        raise MatError(f"{len(data)} bytes: shorter than a MAT-file header")
    if data[:19] == b"MATLAB 7.3 MAT-file":
        raise MatError("a MATLAB 7.3 MAT-file (HDF5), not the Level 5 format")
    endian = {b"IM": "<", b"MI": ">"}.get(data[126:128])
    if not data.startswith(b"MATLAB 5.0 MAT-file") or endian is None:
        raise MatError("no 'MATLAB 5.0 MAT-file' header: not a Level 5 MAT-file")
    reader = _Reader(endian)
    variables: dict[str, object] = {}
    position = HEADER_BYTES
    while position + 8 <= len(data):
        kind, body, position = reader.element(data, position, padded=False)
        if kind == MI_COMPRESSED:
            try:
                inner = zlib.decompress(body)
            except zlib.error as exc:
                raise MatError(f"a compressed element does not decompress: {exc}") from None
            kind, body, _ = reader.element(inner, 0)
        if kind == MI_MATRIX:
            name, value = reader.matrix(body)
            variables[name] = value
    return variables


class _Reader:
    def __init__(self, endian: str):
        self.endian = endian

    def element(self, data: bytes, position: int, padded: bool = True) -> tuple[int, bytes, int]:
        """(type, data, position after it) of the element at `position`; top-level elements
        are not padded (a compressed one's count is exact)."""
        if position + 8 > len(data):
            raise MatError(f"an element tag runs past the end at byte {position}")
        kind, count = struct.unpack_from(self.endian + "II", data, position)
        if kind >> 16:  # small data element: count in the upper half, data in the next 4 bytes
            kind, count = kind & 0xFFFF, kind >> 16
            return kind, data[position + 4 : position + 4 + count], position + 8
        start = position + 8
        if start + count > len(data):
            raise MatError(f"an element of {count} bytes runs past the end at byte {position}")
        end = start + count
        return kind, data[start:end], end + (-count % 8 if padded else 0)

    def numbers(self, kind: int, body: bytes) -> list:
        code = NUMERIC.get(kind)
        if code is None:
            raise MatError(f"data type {kind} where numbers were expected")
        return list(struct.unpack(f"{self.endian}{len(body) // struct.calcsize(code)}{code}", body))

    def matrix(self, body: bytes) -> tuple[str, object]:
        """(name, value) of a miMATRIX element's contents."""
        if not body:
            return "", []  # an empty array ([]) may be written as a tag alone
        _, flags, position = self.element(body, 0)
        (word,) = struct.unpack(self.endian + "I", flags[:4])
        mx_class = word & 0xFF
        _, dims_body, position = self.element(body, position)
        dims = self.numbers(5, dims_body)
        _, name, position = self.element(body, position)
        count = 1
        for size in dims:
            count *= size
        if count == 0 and mx_class in (*MX_NUMERIC, MX_CHAR):
            return name.decode(), "" if mx_class == MX_CHAR else []
        if mx_class in MX_NUMERIC:
            kind, real, _ = self.element(body, position)
            return name.decode(), self.numbers(kind, real)[:count]
        if mx_class == MX_CHAR:
            kind, chars, _ = self.element(body, position)
            return name.decode(), self.text(kind, chars, dims)
        if mx_class == MX_STRUCT:
            return name.decode(), self.struct_array(body, position, count)
        if mx_class == MX_CELL:
            cells = []
            for _ in range(count):
                kind, cell, position = self.element(body, position)
                if kind != MI_MATRIX:
                    raise MatError(f"a cell holds data type {kind}, not an array")
                cells.append(self.matrix(cell)[1])
            return name.decode(), cells
        raise MatError(f"array class {mx_class} (sparse, object, function?) is not read here")

    def text(self, kind: int, chars: bytes, dims: list[int]) -> str | list[str]:
        if kind == MI_UTF8 or kind in (1, 2):
            text = chars.decode("utf-8" if kind == MI_UTF8 else "latin-1")
        elif kind in (4, MI_UTF16):  # miUINT16: UTF-16 code units
            text = chars.decode("utf-16-le" if self.endian == "<" else "utf-16-be")
        elif kind == MI_UTF32:
            text = chars.decode("utf-32-le" if self.endian == "<" else "utf-32-be")
        else:
            raise MatError(f"a char array stored as data type {kind}")
        rows = dims[0] if dims else 1
        if rows <= 1:
            return text
        return [text[row::rows] for row in range(rows)]  # column-major

    def struct_array(self, body: bytes, position: int, count: int) -> list[dict]:
        _, width_body, position = self.element(body, position)
        (width,) = struct.unpack(self.endian + "i", width_body[:4])
        _, names_body, position = self.element(body, position)
        if width <= 0:
            raise MatError(f"a struct's field name length is {width}")
        names = [
            names_body[i : i + width].split(b"\0", 1)[0].decode()
            for i in range(0, len(names_body), width)
        ]
        elements = []
        for _ in range(count):
            element = {}
            for field in names:
                kind, value, position = self.element(body, position)
                if kind != MI_MATRIX:
                    raise MatError(f"field {field} of a struct is data type {kind}, not an array")
                element[field] = self.matrix(value)[1]
            elements.append(element)
        return elements
