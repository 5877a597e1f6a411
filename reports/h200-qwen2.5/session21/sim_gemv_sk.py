"""A Python model of gemm_q4.cu gemv_q4_sk_impl's control flow (session 21, CPU): which codes, scale-word buffer and
group each k32 block of every warp uses, over several plans, and that every (tile, group) is flushed exactly once.
It checks the kernel's bookkeeping as written (qa / qb alternation, sw[i & 1] with the swap after an odd segment),
not the kernel itself: run the GPU tests for that.

    python3 reports/h200-qwen2.5/session21/sim_gemv_sk.py
"""


def sim(N, K, W, CPG=4, DEPTH=4):
    GPU_ = DEPTH // CPG
    UPT = (K // 32) // DEPTH; GPT = UPT * GPU_; U = (N // 32) * UPT
    emitted = {}
    for w in range(W):
        u_lo, u_hi = w * U // W, (w + 1) * U // W
        if u_hi <= u_lo: continue
        nb = u_lo // UPT; ut = u_lo - nb * UPT
        xr = ut * DEPTH  # x's k32 block (the kernel's xr, in k32 blocks from the token's row start)
        pt, pg = nb, ut * GPU_
        def nxt():
            nonlocal pt, pg
            pg += 1
            if pg == GPT: pg = 0; pt += 1
        g_end = (u_hi - u_lo) * GPU_
        sw = [None, None]
        sw[0] = (pt, pg); nxt()
        sw[1] = (pt, pg) if g_end > 1 else None; nxt()
        gleft = g_end - 2  # the kernel's groups not yet loaded into sw
        qa = ('code', u_lo); qb = None
        acc = []
        def unit(q, which, u, half):
            nonlocal gleft, qa, qb, xr
            assert q == ('code', u), (q, u)
            assert xr == (u % UPT) * DEPTH, (w, u, xr)  # x at the unit's place in its tile
            xr += DEPTH
            nq = ('code', u + 1) if u + 1 < u_hi else ('code', u_lo)
            if which == 'a': qb = nq
            else: qa = nq
            tile, kb0 = divmod(u, UPT)
            for d in range(DEPTH):
                if (d + 1) % CPG == 0:
                    b = (half * DEPTH + d) // CPG & 1
                    grp = (kb0 * DEPTH + d) // CPG
                    assert sw[b] == (tile, grp), (w, u, d, sw[b], (tile, grp))
                    acc.append((tile, grp))
                    more = gleft > 0
                    gleft -= 1
                    sw[b] = (pt, pg) if more else None
                    nxt()
        u = u_lo
        while True:
            seg_end = min(u_hi, (nb + 1) * UPT)
            odd = False
            while True:
                unit(qa, 'a', u, 0); u += 1
                if u == seg_end: odd = True; break
                unit(qb, 'b', u, 1); u += 1
                if u == seg_end: break
            emitted.setdefault(nb, []).append((w, tuple(acc))); acc = []
            if u >= u_hi: break
            nb += 1
            xr -= UPT * DEPTH  # (the kernel's xr -= K)
            if odd:
                qa = qb
                if GPU_ & 1: sw[0], sw[1] = sw[1], sw[0]
    # every group of every tile exactly once
    allg = sorted(g for v in emitted.values() for _, a in v for g in a)
    assert allg == sorted((t, g) for t in range(N // 32) for g in range(GPT)), "coverage"
    return True


for CPG in (4, 1):  # group 128 (AWQ) and 32 (GGUF Q4_0 / Q4_1)
    for N, K, W in [(4608, 3584, 2016), (128, 18944, 296), (1216, 1152, 132), (256, 512, 16), (4608, 3584, 132),
                    (4608, 3584, 4032), (96 * 32, 128 * 7, 17)]:
        print(f"G {32 * CPG}", N, K, W, sim(N, K, W, CPG=CPG))
