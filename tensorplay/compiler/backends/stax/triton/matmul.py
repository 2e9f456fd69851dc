"""A Triton GEMM template with fused prologue and epilogue, its launch configs, and the choice
against the ATen extern (cuBLAS) (the chapter, §9.8, Theorem 9.1, Prop. 9.4, table 11.1; SPEC §8.4).

**The seed.**  Tiling (§9.8, exercises 25 and 40): a program computes one ``BLOCK_M x BLOCK_N`` tile
of ``C = A @ B`` and walks K in steps of ``BLOCK_K``, holding an A block and a B block per pipeline
stage on chip; it moves ``m n k (1/BLOCK_N + 1/BLOCK_M)`` input elements from memory and writes C
once, an arithmetic intensity that grows with the tile -- within the capacity ``S`` of the fast
memory the tiling attains, up to a constant, Theorem 9.1's lower bound ``Omega(m n k / sqrt(S))``
(Loomis--Whitney).  A stage of the pipeline holds ``(BLOCK_M + BLOCK_N) BLOCK_K`` elements, so
``num_stages`` is bounded by the shared memory (exercise 40: 228 KB on an H100):
:func:`smem_bytes` and :data:`SMEM_BYTES`.  A square GEMM is compute-bound once its intensity
``2 n / (3 itemsize)`` passes the ridge ``P / B`` of the machine (§9.8's method; :data:`MACHINES`).
Grouped ordering (Prop. 9.4, exercise 35): the W programs running at once on a ``g_m x g_n`` grid
of tiles read the A row panels and the B column panels of their tiles; numbered row by row they
cover ``ceil(W / g_n)`` rows and all ``g_n`` columns, grouped by ``GROUP_M = G`` rows they cover
``G`` rows and ``W / G`` columns -- ``G + W / G`` panels, minimal near ``G = sqrt(W)`` -- so the panels
in flight fit in L2 and each is read from HBM about once (:func:`grouped_order`,
:func:`panels_in_flight`: 18 panels row by row, 10 with G = 4, 11 with G = 8 for exercise 35's
``g_m = g_n = 16, W = 24``).  Table 11.1: ``max-autotune`` widens the search -- here the template is
measured over :func:`candidate_configs` and against the extern (``choose(autotune=True)``).

**The template** (:func:`matmul_template`).  ``C[M, N] = epilogue(prologue(A)[M, K] @ B[K, N])``
(optionally batched: ``A[Z, M, K]``, ``B[Z, K, N]``, either one broadcast with batch stride 0),
printed as the source of one ``@triton.jit`` function like the other kernels of this backend (no
``# stax-launch:`` line: the runner launches it, not the wrapper printer)::

    def stax_mm_bias_gelu(a_ptr, b_ptr, c_ptr, bias0, M, N, K, stride_am, stride_ak, stride_bk,
                          stride_bn, stride_cm, stride_cn, bias0_stride,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, EVEN_K: tl.constexpr)

* every stride is an argument (a transposed or sliced A or B needs no copy; Triton specialises a
  stride equal to 1, so a contiguous dimension is known contiguous and its loads vectorised);
* grouped program ordering (Prop. 9.4) of a 1-D grid ``Z * cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)``
  (the batch folded into axis 0: runtime.Launcher launches 1-D grids, and axis 0 has no 65535 limit);
* M and N tails: rows and columns wrapped into range for the loads (``rm % M``), masked at the
  store; the K tail masked (``EVEN_K``, a constexpr: no masks when ``BLOCK_K`` divides K);
* accumulation in a float32 tile by ``tl.dot`` with ``input_precision="tf32"`` only when the caller
  enabled TF32 (``torch.backends.cuda.matmul.allow_tf32``: :func:`tf32_enabled`), else ``"ieee"``;
  float16 and bfloat16 operands go to the tensor cores as they are, mixed operands meet in float32;
* pipelining by the launch option ``num_stages`` (Triton's software pipeliner over the K loop);
* 64-bit offsets when a tensor spans 2**31 elements or more (``wide``).

In Triton's interpreter (CPU tensors, tests) K is a constexpr (its loops need a Python int) and
bfloat16 operands are upcast to float32 before ``tl.dot`` (triton 3.6's interpreter returns garbage
for a bfloat16 dot); the products of bfloat16 values are exact in float32, so that is the GPU's
bfloat16 MMA up to the order of the float32 sums.

**The epilogue contract.**  An epilogue is a sequence of :class:`Epilogue` steps applied, in order,
to the float32 accumulator tile ``acc`` (``[BLOCK_M, BLOCK_N]``) with its row and column index
vectors ``rm``, ``rn`` (and masks ``mask_m``, ``mask_n``) in scope; then ``acc`` is stored in the
output's dtype (the final dtype cast).  Steps (``kind``; constructors :func:`bias`,
:func:`activation`, :func:`residual`, :func:`scale`, :func:`cast`)::

    Epilogue("bias", operand="bias0", axis=1)     acc += bias0[rn][None, :]   (axis=0: bias0[rm][:, None])
    Epilogue("activation", fn="gelu")             relu, gelu (erf), gelu_tanh, silu, sigmoid, tanh
    Epilogue("residual", operand="res0")          acc += res0[rm, rn]         (any strides, 0 to broadcast)
    Epilogue("scale", alpha=0.5)                  acc *= 0.5                  (a Python float, printed)
    Epilogue("cast", dtype=torch.float16)         acc = acc.to(fp16).to(fp32) (rounds as eager would)

Every operand name is a kernel parameter (a pointer, its strides after the GEMM's); operands are
passed to the runner in the order of their first appearance (:func:`epilogue_operands`); one name
used twice is one tensor.  Operand values are read in their own dtype and converted to float32.
The steps are frozen dataclasses, so a scheduler can build them from a pointwise group and hash
them.  The **prologue** (:class:`Prologue`) is an elementwise Triton expression over the loaded A
tile ``a`` (A's dtype), e.g. ``"a * 0.5"`` or ``"a.to(tl.float16)"``; its result is what ``tl.dot``
reads (``dtype``: its dtype, when it casts).  It is legal when elementwise (checked: no loads,
stores, reductions, program ids, dots; only ``a``, ``tl`` and ``libdevice`` named): the K tail is
re-zeroed after it, so ``f(0) != 0`` is fine; it is recomputed once per N block, so it should be
cheap (a compiled graph's pointwise group becomes one by template_prologue.py's rule).

**Launch configs.**  ``{"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"}``;
:data:`CONFIGS` names the table, :func:`default_config` picks the largest tile of the dtype's list
that still gives every SM a program (one wave: :data:`WAVE_SMS`), clamped to the problem;
:func:`candidate_configs` is the short list ``max-autotune`` measures.

**The choice rule** (:func:`choose`) against ATen (cuBLAS) followed by a separate epilogue.  An
epilogue left unfused is a second pass over C: it reads C and writes it again, ``2 M N itemsize``
bytes (its operands are read either way), so fusing saves ``t_saved = 2 Z M N s_out / B``.  The
template is, at best, as fast as cuBLAS on the bare GEMM; we charge it a relative deficit
``eps`` (:data:`TEMPLATE_DEFICIT`, per precision: tensor cores vs float32 FMA) of the roofline
time of the GEMM ``t_gemm = max(2 Z M N K / P, bytes / B)``.  By default (no autotune)::

    "template"  iff  (1) the epilogue fuses a memory operand (bias, residual) or an activation
                         (scale and cast alone cost cuBLAS nothing: alpha and the output type),
                     (2) the default config gives at least one wave of tiles (Z * tiles >= SMs;
                         below it cuBLAS's split-K / stream-K kernels use the machine better), and
                     (3) t_saved >= eps * t_gemm  -- for a compute-bound GEMM:
                         K <= s_out * (P / B) / eps  (the ridge of §9.8 over the deficit);
    else "extern".

With H100 numbers, bf16: ``K <= 2 * 295 / 0.15 ~ 3900`` (4096**3 + bias + GELU: extern; H200:
``K <= 2750``); float32 without TF32 (FMA, ridge 20, eps 0.5): ``K <= 160``.  The tensor-core deficit
0.15 is the measured one: the template's main loop 0.199 ms against cuBLAS's 0.175 ms at 4096³ bf16
(14 %; 0.10 chose the template there, and tp.compile ran 0.221 ms against 0.215 ms with the extern).

Measured on an H200 (benchmarks/matmul_epilogue.py, ``do_bench`` medians, ms), bf16 + bias + GELU::

                 cuBLAS   template   template+epi   cuBLAS+epilogue kernel   eager   torch.compile
    4096^3       0.175    0.199      0.222-0.228    0.218-0.220              0.252   0.216 (max-autotune 0.213)
    8192^3       1.566    1.590      1.727          1.714                    1.822

So the bytes are half of the story.  At 4096^3 the template's main loop is 24 us behind cuBLAS and
its fused epilogue adds 23-29 us more (8192^3: 24 and 137 us), against 43 us (148 us) for the
separate pass after cuBLAS: the bytes saved are spent on the epilogue's arithmetic (erf), which is
exposed (consistent with one 144 KiB program per SM: the tensor cores idle while it runs).  At these
sizes template and extern are within 1-4 % (the benchmark's rows put the extern ahead, its ``tune``
run the template): the rule's "template" is a tie there, and it decides clearly only where the bytes
dominate (a short K; operands the extern reads in a pass of its own).  ``autotune=True`` measures
both with the caller's ``measure(fn) -> seconds``: the template at each of
:func:`candidate_configs`, the extern as ``torch.matmul`` followed by one fused pointwise epilogue
kernel (:class:`EpilogueKernel`, what Stax runs after an extern GEMM), and the faster wins
(:func:`tune` returns the times and the best config too).

**Guarantees.**  ``MatmulKernel(...)(a, b, *operands)`` returns ``epilogue(prologue(a) @ b)`` to the
rounding of float32 accumulation (and TF32 inputs when enabled) and of the output dtype, for any
strides, any M, N, K >= 0 (an empty output launches nothing; K = 0 gives the epilogue of zeros),
on CUDA tensors (compiled, launched on the current stream by runtime.Launcher) and on CPU tensors
(Triton's interpreter); the grouped ordering changes which program computes a tile, never the
tile's value (the same bits for every ``GROUP_M``); every block size of the tables is a power of
two >= 16 (``tl.dot``'s and ``tl.arange``'s requirements) within the shared memory.
"""
from __future__ import annotations

import ast
import dataclasses
import keyword
import math
from typing import Sequence

import torch

from .ops import literal, tl_type
from .runtime import GPU_LIBDEVICE, Launcher, cdiv, load_kernel

__all__ = ["Epilogue", "Prologue", "bias", "activation", "residual", "scale", "cast", "epilogue_operands",
           "ACTIVATIONS", "matmul_template", "epilogue_template", "MatmulKernel", "EpilogueKernel",
           "apply_epilogue", "CONFIGS", "default_config", "candidate_configs", "check_config", "smem_bytes",
           "SMEM_BYTES", "WAVE_SMS", "Machine", "MACHINES", "TEMPLATE_DEFICIT", "choose", "choice_terms", "tune",
           "tf32_enabled", "grouped_order", "panels_in_flight"]

# ------------------------------------------------------------------------------------------------
# the epilogue and prologue descriptions
# ------------------------------------------------------------------------------------------------

#: activation -> its Triton expression over the float32 tile ``acc`` (NaN propagates through relu)
ACTIVATIONS = {
    "relu": "tl.where(acc < 0, 0.0, acc)",
    "gelu": "0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))",
    "gelu_tanh": "0.5 * acc * (1.0 + libdevice.tanh(0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)))",
    "silu": "acc * tl.sigmoid(acc)",
    "sigmoid": "tl.sigmoid(acc)",
    "tanh": "libdevice.tanh(acc)",
}
_TORCH_ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}
_KINDS = ("bias", "activation", "residual", "scale", "cast")
_OPERAND_KINDS = ("bias", "residual")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
#: parameter names of the template an operand may not take
_RESERVED = {"a_ptr", "b_ptr", "c_ptr", "x_ptr", "a_ptrs", "b_ptrs", "c_ptrs", "M", "N", "K", "acc", "a", "b",
             "rm", "rn", "rk", "k0", "pid", "pid_m", "pid_n", "pid_z", "num_pid_m", "num_pid_n", "tiles", "width",
             "group", "first_m", "group_m", "mask_m", "mask_n", "tl", "triton", "libdevice", "range"}


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """One step of an epilogue (module doc): ``kind`` and the field it reads -- ``operand`` (bias,
    residual: the kernel parameter's name), ``axis`` (bias: 1 a vector along N, 0 along M), ``fn``
    (activation), ``alpha`` (scale), ``dtype`` (cast)."""
    kind: str
    operand: str | None = None
    axis: int = 1
    fn: str | None = None
    alpha: float | None = None
    dtype: torch.dtype | None = None

    def __post_init__(self):
        k = self.kind
        if k not in _KINDS:
            raise ValueError(f"epilogue kind {k!r}: one of {_KINDS}")
        if k in _OPERAND_KINDS:
            name = self.operand
            if not (isinstance(name, str) and name.isidentifier()) or name in _RESERVED or keyword.iskeyword(name) \
                    or name.startswith(("stride_", "BLOCK_", "GROUP_", "EVEN_")):
                raise ValueError(f"epilogue {k}: operand must be a free identifier, got {self.operand!r}")
        if k == "bias" and self.axis not in (0, 1):
            raise ValueError(f"epilogue bias: axis 0 (along M) or 1 (along N), got {self.axis!r}")
        if k == "activation" and self.fn not in ACTIVATIONS:
            raise ValueError(f"epilogue activation {self.fn!r}: one of {sorted(ACTIVATIONS)}")
        if k == "scale" and not isinstance(self.alpha, (int, float)):
            raise ValueError(f"epilogue scale: alpha must be a Python number, got {self.alpha!r}")
        if k == "cast" and self.dtype not in _FLOATS:
            raise ValueError(f"epilogue cast: dtype one of {_FLOATS}, got {self.dtype}")


def bias(operand: str = "bias0", axis: int = 1) -> Epilogue:
    return Epilogue("bias", operand=operand, axis=axis)


def activation(fn: str) -> Epilogue:
    return Epilogue("activation", fn=fn)


def residual(operand: str = "res0") -> Epilogue:
    return Epilogue("residual", operand=operand)


def scale(alpha: float) -> Epilogue:
    return Epilogue("scale", alpha=float(alpha))


def cast(dtype: torch.dtype) -> Epilogue:
    return Epilogue("cast", dtype=dtype)


def epilogue_operands(epilogue: Sequence[Epilogue]) -> list:
    """The operand steps of ``epilogue``, one per name, in the order of first appearance (the order
    the runner takes the tensors in); a name used by two steps must mean the same kind of tensor."""
    seen = {}
    for e in epilogue:
        if e.kind in _OPERAND_KINDS:
            prev = seen.setdefault(e.operand, e)
            if (prev.kind, prev.axis) != (e.kind, e.axis):
                raise ValueError(f"epilogue operand {e.operand!r} used as {prev.kind} and as {e.kind}")
    return list(seen.values())


_PROLOGUE_FORBIDDEN = {"load", "store", "dot", "sum", "max", "min", "reduce", "program_id", "num_programs",
                       "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg", "cumsum", "cumprod",
                       "argmax", "argmin", "xor_sum", "device_assert", "device_print", "arange", "zeros", "full",
                       "associative_scan", "sort", "histogram", "make_block_ptr", "advance", "permute", "trans",
                       "reshape", "view", "broadcast_to", "expand_dims", "join", "split", "gather"}


@dataclasses.dataclass(frozen=True)
class Prologue:
    """An elementwise function of A's loaded tile: ``expr``, Triton text over ``a`` (A's dtype);
    ``dtype``: the dtype of its result when it casts (None: A's dtype)."""
    expr: str
    dtype: torch.dtype | None = None

    def __post_init__(self):
        try:
            tree = ast.parse(self.expr, mode="eval")
        except SyntaxError as e:
            raise ValueError(f"prologue {self.expr!r}: not a Python expression ({e.msg})") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in ("a", "tl", "libdevice"):
                raise ValueError(f"prologue {self.expr!r}: names {node.id!r} (only a, tl, libdevice: elementwise)")
            if isinstance(node, ast.Attribute) and node.attr in _PROLOGUE_FORBIDDEN:
                raise ValueError(f"prologue {self.expr!r}: {node.attr} is not elementwise")
            if isinstance(node, (ast.Lambda, ast.NamedExpr, ast.Subscript, ast.ListComp, ast.GeneratorExp)):
                raise ValueError(f"prologue {self.expr!r}: only an elementwise expression of a")
        if self.dtype is not None and self.dtype not in _FLOATS:
            raise ValueError(f"prologue dtype one of {_FLOATS}, got {self.dtype}")


def _as_steps(epilogue) -> tuple:
    steps = tuple(epilogue or ())
    for e in steps:
        if not isinstance(e, Epilogue):
            raise TypeError(f"an epilogue is a list of Epilogue steps, got {e!r}")
    epilogue_operands(steps)
    return steps


# ------------------------------------------------------------------------------------------------
# printing
# ------------------------------------------------------------------------------------------------

_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K")


def _operand_params(ops, batched) -> tuple:
    """(pointer parameters, stride parameters) of the epilogue operands."""
    ptrs, strides = [], []
    for e in ops:
        ptrs.append(e.operand)
        if e.kind == "bias":
            strides.append(f"{e.operand}_stride")
        else:
            strides += [f"{e.operand}_stride_{d}" for d in ("mnz" if batched else "mn")]
    return ptrs, strides


def _epilogue_body(steps, batched) -> list:
    """Lines applying ``steps`` to ``acc`` and storing it (module doc: the epilogue contract)."""
    out = ["# the epilogue: on the float32 tile acc, rows rm, columns rn",
           "mask_m = rm < M", "mask_n = rn < N"]
    if batched:
        for e in epilogue_operands(steps):
            if e.kind == "residual":
                out.append(f"{e.operand} += pid_z.to(tl.int64) * {e.operand}_stride_z")
    for e in steps:
        if e.kind == "bias":
            idx, mask, bcast = ("rn", "mask_n", "[None, :]") if e.axis == 1 else ("rm", "mask_m", "[:, None]")
            out.append(f"acc = acc + tl.load({e.operand} + {idx} * {e.operand}_stride, mask={mask}, "
                       f"other=0.0).to(tl.float32){bcast}")
        elif e.kind == "residual":
            out.append(f"acc = acc + tl.load({e.operand} + rm[:, None] * {e.operand}_stride_m + rn[None, :] * "
                       f"{e.operand}_stride_n, mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)")
        elif e.kind == "activation":
            out.append(f"acc = {ACTIVATIONS[e.fn]}   # {e.fn}")
        elif e.kind == "scale":
            out.append(f"acc = acc * {literal(e.alpha, torch.float32)}")
        else:
            out.append(f"acc = acc.to({tl_type(e.dtype)}).to(tl.float32)   # rounded to {e.dtype}")
    out += ["c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn",
            "tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])"]
    return out


def _kernel_name(prefix, steps, prologue) -> str:
    parts = [e.fn if e.kind == "activation" else e.kind for e in steps]
    if prologue is not None:
        parts.insert(0, "pro")
    return "_".join([prefix] + parts)[:60]


def _module(name, sig, body) -> str:
    head = ["import triton", "import triton.language as tl", GPU_LIBDEVICE, "", "", "@triton.jit",
            f"def {name}({', '.join(sig)}):"]
    return "\n".join(head + ["    " + ln if ln else "" for ln in body]) + "\n"


def _dot_dtype(a_dtype, b_dtype):
    return a_dtype if a_dtype == b_dtype else torch.float32


_sources: dict = {}


def matmul_template(config: dict, *, epilogue=(), prologue: Prologue | None = None, a_dtype=torch.float32,
                    b_dtype=torch.float32, tf32: bool = False, even_k: bool = False, batched: bool = False,
                    wide: bool = False, interpret: bool = False, tail=None, head=None) -> tuple:
    """``(source, kernel name, constexprs)`` of the GEMM template (module doc) for ``epilogue`` (a
    list of :class:`Epilogue`), ``prologue``, the operand dtypes, TF32 on or off, batched, 64-bit
    offsets (``wide``) and Triton's interpreter; ``constexprs``: the values of the trailing constexpr
    parameters for ``config`` in signature order (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``,
    ``EVEN_K``: ``even_k`` says BLOCK_K divides K).  The source does not depend on ``config``: Triton
    compiles it once per block sizes.  ``tail``: ``(parameters, lines)`` that replace the store of C
    (a fused pointwise group printed over ``acc``, ``rm``, ``rn``: template_fusion.py); the kernel
    then has no C parameters and takes ``parameters`` after the epilogue operands.  ``head``:
    ``(parameters, lines)`` that replace ``prologue``'s expression (a fused pointwise group printed
    over the loaded tile ``a``: template_prologue.py; ``prologue`` then only gives the dtype), its
    ``parameters`` after the tail's."""
    check_config(config)
    steps = _as_steps(epilogue)
    for dt in (a_dtype, b_dtype):
        if dt not in _FLOATS:
            raise ValueError(f"matmul template: operands float16, bfloat16 or float32, got {dt}")
    if tail is not None or head is not None:
        hit = _print_matmul(steps, prologue, a_dtype, b_dtype, tf32, batched, wide, interpret, tail, head)
    else:
        key = (steps, prologue, a_dtype, b_dtype, bool(tf32), batched, wide, interpret)
        hit = _sources.get(key)
        if hit is None:
            hit = _sources[key] = _print_matmul(steps, prologue, a_dtype, b_dtype, tf32, batched, wide, interpret)
    source, name = hit
    constexprs = {k: config[k] for k in _CONSTEXPRS[:4]}
    constexprs["EVEN_K"] = bool(even_k)
    return source, name, constexprs


def _print_matmul(steps, prologue, a_dtype, b_dtype, tf32, batched, wide, interpret, tail=None, head=None) -> tuple:
    ops = epilogue_operands(steps)
    optrs, ostrides = _operand_params(ops, batched)
    c_params = ["c_ptr"] if tail is None else []
    sig = (["a_ptr", "b_ptr"] + c_params + optrs + (list(tail[0]) if tail is not None else [])
           + (list(head[0]) if head is not None else [])
           + ["M", "N", "K: tl.constexpr" if interpret else "K",
              "stride_am", "stride_ak", "stride_bk", "stride_bn"]
           + (["stride_cm", "stride_cn"] if tail is None else [])
           + (["stride_az", "stride_bz", "stride_cz"] if batched else []) + ostrides
           + [f"{c}: tl.constexpr" for c in _CONSTEXPRS])
    a_in = prologue.dtype if prologue is not None and prologue.dtype is not None else a_dtype
    dot = _dot_dtype(a_in, b_dtype)
    if interpret and dot == torch.bfloat16:
        dot = torch.float32          # the interpreter's bf16 dot is wrong (module doc); exact products in fp32
    precision = "tf32" if tf32 and dot == torch.float32 else "ieee"
    body = ["# grouped ordering (Prop. 9.4): GROUP_M row blocks share each B column panel while it is in L2",
            "pid = tl.program_id(0)",
            "num_pid_m = tl.cdiv(M, BLOCK_M)",
            "num_pid_n = tl.cdiv(N, BLOCK_N)"]
    if batched:
        body += ["tiles = num_pid_m * num_pid_n",
                 "pid_z = pid // tiles            # the batch, folded into axis 0",
                 "pid = pid % tiles",
                 "a_ptr += pid_z.to(tl.int64) * stride_az",
                 "b_ptr += pid_z.to(tl.int64) * stride_bz",
                 "c_ptr += pid_z.to(tl.int64) * stride_cz"]
    body += ["width = GROUP_M * num_pid_n",
             "group = pid // width",
             "first_m = group * GROUP_M",
             "group_m = tl.minimum(num_pid_m - first_m, GROUP_M)",
             "pid_m = first_m + (pid % width) % group_m",
             "pid_n = (pid % width) // group_m",
             "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
             "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
             "rk = tl.arange(0, BLOCK_K)"]
    if wide:
        body += ["rm = rm.to(tl.int64)   # 64-bit offsets", "rn = rn.to(tl.int64)", "rk = rk.to(tl.int64)"]
    body += ["# the M and N tails: rows and columns wrapped into range for the loads, masked at the store",
             "a_ptrs = a_ptr + (rm % M)[:, None] * stride_am + rk[None, :] * stride_ak",
             "b_ptrs = b_ptr + rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn",
             "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
             "for k0 in range(0, tl.cdiv(K, BLOCK_K)):   # pipelined over num_stages (the launch option)"]
    loop = ["if EVEN_K:",
            "    a = tl.load(a_ptrs)",
            "    b = tl.load(b_ptrs)",
            "else:   # the K tail",
            "    a = tl.load(a_ptrs, mask=rk[None, :] < K - k0 * BLOCK_K, other=0.0)",
            "    b = tl.load(b_ptrs, mask=rk[:, None] < K - k0 * BLOCK_K, other=0.0)"]
    if prologue is not None:
        loop += (list(head[1]) if head is not None else [f"a = {prologue.expr}   # the prologue"])
        loop += ["if not EVEN_K:   # f(0) need not be 0: the tail is zero again",
                 "    a = tl.where(rk[None, :] < K - k0 * BLOCK_K, a, tl.zeros_like(a))"]
    if a_in != dot or prologue is not None:
        loop.append(f"a = a.to({tl_type(dot)})")
    if b_dtype != dot:
        loop.append(f"b = b.to({tl_type(dot)})")
    loop += [f'acc = tl.dot(a, b, acc, input_precision="{precision}")',
             "a_ptrs += BLOCK_K * stride_ak",
             "b_ptrs += BLOCK_K * stride_bk"]
    body += ["    " + ln for ln in loop]
    ep = _epilogue_body(steps, batched)
    body += ep if tail is None else ep[:-2] + list(tail[1])     # (tail: the fused group stores)
    name = _kernel_name("stax_mm", steps, prologue)
    return _module(name, sig, body), name


def epilogue_template(epilogue=(), *, batched: bool = False, wide: bool = False) -> tuple:
    """``(source, kernel name)`` of the epilogue alone as a 2-D pointwise kernel over a computed C
    (``x_ptr``): what Stax runs after an extern GEMM (one fused pointwise pass, reading C and writing
    it again); same epilogue contract, constexprs ``BLOCK_M``, ``BLOCK_N``."""
    steps = _as_steps(epilogue)
    key = ("epilogue", steps, batched, wide)
    hit = _sources.get(key)
    if hit is None:
        ops = epilogue_operands(steps)
        optrs, ostrides = _operand_params(ops, batched)
        sig = (["x_ptr", "c_ptr"] + optrs + ["M", "N", "stride_xm", "stride_xn", "stride_cm", "stride_cn"]
               + (["stride_xz", "stride_cz"] if batched else []) + ostrides
               + ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"])
        body = ["pid = tl.program_id(0)", "num_pid_n = tl.cdiv(N, BLOCK_N)"]
        if batched:
            body += ["tiles = tl.cdiv(M, BLOCK_M) * num_pid_n", "pid_z = pid // tiles", "pid = pid % tiles",
                     "x_ptr += pid_z.to(tl.int64) * stride_xz", "c_ptr += pid_z.to(tl.int64) * stride_cz"]
        body += ["rm = (pid // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)",
                 "rn = (pid % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)"]
        if wide:
            body += ["rm = rm.to(tl.int64)", "rn = rn.to(tl.int64)"]
        body += ["acc = tl.load(x_ptr + rm[:, None] * stride_xm + rn[None, :] * stride_xn, "
                 "mask=(rm < M)[:, None] & (rn < N)[None, :], other=0.0).to(tl.float32)"]
        body += _epilogue_body(steps, batched)
        name = _kernel_name("stax_epilogue", steps, None)
        hit = _sources[key] = (_module(name, sig, body), name)
    return hit


# ------------------------------------------------------------------------------------------------
# launch configs
# ------------------------------------------------------------------------------------------------

#: the shared memory a program may use on an H100 / H200 (227 KiB opt-in; exercise 40's 228 KB)
SMEM_BYTES = 232448
#: SMs of an H100 / H200 SXM: a grid of at least this many programs is one full wave
WAVE_SMS = 132


def _cfg(bm, bn, bk, g, w, s) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, "num_warps": w, "num_stages": s}


#: the named configs, largest tile first per dtype class ("half": float16 / bfloat16, "fp32");
#: 128 x 256 x 64 on 8 warps with 3 stages is Triton's best-known bf16 GEMM tile on Hopper (48 KiB
#: a stage) and was the fastest of the candidates at 4096^3 and 8192^3 bf16 + bias + GELU on an H200
#: (with 4 stages, within 2 %); at 2048^3 (128 x 256 gives 128 programs, less than a wave) 128 x 128 x 64
#: on 8 warps with 3 stages was (0.033 ms; 4 stages 0.037); float32 halves BLOCK_K to keep a stage's bytes
CONFIGS = {
    "half_xl": _cfg(128, 256, 64, 8, 8, 3),
    "half_l": _cfg(128, 128, 64, 8, 8, 3),
    "half_m": _cfg(64, 128, 64, 8, 4, 4),
    "half_s": _cfg(64, 64, 64, 8, 4, 3),
    "fp32_xl": _cfg(128, 256, 32, 8, 8, 3),
    "fp32_l": _cfg(128, 128, 32, 8, 8, 3),
    "fp32_m": _cfg(64, 128, 32, 8, 4, 3),
    "fp32_s": _cfg(64, 64, 32, 8, 4, 3),
}
#: more shapes max-autotune measures (per class), after the ladder of CONFIGS
_EXTRA = {
    "half": [_cfg(128, 256, 64, 8, 8, 4), _cfg(256, 128, 64, 8, 8, 3), _cfg(128, 128, 64, 8, 8, 4),
             _cfg(128, 128, 64, 8, 4, 3)],
    "fp32": [_cfg(256, 128, 32, 8, 8, 3), _cfg(128, 128, 32, 8, 4, 4), _cfg(128, 64, 32, 8, 4, 4)],
}


def _class(dtype) -> str:
    return "fp32" if dtype == torch.float32 else "half"


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def check_config(config: dict) -> dict:
    """``config`` when it is a valid launch config (module doc), else ValueError."""
    need = set(_CONSTEXPRS[:4]) | {"num_warps", "num_stages"}
    if set(config) != need:
        raise ValueError(f"matmul config: keys {sorted(need)}, got {sorted(config)}")
    for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        v = config[k]
        if not isinstance(v, int) or v < 16 or v & (v - 1):
            raise ValueError(f"matmul config: {k} must be a power of two >= 16, got {v!r}")
    if not isinstance(config["GROUP_M"], int) or config["GROUP_M"] < 1:
        raise ValueError(f"matmul config: GROUP_M must be >= 1, got {config['GROUP_M']!r}")
    w = config["num_warps"]
    if not isinstance(w, int) or w < 1 or w > 16 or w & (w - 1):
        raise ValueError(f"matmul config: num_warps a power of two <= 16, got {w!r}")
    if not isinstance(config["num_stages"], int) or config["num_stages"] < 1:
        raise ValueError(f"matmul config: num_stages >= 1, got {config['num_stages']!r}")
    return config


def smem_bytes(config: dict, itemsize: int) -> int:
    """Shared memory of the pipeline: ``num_stages`` stages of an A block and a B block (§9.8)."""
    return config["num_stages"] * (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * itemsize


def _clamp(config, M, N, K) -> dict:
    """``config`` with blocks no larger than the problem needs (powers of two >= 16), and the
    stages at most the K loop's trip count."""
    c = dict(config)
    c["BLOCK_M"] = min(c["BLOCK_M"], max(16, _pow2(M)))
    c["BLOCK_N"] = min(c["BLOCK_N"], max(16, _pow2(N)))
    c["BLOCK_K"] = min(c["BLOCK_K"], max(16, _pow2(K)))
    c["num_stages"] = max(1, min(c["num_stages"], cdiv(max(K, 1), c["BLOCK_K"])))
    c["num_warps"] = min(c["num_warps"], max(1, c["BLOCK_M"] * c["BLOCK_N"] // 512))
    return c


def _tiles(c, M, N, batch=1) -> int:
    return batch * cdiv(M, c["BLOCK_M"]) * cdiv(N, c["BLOCK_N"])


def default_config(M: int, N: int, K: int, dtype=torch.bfloat16, batch: int = 1) -> dict:
    """The launch config of a problem: the largest tile of the dtype's ladder in :data:`CONFIGS`
    whose grid still gives every SM a program (``batch * tiles >= WAVE_SMS``; else the smallest),
    clamped to the problem (a skinny M or N gets a block of its size)."""
    ladder = [v for k, v in CONFIGS.items() if k.startswith(_class(dtype) + "_")]
    for c in ladder:
        c = _clamp(c, M, N, K)
        if _tiles(c, M, N, batch) >= WAVE_SMS:
            return c
    return _clamp(ladder[-1], M, N, K)


def candidate_configs(M: int, N: int, K: int, dtype=torch.bfloat16, batch: int = 1) -> list:
    """The configs max-autotune measures: the default first, then the dtype's ladder and a few more
    shapes, clamped to the problem, without repeats and within :data:`SMEM_BYTES`."""
    item = torch.empty((), dtype=dtype).element_size()
    cls = _class(dtype)
    out = []
    for c in [default_config(M, N, K, dtype, batch)] + [v for k, v in CONFIGS.items() if k.startswith(cls + "_")] \
            + _EXTRA[cls]:
        c = _clamp(c, M, N, K)
        if c not in out and smem_bytes(c, item) <= SMEM_BYTES:
            out.append(c)
    return out


def grouped_order(num_pid_m: int, num_pid_n: int, group_m: int) -> list:
    """The tile ``(pid_m, pid_n)`` of each program id, as the template numbers them (Prop. 9.4)."""
    out = []
    width = group_m * num_pid_n
    for pid in range(num_pid_m * num_pid_n):
        first = (pid // width) * group_m
        size = min(num_pid_m - first, group_m)
        out.append((first + (pid % width) % size, (pid % width) // size))
    return out


def panels_in_flight(order: list, w: int) -> int:
    """Input panels (A row panels + B column panels) the first ``w`` programs of ``order`` read."""
    head = order[:w]
    return len({m for m, _ in head}) + len({n for _, n in head})


# ------------------------------------------------------------------------------------------------
# the runner
# ------------------------------------------------------------------------------------------------

def tf32_enabled() -> bool:
    """Whether torch lets float32 matmuls use TF32 (what the template's ``tf32`` should follow)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def _unwrap(x):
    if isinstance(x, torch.Tensor):
        return x, False
    data = getattr(x, "_data", None)
    if isinstance(data, torch.Tensor):
        return data, True
    raise TypeError(f"matmul: a tensor, got {type(x).__name__}")


def _span(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s > 0)


def _final_dtype(steps, otherwise):
    """The output dtype an epilogue implies: its final cast's, else ``otherwise``."""
    return steps[-1].dtype if steps and steps[-1].kind == "cast" else otherwise


def _wrap_back(out, tp_in):
    if tp_in:
        import tensorplay as tp
        return tp.from_torch(out)
    return out


class _Runner:
    """What the GEMM and the epilogue-only kernels share: operand checks and strides, the
    kernel of each source variant, and the launch (runtime.Launcher on CUDA, ``kernel[grid]`` in
    the interpreter)."""

    def _init_steps(self, epilogue):
        self.epilogue = _as_steps(epilogue)
        self.operands = epilogue_operands(self.epilogue)

    def _operand_args(self, operands, M, N, Z, batched, device):
        if len(operands) != len(self.operands):
            raise ValueError(f"matmul: {len(self.operands)} epilogue operands "
                             f"({', '.join(e.operand for e in self.operands) or 'none'}), got {len(operands)}")
        ptrs, strides, tensors = [], [], []
        for e, t in zip(self.operands, operands):
            t, _ = _unwrap(t)
            if t.device != device:
                raise ValueError(f"matmul: operand {e.operand} on {t.device}, the GEMM on {device}")
            if e.kind == "bias":
                n = N if e.axis == 1 else M
                if t.dim() != 1 and not (t.dim() >= 1 and t.numel() == t.shape[-1]):
                    raise ValueError(f"matmul: bias {e.operand} must be a vector, got shape {tuple(t.shape)}")
                t = t.reshape(-1) if t.dim() != 1 else t
                if t.shape[0] not in (n, 1):
                    raise ValueError(f"matmul: bias {e.operand} along {'N' if e.axis == 1 else 'M'} needs "
                                     f"{n} values, got {t.shape[0]}")
                strides.append(t.stride(0) if t.shape[0] == n else 0)
            else:
                shape = (Z, M, N) if batched else (M, N)
                try:
                    v = torch.broadcast_to(t, shape)
                except RuntimeError:
                    raise ValueError(f"matmul: residual {e.operand} of shape {tuple(t.shape)} does not "
                                     f"broadcast to {shape}") from None
                st = v.stride()
                strides += [st[-2], st[-1]] + ([st[0]] if batched else [])
            ptrs.append(t)
            tensors.append(t)
        return ptrs, strides, tensors

    def _variant(self, key, make):
        """The loaded kernel of a source variant with its constexprs and launch options (made by
        ``make() -> (source, name, constexprs, options)`` once per key) and, on CUDA, its Launcher."""
        entry = self._variants.get(key)
        if entry is None:
            source, name, constexprs, options = make()
            interpret = key[-1]
            kernel = load_kernel(source, name, interpret=interpret)
            launch = None if interpret else Launcher(kernel, {**constexprs, **options}, constexprs=tuple(constexprs))
            entry = self._variants[key] = (kernel, constexprs, options, launch)
        return entry

    @staticmethod
    def _run(entry, grid, args):
        kernel, constexprs, options, launch = entry
        if launch is None:      # the interpreter
            kernel[grid](*args, **constexprs, **options)
        else:
            launch(list(grid), *args)     # (a list: this launch's grid, runtime.Launcher)


class MatmulKernel(_Runner):
    """``MatmulKernel(a_dtype, b_dtype, out_dtype, epilogue, prologue=None, tf32=False)(a, b,
    *operands, out=None, config=None)``: ``epilogue(prologue(a) @ b)`` by the template (module doc).
    ``a``: ``[M, K]`` or ``[Z, M, K]``, ``b``: ``[K, N]`` or ``[Z, K, N]`` (any strides; a 2-D one is
    shared by the batch); ``operands``: the epilogue's tensors in :func:`epilogue_operands` order;
    ``out``: a tensor to write (any strides; it may be the residual, read before it is written),
    else a new one of ``out_dtype`` (None: the dtype of a final cast step, else the operands'
    promoted dtype); ``config``: a launch config (None: :func:`default_config`).  CPU tensors run in
    Triton's interpreter.  torch tensors in and out (tensorplay tensors are unwrapped and wrapped
    back)."""

    def __init__(self, a_dtype, b_dtype, out_dtype=None, epilogue=(), prologue: Prologue | None = None,
                 tf32: bool = False):
        for dt in (a_dtype, b_dtype):
            if dt not in _FLOATS:
                raise ValueError(f"MatmulKernel: operands float16, bfloat16 or float32, got {dt}")
        self.a_dtype, self.b_dtype = a_dtype, b_dtype
        self._init_steps(epilogue)
        if prologue is not None and not isinstance(prologue, Prologue):
            prologue = Prologue(prologue)
        self.prologue = prologue
        if out_dtype is None:
            out_dtype = _final_dtype(self.epilogue, torch.promote_types(a_dtype, b_dtype))
        self.out_dtype = out_dtype
        self.tf32 = bool(tf32)
        self._variants = {}

    def source(self, config=None, *, K=None, batched=False, wide=False, interpret=False) -> str:
        """The kernel source of a variant (for reading and tests)."""
        config = config or default_config(64, 64, K or 64, self.a_dtype)
        return matmul_template(config, epilogue=self.epilogue, prologue=self.prologue, a_dtype=self.a_dtype,
                               b_dtype=self.b_dtype, tf32=self.tf32, even_k=bool(K and K % config["BLOCK_K"] == 0),
                               batched=batched, wide=wide, interpret=interpret)[0]

    def __call__(self, a, b, *operands, out=None, config=None):
        a, tp_in = _unwrap(a)
        b, _ = _unwrap(b)
        if a.dtype != self.a_dtype or b.dtype != self.b_dtype:
            raise ValueError(f"MatmulKernel for {self.a_dtype} @ {self.b_dtype}, got {a.dtype} @ {b.dtype}")
        if a.dim() not in (2, 3) or b.dim() not in (2, 3):
            raise ValueError(f"matmul: A and B of 2 or 3 dims, got {tuple(a.shape)} and {tuple(b.shape)}")
        if a.device != b.device:
            raise ValueError(f"matmul: A on {a.device}, B on {b.device}")
        M, K = a.shape[-2:]
        K2, N = b.shape[-2:]
        if K != K2:
            raise ValueError(f"matmul: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not agree in K")
        batched = a.dim() == 3 or b.dim() == 3
        Z = 1
        if batched:
            za, zb = (a.shape[0] if a.dim() == 3 else 1), (b.shape[0] if b.dim() == 3 else 1)
            if za != zb and 1 not in (za, zb):
                raise ValueError(f"matmul: batch sizes {za} and {zb} do not broadcast")
            Z = max(za, zb)
        shape = (Z, M, N) if batched else (M, N)
        if out is None:
            out = torch.empty(shape, dtype=self.out_dtype, device=a.device)
        else:
            out, _ = _unwrap(out)
            if tuple(out.shape) != shape or out.device != a.device:
                raise ValueError(f"matmul: out must be {shape} on {a.device}, got {tuple(out.shape)} on {out.device}")
        ptrs, ostrides, tensors = self._operand_args(operands, M, N, Z, batched, a.device)
        if out.numel() == 0:
            return _wrap_back(out, tp_in)
        config = check_config(config) if config is not None else default_config(M, N, K, self.a_dtype, Z)
        interpret = a.device.type == "cpu"
        wide = max(_span(t) for t in [a, b, out] + tensors) >= 2 ** 31 - 1
        even_k = K % config["BLOCK_K"] == 0
        # (on the GPU Triton specialises on the dtypes of the pointers: one variant, one Launcher, each)
        key = (tuple(config.items()), even_k, batched, wide, out.dtype, tuple(t.dtype for t in tensors), interpret)

        def make():
            source, name, constexprs = matmul_template(
                config, epilogue=self.epilogue, prologue=self.prologue, a_dtype=self.a_dtype, b_dtype=self.b_dtype,
                tf32=self.tf32, even_k=even_k, batched=batched, wide=wide, interpret=interpret)
            return source, name, constexprs, {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
        entry = self._variant(key, make)
        sa, sb, so = a.stride(), b.stride(), out.stride()
        args = [a, b, out, *ptrs, M, N, K, sa[-2], sa[-1], sb[-2], sb[-1], so[-2], so[-1]]
        if batched:
            args += [sa[0] if a.dim() == 3 and a.shape[0] > 1 else 0, sb[0] if b.dim() == 3 and b.shape[0] > 1 else 0,
                     so[0]]
        args += ostrides
        self._run(entry, (_tiles(config, M, N, Z),), args)
        return _wrap_back(out, tp_in)


class EpilogueKernel(_Runner):
    """``EpilogueKernel(epilogue, out_dtype=None)(c, *operands, out=None)``: the epilogue alone, one
    pointwise pass over a computed ``c`` ``[M, N]`` or ``[Z, M, N]`` (:func:`epilogue_template`) --
    the extern path's epilogue; ``out`` may be ``c`` itself (in place)."""

    BLOCK_M, BLOCK_N, WARPS = 32, 128, 4

    def __init__(self, epilogue=(), out_dtype=None):
        self._init_steps(epilogue)
        self.out_dtype = out_dtype
        self._variants = {}

    def __call__(self, c, *operands, out=None):
        c, tp_in = _unwrap(c)
        if c.dim() not in (2, 3):
            raise ValueError(f"epilogue kernel: C of 2 or 3 dims, got {tuple(c.shape)}")
        batched = c.dim() == 3
        M, N = c.shape[-2:]
        Z = c.shape[0] if batched else 1
        if out is None:
            out = torch.empty(c.shape, dtype=self.out_dtype or _final_dtype(self.epilogue, c.dtype), device=c.device)
        else:
            out, _ = _unwrap(out)
        ptrs, ostrides, tensors = self._operand_args(operands, M, N, Z, batched, c.device)
        if out.numel() == 0:
            return _wrap_back(out, tp_in)
        interpret = c.device.type == "cpu"
        wide = max(_span(t) for t in [c, out] + tensors) >= 2 ** 31 - 1
        bm, bn = min(self.BLOCK_M, max(16, _pow2(M))), min(self.BLOCK_N, max(16, _pow2(N)))
        key = (bm, bn, batched, wide, out.dtype, c.dtype, tuple(t.dtype for t in tensors), interpret)

        def make():
            source, name = epilogue_template(self.epilogue, batched=batched, wide=wide)
            return source, name, {"BLOCK_M": bm, "BLOCK_N": bn}, {"num_warps": self.WARPS, "num_stages": 1}
        entry = self._variant(key, make)
        sc, so = c.stride(), out.stride()
        args = [c, out, *ptrs, M, N, sc[-2], sc[-1], so[-2], so[-1]] + ([sc[0], so[0]] if batched else []) + ostrides
        self._run(entry, (Z * cdiv(M, bm) * cdiv(N, bn),), args)
        return _wrap_back(out, tp_in)


def apply_epilogue(c: torch.Tensor, epilogue, *operands, dtype=None) -> torch.Tensor:
    """The epilogue in torch (tests' references, in float64; eager's unfused form): ``c`` converted
    to ``dtype`` (None: c's), each step applied in that dtype, ``cast`` rounding through its dtype."""
    steps = _as_steps(epilogue)
    ops = epilogue_operands(steps)
    if len(operands) != len(ops):
        raise ValueError(f"apply_epilogue: {len(ops)} operands, got {len(operands)}")
    vals = {e.operand: _unwrap(t)[0] for e, t in zip(ops, operands)}
    dtype = dtype or c.dtype
    x = c.to(dtype)
    for e in steps:
        if e.kind == "bias":
            v = vals[e.operand].reshape(-1).to(dtype)
            x = x + (v if e.axis == 1 else v[:, None])
        elif e.kind == "residual":
            x = x + vals[e.operand].to(dtype)
        elif e.kind == "activation":
            x = _TORCH_ACTIVATIONS[e.fn](x)
        elif e.kind == "scale":
            x = x * e.alpha
        else:
            x = x.to(e.dtype).to(dtype)
    return x


# ------------------------------------------------------------------------------------------------
# the choice against the extern
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Machine:
    """What the default choice rule knows of a GPU: SMs, HBM bandwidth (bytes/s) and the dense peak
    FLOP/s per input precision (``"half"``: fp16/bf16 tensor cores, ``"tf32"``, ``"fp32"``: FMA)."""
    name: str
    sms: int
    bandwidth: float
    peak: dict


#: H100 SXM and H200 (the same SMs and peaks; the H200's HBM3e is faster)
MACHINES = {
    "H100": Machine("H100", 132, 3.35e12, {"half": 989e12, "tf32": 494e12, "fp32": 67e12}),
    "H200": Machine("H200", 132, 4.8e12, {"half": 989e12, "tf32": 494e12, "fp32": 67e12}),
}
#: the template's time over cuBLAS's on the bare GEMM that the rule charges: tensor cores, measured on
#: an H200 (benchmarks/matmul_epilogue.py), 13 % at 4096^3 and 1.5 % at 8192^3 bf16; float32 FMA dots
#: about half as fast (not measured here: a lead)
TEMPLATE_DEFICIT = {"half": 0.15, "tf32": 0.15, "fp32": 0.5}
#: the kinds that make fusion worth a template (module doc, rule (1))
_WORTH = {"bias", "residual", "activation"}


def _precision(dtype, tf32) -> str:
    if dtype == torch.float32:
        return "tf32" if tf32 else "fp32"
    return "half"


def choice_terms(M: int, N: int, K: int, dtype, epilogue, *, batch: int = 1, out_dtype=None, tf32: bool = False,
                 machine: Machine | str = "H100") -> dict:
    """The quantities of the default rule (module doc): ``worth`` (1), ``tiles`` and ``sms`` (2),
    ``saved_bytes``, ``t_saved``, ``t_gemm``, ``deficit`` (3), ``k_max`` (the compute-bound bound of
    (3)) and ``choice``."""
    mach = MACHINES[machine] if isinstance(machine, str) else machine
    steps = _as_steps(epilogue)
    s_in = torch.empty((), dtype=dtype).element_size()
    s_out = torch.empty((), dtype=out_dtype or dtype).element_size()
    prec = _precision(dtype, tf32)
    peak, eps = mach.peak[prec], TEMPLATE_DEFICIT[prec]
    worth = any(e.kind in _WORTH for e in steps)
    tiles = _tiles(default_config(M, N, K, dtype, batch), M, N, batch)
    saved = 2 * batch * M * N * s_out
    gemm_bytes = batch * (M * K + K * N) * s_in + batch * M * N * s_out
    t_gemm = max(2 * batch * M * N * K / peak, gemm_bytes / mach.bandwidth)
    t_saved = saved / mach.bandwidth
    ok = worth and tiles >= mach.sms and t_saved >= eps * t_gemm
    return {"worth": worth, "tiles": tiles, "sms": mach.sms, "saved_bytes": saved, "t_saved": t_saved,
            "t_gemm": t_gemm, "deficit": eps, "k_max": s_out * peak / mach.bandwidth / eps,
            "choice": "template" if ok else "extern"}


def choose(M: int, N: int, K: int, dtype, epilogue, *, autotune: bool = False, measure=None, batch: int = 1,
           out_dtype=None, tf32: bool = False, machine: Machine | str = "H100", device=None) -> str:
    """``"template"`` or ``"extern"`` for a GEMM ``[M, K] @ [K, N]`` of ``dtype`` with ``epilogue``:
    by default the rule of the module doc (:func:`choice_terms`); under ``autotune`` by measurement
    (:func:`tune`, ``measure(fn) -> seconds``; ``device``: where to measure)."""
    if not autotune:
        return choice_terms(M, N, K, dtype, epilogue, batch=batch, out_dtype=out_dtype, tf32=tf32,
                            machine=machine)["choice"]
    return tune(M, N, K, dtype, epilogue, measure=measure, batch=batch, out_dtype=out_dtype, tf32=tf32,
                device=device)["choice"]


def _example_operands(ops, M, N, batch, dtype, device, gen):
    out = []
    for e in ops:
        if e.kind == "bias":
            out.append(torch.randn(N if e.axis == 1 else M, generator=gen).to(device=device, dtype=dtype))
        else:
            shape = (batch, M, N) if batch > 1 else (M, N)
            out.append(torch.randn(shape, generator=gen).to(device=device, dtype=dtype))
    return out


def tune(M: int, N: int, K: int, dtype, epilogue, *, measure=None, batch: int = 1, out_dtype=None,
         tf32: bool = False, device=None, configs=None) -> dict:
    """Measure the template at each of ``configs`` (default :func:`candidate_configs`) and the extern
    (``torch.matmul`` then :class:`EpilogueKernel`; no epilogue: ``torch.matmul`` alone) on random
    inputs on ``device`` (default: CUDA when there is one) with ``measure(fn) -> seconds`` (default
    autotune.time_launch).  Each ``fn`` has attributes ``choice`` and ``config`` (None for the
    extern).  Returns ``{"choice", "config" (the template's best), "times": [(label, config,
    seconds)]}``; a config whose run raises costs ``inf``."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if measure is None:
        from .autotune import time_launch

        def measure(fn):
            return time_launch(fn, device=device)
    steps = _as_steps(epilogue)
    gen = torch.Generator().manual_seed(0)
    shape_a = (batch, M, K) if batch > 1 else (M, K)
    a = torch.randn(shape_a, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(K, N, generator=gen).to(device=device, dtype=dtype)
    ops = _example_operands(epilogue_operands(steps), M, N, batch, dtype, device, gen)
    kernel = MatmulKernel(dtype, dtype, out_dtype or dtype, steps, tf32=tf32)
    out = torch.empty((batch, M, N) if batch > 1 else (M, N), dtype=out_dtype or dtype, device=device)
    times = []

    def timed(label, config, fn):
        fn.choice, fn.config = label, config
        try:
            t = float(measure(fn))
        except Exception:  # noqa: BLE001 -- out of resources, a compile error: never chosen
            t = math.inf
        times.append((label, config, t))
        return t

    for c in configs or candidate_configs(M, N, K, dtype, batch):
        timed("template", c, lambda c=c: kernel(a, b, *ops, out=out, config=c))
    epi = EpilogueKernel(steps, out_dtype or dtype)
    def extern():
        if steps:
            return epi(torch.matmul(a, b), *ops, out=out)
        return torch.matmul(a, b, out=out) if out.dtype == dtype else out.copy_(torch.matmul(a, b))
    t_extern = timed("extern", None, extern)
    best = min((t for t in times if t[0] == "template"), key=lambda t: t[2])
    choice = "template" if best[2] < t_extern else "extern"
    return {"choice": choice, "config": best[1], "times": times}
