"""The dense writer streams safetensors itself (row blocks written in place, no concatenated
copy): its files must have safetensors' layout and read back exactly through safetensors, which
the trainer and verify-dumps use."""

from __future__ import annotations

import io
import json

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load

from remote_agent.eagle3.dense import write_safetensors

DTYPES = [torch.bfloat16, torch.float32, torch.int32, torch.float8_e4m3fn]


@st.composite
def shard_tensors(draw):
    names = draw(
        st.lists(
            st.sampled_from(["input_ids", "aux", "final", "aux_fp8", "aux_scale"]),
            min_size=1,
            max_size=5,
            unique=True,
        )
    )
    rows = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4))
    tensors = {}
    for name in names:
        dtype = draw(st.sampled_from(DTYPES))
        width = draw(st.one_of(st.none(), st.integers(1, 9)))
        blocks = []
        for n in rows:
            shape = (n,) if width is None else (n, width)
            blocks.append((torch.randn(shape) * 50).to(dtype))
        tensors[name] = blocks
    meta = {"format": "eagle3-dense", "samples": draw(st.text(max_size=40))}
    return tensors, meta


@settings(max_examples=150, deadline=None)
@given(case=shard_tensors())
def test_streamed_file_reads_back_through_safetensors(case, tmp_path_factory):
    blocks, meta = case
    path = tmp_path_factory.mktemp("st") / "shard.safetensors"
    with open(path, "wb") as f:
        n = write_safetensors(f, blocks, meta)
    data = path.read_bytes()
    whole = {name: torch.cat(parts) for name, parts in blocks.items()}
    assert n == len(data)
    # the layout safetensors itself writes: 8-aligned header, data without gaps, each tensor
    # aligned to its element size (so an mmapped shard yields aligned views)
    head = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + head])
    assert head % 8 == 0 and header.pop("__metadata__") == meta
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(data) - 8 - head
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    for name, t in whole.items():
        assert header[name]["data_offsets"][0] % t.element_size() == 0
    # and safetensors (the Rust validator, then the mmap reader the trainer uses) reads it
    assert load(data).keys() == whole.keys()
    with safe_open(str(path), framework="pt") as h:
        assert h.metadata() == meta
        for name, t in whole.items():
            got = h.get_tensor(name)
            assert got.dtype == t.dtype and got.shape == t.shape
            assert torch.equal(got.view(torch.uint8), t.view(torch.uint8))


def test_blocks_of_different_widths_are_refused():
    bad = {
        "aux": [torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(2, 4, dtype=torch.bfloat16)]
    }
    try:
        write_safetensors(io.BytesIO(), bad, {})
    except ValueError as exc:
        assert "aux" in str(exc)
    else:
        raise AssertionError("mixed widths were written")
