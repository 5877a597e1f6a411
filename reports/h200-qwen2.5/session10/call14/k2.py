import sys; sys.path.insert(0, ".")
import cupy as cp, numpy as np
from llmrs.engine.backends.cuda import CUDABackend
from llmrs.engine.backends.cuda_q4gemm import gemv_q4
from llmrs.engine.config import ModelConfig
from tests.test_quant_marlin import make_weight
c = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32)
be = CUDABackend(c, num_blocks=2, cuda_graphs=False)
rng = np.random.default_rng(0)
# launch order per shape: gemv_q4 (backend's splits) then matvec_q4 (row form); shapes gate_up, down, qkv, o
for name, (N, K) in {"gate_up": (37888, 3584), "down": (3584, 18944), "qkv": (4608, 3584), "o": (3584, 3584)}.items():
    w = make_weight("awq", N, K, 128, rng)
    be.q4_gemv = False
    dw = be.upload_quantized(w)
    x = cp.asarray(rng.standard_normal((1, K)).astype(np.float32)); out = cp.empty((1, N), dtype=cp.float32)
    for _ in range(2):
        gemv_q4(be, x, dw.marlin, None, out)
        be._linear_quant(x, dw, None, out, False, name)
    cp.cuda.Device().synchronize()
    del dw
print("done")
