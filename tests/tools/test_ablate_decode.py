"""probes/ablate_decode.py's patching (no GPU): each part left out launches nothing, everything else goes through
the backend's own methods unchanged, and the methods it patches still exist on CUDABackend with the parameters its
replacements take (a renamed method would otherwise leave the step whole and the table silently wrong)."""

import inspect

import pytest

from probes import ablate_decode


class Backend:
    """Records the calls of the methods ablate_decode patches."""

    def __init__(self):
        self.calls = []

    def _norm_for(self, lin, x, w, eps, y=None):
        self.calls.append(("norm", lin))
        return "normed"

    def _attention(self, layer, q, q_stride, db, out, out_bf16=None):
        self.calls.append(("attention", layer))
        return "att"

    def _linear(self, x, w, bias, out, accumulate=False, name="linear", out_bf16=False, preload=False):
        self.calls.append(("linear", name))

    def _matvec_pair(self, epi, x, w, out, bias=None, db=None, layer=0, norm=None):
        self.calls.append(("pair", epi))

    def _rms_norm(self, x, w, eps, out, rows=None, n_rows=None):
        self.calls.append(("rms_norm", rows is not None))


def step(b):
    """One layer's calls in the order the real step makes them, then the final norm and lm_head."""
    h = b._norm_for("qkv", "x", "g", 1e-6)
    b._matvec_pair("rope", h, "W", "qkv")
    b._attention(0, "qkv", 3, "db", "att")
    b._linear("att", "W", None, "x", True, "o")
    b._rms_norm("x", "g", 1e-6, "h")  # a norm of its own inside a layer (f32 path)
    b._matvec_pair("silu", "h", "W", "act")
    b._linear("act", "W", None, "x", True, "down")
    b._rms_norm("x", "g", 1e-6, "hs", rows="rows")
    b._linear("hs", "W", None, "logits", False, "lm_head")
    return h


def test_nothing_left_out_runs_every_launch():
    b = Backend()
    ablate_decode.ablate(b, set())
    assert step(b) == "normed" and len(b.calls) == 9


@pytest.mark.parametrize("parts,gone", [
    ({"norm"}, {("norm", "qkv")}),
    ({"attn"}, {("attention", 0)}),
    ({"o"}, {("linear", "o")}),
    ({"qkv"}, {("pair", "rope")}),
    ({"mlp"}, {("pair", "silu"), ("linear", "down")}),
    ({"head"}, {("rms_norm", True), ("linear", "lm_head")}),
    ({"norm", "attn", "o", "qkv", "head"}, {("norm", "qkv"), ("attention", 0), ("linear", "o"), ("pair", "rope"),
                                            ("rms_norm", True), ("linear", "lm_head")}),
])


def test_each_part_left_out_launches_nothing_and_the_rest_runs(parts, gone):
    full = Backend()
    ablate_decode.ablate(full, set())
    step(full)
    b = Backend()
    ablate_decode.ablate(b, parts)
    h = step(b)
    assert set(full.calls) - set(b.calls) == gone
    assert [c for c in full.calls if c not in gone] == b.calls
    assert h == ("x" if "norm" in parts else "normed")  # a norm left out passes its input through
    ablate_decode.restore(b)  # the class's methods again: every launch
    b.calls.clear()
    step(b)
    assert b.calls == full.calls


def test_the_patched_methods_exist_on_the_cuda_backend_with_these_parameters():
    from llmrs.backends.cuda import CUDABackend

    assert ablate_decode.PATCHED == ("_norm_for", "_attention", "_linear", "_matvec_pair", "_rms_norm")
    for name in ablate_decode.PATCHED:
        real = list(inspect.signature(getattr(CUDABackend, name)).parameters)
        assert real == list(inspect.signature(getattr(Backend, name)).parameters), name
    assert set(ablate_decode.PARTS) == {"norm", "attn", "o", "qkv", "mlp", "head"}


def test_recording_kernels_name_each_launch_and_keep_their_attributes():
    """The kernel wrapper behind each variant's "kernels: +[...] -[...]" line (a set: switch that took effect shows
    there): a launch adds the name, and the kernel's own attributes (num_regs: the stream-K plans read it) pass
    through."""
    class Kernel:
        num_regs = 64

        def __call__(self, grid, block, args, shared_mem=0):
            return ("launched", grid, shared_mem)

    names: set[str] = set()
    k = ablate_decode.recording(Kernel(), "matvec_bf16_sk", names)
    assert k.num_regs == 64 and not names
    assert k((4,), (128,), (), shared_mem=16) == ("launched", (4,), 16)
    assert names == {"matvec_bf16_sk"}
