"""The Triton GEMM template with fused epilogues (backends/stax/triton/matmul.py).

Without a GPU the kernels run in Triton's interpreter on CPU tensors (test/conftest.py sets
TRITON_INTERPRET=1 before triton is imported), at small sizes; values are checked against float64
references with a tolerance from the error model of a float32 dot (``K * u32 * (|A| @ |B|)``) plus
the rounding of each narrow dtype the value passes through.  ``-m gpu`` runs the 4096^3 bfloat16
case on CUDA against torch and records its time next to torch.matmul + bias + GELU.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from tensorplay.compiler.backends.stax.triton import matmul as mm

pytestmark = pytest.mark.usefixtures("stax_cache")

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
U32 = 2.0 ** -24
EPS = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float64: 2.0 ** -53}
SMALL = mm._cfg(16, 32, 16, 2, 4, 2)        # blocks that leave M, N and K tails at the sizes below


def _rand(*shape, dtype=torch.float32, seed=0, device=DEV):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def _check(got, ref, a, b, *, out_dtype=None, roundings=(), lipschitz=2.0, tf32=False):
    """|got - ref| <= lipschitz * (4 K u (|A| @ |B|)) + 2 (sum of the unit roundings of the narrow
    dtypes passed through) |ref| + a tiny floor: the float32 dot's error bound (u: float32's, or
    TF32's 2^-11), carried through the epilogue by its Lipschitz constant, and the roundings."""
    K = a.shape[-1]
    u = 2.0 ** -11 if tf32 else U32
    absprod = a.abs().double() @ b.abs().double()
    out_dtype = out_dtype or got.dtype
    rel = sum(EPS[d] for d in (out_dtype, *roundings))
    tol = lipschitz * 4 * K * u * absprod + 2 * rel * ref.abs() + 1e-6
    err = (got.double() - ref).abs()
    worst = float((err - tol).max())
    assert worst <= 0, f"max error {float(err.max()):.3g} exceeds the tolerance by {worst:.3g}"


def _ref(a, b, steps=(), *ops):
    return mm.apply_epilogue(a.double() @ b.double(), steps, *[o.double() for o in ops], dtype=torch.float64)


# ------------------------------------------------------------------------------------------------
# the GEMM
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_fp32_tails_and_strides(layout):
    M, N, K = 45, 70, 37                          # not multiples of 16 / 32 / 16
    if layout == "contiguous":
        a, b = _rand(M, K), _rand(K, N, seed=1)
    elif layout == "transposed":
        a, b = _rand(K, M).t(), _rand(N, K, seed=1).t()
    else:
        a, b = _rand(M, 2 * K)[:, ::2], _rand(K, 3 * N, seed=1)[:, 1::3]
    got = mm.MatmulKernel(torch.float32, torch.float32)(a, b, config=SMALL)
    assert got.shape == (M, N) and got.dtype == torch.float32
    _check(got, _ref(a, b), a, b)


def test_default_config_and_even_k():
    a, b = _rand(64, 96), _rand(96, 80, seed=1)       # BLOCK_K divides K: the unmasked loop
    k = mm.MatmulKernel(torch.float32, torch.float32)
    _check(k(a, b), _ref(a, b), a, b)
    _check(k(a, b, config=mm._cfg(32, 16, 32, 1, 2, 3)), _ref(a, b), a, b)


def test_grouped_ordering_changes_no_bit():
    a, b = _rand(96, 40), _rand(40, 96, seed=1)      # 6 x 6 tiles of 16: groups of 4 leave a partial group
    k = mm.MatmulKernel(torch.float32, torch.float32)
    base = k(a, b, config=mm._cfg(16, 16, 16, 1, 1, 1))
    assert torch.equal(k(a, b, config=mm._cfg(16, 16, 16, 1, 1, 1)), base) and len(k._variants) == 1
    for g in (2, 4, 8):
        assert torch.equal(k(a, b, config=mm._cfg(16, 16, 16, g, 1, 1)), base)


def test_grouped_order_is_a_bijection_and_prop_9_4():
    for gm, gn, g in [(6, 6, 4), (7, 3, 2), (1, 5, 8), (16, 16, 8)]:
        order = mm.grouped_order(gm, gn, g)
        assert sorted(order) == [(i, j) for i in range(gm) for j in range(gn)]
    # exercise 35 (1): 16 x 16 tiles, 24 programs at once
    assert mm.panels_in_flight(mm.grouped_order(16, 16, 1), 24) == 18
    assert mm.panels_in_flight(mm.grouped_order(16, 16, 4), 24) == 10
    assert mm.panels_in_flight(mm.grouped_order(16, 16, 8), 24) == 11


def test_fp16_inputs():
    a, b = _rand(40, 50, dtype=torch.float16), _rand(50, 33, dtype=torch.float16, seed=1)
    got = mm.MatmulKernel(torch.float16, torch.float16)(a, b, config=SMALL)
    assert got.dtype == torch.float16
    _check(got, _ref(a, b), a, b)


def test_bf16_inputs_and_fp32_output():
    a, b = _rand(40, 50, dtype=torch.bfloat16), _rand(50, 33, dtype=torch.bfloat16, seed=1)
    k = mm.MatmulKernel(torch.bfloat16, torch.bfloat16, torch.float32)
    got = k(a, b, config=SMALL)
    assert got.dtype == torch.float32
    _check(got, _ref(a, b), a, b)
    _check(mm.MatmulKernel(torch.bfloat16, torch.bfloat16)(a, b), _ref(a, b), a, b)


def _interpreter_bf16_dot_works() -> bool:
    import triton
    import triton.language as tl

    @triton.jit
    def probe(a, b, c):
        r = tl.arange(0, 16)
        x = tl.load(a + r[:, None] * 16 + r[None, :])
        y = tl.load(b + r[:, None] * 16 + r[None, :])
        tl.store(c + r[:, None] * 16 + r[None, :], tl.dot(x, y))
    a, b = torch.eye(16, dtype=torch.bfloat16), torch.ones(16, 16, dtype=torch.bfloat16)
    c = torch.empty(16, 16)
    probe[(1,)](a, b, c)
    return bool(torch.equal(c, torch.ones(16, 16)))


@pytest.mark.skipif(CUDA, reason="the interpreter's bf16 dot (CPU only)")
def test_interpreter_bf16_dot_is_upcast():
    """The template feeds bfloat16 tiles to tl.dot on a GPU; in the interpreter it upcasts them to
    float32 first (exact products), because triton's interpreter computes a bfloat16 dot wrongly."""
    src = mm.MatmulKernel(torch.bfloat16, torch.bfloat16).source(interpret=True)
    assert "a = a.to(tl.float32)" in src and "b = b.to(tl.float32)" in src
    assert "a = a.to(" not in mm.MatmulKernel(torch.bfloat16, torch.bfloat16).source()
    if not _interpreter_bf16_dot_works():
        pytest.skip("triton's interpreter cannot do bfloat16 dots (wrong values in triton 3.6): the native bf16 "
                    "tl.dot is tested by -m gpu only")


def test_mixed_dtypes_meet_in_fp32():
    a, b = _rand(33, 40, dtype=torch.float16), _rand(40, 20, seed=1)
    got = mm.MatmulKernel(torch.float16, torch.float32)(a, b, config=SMALL)
    assert got.dtype == torch.float32
    _check(got, _ref(a, b), a, b)


def test_batched_and_broadcast_batch():
    a, b = _rand(3, 20, 37), _rand(3, 37, 24, seed=1)
    k = mm.MatmulKernel(torch.float32, torch.float32, None, [mm.residual("r")])
    r = _rand(24, seed=2)                     # broadcast over the batch and the rows
    got = k(a, b, r, config=SMALL)
    assert got.shape == (3, 20, 24)
    _check(got, torch.matmul(a.double(), b.double()) + r.double(), a, b)
    b2 = b[0]                                 # one B for the whole batch (stride 0)
    got = k(a, b2, r, config=SMALL)
    _check(got, torch.matmul(a.double(), b2.double()) + r.double(), a, b2)


def test_out_argument_and_empty_and_k0():
    a, b = _rand(20, 30), _rand(30, 40, seed=1)
    out = torch.empty(40, 20).t()                       # a column-major output
    k = mm.MatmulKernel(torch.float32, torch.float32)
    assert k(a, b, out=out, config=SMALL) is out
    _check(out, _ref(a, b), a, b)
    assert k(_rand(0, 30), b).shape == (0, 40)
    kb = mm.MatmulKernel(torch.float32, torch.float32, None, [mm.bias("v"), mm.activation("sigmoid")])
    v = _rand(40, seed=2)
    got = kb(_rand(20, 0), _rand(0, 40), v)             # K = 0: the epilogue of zeros
    torch.testing.assert_close(got, torch.sigmoid(v).expand(20, 40))


def test_residual_in_place():
    a, b = _rand(20, 30), _rand(30, 40, seed=1)
    r = _rand(20, 40, seed=2)
    want = _ref(a, b, [mm.residual("r")], r)
    k = mm.MatmulKernel(torch.float32, torch.float32, None, [mm.residual("r")])
    assert k(a, b, r, out=r, config=SMALL) is r
    _check(r, want, a, b)


def test_tensorplay_tensors_in_and_out():
    import tensorplay as tp
    a, b = _rand(20, 30), _rand(30, 40, seed=1)
    got = mm.MatmulKernel(torch.float32, torch.float32)(tp.from_torch(a), tp.from_torch(b), config=SMALL)
    assert isinstance(got, tp.Tensor)
    _check(got._data, _ref(a, b), a, b)


# ------------------------------------------------------------------------------------------------
# epilogues and prologues
# ------------------------------------------------------------------------------------------------

EPILOGUES = {
    "bias N": ([mm.bias("v", axis=1)], lambda M, N: [_rand(N, seed=5)], 1.0, ()),
    "bias M": ([mm.bias("v", axis=0)], lambda M, N: [_rand(M, seed=5)], 1.0, ()),
    "bias strided": ([mm.bias("v")], lambda M, N: [_rand(3 * N, seed=5)[::3]], 1.0, ()),
    "residual": ([mm.residual("r")], lambda M, N: [_rand(M, N, seed=5)], 1.0, ()),
    "residual transposed": ([mm.residual("r")], lambda M, N: [_rand(N, M, seed=5).t()], 1.0, ()),
    "residual fp16": ([mm.residual("r")], lambda M, N: [_rand(M, N, seed=5, dtype=torch.float16)], 1.0, ()),
    "scale": ([mm.scale(-0.75)], lambda M, N: [], 1.0, ()),
    "cast fp16": ([mm.cast(torch.float16)], lambda M, N: [], 1.0, ()),
    "cast bf16": ([mm.cast(torch.bfloat16)], lambda M, N: [], 1.0, ()),
    **{f"act {f}": ([mm.activation(f)], lambda M, N: [], 1.2, ()) for f in mm.ACTIVATIONS},
}


@pytest.mark.parametrize("case", list(EPILOGUES))
def test_each_epilogue_alone(case):
    steps, make, lip, _ = EPILOGUES[case]
    M, N, K = 35, 50, 40
    a, b = _rand(M, K), _rand(K, N, seed=1)
    ops = make(M, N)
    k = mm.MatmulKernel(torch.float32, torch.float32, None, steps)
    got = k(a, b, *ops, config=SMALL)
    want_dtype = steps[-1].dtype if steps[-1].kind == "cast" else torch.float32
    assert got.dtype == want_dtype
    _check(got, _ref(a, b, steps, *ops), a, b, lipschitz=lip)
    if steps[0].kind == "activation":
        assert mm.ACTIVATIONS[steps[0].fn] in k.source(SMALL)


def test_epilogue_chain_to_fp16():
    steps = [mm.bias("bias0"), mm.activation("gelu"), mm.residual("res0"), mm.scale(0.5), mm.cast(torch.float16)]
    assert [e.operand for e in mm.epilogue_operands(steps)] == ["bias0", "res0"]
    M, N, K = 45, 70, 37
    a, b = _rand(K, M).t(), _rand(K, N, seed=1)
    bias, res = _rand(N, seed=2), _rand(M, N, seed=3, dtype=torch.bfloat16)
    k = mm.MatmulKernel(torch.float32, torch.float32, None, steps)
    got = k(a, b, bias, res, config=SMALL)
    assert got.dtype == torch.float16
    _check(got, _ref(a, b, steps, bias, res), a, b, lipschitz=0.5 * 1.2)
    src = k.source(SMALL, K=K)
    assert src.index("bias0 + rn") < src.index("tl.erf") < src.index("res0 + rm") < src.index("acc * 0.5")


def test_a_cast_mid_chain_rounds_like_eager():
    steps = [mm.cast(torch.bfloat16), mm.activation("relu"), mm.scale(3.0)]
    a, b = _rand(33, 20), _rand(20, 17, seed=1)
    got = mm.MatmulKernel(torch.float32, torch.float32, None, steps)(a, b, config=SMALL)
    assert got.dtype == torch.float32
    _check(got, _ref(a, b, steps), a, b, lipschitz=3.0, roundings=(torch.bfloat16,) * 3)


def test_epilogue_kernel_is_the_extern_path():
    steps = [mm.bias("v", axis=0), mm.activation("silu"), mm.residual("r"), mm.cast(torch.float16)]
    c, v, r = _rand(37, 70), _rand(37, seed=1), _rand(70, 37, seed=2).t()
    got = mm.EpilogueKernel(steps)(c, v, r)
    assert got.dtype == torch.float16
    want = mm.apply_epilogue(c.double(), steps, v.double(), r.double(), dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=1e-5)
    cb, rb = _rand(2, 20, 33), _rand(2, 20, 33, seed=3)                   # batched, in place
    want = cb.double() * 2 + rb.double()
    e = mm.EpilogueKernel([mm.scale(2.0), mm.residual("r")])
    assert e(cb, rb, out=cb) is cb
    torch.testing.assert_close(cb.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("prologue,ref", [
    ("a * 0.5", lambda a: a * 0.5),
    ("a + 1.0", lambda a: a + 1.0),                               # f(0) != 0: the K tail is zeroed again
    ("tl.maximum(a, 0.0) * tl.sigmoid(a)", lambda a: a.clamp_min(0) * torch.sigmoid(a)),
])
def test_prologue(prologue, ref):
    a, b = _rand(45, 37), _rand(37, 30, seed=1)
    k = mm.MatmulKernel(torch.float32, torch.float32, None, [mm.bias("v")], prologue=prologue)
    v = _rand(30, seed=2)
    got = k(a, b, v, config=SMALL)
    pa = ref(a.double())
    _check(got, _ref(pa, b, [mm.bias("v")], v), pa, b, lipschitz=1.0)


def test_prologue_cast_feeds_an_fp16_dot():
    a, b = _rand(40, 48), _rand(48, 24, dtype=torch.float16, seed=1)
    p = mm.Prologue("a.to(tl.float16)", dtype=torch.float16)
    k = mm.MatmulKernel(torch.float32, torch.float16, torch.float32, [], prologue=p)
    src = k.source(SMALL)
    assert "b = b.to(" not in src                                  # both fp16 at the dot
    got = k(a, b, config=SMALL)
    ah = a.half()
    _check(got, _ref(ah, b), ah, b)


@pytest.mark.parametrize("bad", ["tl.load(a)", "tl.sum(a, 0)", "a + x", "a[0]", "tl.program_id(0) + a", "a +"])
def test_illegal_prologues_are_refused(bad):
    with pytest.raises(ValueError):
        mm.Prologue(bad)


def test_bad_descriptions_and_arguments():
    with pytest.raises(ValueError):
        mm.Epilogue("softmax")
    with pytest.raises(ValueError):
        mm.activation("swish")
    with pytest.raises(ValueError):
        mm.bias("M")                                              # a parameter of the template
    with pytest.raises(ValueError):
        mm.bias("v", axis=2)
    with pytest.raises(ValueError):
        mm.epilogue_operands([mm.bias("x"), mm.residual("x")])
    k = mm.MatmulKernel(torch.float32, torch.float32, None, [mm.bias("v")])
    a, b = _rand(20, 30), _rand(30, 40, seed=1)
    with pytest.raises(ValueError, match="1 epilogue operands"):
        k(a, b)
    with pytest.raises(ValueError, match="needs 40 values"):
        k(a, b, _rand(20))
    with pytest.raises(ValueError, match="float32 @ torch.float32"):
        k(a.half(), b, _rand(40))
    with pytest.raises(ValueError, match="do not agree"):
        k(a, b.t(), _rand(40))
    with pytest.raises(ValueError, match="power of two"):
        k(a, b, _rand(40), config=mm._cfg(24, 32, 16, 1, 4, 2))


def test_source_shape():
    k = mm.MatmulKernel(torch.float32, torch.float32, None, [mm.bias("bias0"), mm.activation("gelu")])
    src = k.source(SMALL)
    assert not src.startswith("# stax-launch:") and "@triton.jit" in src
    assert 'input_precision="ieee"' in src and "GROUP_M: tl.constexpr" in src and ", K, stride_am" in src
    assert "bias0_stride" in src and "stride_am" in src and "stride_bn" in src
    tf = mm.MatmulKernel(torch.float32, torch.float32, None, [], tf32=True).source(SMALL)
    assert 'input_precision="tf32"' in tf
    half = mm.MatmulKernel(torch.bfloat16, torch.bfloat16, None, [], tf32=True).source(SMALL)
    assert 'input_precision="ieee"' in half                      # TF32 is about float32 inputs only
    src, name, constexprs = mm.matmul_template(SMALL, epilogue=[mm.residual("r")], batched=True, wide=True,
                                               even_k=True)
    assert name in src and list(constexprs) == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K"]
    assert constexprs["EVEN_K"] is True and "r_stride_z" in src and "rm = rm.to(tl.int64)" in src
    assert "pid_z" in src


def test_tf32_flag_runs_in_the_interpreter():
    a, b = _rand(30, 40), _rand(40, 20, seed=1)
    got = mm.MatmulKernel(torch.float32, torch.float32, None, [], tf32=True)(a, b, config=SMALL)
    _check(got, _ref(a, b), a, b, tf32=True)
    assert mm.tf32_enabled() == torch.backends.cuda.matmul.allow_tf32


# ------------------------------------------------------------------------------------------------
# configs and the choice rule
# ------------------------------------------------------------------------------------------------

def _pow2(v):
    return v >= 16 and v & (v - 1) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mnk", [(4096, 4096, 4096), (8192, 8192, 1024), (2048, 2048, 2048), (512, 512, 512),
                                 (16, 4096, 4096), (4096, 24, 4096), (33, 70, 5), (1, 1, 1)])
def test_configs_are_powers_of_two_within_smem(dtype, mnk):
    M, N, K = mnk
    item = torch.empty((), dtype=dtype).element_size()
    cands = mm.candidate_configs(M, N, K, dtype)
    assert cands[0] == mm.default_config(M, N, K, dtype) and 1 <= len(cands) <= 12
    for c in cands:
        mm.check_config(c)
        assert all(_pow2(c[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        assert c["num_warps"] & (c["num_warps"] - 1) == 0 and c["num_stages"] >= 1
        assert mm.smem_bytes(c, item) <= mm.SMEM_BYTES
        assert c["BLOCK_M"] <= max(16, 1 << (M - 1).bit_length())
    assert len({tuple(sorted(c.items())) for c in cands}) == len(cands)


def test_default_config_table():
    assert mm.default_config(4096, 4096, 4096, torch.bfloat16) == mm.CONFIGS["half_xl"] == \
        dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    assert mm.default_config(2048, 2048, 2048, torch.bfloat16) == mm.CONFIGS["half_l"]    # 128x256: < one wave
    assert mm.default_config(4096, 4096, 4096, torch.float32)["BLOCK_K"] == 32
    skinny = mm.default_config(16, 8192, 4096, torch.bfloat16)
    assert skinny["BLOCK_M"] == 16
    # 128 x 256 x 64 bf16: 48 KiB a stage (exercise 40), 4 stages fit in 227 KiB, 5 do not
    assert mm.smem_bytes(dict(mm.CONFIGS["half_xl"], num_stages=4), 2) <= mm.SMEM_BYTES
    assert mm.smem_bytes(dict(mm.CONFIGS["half_xl"], num_stages=5), 2) > mm.SMEM_BYTES


BIAS_GELU = [mm.bias("bias0"), mm.activation("gelu")]


@pytest.mark.parametrize("mnk,dtype,steps,kw,want", [
    ((4096, 4096, 2048), torch.bfloat16, BIAS_GELU, {}, "template"),
    ((4096, 4096, 2048), torch.bfloat16, [mm.residual("r")], {}, "template"),
    ((4096, 4096, 2048), torch.bfloat16, [mm.activation("relu")], {}, "template"),
    ((4096, 4096, 4096), torch.bfloat16, BIAS_GELU, {}, "extern"),   # measured: the template's main loop is 14 % slower
    ((4096, 4096, 4096), torch.bfloat16, [], {}, "extern"),                        # nothing to fuse
    ((4096, 4096, 4096), torch.bfloat16, [mm.scale(2.0), mm.cast(torch.float16)], {}, "extern"),  # cuBLAS's alpha
    ((64, 64, 64), torch.bfloat16, BIAS_GELU, {}, "extern"),                       # less than a wave
    ((16, 4096, 4096), torch.bfloat16, BIAS_GELU, {}, "extern"),                   # skinny: split-K's case
    ((4096, 4096, 16384), torch.bfloat16, BIAS_GELU, {}, "extern"),                # long K: C's bytes are small
    ((4096, 4096, 4096), torch.float32, BIAS_GELU, {}, "extern"),                  # FMA dot: template too slow
    ((4096, 4096, 2048), torch.float32, BIAS_GELU, {"tf32": True}, "template"),
    ((8192, 8192, 128), torch.float32, BIAS_GELU, {}, "template"),                 # memory-bound: fusion pays
    ((64, 64, 64), torch.bfloat16, BIAS_GELU, {"batch": 256}, "template"),         # the batch fills the GPU
])
def test_choose_default_rule(mnk, dtype, steps, kw, want):
    M, N, K = mnk
    assert mm.choose(M, N, K, dtype, steps, **kw) == want
    t = mm.choice_terms(M, N, K, dtype, steps, **kw)
    assert t["choice"] == want and t["saved_bytes"] == 2 * kw.get("batch", 1) * M * N * dtype.itemsize


def test_choose_rule_k_bound():
    t = mm.choice_terms(4096, 4096, 4096, torch.bfloat16, BIAS_GELU)
    assert t["t_gemm"] == pytest.approx(2 * 4096 ** 3 / 989e12)            # compute-bound
    assert t["k_max"] == pytest.approx(2 * 989e12 / 3.35e12 / 0.15)         # ~3900
    for K in (2048, 3840):
        assert mm.choose(4096, 4096, K, torch.bfloat16, BIAS_GELU) == "template"
    assert mm.choose(4096, 4096, 4096, torch.bfloat16, BIAS_GELU) == "extern"


@pytest.mark.skipif(CUDA, reason="the interpreter path (CPU tensors)")
@pytest.mark.parametrize("faster", ["template", "extern"])
def test_choose_autotune_measures_both(faster):
    seen = []

    def measure(fn):
        fn()                                        # every candidate runs (in the interpreter here)
        seen.append((fn.choice, fn.config))
        return 1.0 if fn.choice == faster else 2.0
    got = mm.choose(32, 48, 40, torch.float32, BIAS_GELU, autotune=True, measure=measure, device="cpu")
    assert got == faster
    kinds = [c for c, _ in seen]
    assert kinds.count("extern") == 1 and kinds.count("template") == len(mm.candidate_configs(32, 48, 40,
                                                                                             torch.float32))


@pytest.mark.skipif(CUDA, reason="the interpreter path (CPU tensors)")
def test_tune_picks_the_fastest_config_and_survives_failures():
    cands = mm.candidate_configs(32, 32, 32, torch.float32)

    def measure(fn):
        if fn.choice == "extern":
            return 5.0
        if fn.config == cands[0]:
            raise RuntimeError("out of resources")
        return 1.0 + cands.index(fn.config)
    r = mm.tune(32, 32, 32, torch.float32, BIAS_GELU, measure=measure, device="cpu")
    assert r["choice"] == "template" and r["config"] == cands[1] if len(cands) > 1 else True
    assert any(t == math.inf for _, _, t in r["times"])


# ------------------------------------------------------------------------------------------------
# fused prologues in a compiled graph (template_prologue.py)
# ------------------------------------------------------------------------------------------------

def _compiled(f, *args, mode="always", dynamic=False):
    """(second call's output as a torch tensor or tuple, the wrapper source) of ``f`` compiled for
    Triton kernels (the interpreter on CPU tensors) with ``stax.triton.templates = mode``."""
    import tensorplay as tp
    with tp.compiler.config.patch({"stax.triton.templates": mode}):
        cf = tp.compile(f, strict_native=True, dynamic=dynamic, options={"stax.kernel_backend": "triton"})
        with tp.no_grad():
            cf(*args)                          # the capture run
            out = cf(*args)
    out = tuple(o._data for o in out) if isinstance(out, tuple) else out._data
    return out, cf._cache[0].artifact.source


def _tp(t):
    import tensorplay as tp
    return tp.from_torch(t)


def _kernels(src):
    return re.findall(r"@triton.jit(?:\(debug=True\))?\ndef (kernel\d+)\(", src)


def _check_pro(got, pa, b, *, out_dtype, a_dtype, ref=None):
    """|got - pa @ b| within the float32 dot's bound, one rounding of each A element to its dtype
    (the printers' erf / exp may round a value to the neighbour) and the output's rounding."""
    K = pa.shape[-1]
    ref = pa @ b if ref is None else ref
    tol = (4 * K * U32 + 2 * EPS[a_dtype]) * (pa.abs() @ b.abs()) + 2 * EPS[out_dtype] * ref.abs() + 1e-6
    err = (got.double() - ref).abs()
    assert float((err - tol).max()) <= 0, f"max error {float(err.max()):.3g}"


def _one_fused_kernel(src, what="GEMM + fused prologue"):
    assert _kernels(src) == ["kernel0"], _kernels(src)          # P's kernel is gone
    assert f"# {what}\n" in src and "# the fused pointwise prologue" in src
    assert "extern kernel" not in src and "XBLOCK" not in src


PRO_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", PRO_DTYPES)
@pytest.mark.parametrize("case,K", [("cast-scale", 45), ("affine", 45), ("affine", 64), ("gelu", 45)])
def test_prologue_fuses_into_the_template(case, K, dtype):
    """The typical prologues -- a cast and a scale before linear, ``x * 2 + 1`` (f(0) != 0: the K tail is
    zeroed again), gelu -- become one GEMM kernel, for each operand dtype; M, N and (K = 45) K tails."""
    import tensorplay.nn.functional as F
    M, N = 37, 30
    x32 = _rand(M, K, seed=3)
    if case == "cast-scale":
        w = _rand(N, K, seed=4, dtype=dtype)
        f = lambda x, w: F.linear(x.to(dtype) * 0.5, w)  # noqa: E731
        x, pa, b = x32, (x32.to(dtype).double() * 0.5).to(dtype).double(), w.double().t()
    else:
        w = _rand(K, N, seed=4, dtype=dtype)
        x = x32.to(dtype)
        fn = {"affine": lambda v: v * 2 + 1, "gelu": torch.nn.functional.gelu}[case]
        f = (lambda x, w: (x * 2 + 1) @ w) if case == "affine" else (lambda x, w: F.gelu(x) @ w)
        pa, b = fn(x.float()).to(dtype).double(), w.double()
    got, src = _compiled(f, _tp(x), _tp(w))
    assert got.dtype == dtype and got.shape == (M, N)
    _check_pro(got, pa, b, out_dtype=dtype, a_dtype=dtype)
    _one_fused_kernel(src)
    if dtype != torch.float32:          # P's value rounded to A's dtype before the dot, as the stored A
        tl_dt = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}[dtype]
        assert re.search(rf"a = pt\d+\.to\({tl_dt}\)\n\s+if not EVEN_K:", src)


@pytest.mark.parametrize("layout", ["column-major", "sliced"])
def test_prologue_reads_x_at_its_strides(layout):
    """X read at its own element through any strides: the template takes them (no copy)."""
    x = _rand(45, 37, seed=3).t() if layout == "column-major" else _rand(37, 64, seed=3)
    f = (lambda x, w: (x * 2 + 1) @ w) if layout == "column-major" else (lambda x, w: (x[:, :45] * 2 + 1) @ w)
    w = _rand(45, 30, seed=4)
    got, src = _compiled(f, _tp(x), _tp(w))
    _check_pro(got, x[:, :45].double() * 2 + 1, w.double(), out_dtype=torch.float32, a_dtype=torch.float32)
    _one_fused_kernel(src)
    ints = re.search(r'"ints": \[([^]]*)\]', src).group(1)
    assert ints.startswith("37, 30, 45, 1, 37," if layout == "column-major" else "37, 30, 45, 64, 1,")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prologue_and_epilogue_in_one_kernel(dtype):
    """prologue -> GEMM -> epilogue: ``silu(linear(x * 2 + 1, w, b))`` is one kernel."""
    import tensorplay.nn.functional as F
    M, N, K = 37, 30, 45
    x, w, v = _rand(M, K, seed=3, dtype=dtype), _rand(N, K, seed=4, dtype=dtype), _rand(N, seed=5, dtype=dtype)
    got, src = _compiled(lambda x, w, v: F.silu(F.linear(x * 2 + 1, w, v)), _tp(x), _tp(w), _tp(v))
    _one_fused_kernel(src, "GEMM + fused prologue and epilogue")
    pa = (x.float() * 2 + 1).to(dtype).double()
    lin = pa @ w.double().t() + v.double()
    want = torch.nn.functional.silu(lin.to(dtype).double())       # the epilogue sees the product rounded
    _check_pro(got, pa, w.double().t(), out_dtype=dtype, a_dtype=dtype, ref=want)


def test_prologue_only_kernel_stores_a_product_others_read():
    """No epilogue group (the product is an output and a reduction reads it): the fused kernel
    stores C, the reduction's kernel reads it."""
    import tensorplay.nn.functional as F
    x, w = _rand(37, 45, seed=3), _rand(30, 45, seed=4)
    (c, s), src = _compiled(lambda x, w: (lambda c: (c, c.sum(-1)))(F.linear(x * 2 + 1, w)), _tp(x), _tp(w))
    pa, b = x.double() * 2 + 1, w.double().t()
    _check_pro(c, pa, b, out_dtype=torch.float32, a_dtype=torch.float32)
    torch.testing.assert_close(s.double(), (pa @ b).sum(-1), rtol=1e-5, atol=1e-4)
    assert len(_kernels(src)) == 2 and "# GEMM + fused prologue\n" in src and "extern kernel" not in src


def _mlp(C=32):
    import tensorplay as tp
    return tp.nn.Linear(C, 4 * C), tp.nn.Linear(4 * C, C)


def test_gpt_mlp_gelu_fuses_once():
    """A GPT MLP ``x + lin2(gelu(lin1(x)))``: gelu is the first GEMM's epilogue (not also the second's
    prologue: no chain); with ``h`` an output (a training forward saves it) the first GEMM keeps
    cuBLAS and gelu is the second GEMM's prologue.  No separate gelu kernel either way."""
    import tensorplay.nn.functional as F
    lin1, lin2 = _mlp()
    x = _rand(37, 32, seed=3)
    W1, B1, W2, B2 = (t._data.double() for t in (lin1.weight, lin1.bias, lin2.weight, lin2.bias))
    h = x.double() @ W1.t() + B1
    g = torch.nn.functional.gelu(h.float()).double()
    want = x.double() + g @ W2.t() + B2
    got, src = _compiled(lambda x: x + lin2(F.gelu(lin1(x))), _tp(x))
    assert _kernels(src) == ["kernel0", "kernel1"] and src.count("# GEMM + fused epilogue\n") == 2
    assert "fused pointwise prologue" not in src and "extern kernel" not in src
    _check_pro(got, g, W2.t(), out_dtype=torch.float32, a_dtype=torch.float32, ref=want)
    (hh, got), src = _compiled(lambda x: (lambda h: (h, x + lin2(F.gelu(h))))(lin1(x)), _tp(x))
    assert _kernels(src) == ["kernel0"] and "# GEMM + fused prologue and epilogue\n" in src
    assert src.count("extern kernel: linear") == 1 and "tl.erf" in src
    _check_pro(hh, x.double(), W1.t(), out_dtype=torch.float32, a_dtype=torch.float32, ref=h)
    _check_pro(got, g, W2.t(), out_dtype=torch.float32, a_dtype=torch.float32, ref=want)


ILLEGAL = {
    "A is an output": (lambda x, y, w: (lambda a: (a @ w, a))(x * 2 + 1), lambda: (_rand(37, 45), None)),
    "A read by two products": (lambda x, y, w: (lambda a: (a @ w, a[:, :30] @ w[:30]))(x * 2 + 1),
                               lambda: (_rand(37, 45), None)),
    "two buffers": (lambda x, y, w: (x + y) @ w, lambda: (_rand(37, 45), _rand(37, 45, seed=9))),
    "reduction": (lambda x, y, w: (x - x.mean(-1, keepdim=True)) @ w, lambda: (_rand(37, 45), None)),
    "transposed load": (lambda x, y, w: (x.t() * 2) @ w, lambda: (_rand(45, 37), None)),
    "broadcast load": (lambda x, y, w: (x.expand(37, 45) * 2) @ w, lambda: (_rand(1, 45), None)),
    "integer X": (lambda x, y, w: (x.to(torch.float32) * 2) @ w,
                  lambda: ((_rand(37, 45) * 10).to(torch.int32), None)),
}


@pytest.mark.parametrize("case", list(ILLEGAL))
def test_illegal_prologues_stay_separate(case):
    import tensorplay as tp
    f, make = ILLEGAL[case]
    x, y = make()
    w = _rand(45, 30, seed=4)
    args = [_tp(x), _tp(y) if y is not None else None, _tp(w)]
    got, src = _compiled(f, *args)
    with tp.no_grad():
        want = f(*args)
    for g_, w_ in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g_.double(), w_._data.double(), rtol=1e-5, atol=1e-4)
    assert "fused pointwise prologue" not in src and "XBLOCK" in src     # P is a kernel of its own


def test_symbolic_sizes_keep_the_prologue_separate():
    import tensorplay as tp
    f = lambda x, w: (x * 2 + 1) @ w  # noqa: E731
    x, w = _rand(37, 45, seed=3), _rand(45, 30, seed=4)
    got, src = _compiled(f, _tp(x), _tp(w), dynamic=True)
    torch.testing.assert_close(got.double(), (x.double() * 2 + 1) @ w.double(), rtol=1e-5, atol=1e-4)
    assert "fused pointwise prologue" not in src and "extern kernel: matmul" in src


@pytest.mark.parametrize("mode", ["never", "rule"])
def test_never_and_the_rule_at_small_sizes_keep_prologues_apart(mode):
    """``never``; the rule: a small product (less than a wave) keeps cuBLAS (ATen), so its prologue
    stays a kernel."""
    import tensorplay.nn.functional as F
    x, w = _rand(37, 45, seed=3), _rand(30, 45, seed=4)
    got, src = _compiled(lambda x, w: F.linear(F.gelu(x), w), _tp(x), _tp(w), mode=mode)
    _check_pro(got, torch.nn.functional.gelu(x).double(), w.double().t(), out_dtype=torch.float32,
               a_dtype=torch.float32)
    assert "fused pointwise prologue" not in src and "extern kernel: linear" in src and len(_kernels(src)) == 1


def test_rule_adds_a_cheap_prologue_to_a_template(monkeypatch):
    """Under ``rule``, once the epilogue rule made the product a template (patched here: the sizes are
    small), a prologue whose recomputation costs less than A's bytes joins it."""
    import tensorplay.nn.functional as F
    monkeypatch.setattr(mm, "choose", lambda *a, **k: "template")
    x, w = _rand(37, 45, seed=3), _rand(30, 45, seed=4)
    got, src = _compiled(lambda x, w: F.relu(F.linear(F.gelu(x), w)), _tp(x), _tp(w), mode="rule")
    _one_fused_kernel(src, "GEMM + fused prologue and epilogue")
    _check_pro(got, torch.nn.functional.gelu(x).double(), w.double().t(), out_dtype=torch.float32,
               a_dtype=torch.float32, ref=(torch.nn.functional.gelu(x).double() @ w.double().t()).relu())


def test_host_scalar_in_a_prologue(monkeypatch):
    """A one-element host buffer (on a GPU: passed by value) P reads is a parameter of the fused
    kernel (``pro_<name>``); in the interpreter every buffer is a host buffer, so without treating
    it as a host scalar P reads two buffers and stays apart."""
    from tensorplay.compiler.backends.stax.triton.backend import TritonBackend
    x, s, w = _rand(37, 45, seed=3), _rand(5, seed=6), _rand(45, 30, seed=4)
    f = lambda x, s, w: (x * s.sum()) @ w  # noqa: E731
    got, src = _compiled(f, _tp(x[1:].contiguous()), _tp(s), _tp(w))        # (other sizes: not the cached graph below)
    assert "fused pointwise prologue" not in src
    torch.testing.assert_close(got.double(), (x[1:].double() * s.double().sum()) @ w.double(), rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(TritonBackend, "_host_scalars", lambda self, graph: frozenset(
        b.name for b in graph.buffers if getattr(b, "layout", None) is not None and b.layout.size == ()))
    want = (x.double() * s.double().sum()) @ w.double()
    got, src = _compiled(f, _tp(x), _tp(s), _tp(w))
    assert "pro_buf" in src and "# GEMM + fused prologue\n" in src and ".item()" in src
    _check_pro(got, x.double() * s.sum().double(), w.double(), out_dtype=torch.float32, a_dtype=torch.float32,
               ref=want)


def test_schedule_dump_shows_the_fused_kernels(monkeypatch, capfd):
    """TP_STAX_DEBUG=schedule: a prologue-only kernel lists the product it computes; with an epilogue
    fused (the extern and P gone from both orders) the dump prints too."""
    import tensorplay.nn.functional as F
    monkeypatch.setenv("TP_STAX_DEBUG", "schedule")
    x, w, v = _rand(37, 45, seed=3), _rand(30, 45, seed=4), _rand(30, seed=5)
    _compiled(lambda x, w: F.linear(F.gelu(x), w), _tp(x), _tp(w))
    err = capfd.readouterr().err
    assert "# schedule: 1 groups" in err and "product memory (linear in this kernel)" in err
    _compiled(lambda x, w, v: F.relu(F.linear(x * 3, w, v)), _tp(x), _tp(w), _tp(v))
    assert "# schedule: 1 groups" in capfd.readouterr().err


def test_prologue_rule():
    """template_prologue.prologue_terms: fuse when recomputing the prologue per N block costs less than
    the bytes of A (and, replacing cuBLAS, more than the template's deficit on a full wave)."""
    from tensorplay.compiler.backends.stax.triton import template_prologue as tpro
    bf = torch.bfloat16
    # GPT-2's second MLP GEMM (M = 8192 tokens, 3072 -> 768), gelu of 5 ops: 3 N blocks of 256
    t = tpro.prologue_terms(8192, 768, 3072, bf, 5, templated=False)
    assert t["choice"] == "template" and t["n_blocks"] == 3 and t["saved_bytes"] == 2 * 8192 * 3072 * 2
    assert t["t_saved"] - t["t_recompute"] >= t["deficit"] * t["t_gemm"]
    # 4096^3: 16 N blocks; a cast (1 op) pays with an epilogue fused already, not against cuBLAS
    assert tpro.prologue_terms(4096, 4096, 4096, bf, 1, templated=True)["choice"] == "template"
    assert tpro.prologue_terms(4096, 4096, 4096, bf, 1, templated=False)["choice"] == "extern"
    assert tpro.prologue_terms(4096, 4096, 4096, bf, 2, templated=True)["choice"] == "template"
    t = tpro.prologue_terms(4096, 4096, 4096, bf, 3, templated=True)          # recomputed 16 times: too dear
    assert t["choice"] == "extern" and t["t_recompute"] > t["t_saved"]
    assert tpro.prologue_terms(8192, 128, 4096, bf, tpro.PROLOGUE_MAX_OPS + 1, templated=True)["choice"] == "extern"
    assert tpro.prologue_terms(8192, 128, 4096, bf, tpro.PROLOGUE_MAX_OPS, templated=True)["choice"] == "template"
    assert tpro.prologue_terms(64, 64, 64, bf, 1, templated=False)["choice"] == "extern"        # < one wave


# ------------------------------------------------------------------------------------------------
# GPU (-m gpu)
# ------------------------------------------------------------------------------------------------

def _bench(fn):
    from triton.testing import do_bench
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_4096_bf16_bias_gelu(record_property):
    import torch.nn.functional as F
    M = N = K = 4096
    dt = torch.bfloat16
    a, b = _rand(M, K, dtype=dt), (_rand(K, N, dtype=dt, seed=1) / 64).to(dt)
    v = _rand(N, dtype=dt, seed=2)
    k = mm.MatmulKernel(dt, dt, dt, BIAS_GELU)
    got = k(a, b, v)
    assert got.dtype == dt and got.is_cuda
    ref = F.gelu(a.float() @ b.float() + v.float()).double()
    _check(got, ref, a, b, lipschitz=1.2)
    again = k(a, b, v)                                  # the second call: the compiled kernel, directly
    assert torch.equal(again, got)
    t_template = _bench(lambda: k(a, b, v))
    t_torch = _bench(lambda: F.gelu(a @ b + v))
    t_blas = _bench(lambda: a @ b)
    record_property("template_ms", t_template)
    record_property("torch_matmul_bias_gelu_ms", t_torch)
    record_property("torch_matmul_ms", t_blas)
    print(f"\n4096^3 bf16 + bias + gelu: template {t_template:.3f} ms, torch matmul+bias+gelu {t_torch:.3f} ms "
          f"({t_template / t_torch:.2f}x), torch.matmul alone {t_blas:.3f} ms")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype,tf32", [(torch.float32, False), (torch.float32, True), (torch.float16, False)])
def test_gpu_chain_batched_strided(dtype, tf32):
    steps = [mm.bias("v", axis=0), mm.activation("gelu_tanh"), mm.residual("r"), mm.scale(0.25), mm.cast(torch.float16)]
    a = _rand(3, 300, 257, dtype=dtype).transpose(1, 2).contiguous().transpose(1, 2)
    b = _rand(400, 257, dtype=dtype, seed=1)[::2].t()
    v, r = _rand(300, seed=2), _rand(3, 300, 200, seed=3)
    k = mm.MatmulKernel(dtype, dtype, None, steps, tf32=tf32)
    got = k(a, b, v, r)
    _check(got, _ref(a, b, steps, v, r), a, b, lipschitz=0.3, tf32=tf32)
    for c in mm.candidate_configs(300, 200, 257, dtype, 3)[:3]:
        _check(k(a, b, v, r, config=c), _ref(a, b, steps, v, r), a, b, lipschitz=0.3, tf32=tf32)
