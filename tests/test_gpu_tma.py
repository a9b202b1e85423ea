"""The warpgroup tile GEMM's TMA tensor maps (gpu/tma.py): what the driver is asked to encode, the
operand checks at the boundary, and the order the kernel reads the maps in (params.cuh TMAP_*).
Whether the maps are right is the GPU tests' business: the bf16 kernel reads every operand
through them (the tf32x3 kernel too, float32), so their check cases fail against the golden if a
map is wrong."""

import re

import numpy as np
import pytest

from gpu import errors, layout, tma


class FakeTensor:
    """What operand_specs reads of a torch tensor: shape, element count, element size and address."""

    def __init__(self, shape, address, elem_bytes=2):
        self.shape, self._address, self._elem_bytes = shape, address, elem_bytes

    def element_size(self):
        return self._elem_bytes

    def numel(self):
        return int(np.prod(self.shape))

    def data_ptr(self):
        return self._address


def test_spec_is_k_innermost_with_a_row_stride_of_k_bf16s():
    s = tma.spec("w1", 0x7F00_0000_0000, rows=64 * 2048, k=2048, box_rows=128)
    assert s.dims == (2048, 64 * 2048) and s.row_stride_bytes == 4096 and s.box == (64, 128)


def test_a_float32_spec_slices_32_deep_with_a_row_stride_of_k_floats():
    s = tma.spec("w1", 0x7F00_0000_0000, rows=64 * 2048, k=2048, box_rows=128, elem_bytes=4)
    assert s.dims == (2048, 64 * 2048) and s.row_stride_bytes == 8192 and s.box == (32, 128)
    assert tma.DATA_TYPES[s.elem_bytes] != tma.DATA_TYPES[2]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(address=0x1008, rows=64, k=128, box_rows=64), "address 0x1008 .* 16-byte"),
    (dict(address=0x1000, rows=64, k=96, box_rows=64), "K = 96 .* multiple of 64"),
    (dict(address=0x1000, rows=64, k=128, box_rows=512), "box of 512 rows .* 1 to 256"),
    (dict(address=0x1000, rows=0, k=128, box_rows=64), "0 rows"),
    (dict(address=0x1000, rows=64, k=48, box_rows=64, elem_bytes=4), "K = 48 .* multiple of 32"),
    (dict(address=0x1000, rows=64, k=128, box_rows=64, elem_bytes=8), "8-byte elements .* 2 \\(bf16\\) or 4"),
])
def test_bad_operands_are_named(kwargs, needle):
    with pytest.raises(tma.TensorMapError, match=f"inbox: {needle}"):
        tma.spec("inbox", **kwargs)


def test_operand_specs_read_a_by_64_rows_and_weights_by_the_column_block():
    L, C, H, I = 4, 384, 2048, 1024  # noqa: E741
    t = dict(inbox=FakeTensor((L * C, H), 0x10000), hidden=FakeTensor((L * C, I), 0x20000),
             w1=FakeTensor((L, I, H), 0x30000), w2=FakeTensor((L, H, I), 0x40000), x=FakeTensor((C, H), 0x50000))
    inbox, hidden, w1, w2, x = tma.operand_specs(t, tile_n=256)
    assert inbox.dims == (H, L * C) and inbox.box == (64, tma.A_BOX_ROWS)
    assert hidden.dims == (I, L * C) and hidden.row_stride_bytes == 2 * I
    assert w1.dims == (H, L * I) and w1.box == (64, 256) and w1.address == 0x30000
    assert w2.dims == (I, L * H) and w2.box == (64, 256)
    assert x.dims == (H, C) and x.box == (64, tma.A_BOX_ROWS)


def test_maps_are_read_in_the_order_they_are_written():
    text = (layout.KERNEL_DIR / "params.cuh").read_text()
    index = {m[1].lower(): int(m[2]) for m in re.finditer(r"TMAP_(\w+) = (\d+)", text)}
    assert [index[name] for name in tma.OPERANDS] == list(range(len(tma.OPERANDS)))
    assert index["bytes"] == tma.MAP_BYTES


def test_a_slice_that_never_lands_is_a_timeout_naming_it():
    words = np.array([1, 0, 17, 0, 10, 256, 4096, 5, 0, 1, 5_000_000_000], np.int64)
    with pytest.raises(errors.KernelTimeout, match=r"rank 0 block 17 .* slice 5 \(TMA: A rows from 256, weight rows "
                                                   r"from 4096\)"):
        errors.raise_if_error(words)
