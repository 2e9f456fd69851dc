"""The Triton GEMM template with fused epilogues (backends/stax/triton/matmul.py).

Without a GPU the kernels run in Triton's interpreter on CPU tensors (test/conftest.py sets
TRITON_INTERPRET=1 before triton is imported), at small sizes; values are checked against float64
references with a tolerance from the error model of a float32 dot (``K * u32 * (|A| @ |B|)``) plus
the rounding of each narrow dtype the value passes through.  ``-m gpu`` runs the 4096^3 bfloat16
case on CUDA against torch and records its time next to torch.matmul + bias + GELU.
"""
from __future__ import annotations

import math

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
