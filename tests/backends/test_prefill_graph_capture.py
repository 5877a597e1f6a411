"""The prefill graphs' capture check on the CPU (fakes for CuPy and the backend): its batch gets distinct blocks at
precapture (`capture_blocks`), and a failed programmatic-launch check there costs only that graph its programmatic
launch, where a decode graph's failure turns it off for the backend (a prefill capture can fail its check from the pad
block's racing K/V writes; that must not cost PDL for every later capture)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from llmrs.backends.cuda import graphs as CG
from llmrs.backends.cuda.graphs import PrefillGraphs, capture_blocks


def test_capture_blocks_are_distinct_when_the_pool_has_them():
    assert capture_blocks(256, 16, 1000) == list(range(16))
    assert capture_blocks(1024, 16, 64) == list(range(64)) and capture_blocks(1024, 16, 63) is None


class Stream(contextlib.nullcontext):
    ptr = 0

    def synchronize(self):
        pass


class Arr:
    def copy(self):
        return self


def fake_graphs(cls, monkeypatch):
    g = object.__new__(cls)
    cuda = SimpleNamespace(Device=lambda: SimpleNamespace(synchronize=lambda: None),
                           get_current_stream=lambda: SimpleNamespace(ptr=0))
    g.cp = SimpleNamespace(cuda=cuda)
    g.b = SimpleNamespace(_ws={}, tp=None, _handle=0, k=SimpleNamespace(pdl_capable=True),
                          cublas=SimpleNamespace(setStream=lambda h, s: None), _forward_device=lambda w, db: Arr())
    g.ws, g.graphs, g.failed, g.stream, g.captures, g.replays = {}, {}, set(), Stream(), 0, 0
    recorded = []

    def record(w, db, pdl):
        recorded.append(pdl)
        return Arr(), f"graph(pdl={pdl})"

    g._record = record
    g._replays_like = lambda graph, logits, ref: False  # the check fails
    monkeypatch.setattr(CG.RawCublas, "set_stream", classmethod(lambda cls, h, s: None))
    return g, recorded


@pytest.mark.parametrize("cls,global_off", [(CG.DecodeGraphs, True), (PrefillGraphs, False)])
def test_a_failed_check_turns_pdl_off_globally_only_for_decode_graphs(cls, global_off, monkeypatch, capsys):
    g, recorded = fake_graphs(cls, monkeypatch)
    out = g._capture_db("w", (64, 0), np.zeros(4, np.int32), None, SimpleNamespace(), 4, "a 64-token prefill")
    assert recorded == [True, False]  # captured with PDL, checked, captured again without
    assert out is not None and out.pdl is False and g.graphs[(64, 0)] is out
    assert g.b.k.pdl_capable is (not global_off)
    err = capsys.readouterr().err
    assert ("capturing without it" in err) if global_off else ("capturing that graph without it" in err)
