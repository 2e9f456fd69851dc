"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and their single-step cells ``RNNCell``,
``LSTMCell``, ``GRUCell``, with PyTorch's signatures, defaults and parameter names.

Per layer ``k`` and direction (suffix ``""`` or ``"_reverse"``) a layer holds ``weight_ih_l{k}``
``(G·H, I_k)``, ``weight_hh_l{k}`` ``(G·H, H_out)``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` ``(G·H)``
and, for an LSTM with ``proj_size > 0``, ``weight_hr_l{k}`` ``(proj_size, H)``; G is 1 (RNN), 4
(LSTM: gates i, f, g, o) or 3 (GRU: r, z, n).  Every parameter starts as U(-1/√H, 1/√H).  One step::

    RNN:  h' = act(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh)                   act = tanh or relu
    LSTM: i, f, g, o = σ, σ, tanh, σ of (x W_ihᵀ + b_ih + h W_hhᵀ + b_hh)
          c' = f c + i g      h' = o tanh(c')      (h' = h' W_hrᵀ with proj_size)
    GRU:  r, z = σ(x W_ir,zᵀ + b_ir,z + h W_hr,zᵀ + b_hr,z)
          n = tanh(x W_inᵀ + b_in + r (h W_hnᵀ + b_hn))      h' = (1 - z) n + z h

Guarantees: the recurrence is a Python loop over time steps of tp ops (one input projection per
layer and direction for the whole sequence, then per step one matmul and the pointwise gates), so
autograd differentiates it and ``tp.compile`` captures it (the gates of a step fuse into one
kernel); results equal PyTorch's modules with the same weights to float rounding.  Inputs are
``(T, B, I)``, ``(B, T, I)`` with ``batch_first``, unbatched ``(T, I)`` or a ``PackedSequence``
(``nn.utils.rnn``); ``h0``/``c0`` default to zeros; ``dropout`` applies to the outputs of every
layer but the last, in training mode only.  Wrong input or state shapes raise ``RuntimeError``
naming the module and both shapes.
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

from .. import functional as F
from .. import init
from ... import ops as _ops
from ..._tensor import Tensor
from ..parameter import Parameter
from ..utils.rnn import PackedSequence
from .module import Module

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


# ---------------------------------------------------------------------------------------------
# one time step: (projected input x W_ihᵀ + b_ih, state) -> new state (a tuple: (h,) or (h, c))
# ---------------------------------------------------------------------------------------------
def _simple_step(act):
    def step(xw, state, w_hh, b_hh, w_hr):
        return (act(F.linear(state[0], w_hh, b_hh) + xw),)
    return step


def _lstm_step(xw, state, w_hh, b_hh, w_hr):
    h, c = state
    # gate by gate (each a slice of both projections): the adds fuse into the gates' kernel
    i, f, g, o = (a + b for a, b in zip(F.linear(h, w_hh, b_hh).chunk(4, 1), xw.chunk(4, 1)))
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    h = o.sigmoid() * c.tanh()
    if w_hr is not None:
        h = F.linear(h, w_hr)
    return h, c


def _gru_step(xw, state, w_hh, b_hh, w_hr):
    h = state[0]
    xr, xz, xn = xw.chunk(3, 1)
    hr, hz, hn = F.linear(h, w_hh, b_hh).chunk(3, 1)
    r = (hr + xr).sigmoid()
    z = (hz + xz).sigmoid()
    n = (xn + hn * r).tanh()
    return ((h - n) * z + n,)


_STEPS = {"RNN_TANH": _simple_step(_ops.tanh), "RNN_RELU": _simple_step(_ops.relu), "LSTM": _lstm_step,
          "GRU": _gru_step}


def _run_padded(step, xw, state, w, reverse):
    """One layer and direction over a padded ``xw`` (T, B, G·H): (outputs (T, B, H_out), last state)."""
    T = xw.shape[0]
    outs = [None] * T
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        state = step(xw[t], state, *w)
        outs[t] = state[0]
    return _ops.stack(outs, 0), state


def _run_packed(step, xw, state, w, reverse, sizes):
    """One layer and direction over packed rows ``xw`` (N, G·H) with ``batch_sizes`` ``sizes``: the
    batch shrinks as sequences end (their last state is kept) — or, in reverse, grows as they begin."""
    offsets = [0]
    for bs in sizes:
        offsets.append(offsets[-1] + bs)
    outs = [None] * len(sizes)
    if not reverse:
        done = []
        for t, bs in enumerate(sizes):
            if bs < state[0].shape[0]:
                done.append(tuple(s[bs:] for s in state))
                state = tuple(s[:bs] for s in state)
            state = step(xw[offsets[t]:offsets[t + 1]], state, *w)
            outs[t] = state[0]
        state = tuple(_ops.cat([state[i]] + [d[i] for d in reversed(done)], 0) if done else state[i]
                      for i in range(len(state)))
    else:
        full = state
        state = tuple(s[:sizes[-1]] for s in full)
        for t in range(len(sizes) - 1, -1, -1):
            bs, cur = sizes[t], state[0].shape[0]
            if bs > cur:
                state = tuple(_ops.cat([s, f[cur:bs]], 0) for s, f in zip(state, full))
            state = step(xw[offsets[t]:offsets[t + 1]], state, *w)
            outs[t] = state[0]
    return _ops.cat(outs, 0), state


def _reset_uniform(module) -> None:
    """Every parameter ~ U(-1/√H, 1/√H), drawn in registration order (PyTorch's rule and order)."""
    stdv = 1.0 / math.sqrt(module.hidden_size) if module.hidden_size > 0 else 0
    for weight in module.parameters():
        init.uniform_(weight, -stdv, stdv)


def _apply_permutation(t, permutation, dim=1):
    return t if permutation is None else _ops.index_select(t, dim, permutation)


class RNNBase(Module):
    """The multi-layer recurrent network shared by ``RNN``, ``LSTM`` and ``GRU`` (``mode`` is
    ``"RNN_TANH"``, ``"RNN_RELU"``, ``"LSTM"`` or ``"GRU"``)."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None):
        super().__init__()
        name = self._name_for(mode)
        if mode not in _GATES:
            raise ValueError(f"nn.RNNBase: unrecognized RNN mode {mode!r}")
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool) or not 0 <= dropout <= 1):
            raise ValueError(f"nn.{name}: dropout should be a number in range [0, 1] representing the probability "
                             f"of an element being zeroed, got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"nn.{name}: dropout option adds dropout after all but last recurrent layer, so non-zero "
                          f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", UserWarning, stacklevel=2)
        for what, v, low in (("hidden_size", hidden_size, 1), ("num_layers", num_layers, 1)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"nn.{name}: {what} should be of type int, got: {type(v).__name__}")
            if v < low:
                raise ValueError(f"nn.{name}: {what} must be greater than 0, got {v}")
        if proj_size < 0:
            raise ValueError(f"nn.{name}: proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError(f"nn.{name}: proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError(f"nn.{name}: proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        num_directions = 2 if bidirectional else 1
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        fk = dict(device=device, dtype=dtype)
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_in = input_size if layer == 0 else real_hidden * num_directions
                suffix = "_reverse" if direction == 1 else ""
                shapes = [("weight_ih", (gate_size, layer_in)), ("weight_hh", (gate_size, real_hidden))]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes.append(("weight_hr", (proj_size, hidden_size)))
                names = []
                for kind, shape in shapes:
                    pname = f"{kind}_l{layer}{suffix}"
                    setattr(self, pname, Parameter(torch.empty(shape, **fk)))
                    names.append(pname)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    @staticmethod
    def _name_for(mode):
        return {"LSTM": "LSTM", "GRU": "GRU"}.get(mode, "RNN")

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """Kept for ported code: the weights are always used as they are (nothing to flatten)."""

    def reset_parameters(self) -> None:
        _reset_uniform(self)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # ---- checks ----------------------------------------------------------------------------------
    def _state_shapes(self, batch):
        d = 2 if self.bidirectional else 1
        h = (self.num_layers * d, batch, self.proj_size or self.hidden_size)
        return [h, (self.num_layers * d, batch, self.hidden_size)] if self.mode == "LSTM" else [h]

    def _check_input(self, input, batched):
        name = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"nn.{name}: input must be a tp.Tensor or a PackedSequence, got {type(input).__name__}")
        if batched is not None and input.dim() != (3 if batched else 2):
            raise RuntimeError(f"nn.{name}: input must have {3 if batched else 2} dimensions, got {input.dim()}")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"nn.{name}: input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")
        w = self.weight_ih_l0
        if input.dtype != w.dtype:
            raise RuntimeError(f"nn.{name}: input must have the type {w.dtype}, got type {input.dtype}")

    def _check_state(self, hx, batch):
        name = type(self).__name__
        states = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
        shapes = self._state_shapes(batch)
        if len(states) != len(shapes) or not all(isinstance(s, Tensor) for s in states):
            raise RuntimeError(f"nn.{name}: expected hx to be {'a tuple (h_0, c_0) of' if len(shapes) == 2 else 'a'} "
                               f"tensor{'s' if len(shapes) == 2 else ''}, got {type(hx).__name__}")
        for i, (s, shape) in enumerate(zip(states, shapes)):
            if tuple(s.shape) != shape:
                what = f"hidden[{i}]" if len(shapes) == 2 else "hidden"
                raise RuntimeError(f"nn.{name}: Expected {what} size {shape}, got {list(s.shape)}")
        return states

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, input, hx=None):
        name = type(self).__name__
        sorted_idx = unsorted_idx = None
        packed = isinstance(input, PackedSequence)
        unbatched = False
        if packed:
            data, batch_sizes, sorted_idx, unsorted_idx = input
            self._check_input(data, None)
            sizes = batch_sizes.tolist()
            batch = sizes[0] if sizes else 0
            x = data
        else:
            self._check_input(input, None)
            if input.dim() not in (2, 3):
                raise ValueError(f"nn.{name}: Expected input to be 2D or 3D, got {input.dim()}D instead")
            unbatched = input.dim() == 2
            if input.shape[1 if self.batch_first and not unbatched else 0] == 0:
                raise RuntimeError(f"nn.{name}: Expected sequence length to be larger than 0 in RNN, got input of "
                                   f"shape {list(input.shape)}")
            x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
            batch = x.shape[1]
        if hx is None:
            states = tuple(_ops.zeros(list(s), dtype=x.dtype, device=x.device) for s in self._state_shapes(batch))
        else:
            if unbatched:
                hs = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
                if any(isinstance(h, Tensor) and h.dim() != 2 for h in hs):
                    raise RuntimeError(f"nn.{name}: For unbatched 2-D input, hx should also be 2-D but got "
                                       f"{', '.join(f'{h.dim()}-D' for h in hs)} tensor")
                hx = tuple(h.unsqueeze(1) for h in hs) if isinstance(hx, (tuple, list)) else hx.unsqueeze(1)
            elif not packed:
                hs = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
                if any(isinstance(h, Tensor) and h.dim() != 3 for h in hs):
                    raise RuntimeError(f"nn.{name}: For batched 3-D input, hx should also be 3-D but got "
                                       f"{', '.join(f'{h.dim()}-D' for h in hs)} tensor")
            states = tuple(_apply_permutation(s, sorted_idx) for s in self._check_state(hx, batch))
        out, finals = self._layers(x, states, sizes if packed else None)
        finals = tuple(_apply_permutation(f, unsorted_idx) for f in finals)
        if packed:
            output = PackedSequence(out, batch_sizes, sorted_idx, unsorted_idx)
        elif unbatched:
            output = out.squeeze(1)
            finals = tuple(f.squeeze(1) for f in finals)
        else:
            output = out.transpose(0, 1) if self.batch_first else out
        return output, (finals if self.mode == "LSTM" else finals[0])

    def _layers(self, x, states, sizes):
        """Every layer and direction over ``x`` ((T, B, I) padded, or packed rows with ``sizes``)."""
        step = _STEPS[self.mode]
        d = 2 if self.bidirectional else 1
        finals = [[] for _ in states]
        for layer in range(self.num_layers):
            outs = []
            for direction in range(d):
                p = {n.rsplit("_l", 1)[0]: getattr(self, n) for n in self._all_weights[layer * d + direction]}
                xw = F.linear(x, p["weight_ih"], p.get("bias_ih"))
                state = tuple(s[layer * d + direction] for s in states)
                w = (p["weight_hh"], p.get("bias_hh"), p.get("weight_hr"))
                if sizes is None:
                    out, state = _run_padded(step, xw, state, w, direction == 1)
                else:
                    out, state = _run_packed(step, xw, state, w, direction == 1, sizes)
                outs.append(out)
                for f, s in zip(finals, state):
                    f.append(s)
            x = outs[0] if d == 1 else _ops.cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        return x, tuple(_ops.stack(f, 0) for f in finals)


class RNN(RNNBase):
    """Elman RNN: ``RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
    batch_first=False, dropout=0.0, bidirectional=False)``; returns ``(output, h_n)``."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("nn.RNN: proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            nonlinearity, args = args[3], args[:3] + args[4:]
        else:
            nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"nn.RNN: Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__(mode, *args, **kwargs)


class LSTM(RNNBase):
    """``LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0)``; returns ``(output, (h_n, c_n))``."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """``GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False)``; returns ``(output, h_n)``."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("nn.GRU: proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# cells: one time step, parameters weight_ih, weight_hh, bias_ih, bias_hh
# ---------------------------------------------------------------------------------------------
class RNNCellBase(Module):
    """The parameters and checks shared by the three cells (``num_chunks`` gates)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        fk = dict(device=device, dtype=dtype)
        self.weight_ih = Parameter(torch.empty((num_chunks * hidden_size, input_size), **fk))
        self.weight_hh = Parameter(torch.empty((num_chunks * hidden_size, hidden_size), **fk))
        if bias:
            self.bias_ih = Parameter(torch.empty(num_chunks * hidden_size, **fk))
            self.bias_hh = Parameter(torch.empty(num_chunks * hidden_size, **fk))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_uniform(self)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _cell(self, mode, input, hx, n_states):
        name = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"nn.{name}: input must be a tp.Tensor, got {type(input).__name__}")
        if input.dim() not in (1, 2):
            raise ValueError(f"nn.{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"nn.{name}: input has inconsistent input_size: got {input.shape[-1]} expected "
                               f"{self.input_size}")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        shape = (x.shape[0], self.hidden_size)
        if hx is None:
            states = tuple(_ops.zeros(list(shape), dtype=x.dtype, device=x.device) for _ in range(n_states))
        else:
            states = tuple(hx) if n_states == 2 else (hx,)
            if len(states) != n_states:
                raise RuntimeError(f"nn.{name}: expected hx to be a tuple (h_0, c_0), got {len(states)} tensors")
            for i, s in enumerate(states):
                if s.dim() != input.dim():
                    raise ValueError(f"nn.{name}: Expected hidden{f'[{i}]' if n_states == 2 else ''} to be "
                                     f"{input.dim()}D for {input.dim()}D input, got {s.dim()}D instead")
            states = tuple(s if batched else s.unsqueeze(0) for s in states)
            for i, s in enumerate(states):
                if tuple(s.shape) != shape:
                    raise RuntimeError(f"nn.{name}: Expected hidden{f'[{i}]' if n_states == 2 else ''} size "
                                       f"{shape if batched else shape[1:]}, got "
                                       f"{list(s.shape if batched else s.shape[1:])}")
        xw = F.linear(x, self.weight_ih, self.bias_ih)
        out = _STEPS[mode](xw, states, self.weight_hh, self.bias_hh, None)
        if not batched:
            out = tuple(o.squeeze(0) for o in out)
        return out if n_states == 2 else out[0]


class RNNCell(RNNCellBase):
    """``RNNCell(input_size, hidden_size, bias=True, nonlinearity='tanh')``: ``h' = act(x W_ihᵀ + b_ih +
    h W_hhᵀ + b_hh)``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nn.RNNCell: Unknown nonlinearity: {nonlinearity}. Select from 'tanh' or 'relu'.")
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        return self._cell("RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU", input, hx, 1)


class LSTMCell(RNNCellBase):
    """``LSTMCell(input_size, hidden_size, bias=True)``: returns ``(h', c')``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        return self._cell("LSTM", input, hx, 2)


class GRUCell(RNNCellBase):
    """``GRUCell(input_size, hidden_size, bias=True)``: returns ``h'``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        return self._cell("GRU", input, hx, 1)
