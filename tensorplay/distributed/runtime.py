"""The process group of a run: the devices of a mesh are its processes (seed 001 §4 assumes them).

:func:`init` joins the group of the processes a launcher started (``python -m
tensorplay.distributed.launch``, or ``torchrun``: both set ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).

Guarantees:

* NCCL when CUDA is available and every local process gets a GPU of its own (the process is then
  bound to GPU ``LOCAL_RANK``), gloo otherwise; ``init(backend)`` forces one;
* without launcher variables, a group of one process (a script also runs as ``python script.py``);
  a second call is a no-op;
* :func:`shutdown` is collective: every process calls it; it waits for all of them, drops the
  mesh sub-groups and destroys the group (a process that tears its connections down while another
  still uses them makes that one abort);
* :func:`local_device` is where this process's blocks live: its GPU under NCCL, else the CPU.
"""
from __future__ import annotations

import os
import socket

import torch

from .mesh import forget_groups

__all__ = ["init", "shutdown", "is_initialized", "rank", "world_size", "local_device", "free_port"]


def _dist():
    import torch.distributed as dist
    return dist


def free_port() -> int:
    """A TCP port that was free a moment ago (bound to port 0 and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_initialized() -> bool:
    dist = _dist()
    return dist.is_available() and dist.is_initialized()


def init(backend: str | None = None) -> None:
    """Join the process group of this run (module doc)."""
    dist = _dist()
    if is_initialized():
        return
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        dist.init_process_group(backend or "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
        return
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if backend is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        backend = "nccl" if gpus >= local_world else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, init_method="env://")


def shutdown() -> None:
    """Leave the process group (end of a script; module doc)."""
    if is_initialized():
        dist = _dist()
        dist.barrier()
        forget_groups()
        dist.destroy_process_group()


def rank() -> int:
    return _dist().get_rank() if is_initialized() else 0


def world_size() -> int:
    return _dist().get_world_size() if is_initialized() else 1


def local_device() -> torch.device:
    """The device of this process's blocks: its GPU under NCCL, the CPU otherwise."""
    if is_initialized() and _dist().get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
