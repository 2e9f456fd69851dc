"""Launch-configuration autotuning for Stax's Triton kernels (chapter §9.6–9.7, table 11.1, exercise 52).

**The search model (§9.6).**  A Triton kernel is generated once; how it is *launched* is a separate
choice: a *launch config* is a dict of ints, e.g. ``{"XBLOCK": 128, "RBLOCK": 64, "num_warps": 4,
"num_stages": 1}``.  The caller gives the *space* ``Π``: ``{name: sorted list of allowed values}``
(a value held fixed is a one-element list) and, optionally, a validity predicate ``valid(config)``
(``XBLOCK * RBLOCK <= max elements``, ``num_warps * 32 <= XBLOCK * RBLOCK``, ...).  The cost
``t(c)`` of a config is only known by running it -- ``measure(config) -> seconds``, normally
:func:`time_launch` of one launch -- so choosing a config is black-box optimisation over a finite
grid.  A config whose measurement raises (Triton out of resources, a compile error) costs
``t = +inf``: it is recorded and never chosen, and the search goes on.  Within one search every
config is measured at most once (memoised), so a noisy ``measure`` cannot make the search cycle.

**Coordinate descent (Alg. 9.2, Prop. 9.2)** -- :func:`coordinate_descent`.  From the heuristic's
config ``x``, for each coordinate in turn, measure its neighbours (one step up and one step down in
its list; with ``doubling=True`` also the values ×2 and ÷2 when the list has them) and move to the
best one while it improves the time by more than the relative noise threshold
:data:`NOISE_THRESHOLD` ``ε`` (``t(y) < (1 - ε) t(x)``); repeat the rounds until none moves.  Each
move lowers ``t`` by a factor ``1 - ε`` on a finite grid, so it ends; where it ends, *no valid
single-coordinate neighbour is faster by more than ε* -- a local optimum (Prop. 9.2), not in general
a global one.  On a *separable convex* cost (a sum of convex functions of one coordinate each)
the local optimum is global.  Exercise 24 and exercise 52 (2) construct costs where it is not: a
start whose neighbours are all slower (they spill, or fail) stops the descent there, however slow
it is among all configs (test/stax/test_autotune.py builds one in the slowest 1%).

**Random search (Prop. 9.3)** -- :func:`random_search`.  Measure ``N = ceil(log δ / log(1 - q))``
valid configs drawn uniformly (:func:`samples_needed`; ``q = δ = 0.01`` gives 459, exercise 52
(1)).  The chance that none of them lies in the best ``q``-quantile of the valid configs is
``(1 - q)^N <= δ``: with probability at least ``1 - δ`` the best sample is in the best ``q``-quantile,
whatever the cost function.  Sampling is without repetition (a small space is enumerated and a
subset drawn, a large one is sampled with rejection of repeats and of invalid configs); a subset
drawn without replacement misses the quantile with probability at most the binomial ``(1 - q)^N``, so
the guarantee stands; a space of at most ``N`` valid configs is measured whole (the exact optimum).
The guarantee is about the *measured* times: with noisy readings it holds for ``t + noise``
(exercise 52 (3)); :func:`time_launch`'s median of repeats keeps the noise small.

**Both** (``method="both"``, what ``max-autotune`` asks for: :func:`method_for_options`): random
search (with the heuristic's config among the candidates), then coordinate descent from its winner
-- the quantile guarantee of Prop. 9.3 and a local optimum of Prop. 9.2 at once, sharing one memo.

**The cache** -- :func:`autotune`.  A tuned config is a pure function of the kernel, the device and
the argument sizes, so its measurements are memoised on disk like compiled code (§11.1, Def. 11.1):
:func:`tuning_key` hashes the kernel source, Triton's version, the device (name and capability:
:func:`device_description`) and the sizes; the entry's folder is
``codecache.entry_dir(h(key, space, start, method, search parameters))`` and holds
``autotune.json`` (the winner, its time and every measurement; written atomically with
codecache's helpers, under its file lock, so concurrent processes tune a key once).  A new process
finds it and measures nothing.  The validity predicate is a function and is not hashed: the key
must determine it (it follows from the kernel and the device, both keyed).  A search whose every
config failed (``t = inf``) is returned but not stored.  Progress: a tqdm bar of configs measured
while :func:`autotune` measures, on stderr, under the compile bar's knobs (``stax.compile_progress``:
``auto`` on a terminal, ``1`` always, ``0`` never; it appears after ``stax.compile_progress_delay_s``).

**Timing** -- :func:`time_launch`: on CUDA, CUDA events on the current stream around ``rep``
launches, the median over ``repeats`` (L2 optionally flushed between repeats); on the CPU
(TRITON_INTERPRET=1, tests) ``time.perf_counter``.  Seconds per launch; an exception is ``inf``.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import random
import statistics
import sys
import time
from typing import Callable, Iterable, NamedTuple

from .... import config as _config
from .. import codecache

__all__ = ["Tuned", "NOISE_THRESHOLD", "samples_needed", "coordinate_descent", "random_search", "autotune",
           "tuning_key", "device_description", "method_for_options", "time_launch", "launch_timer"]

log = logging.getLogger(__name__)

#: Coordinate descent moves only for a time better by more than this fraction (medians of GPU
#: launches differ by about half a percent between repeats; a smaller gain is noise, not a better config).
NOISE_THRESHOLD = 0.01
#: Bound on the rounds of coordinate descent (a round visits every coordinate; it ends far sooner).
MAX_ROUNDS = 32
#: Random search enumerates the valid configs of a space of at most this many points (else it samples).
ENUMERATE_MAX = 1 << 16
#: Random search on a large space gives up after this many draws per sample wanted (a predicate
#: that rejects nearly everything); it then measures the configs it found.
DRAWS_PER_SAMPLE = 64
#: :func:`time_launch`'s defaults: launches before timing, launches per timed repeat, timed repeats.
WARMUP, REP, REPEATS = 3, 20, 5
#: Part of every entry's key and of its JSON (bumped when either changes meaning).
TUNE_VERSION = "stax-autotune-1"
METHODS = ("coordinate", "random", "both")

Config = dict
Space = dict


class Tuned(NamedTuple):
    """A search's result: the chosen config, its time (seconds) and every measurement made, in order
    (``(config, seconds)``; ``inf`` for a config that failed)."""
    config: dict
    seconds: float
    measurements: list


# --------------------------------------------------------------------------------------------
# the space and the measurements
# --------------------------------------------------------------------------------------------

def _check_space(space: Space) -> dict:
    out = {}
    for name, values in space.items():
        vals = list(values)
        if not vals or any(not isinstance(v, int) or isinstance(v, bool) for v in vals) \
                or any(a >= b for a, b in zip(vals, vals[1:])):
            raise ValueError(f"autotune: the values of {name!r} must be a non-empty increasing list of ints, "
                             f"got {values!r}")
        out[name] = vals
    return out


def _check_start(start: Config, space: dict, valid) -> dict:
    if set(start) != set(space):
        raise ValueError(f"autotune: the start config names {sorted(start)}, the space {sorted(space)} "
                         f"(a fixed value is a one-element list)")
    x = {n: start[n] for n in space}           # the space's order: the memo's key is the values in order
    bad = [n for n in space if x[n] not in space[n]]
    if bad:
        raise ValueError(f"autotune: start {x} has values outside the space for {bad}")
    if valid is not None and not valid(dict(x)):
        raise ValueError(f"autotune: start {x} is not a valid config")
    return x


class _Measurer:
    """``measure`` memoised within one search: a failure counts as ``inf``; every new measurement is
    logged (and ticks the progress bar, if there is one)."""

    def __init__(self, measure: Callable[[dict], float], bar=None):
        self.measure, self.bar = measure, bar
        self.memo: dict = {}
        self.log: list = []

    def __call__(self, config: dict) -> float:
        k = tuple(config.values())
        t = self.memo.get(k)
        if t is None:
            try:
                t = float(self.measure(dict(config)))
            except Exception as e:          # out of resources, a compile error...: this config is out
                log.debug("autotune: %s failed: %s: %s", config, type(e).__name__, e)
                t = math.inf
            if math.isnan(t):
                t = math.inf
            self.memo[k] = t
            self.log.append((dict(config), t))
            if self.bar is not None:
                if self.bar.total is not None and self.bar.n >= self.bar.total:
                    self.bar.total = self.bar.n + 1     # the descent after a random search: open-ended
                self.bar.update(1)
        return t

    def best(self) -> tuple:
        """The fastest config measured (the first of equals) and its time."""
        c, t = min(self.log, key=lambda e: e[1])
        return dict(c), t


def _measurer(measure) -> _Measurer:
    return measure if isinstance(measure, _Measurer) else _Measurer(measure)


# --------------------------------------------------------------------------------------------
# coordinate descent (Alg. 9.2)
# --------------------------------------------------------------------------------------------

def _neighbours(x: dict, name: str, values: list, doubling: bool) -> list:
    """The configs one step from ``x`` along ``name``: the adjacent values of its list (and ×2, ÷2)."""
    v = x[name]
    i = values.index(v)
    cand = {values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)}
    if doubling:
        cand |= {w for w in (2 * v, v // 2 if v % 2 == 0 else None) if w in values}
    cand.discard(v)
    return [{**x, name: w} for w in sorted(cand)]


def _descend(m: _Measurer, x: dict, space: dict, valid, max_rounds: int, doubling: bool,
             threshold: float) -> tuple:
    t = m(x)
    for _ in range(max_rounds):
        moved = False
        for name, values in space.items():
            while True:                         # a line search along this coordinate
                trials = [(m(y), y) for y in _neighbours(x, name, values, doubling)
                          if valid is None or valid(dict(y))]
                if not trials:
                    break
                ty, y = min(trials, key=lambda e: e[0])
                if not ty < t * (1 - threshold):
                    break
                x, t, moved = y, ty, True
        if not moved:
            return x, t
    log.debug("autotune: coordinate descent stopped after %d rounds at %s (not a proven local optimum)",
              max_rounds, x)
    return x, t


def coordinate_descent(start: Config, space: Space, measure: Callable[[dict], float], valid=None,
                       max_rounds: int = MAX_ROUNDS, *, doubling: bool = False,
                       threshold: float = NOISE_THRESHOLD) -> Tuned:
    """Alg. 9.2: from ``start``, move along one coordinate at a time to the best neighbouring value
    (one step up or down in its list; ``doubling``: also ×2 and ÷2) while that is faster by more than
    ``threshold`` (relative); rounds over all coordinates until none moves (at most ``max_rounds``).

    Returns :class:`Tuned`: the config where it stopped, its time and every measurement made.  When it
    stops by itself the config is a local optimum (Prop. 9.2): no valid single-step neighbour is faster
    by more than ``threshold``.  Invalid neighbours (``valid(config)`` false) are not measured; a
    neighbour whose ``measure`` raises costs ``inf``.  ``start`` must be in the space and valid.
    """
    space = _check_space(space)
    x = _check_start(start, space, valid)
    m = _measurer(measure)
    x, t = _descend(m, x, space, valid, max_rounds, doubling, threshold)
    return Tuned(dict(x), t, list(m.log))


# --------------------------------------------------------------------------------------------
# random search (Prop. 9.3)
# --------------------------------------------------------------------------------------------

def samples_needed(q: float, delta: float) -> int:
    """Prop. 9.3: the least ``N`` with ``(1 - q)^N <= delta``, i.e. ``ceil(log delta / log(1 - q))``:
    ``N`` uniform samples hold one of the best ``q``-quantile with probability ``>= 1 - delta``."""
    if not (0 < q < 1 and 0 < delta < 1):
        raise ValueError(f"random search needs 0 < q < 1 and 0 < delta < 1, got q={q}, delta={delta}")
    n = max(1, math.ceil(math.log(delta) / math.log1p(-q) - 1e-9))   # (no float noise above an integer)
    while (1 - q) ** n > delta:
        n += 1
    return n


def _rng(rng) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


def _sample(space: dict, n: int, valid, rng: random.Random) -> list:
    """``n`` distinct valid configs, uniform (all of them when there are at most ``n``)."""
    names = list(space)
    if math.prod(len(v) for v in space.values()) <= ENUMERATE_MAX:
        every = [c for c in (dict(zip(names, vals)) for vals in itertools.product(*space.values()))
                 if valid is None or valid(dict(c))]
        return every if len(every) <= n else rng.sample(every, n)
    seen, out = set(), []
    for _ in range(n * DRAWS_PER_SAMPLE):
        vals = tuple(rng.choice(space[k]) for k in names)
        if vals not in seen:
            seen.add(vals)
            c = dict(zip(names, vals))
            if valid is None or valid(dict(c)):
                out.append(c)
                if len(out) == n:
                    break
    if len(out) < n:
        log.debug("autotune: random search found %d valid configs of the %d it wanted", len(out), n)
    return out


def _random(m: _Measurer, space: dict, q: float, delta: float, valid, rng, include: Iterable = ()) -> tuple:
    candidates = list(include) + _sample(space, samples_needed(q, delta), valid, _rng(rng))
    if m.bar is not None:
        m.bar.total = (m.bar.total or 0) + len(candidates)
        m.bar.refresh()
    for c in candidates:
        m(c)
    if not m.log:
        raise ValueError("autotune: the space has no valid config")
    return m.best()


def random_search(space: Space, measure: Callable[[dict], float], q: float = 0.05, delta: float = 0.05,
                  valid=None, rng=None) -> Tuned:
    """Prop. 9.3: measure ``samples_needed(q, delta)`` distinct valid configs drawn uniformly (every
    valid config when there are no more) and keep the fastest; with probability ``>= 1 - delta`` it is
    in the best ``q``-quantile of the valid configs.  ``rng``: a ``random.Random`` or a seed (None:
    fresh entropy).  Returns :class:`Tuned` (a failing config costs ``inf``)."""
    space = _check_space(space)
    m = _measurer(measure)
    c, t = _random(m, space, q, delta, valid, rng)
    return Tuned(c, t, list(m.log))


# --------------------------------------------------------------------------------------------
# autotune: the search behind the content-addressed cache
# --------------------------------------------------------------------------------------------

def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return ""
    return getattr(triton, "__version__", "")


def tuning_key(source: str, device_name: str, *parts) -> str:
    """The key of one kernel's tuning: SHA-256 of the kernel source, the device (name and capability:
    :func:`device_description`), ``triton.__version__`` (when triton imports) and ``parts`` (argument
    sizes, dtypes...; each as ``str``)."""
    return codecache._sha256_parts(TUNE_VERSION, source, device_name, "triton=" + _triton_version(),
                                   *(str(p) for p in parts))


def device_description(device) -> str:
    """What decides a device's timings, for :func:`tuning_key`: a CUDA device's name and compute
    capability (``"NVIDIA H200 sm_90"``), else the device type."""
    import torch
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"{torch.cuda.get_device_name(dev)} sm_{major}{minor}"
    return dev.type


def method_for_options(options: dict) -> str | None:
    """The search table 11.1's options ask for: ``stax.max_autotune`` -> random search (a larger
    space of candidates), ``stax.coordinate_descent_tuning`` -> coordinate descent, both (the
    max-autotune modes) -> ``"both"``, neither -> None (launch with the heuristic's config)."""
    wide, local = options.get("stax.max_autotune"), options.get("stax.coordinate_descent_tuning")
    return "both" if wide and local else "random" if wide else "coordinate" if local else None


def _entry_key(key: str, start: dict, space: dict, method: str, params: dict) -> str:
    return codecache._sha256_parts(TUNE_VERSION, key, json.dumps(space), json.dumps(start), method,
                                   json.dumps(params, sort_keys=True))


def _seconds_out(t: float):
    return None if math.isinf(t) else t


def _seconds_in(t) -> float:
    return math.inf if t is None else float(t)


def _load(path, key: str, space: dict):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if d["format"] != TUNE_VERSION or d["key"] != key or set(d["config"]) != set(space):
            return None
        return Tuned({n: int(d["config"][n]) for n in space}, _seconds_in(d["seconds"]),
                     [(e["config"], _seconds_in(e["seconds"])) for e in d["measurements"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(path, key: str, method: str, space: dict, start: dict, params: dict, result: Tuned) -> None:
    entry = {"format": TUNE_VERSION, "key": key, "method": method, "params": params, "space": space,
             "start": start, "config": result.config, "seconds": _seconds_out(result.seconds),
             "measurements": [{"config": c, "seconds": _seconds_out(t)} for c, t in result.measurements]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        codecache._atomic_write(path, json.dumps(entry, indent=1, allow_nan=False) + "\n")
    except OSError as e:       # a read-only cache only loses the record
        log.debug("autotune: could not store %s: %s", path, e)


def _show_progress() -> bool:
    """The compile bar's knob (``stax.compile_progress``): ``1`` always, ``0`` never, ``auto`` on a terminal."""
    setting = _config.get("stax.compile_progress")
    if setting == "auto":
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    return setting == "1"


@contextlib.contextmanager
def _progress_bar(desc: str):
    if not _show_progress():
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None
        return
    with tqdm(total=None, desc=desc, unit="config", delay=_config.get("stax.compile_progress_delay_s"),
              leave=False, file=sys.stderr) as bar:
        yield bar


def _search(m: _Measurer, start: dict, space: dict, method: str, valid, q, delta, rng, max_rounds,
            doubling, threshold) -> Tuned:
    x = start
    if method in ("random", "both"):
        x, t = _random(m, space, q, delta, valid, rng, include=[start])
    if method in ("coordinate", "both"):
        x, t = _descend(m, x, space, valid, max_rounds, doubling, threshold)
    return Tuned(dict(x), t, list(m.log))


def autotune(key: str, start: Config, space: Space, measure: Callable[[dict], float], method: str = "coordinate",
             *, valid=None, q: float = 0.05, delta: float = 0.05, rng=None, max_rounds: int = MAX_ROUNDS,
             doubling: bool = False, threshold: float = NOISE_THRESHOLD, desc: str = "") -> Tuned:
    """The best launch config for ``key`` (normally :func:`tuning_key`), from the on-disk cache if a
    process tuned it before -- then ``measure`` is not called at all -- else by ``method``:
    ``"coordinate"`` (:func:`coordinate_descent` from ``start``), ``"random"`` (:func:`random_search`,
    ``start`` among the candidates) or ``"both"`` (random search, then coordinate descent from its
    winner), and stored as ``<cache>/<h[:2]>/<h>/autotune.json``, ``h`` hashing the key and the search
    (space, start, method, parameters).  A tqdm bar counts the configs measured (``stax.compile_progress``).
    Returns :class:`Tuned`; a result whose time is ``inf`` (every config failed) is not stored.
    """
    if method not in METHODS:
        raise ValueError(f"autotune: method must be one of {METHODS}, got {method!r}")
    space = _check_space(space)
    start = _check_start(start, space, valid)
    params = {"q": q, "delta": delta, "max_rounds": max_rounds, "doubling": doubling, "threshold": threshold}
    ek = _entry_key(key, start, space, method, params)
    path = codecache.entry_dir(ek) / "autotune.json"
    hit = _load(path, key, space)
    if hit is None:
        with codecache._thread_lock("autotune:" + ek), contextlib.ExitStack() as stack:
            try:
                stack.enter_context(codecache._file_lock(path.parent / ".lock"))
            except OSError:                # a read-only cache: tune without the lock
                pass
            hit = _load(path, key, space)   # double check: another process may have tuned it meanwhile
            if hit is None:
                with _progress_bar(f"tp.compile: autotune {desc}".rstrip()) as bar:
                    m = _Measurer(measure, bar)
                    result = _search(m, start, space, method, valid, q, delta, rng, max_rounds, doubling,
                                     threshold)
                codecache._count("tunes")
                if not math.isinf(result.seconds):
                    _store(path, key, method, space, start, params, result)
                return result
    codecache._count("tune_hits")
    return hit


# --------------------------------------------------------------------------------------------
# timing one config
# --------------------------------------------------------------------------------------------

_flush_buffers: dict = {}


def _flush_l2(dev) -> None:
    """Overwrite a buffer twice the size of the device's L2 (so the next launch reads from HBM)."""
    import torch
    buf = _flush_buffers.get(dev)
    if buf is None:
        size = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (128 << 20)
        buf = _flush_buffers[dev] = torch.empty(2 * size, dtype=torch.uint8, device=dev)
    buf.zero_()


def _time_cuda(fn, dev, warmup: int, rep: int, repeats: int, flush_l2: bool) -> list:
    import torch
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        for _ in range(max(1, warmup)):        # the first launch compiles: its errors surface here
            fn()
        torch.cuda.synchronize(dev)
        times = []
        for _ in range(repeats):
            if flush_l2:
                _flush_l2(dev)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            for _ in range(rep):
                fn()
            end.record(stream)
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3 / rep)
        return times


def _time_cpu(fn, warmup: int, rep: int, repeats: int) -> list:
    for _ in range(max(1, warmup)):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(rep):
            fn()
        times.append((time.perf_counter() - t0) / rep)
    return times


def time_launch(fn: Callable[[], object], *, device, warmup: int = WARMUP, rep: int = REP,
                repeats: int = REPEATS, flush_l2: bool = False) -> float:
    """Seconds one call of ``fn`` (one kernel launch) takes: ``max(1, warmup)`` untimed calls, then
    ``repeats`` times ``rep`` calls back to back, timed -- on a CUDA ``device`` by CUDA events recorded
    on the current stream (``flush_l2``: overwrite the L2 between repeats), else by
    ``time.perf_counter`` -- and the median over the repeats of their time per call.  An exception
    from ``fn`` (out of resources, a compile error) gives ``inf``."""
    if rep < 1 or repeats < 1:
        raise ValueError(f"time_launch: rep and repeats must be >= 1, got rep={rep}, repeats={repeats}")
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    try:
        if kind == "cuda":
            import torch
            times = _time_cuda(fn, torch.device(device), warmup, rep, repeats, flush_l2)
        else:
            times = _time_cpu(fn, warmup, rep, repeats)
    except Exception as e:
        log.debug("time_launch: %s: %s", type(e).__name__, e)
        return math.inf
    return statistics.median(times)


def launch_timer(launch: Callable[[dict], object], *, device, **timing) -> Callable[[dict], float]:
    """``measure`` for the searches: ``config -> time_launch(lambda: launch(config), device=device,
    **timing)``; e.g. ``launch_timer(lambda c: kernel[grid(c)](*args, **c), device=x.device)``."""
    def measure(config: dict) -> float:
        return time_launch(lambda: launch(config), device=device, **timing)
    return measure
