"""Runs well-known public PyTorch example programs with ``import torch`` resolved to tensorplay, for a
few steps at tiny sizes, and compares their printed losses with the same program under real torch.

The programs' sources are NOT part of this repository: pass local checkouts on the command line
(``git clone`` or ``git archive`` of github.com/pytorch/examples, karpathy/makemore and
karpathy/minGPT)::

    python tools/run_examples.py --examples ~/src/examples --makemore ~/src/makemore \
        --mingpt ~/src/minGPT [--only mnist,vae] [--timeout 240] [--no-torch]

How ``torch`` becomes tensorplay: each program runs in a fresh subprocess whose script (and every
module imported from the program's own folder, e.g. ``model.py``, ``mingpt/``) is executed with its
own ``__builtins__`` whose ``__import__`` maps ``torch`` -> ``tensorplay``, ``torch.nn`` ->
``tensorplay.nn``, ``torch.nn.functional``, ``torch.optim``, ``torch.utils.data`` likewise (any
``torch.X`` -> ``tensorplay.X``; a submodule tensorplay lacks is an ImportError naming it).
Libraries (numpy, torch itself, tensorplay) keep the real imports, so nothing else is affected.

No network: programs that download data get a small synthetic stand-in prepared by the harness
(a random MNIST-like ``torchvision.datasets`` when torchvision is absent, a ``SummaryWriter`` that
records nothing when tensorboard is absent, a synthetic Cora for
GCN/GAT, a generated text corpus for the word language model, sine waves for the time-sequence
example); their numbers are not the papers' numbers, only tp's against torch's on the same data.

Output: one line per program, ``ok`` (ran; printed losses equal torch's within 1e-3 relative, or
"no losses printed"), ``differs`` (ran, losses differ: both sequences shown) or ``FAIL`` with the
first error of the tensorplay run (its last traceback line) and whether the program runs with real
torch here (a program that fails under torch too needs something this machine lacks, e.g. gymnasium).
Exit status 0 always: this is a report.
"""
from __future__ import annotations

import argparse
import builtins
import importlib
import importlib.abc
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# name, source root key, folder, script, argv, data preparation (a name in PREPARE)
PROGRAMS = [
    ("mnist", "examples", "mnist", "main.py", ["--epochs", "1", "--batch-size", "16", "--test-batch-size", "16",
                                               "--dry-run", "--log-interval", "1"], "mnist"),
    ("mnist_rnn", "examples", "mnist_rnn", "main.py", ["--epochs", "1", "--batch-size", "16", "--test-batch-size",
                                                       "16", "--dry-run", "--log-interval", "1"], "mnist"),
    ("mnist_forward_forward", "examples", "mnist_forward_forward", "main.py",
     ["--epochs", "2", "--train_size", "64", "--test_size", "32", "--log-interval", "1"], "mnist"),
    ("siamese_network", "examples", "siamese_network", "main.py",
     ["--epochs", "1", "--batch-size", "8", "--test-batch-size", "8", "--dry-run", "--log-interval", "1"], "mnist"),
    ("vae", "examples", "vae", "main.py", ["--epochs", "1", "--batch-size", "16", "--log-interval", "1"], "mnist"),
    ("dcgan", "examples", "dcgan", "main.py", ["--dataset", "fake", "--niter", "1", "--dry-run", "--batchSize", "4",
                                               "--imageSize", "64", "--ngf", "8", "--ndf", "8", "--nz", "16",
                                               "--workers", "0", "--manualSeed", "1"], "mnist"),
    ("super_resolution", "examples", "super_resolution", "main.py",
     ["--upscale_factor", "2", "--batchSize", "2", "--testBatchSize", "2", "--nEpochs", "1", "--threads", "0"], None),
    ("fast_neural_style", "examples", "fast_neural_style/neural_style", "neural_style.py",
     ["train", "--dataset", "data", "--style-image", "style.jpg", "--save-model-dir", "out", "--epochs", "1",
      "--accel", "0", "--batch-size", "1", "--image-size", "32", "--style-size", "32"], None),
    ("regression", "examples", "regression", "main.py", [], None),
    ("word_language_model.LSTM", "examples", "word_language_model", "main.py",
     ["--data", "corpus", "--model", "LSTM", "--emsize", "16", "--nhid", "16", "--epochs", "1", "--bptt", "8",
      "--batch_size", "4", "--dry-run", "--log-interval", "1", "--save", "m.pt"], "corpus"),
    ("word_language_model.GRU", "examples", "word_language_model", "main.py",
     ["--data", "corpus", "--model", "GRU", "--emsize", "16", "--nhid", "16", "--epochs", "1", "--bptt", "8",
      "--batch_size", "4", "--dry-run", "--log-interval", "1", "--save", "m.pt"], "corpus"),
    ("word_language_model.RNN_TANH", "examples", "word_language_model", "main.py",
     ["--data", "corpus", "--model", "RNN_TANH", "--emsize", "16", "--nhid", "16", "--epochs", "1", "--bptt", "8",
      "--batch_size", "4", "--dry-run", "--log-interval", "1", "--save", "m.pt"], "corpus"),
    ("word_language_model.Transformer", "examples", "word_language_model", "main.py",
     ["--data", "corpus", "--model", "Transformer", "--emsize", "16", "--nhid", "16", "--nhead", "2", "--epochs",
      "1", "--bptt", "8", "--batch_size", "4", "--dry-run", "--log-interval", "1", "--save", "m.pt"], "corpus"),
    ("time_sequence_prediction", "examples", "time_sequence_prediction", "train.py", ["--steps", "1"], "sine"),
    ("gcn", "examples", "gcn", "main.py", ["--epochs", "2", "--val-every", "1", "--dry-run"], "cora"),
    ("gat", "examples", "gat", "main.py", ["--epochs", "2", "--val-every", "1", "--dry-run", "--hidden-dim", "8",
                                           "--num-heads", "2"], "cora"),
    ("reinforce", "examples", "reinforcement_learning", "reinforce.py", [], None),
    ("actor_critic", "examples", "reinforcement_learning", "actor_critic.py", [], None),
] + [
    (f"makemore.{t}", "makemore", ".", "makemore.py",
     ["--type", t, "--max-steps", "3", "--num-workers", "0", "--n-layer", "2", "--n-embd", "16", "--n-embd2", "16",
      "--batch-size", "8", "--work-dir", "out", "--input-file", "{src}/names.txt"], None)
    for t in ("bigram", "mlp", "rnn", "gru", "bow", "transformer")
] + [
    ("minGPT.adder", "mingpt", "projects/adder", "adder.py",
     ["--trainer.max_iters=3", "--trainer.num_workers=0", "--trainer.batch_size=8", "--system.work_dir=out"], None),
    ("minGPT.chargpt", "mingpt", "projects/chargpt", "chargpt.py",
     ["--trainer.max_iters=3", "--trainer.num_workers=0", "--trainer.batch_size=4", "--model.model_type=gpt-nano",
      "--data.block_size=16", "--system.work_dir=out"], "chartext"),
]


# -- the import hook -------------------------------------------------------------------------------

def _alias(name: str) -> str:
    return "tensorplay" + name[len("torch"):]


#: harness stand-ins for torch submodules that only log (installed by the child when the library
#: behind them is missing): the same module in the torch and the tensorplay run
STANDINS: dict = {}


def make_builtins(real_import=builtins.__import__):
    """A ``__builtins__`` dict whose ``__import__`` resolves torch and torch.X to tensorplay."""
    def tp_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in STANDINS:
            return STANDINS[name] if fromlist else importlib.import_module("tensorplay")
        if level == 0 and (name == "torch" or name.startswith("torch.")):
            target = _alias(name)
            try:
                mod = importlib.import_module(target)
            except ModuleNotFoundError as e:
                raise ImportError(f"tensorplay has no {name} (looked for {target}: {e})") from None
            return mod if fromlist else importlib.import_module("tensorplay")
        return real_import(name, globals, locals, fromlist, level)
    b = dict(vars(builtins))
    b["__import__"] = tp_import
    return b


class _LocalFinder(importlib.abc.MetaPathFinder):
    """Modules under the program's folders load with the tensorplay ``__builtins__``."""

    def __init__(self, roots, bdict):
        self.roots, self.bdict = [os.path.abspath(r) for r in roots], bdict

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        for root in self.roots:
            base = os.path.join(root, *parts)
            for file, pkg in ((os.path.join(base, "__init__.py"), True), (base + ".py", False)):
                if os.path.isfile(file):
                    loader = _Loader(file, self.bdict)
                    return importlib.util.spec_from_file_location(
                        fullname, file, loader=loader,
                        submodule_search_locations=[base] if pkg else None)
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, file, bdict):
        self.file, self.bdict = file, bdict

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__dict__["__builtins__"] = self.bdict
        with open(self.file) as f:
            code = compile(f.read(), self.file, "exec")
        exec(code, module.__dict__)


# -- synthetic stand-ins for downloads -------------------------------------------------------------

def _fake_torchvision(torch_mod):
    """A minimal torchvision (datasets MNIST/FashionMNIST/FakeData with random images, transforms,
    utils.save_image) for machines without it; the images are real torch tensors, as torchvision's."""
    import torch
    tv = types.ModuleType("torchvision")
    ds, tr, ut = (types.ModuleType(f"torchvision.{n}") for n in ("datasets", "transforms", "utils"))

    class _Images(torch.utils.data.Dataset):
        def __init__(self, root=None, train=True, download=False, transform=None, target_transform=None,
                     size=None, image_size=(1, 28, 28), num_classes=10, **kw):
            n = size or (64 if train else 32)
            g = torch.Generator().manual_seed(0 if train else 1)
            self.data = (torch.rand(n, *image_size[1:], generator=g) * 255).to(torch.uint8) \
                if image_size[0] == 1 else torch.rand(n, *image_size, generator=g)
            self.targets = torch.randint(0, num_classes, (n,), generator=g)
            self.transform, self.target_transform = transform, target_transform

        def __len__(self):
            return len(self.targets)

        def __getitem__(self, i):
            img, t = self.data[i], int(self.targets[i])
            if self.transform is not None:
                img = self.transform(img)
            if self.target_transform is not None:
                t = self.target_transform(t)
            return img, t
    ds.MNIST = ds.FashionMNIST = _Images

    def FakeData(size=64, image_size=(3, 64, 64), num_classes=10, transform=None, **kw):
        return _Images(size=size, image_size=image_size, num_classes=num_classes, transform=transform)
    ds.FakeData = FakeData

    class Compose:
        def __init__(self, ts):
            self.ts = ts

        def __call__(self, x):
            for t in self.ts:
                x = t(x)
            return x

    def ToTensor():
        def f(x):
            x = torch.as_tensor(x)
            if x.dtype == torch.uint8:
                x = x.float() / 255
            return x.unsqueeze(0) if x.dim() == 2 else x
        return f

    def Normalize(mean, std):
        return lambda x: (x - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)

    def Lambda(f):
        return f

    def _identity(*a, **k):
        return lambda x: x
    tr.Compose, tr.ToTensor, tr.Normalize, tr.Lambda = Compose, ToTensor, Normalize, Lambda
    tr.Resize = tr.CenterCrop = _identity
    ut.save_image = lambda *a, **k: None
    tv.datasets, tv.transforms, tv.utils = ds, tr, ut
    for m in (tv, ds, tr, ut):
        sys.modules[m.__name__] = m


def _fake_tensorboard():
    """``torch.utils.tensorboard.SummaryWriter`` that records nothing (tensorboard is not installed;
    logging is no part of what the programs compute)."""
    mod = types.ModuleType("torch.utils.tensorboard")

    class SummaryWriter:
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None
    mod.SummaryWriter = SummaryWriter
    sys.modules["torch.utils.tensorboard"] = mod
    STANDINS["torch.utils.tensorboard"] = mod


def _write_corpus(d):
    import random
    rnd = random.Random(0)
    words = [f"w{i}" for i in range(50)]
    os.makedirs(d, exist_ok=True)
    for split, n in (("train", 60), ("valid", 20), ("test", 20)):
        with open(os.path.join(d, f"{split}.txt"), "w") as f:
            for _ in range(n):
                f.write(" " + " ".join(rnd.choice(words) for _ in range(12)) + " \n")


def _cora_files(d, n=1600, feats=32, labels=7):
    import random
    rnd = random.Random(0)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "cora.content"), "w") as f:
        for i in range(n):
            f.write("\t".join([str(1000 + i)] + [str(rnd.randint(0, 1)) for _ in range(feats)]
                              + [f"label{rnd.randrange(labels)}"]) + "\n")
    with open(os.path.join(d, "cora.cites"), "w") as f:
        for _ in range(3 * n):
            f.write(f"{1000 + rnd.randrange(n)}\t{1000 + rnd.randrange(n)}\n")


def _fake_requests(workdir):
    """``requests.get`` answering the Cora URL with a synthetic cora.tgz (no network here)."""
    buf = io.BytesIO()
    tmp = tempfile.mkdtemp()
    _cora_files(os.path.join(tmp, "cora"))
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        t.add(os.path.join(tmp, "cora"), arcname="cora")
    data = buf.getvalue()
    mod = types.ModuleType("requests")

    class _Resp:
        def __init__(self):
            self.raw = io.BytesIO(data)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def get(url, **kw):
        if "cora" not in url:
            raise ConnectionError(f"run_examples: no network for {url}")
        return _Resp()
    mod.get = get
    sys.modules["requests"] = mod


def prepare(kind, workdir, src_dir):
    if kind == "corpus":
        _write_corpus(os.path.join(workdir, "corpus"))
    elif kind == "cora":
        _cora_files(os.path.join(workdir, "cora"))
        _fake_requests(workdir)
    elif kind == "sine":     # the example's own generator (with real torch), as its README says
        subprocess.run([sys.executable, os.path.join(src_dir, "generate_sine_wave.py")], cwd=workdir, check=True,
                       capture_output=True)
    elif kind == "chartext":
        with open(os.path.join(workdir, "input.txt"), "w") as f:
            f.write(("O God, O God! the quick brown fox jumps over the lazy dog.\n" * 40))   # chargpt samples from "O God, O God!"


def _no_network():
    """A program's own download attempt fails at once, without a DNS query or a connection."""
    import socket
    import urllib.request

    def refuse(*a, **k):
        raise ConnectionError("run_examples: no network (this program downloads its data)")
    socket.create_connection = refuse
    socket.getaddrinfo = refuse
    urllib.request.urlopen = refuse


# -- the child: one program in one mode ------------------------------------------------------------

def child(name, mode, roots, workdir):
    spec = next(p for p in PROGRAMS if p[0] == name)
    _, key, folder, script, argv, prep = spec
    src_dir = os.path.join(roots[key], folder)
    os.chdir(workdir)
    sys.path.insert(0, REPO)
    _no_network()
    try:
        import torchvision  # noqa: F401
    except ImportError:
        _fake_torchvision(None)
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        _fake_tensorboard()
    if prep:
        prepare(prep, workdir, src_dir)
    path = os.path.join(src_dir, script)
    local_roots = [src_dir] + ([roots[key]] if key == "mingpt" else [])
    g = {"__name__": "__main__", "__file__": path}
    if mode == "tp":
        import tensorplay  # noqa: F401  (imported with the real torch first)
        bdict = make_builtins()
        sys.meta_path.insert(0, _LocalFinder(local_roots, bdict))
        g["__builtins__"] = bdict
    else:
        sys.path[:0] = local_roots
    sys.argv = [path] + [a.replace("{src}", src_dir) for a in argv]     # {src}: the program's folder
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    exec(code, g)


# -- the parent ------------------------------------------------------------------------------------

_LOSS = re.compile(r"loss[^0-9\-+]{0,20}([-+]?\d+\.\d+(?:[eE][-+]?\d+)?)", re.IGNORECASE)


def losses(text):
    return [float(m.group(1)) for m in _LOSS.finditer(text)]


def _run(name, mode, roots, timeout):
    work = tempfile.mkdtemp(prefix=f"tpex_{mode}_")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--mode", mode, "--workdir", work,
           "--roots", json.dumps(roots)]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            f"timed out after {timeout} s"
    shutil.rmtree(work, ignore_errors=True)
    return rc, out, err, time.time() - t0


def first_error(err):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", ln) or "timed out" in ln:
            return ln.strip()[:300]
    return (lines[-1].strip()[:300] if lines else "no output")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", help="checkout of pytorch/examples")
    ap.add_argument("--makemore", help="checkout of karpathy/makemore")
    ap.add_argument("--mingpt", help="checkout of karpathy/minGPT")
    ap.add_argument("--only", default="", help="comma-separated program names")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per program run")
    ap.add_argument("--no-torch", action="store_true", help="skip the reference runs with real torch")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--roots", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child, a.mode, json.loads(a.roots), a.workdir)
    roots = {k: os.path.abspath(v) for k, v in (("examples", a.examples), ("makemore", a.makemore),
                                                 ("mingpt", a.mingpt)) if v}
    only = {n for n in a.only.split(",") if n}
    progs = [p for p in PROGRAMS if p[1] in roots and (not only or p[0] in only)]
    n_ok = 0
    for name, *_ in progs:
        rc, out, err, dt = _run(name, "tp", roots, a.timeout)
        if rc != 0:
            why = first_error(err)
            if not a.no_torch:     # does the program itself run here, with real torch?
                rc_t, _, err_t, _ = _run(name, "torch", roots, a.timeout)
                why += "   [torch: " + ("runs]" if rc_t == 0 else f"fails too: {first_error(err_t)[:120]}]")
            print(f"FAIL     {name:34s} {dt:5.0f} s  {why}", flush=True)
            continue
        n_ok += 1
        mine = losses(out)
        if a.no_torch:
            print(f"ok       {name:34s} {dt:5.0f} s  losses {mine[:6]}", flush=True)
            continue
        rc_t, out_t, err_t, _ = _run(name, "torch", roots, a.timeout)
        ref = losses(out_t)
        if rc_t != 0:
            print(f"ok       {name:34s} {dt:5.0f} s  (torch run failed: {first_error(err_t)})", flush=True)
        elif not mine and not ref:
            print(f"ok       {name:34s} {dt:5.0f} s  no losses printed", flush=True)
        elif len(mine) == len(ref) and all(abs(x - y) <= 1e-3 * abs(y) + 1e-6 for x, y in zip(mine, ref)):
            print(f"ok       {name:34s} {dt:5.0f} s  {len(mine)} losses equal torch's (first {mine[:3]})",
                  flush=True)
        else:
            print(f"differs  {name:34s} {dt:5.0f} s  tp {mine[:5]} vs torch {ref[:5]}", flush=True)
    print(f"\n{n_ok}/{len(progs)} programs run with torch resolved to tensorplay")
    return 0


if __name__ == "__main__":
    sys.exit(main())
