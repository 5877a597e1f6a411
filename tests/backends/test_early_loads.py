"""common.cuh's early-load rules, checked in the SASS ptxas makes for sm_90 (no GPU: NVRTC, ptxas, nvdisasm as
`llmrs ptx-check --sass` runs them). Left alone, ptxas moves every matvec / gemv kernel's "before pdl_wait" weight
loads below `griddepcontrol.wait` (SASS ACQBULK): nothing would stream while the previous kernel drains. So the wait
depends on a word of each early chunk (pdl_wait_on): those loads come first; and x, which the
previous kernel writes, is read through the coherent path (ldx4 / ldx2), which ptxas does not hoist above it.
`pre_wait_loads` (llmrs.ptx.sass) counts the loads a path from the entry reaches before a wait."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from llmrs.ptx.compile import compile_file
from llmrs.ptx.sass import Instr, _loads_before_wait, parse_nvdisasm, summarize
from llmrs.ptx.toolchain import find_nvdisasm, find_toolchain

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "llmrs" / "kernels_cu"
PROBES = ROOT / "probes"  # research copies of kernels with timing switches (not in the package)


def source(cu: str) -> Path:
    """a kernel file of the package, or a probe's ("probes/NAME.cu")."""
    return ROOT / cu if cu.startswith("probes/") else KERNELS / cu


@functools.lru_cache(maxsize=None)
def sass_lines(cu: str, defines: tuple[str, ...] = ()) -> dict:
    """kernel -> its SASS lines (sm_90; parse_nvdisasm's); skips where the CUDA compiler wheels are missing."""
    try:
        c = compile_file(source(cu), "sm_90", find_toolchain(), [], [f"-D{d}" for d in defines],
                         nvdisasm=find_nvdisasm())
    except Exception as e:
        pytest.skip(f"no sm_90 SASS here: {e}")
    return parse_nvdisasm(c.sass)


def sass_text(cu: str, name: str, defines: tuple[str, ...] = ()) -> list[str]:
    """one kernel's SASS instructions as text (sm_90), labels and blank lines left out."""
    return [i.text for i, _ in sass_lines(cu, defines)[name] if i is not None]


def opcode(t: str) -> str:
    """an instruction's opcode with its modifiers (after the predicate, if any)."""
    return t.split()[1] if t.startswith("@") else t.split()[0]


def sass_of(cu: str, defines: tuple[str, ...] = ()) -> dict:
    """kernel -> its SassSummary (sm_90)."""
    return {name: summarize(lines) for name, lines in sass_lines(cu, defines).items()}


@pytest.fixture(scope="module")
def matvec():
    return sass_of("matvec.cu")


# the early chunks: matvec 4 a lane, the row pairs 4 of each row, matvec_rows its whole row (R)
@pytest.mark.parametrize("kernel,early", [("matvec_bf16_t1", 4), ("matvec_bf16_t8", 4), ("matvec_silu_bf16_t1", 8),
                                          ("matvec_rope_bf16_t1", 8), ("matvec_silu_norm_bf16_t1", 8),
                                          ("matvec_rope_norm_bf16_t1", 8), ("matvec_rows_bf16_r16", 16),
                                          ("matvec_rows_bf16_r8", 8)])
def test_exactly_the_early_weight_chunks_go_out_before_the_wait(matvec, kernel, early):
    """Exactly: more would mean x (or another earlier kernel's output) read before the wait."""
    s = matvec[kernel]
    assert s.pdl_waits >= 1 and s.pre_wait_loads == early


def test_the_4bit_gemv_too():
    gemv = sass_of("gemv_q4.cu")
    # its first GV_DEPTH (4) code words; the t16 form also hoists its first groups' scale words (weights: 8)
    assert gemv["gemv_q4z_c4"].pre_wait_loads == 4 and gemv["gemv_q4m_c4"].pre_wait_loads == 4
    assert gemv["gemv_q4z_t16_c4"].pre_wait_loads == 12


def test_cluster_merges_push_without_a_gpu_fence():
    """gemv_q4's K slices launched as a cluster push their sums into block 0's shared memory with st.async (SASS
    STAS), completing on its mbarrier (SYNCS ... TRYWAIT): no cluster barrier arrived with .release, which ptxas
    emits as MEMBAR.ALL.GPU (~18 us a step of the 7B AWQ's). The forms with a cluster path (one n8 tile of tokens)
    have it; the two-tile t16 forms keep the L2 hand-off only. attn_o_cluster's splits push the same way (every
    block receiving), and attn_cluster's merge. The only GPU-scope fences left are the L2 hand-off's
    (block_counts_last): two fence.acq_rel (MEMBAR.ALL.GPU) by thread 0, not a __threadfence (MEMBAR.SC.GPU) in
    every thread."""
    def ops(name: str) -> list[str]:
        return sass_text("gemv_q4.cu", name)

    def membars(text: list[str]) -> list[str]:
        return [opcode(t) for t in text if "MEMBAR" in t and "GPU" in t]

    for name in ("gemv_q4z_c4", "gemv_q4m_c1", "gemv_q4z_c4_nout", "gemv_q4z_silu_c4", "gemv_q4m_silu_c4_nin",
                 "gemv_q4z_rope_c4", "gemv_q4z_rope_c4_nin"):
        text = ops(name)
        assert any(t.startswith("STAS") for t in text) and any("TRYWAIT" in t for t in text), name
        assert membars(text) == ["MEMBAR.ALL.GPU"] * 2, name  # the hand-off's (S slices without a cluster)
        assert sum("UCGABAR_ARV" in t for t in text) == 1 and sum("UCGABAR_WAIT" in t for t in text) == 1, name
    t16 = ops("gemv_q4z_t16_c4")
    assert not any(t.startswith("STAS") or "UCGABAR" in t for t in t16)
    assert membars(t16) == ["MEMBAR.ALL.GPU"] * 2
    att = {name: sass_text(cu, name) for cu in ("attention_cluster.cu", "attention_o.cu") for name in sass_lines(cu)}
    for name in ("attn_o_cluster8_w8", "attn_o_cluster8", "attn_o_cluster4"):
        assert any(t.startswith("STAS") for t in att[name]) and any("TRYWAIT" in t for t in att[name]), name
        assert membars(att[name]) == ["MEMBAR.ALL.GPU"] * 2, name  # the cross-head sum's hand-off
    clusters = [n for n in att if n.startswith("attn_cluster")]
    assert len(clusters) == 13
    for name in clusters:
        text = att[name]
        assert any(t.startswith("STAS") for t in text) and any("TRYWAIT" in t for t in text), name
        assert membars(text) == [], name
        assert sum("UCGABAR_ARV" in t for t in text) == 1 and sum("UCGABAR_WAIT" in t for t in text) == 1, name
    sample = sass_text("sampling.cu", "sample_tokens")
    assert membars(sample) == ["MEMBAR.ALL.GPU"] * 2


def ins(addr: int, text: str) -> Instr:
    toks = text.split()
    return Instr(addr, toks[1] if toks[0].startswith("@") else toks[0], text)


def test_loads_before_wait_follows_branches_and_their_predicates():
    """A synthetic listing of the predicated-wait idiom: the loads before it count, the ones after either wait do
    not, and the path that would skip both complementary waits is not taken; an early EXIT ends a path."""
    code = [ins(0x00, "LDG.E.NA.128 R4, desc[UR4][R2.64]"),
            ins(0x10, "ISETP.NE.U32.AND P6, PT, R4, 0x7fc00001, PT"),
            ins(0x20, "@P6 BRA `(.L_a)"),
            ins(0x30, "ACQBULK"),
            ins(0x40, "@!P6 BRA `(.L_b)"),  # .L_a
            ins(0x50, "ACQBULK"),
            ins(0x60, "LDG.E.128 R8, desc[UR4][R6.64]"),  # .L_b: x, after a wait on every path
            ins(0x70, "EXIT")]
    labels = {".L_a": 0x40, ".L_b": 0x60}
    assert _loads_before_wait(code, labels) == 1
    # without the predicate bookkeeping both waits could be skipped: a rewrite of the predicate in between breaks it
    code[3] = ins(0x30, "ISETP.NE.AND P6, PT, R9, RZ, PT")
    assert _loads_before_wait(code, labels) == 2


def test_decode_attention_reads_q_after_the_wait():
    """q is written by the kernel before the attention (qkv + rope). As a `const __restrict__` load ptxas had
    hoisted it above the wait in attn_partial / attn_cluster (their loads before the wait grew with the dims a lane
    holds: d1 4, d2 6, d4 12, d8 22: a race under programmatic launch); through ldx* only the index loads
    (positions, token_seq, the block table: 4) and the first keys' K / V rows an earlier step wrote (attn_first_keys:
    attn_partial's first key, 2 loads; attn_cluster's first batch of 8 keys, 16) stay there, the same count at
    every d."""
    att = {**sass_of("attention.cu"), **sass_of("attention_cluster.cu")}
    for fam, early in (("attn_partial_d{}", 2), ("attn_cluster16_d{}", 16)):
        ds = (1, 2, 4, 8) if "partial" in fam else (2, 4)
        counts = {d: att[fam.format(d)].pre_wait_loads for d in ds}
        assert set(counts.values()) == {4 + early}, (fam, counts)
    gqa = sass_of("attention_gqa.cu")
    assert len({gqa[f"attn_partial_gqa_d{d}"].pre_wait_loads for d in (1, 2, 4, 8)}) == 1


def expected_pre_wait_loads(name: str) -> int:
    """What may run before each PDL kernel's wait on sm_90: weights and the step's index arrays, nothing an earlier
    kernel of the step writes. The decode attention: its index loads (positions, token_seq, the block table) and
    its first keys' K / V rows (earlier steps'); the 4-bit GEMV: its first code batch (+ the first groups' scale
    words where ptxas hoists them); the matvecs: their early weight chunks (common.cuh ldg_early); the RMSNorms:
    their weight (2 float4s a thread) and rms_norm's row index; every other kernel: none."""
    # (decode_attn_tc: positions, and at head dim 64 token_seq; ptxas sinks the rest of the positions -> token_seq ->
    # block table chain past the wait)
    # (attn_cluster: 4 index loads + a K and a V row of each of its CK first keys: 8, or 4 in the 16-warp forms;
    # attn_o_cluster: those of the 16-warp forms + its 8 (CL 8) or 16 (CL 4, and the 8-warp CL 8) chunks of o
    # weights a lane)
    rules = [(r"attn_o_cluster8_w8", 28), (r"attn_o_cluster8", 20), (r"attn_o_cluster4", 28),
             (r"attn_cluster\d+_d\d_g4_w16", 12), (r"attn_cluster\d+_d\d", 20), (r"attn_partial_d\d", 6),
             (r"attn_partial_gqa_d\d", 3), (r"decode_attn_tc(_bf16)?_d64", 2), (r"decode_attn_tc", 1),
             (r"rms_norm(_bf16)?$", 3), (r"add_rms_norm(_bf16)?$", 2),
             (r"gemv_q4[zm](_t16|_silu|_rope)?_c1(_nout|_nin)?$|gemv_q4[zm](_t16|_silu)_c4(_nin)?$", 12),
             (r"gemv_q4", 4),
             (r"matvec_bf16_t\d", 4),
             (r"matvec_(rope|silu)(_norm)?_bf16_t\d", 8)]
    m = re.fullmatch(r"matvec_rows_bf16_r(\d+)", name)
    if m:
        return int(m.group(1))
    return next((n for pat, n in rules if re.match(pat, name)), 0)


def test_every_pdl_kernel_loads_before_its_wait_only_what_it_may():
    """A guard over every kernel launched with programmatic dependent launch (cuda.kernels.PDL_KERNELS): a new
    ptxas that hoists an activation load above the wait, or sinks the early weight loads, changes a count here."""
    from llmrs.backends.cuda.kernels import ENTRY_POINTS, PDL_KERNELS

    seen = 0
    for cu in ENTRY_POINTS:
        for name, s in sass_of(cu).items():
            if name not in PDL_KERNELS or s.pdl_waits == 0:  # (sm_90a-only kernels are empty bodies for sm_90)
                continue
            seen += 1
            assert s.pre_wait_loads == expected_pre_wait_loads(name), (cu, name, s.pre_wait_loads)
    assert seen >= 80


def test_the_attention_clock_probe_keeps_the_kernels_loads_before_the_wait():
    """probes/attn_clocks.cu (the decode attention with clock64 phases) compiles attn_cluster and attn_o_cluster with
    the same loads before the wait as the shipped kernels, so its phases time the same prologue."""
    base = {**sass_of("attention_cluster.cu"), **sass_of("attention_o.cu")}
    probe = sass_of("probes/attn_clocks.cu")
    for name in ("attn_cluster8_d4", "attn_cluster16_d2", "attn_cluster8_d4_g4_w16", "attn_o_cluster8_w8",
                 "attn_o_cluster4"):
        assert probe[name].pre_wait_loads == base[name].pre_wait_loads, name
        assert probe[name].instructions > base[name].instructions, name  # the clocks and their atomics


def test_attn_o_red_probe_adds_into_x_with_atomics():
    """probes/attn_clocks.cu's -DLLMRS_ATTN_O_RED (a timing probe): attn_o_cluster's blocks add
    their rows into x with fire-and-forget float atomics (RED, no returned value) and skip block_counts_last (no
    ATOMG on the count, no fence); the default build has no float atomics there and the count's atomic."""
    def ops(defines: tuple[str, ...]) -> list[str]:
        return sass_text("probes/attn_clocks.cu", "attn_o_cluster8_w8", defines)

    base, red = ops(()), ops(("LLMRS_ATTN_O_RED",))
    assert not any(opcode(t).startswith("RED") for t in base)
    assert any(opcode(t).startswith("ATOMG") for t in base) and any(opcode(t).startswith("MEMBAR") for t in base)
    assert any(opcode(t).startswith("RED") and "F32" in opcode(t) for t in red)
    assert not any(opcode(t).startswith("ATOMG") for t in red) and not any(opcode(t).startswith("MEMBAR") for t in red)


def test_gemv_ablation_switches_do_what_they_say():
    """probes/gemv_q4_ablate.cu's timing switches (-DGV_ABLATE_MATH / -DGV_ABLATE_LOADS / -DGV_ABLATE_X ...): the math ablation's gemv keeps its 128-bit code loads and has no HMMA (nor x's 64-bit loads); the
    loads ablation keeps every HMMA but loads only its first batch of codes (GV_DEPTH 128-bit loads, before the wait);
    the x ablation keeps the codes' loads and every HMMA but loads no x; the ones ablation drops a third of the HMMA,
    the decode ablation most of the LOP3; GV_ABLATE_PAD
    holds the plain form at 4 blocks an SM on sm_90 (5 do not fit in 228 KB). The default build is neither, and is
    the shipped gemv_q4.cu's kernel."""
    def ops(defines: tuple[str, ...]) -> list[str]:
        return sass_text("probes/gemv_q4_ablate.cu", "gemv_q4z_c4", defines)

    base = ops(())
    assert len(base) == len(sass_text("gemv_q4.cu", "gemv_q4z_c4"))
    code_loads = [t for t in base if opcode(t).startswith("LDG.E.NA.128")]
    assert any("HMMA" in t for t in base) and len(code_loads) >= 8
    math = ops(("GV_ABLATE_MATH",))
    assert not any("HMMA" in t for t in math) and not any(opcode(t).startswith("LDG.E.64") for t in math)
    assert len([t for t in math if opcode(t).startswith("LDG.E.NA.128")]) >= 8
    loads = ops(("GV_ABLATE_LOADS",))
    assert sum("HMMA" in t for t in loads) == sum("HMMA" in t for t in base)
    assert len([t for t in loads if opcode(t).startswith("LDG.E.NA.128")]) == 4  # the first batch (ldg_early)
    # GV_ABLATE_X: no x loads (x's 64-bit loads), the codes and every HMMA kept; with GV_ABLATE_LOADS neither stream
    assert any(opcode(t).startswith("LDG.E.64") for t in base)
    nox = ops(("GV_ABLATE_X",))
    assert not any(opcode(t).startswith("LDG.E.64") for t in nox)
    assert sum("HMMA" in t for t in nox) == sum("HMMA" in t for t in base)
    assert len([t for t in nox if opcode(t).startswith("LDG.E.NA.128")]) == len(code_loads)
    bare = ops(("GV_ABLATE_X", "GV_ABLATE_LOADS"))
    assert sum("HMMA" in t for t in bare) == sum("HMMA" in t for t in base)
    assert not any(opcode(t).startswith("LDG.E.64") for t in bare)
    assert len([t for t in bare if opcode(t).startswith("LDG.E.NA.128")]) == 4
    # GV_ABLATE_ONES: the main loop's 4 code HMMA a k32 block, without the 2 ones HMMA; GV_ABLATE_DECODE: every HMMA,
    # without the decode's lop3 (bf16x2_code: 4 a word)
    hmma = sum("HMMA" in t for t in base)
    ones = sum("HMMA" in t for t in ops(("GV_ABLATE_ONES",)))
    assert abs(ones - 2 * hmma / 3) <= hmma / 12, (ones, hmma)
    raw = ops(("GV_ABLATE_DECODE",))
    assert sum("HMMA" in t for t in raw) == hmma
    assert sum(opcode(t).startswith("LOP3") for t in raw) < sum(opcode(t).startswith("LOP3") for t in base) / 2
    # GV_FP16 (a form with fp16 operands, not a probe): fp16 HMMA, as many, with fewer shifts (1 a code word, not 3)
    f16 = ops(("GV_FP16",))
    assert sum("HMMA" in t for t in f16) == hmma
    assert all("BF16" in opcode(t) for t in base if "HMMA" in t)
    assert not any("BF16" in opcode(t) for t in f16 if "HMMA" in t)
    shf = [sum(opcode(t).startswith("SHF") for t in v) for v in (base, f16)]
    assert shf[1] < shf[0], shf
    c = compile_file(PROBES / "gemv_q4_ablate.cu", "sm_90", find_toolchain(), [],
                     ["-DGV_ABLATE_MATH", "-DGV_ABLATE_PAD=39000"])
    smem = c.ptxas["gemv_q4z_c4"].shared_bytes + 1024  # + the 1 KB an SM reserves a block
    assert c.ptxas["gemv_q4z_c4"].registers <= 80 and 4 * smem <= 228 * 1024 < 5 * smem
    assert c.ptxas["gemv_q4z_silu_c4"].shared_bytes < 20000  # the paired forms are not padded
