"""The device seam: what code generation for one device answers and does (the chapter, §8.1).

Everything up to the KernelPlan (lowering, scheduling, kernel_plan.py) is device-neutral; a
:class:`DeviceBackend` takes it from there.  Per kernel it adds the device's decisions to the plan
(:meth:`~DeviceBackend.plan`) and prints it (:meth:`~DeviceBackend.render`); per graph it says how
the generated wrapper module defines and calls its kernels (:meth:`~DeviceBackend.wrapper_imports`,
:meth:`~DeviceBackend.kernel_definition`, :meth:`~DeviceBackend.wait`,
:meth:`~DeviceBackend.kernel_call`) and may generate the whole wrapper itself
(:meth:`~DeviceBackend.generate_wrapper`, e.g. the CPU's C++ wrapper).  Building and loading the
kernels happens when the wrapper module is imported, through what ``kernel_definition`` wrote.

Registering a backend for a device is one call::

    register_device_backend("cpu", CppBackend())      # tensorplay/compiler/backends/stax/cpp/

``compile_graph`` picks the backend of the graph's device (:func:`backend_for`); the scheduler and
everything before it never see one.  Nothing here imports a backend: the built-in CPU backend
registers itself when ``tensorplay.compiler`` imports it.
"""
from __future__ import annotations

__all__ = ["DeviceBackend", "register_device_backend", "device_backend", "backend_for", "registered_devices"]


class DeviceBackend:
    """The interface of a device's code generator; subclass and override what the device needs.

    ``kernels`` below is the dict ``compile_graph`` builds: {group id: (kernel name, source,
    params)}, ``params`` being {buffer name: (element type on the device, written?)} in the kernel's
    argument order (the wrapper allocates the written ones)."""

    #: a short name (debug dumps, error messages)
    name = "device"

    def plan(self, kernel_plan):
        """The device's decisions added to a device-neutral KernelPlan (default: none)."""
        return kernel_plan

    def render(self, kernel_plan, name: str) -> tuple[str, dict]:
        """(source, params): the kernel ``name`` printed from a plan."""
        raise NotImplementedError

    def wrapper_imports(self) -> list:
        """Lines of the wrapper module's header that the kernel definitions need."""
        return []

    def kernel_definition(self, name: str, source: str, params: dict) -> list:
        """Lines of the wrapper module's top level that make ``name`` a callable kernel (start
        its build, load it)."""
        raise NotImplementedError

    def wait(self) -> list:
        """Lines after all kernel definitions (join the builds)."""
        return []

    def kernel_call(self, name: str, params: dict) -> str:
        """The expression that runs kernel ``name`` inside ``call(args)``: its arguments are the
        buffers named by ``params``, in order."""
        raise NotImplementedError

    def generate_wrapper(self, graph, sched, kernels, **options):
        """(source, materialized) of a device-specific wrapper for ``options`` (e.g. the CPU's
        ``cpp_wrapper=True``), or None for the common Python wrapper (codegen/wrapper.py)."""
        return None


_BACKENDS: dict = {}


def register_device_backend(device: str, backend: DeviceBackend) -> DeviceBackend | None:
    """Make ``backend`` generate the kernels of tensors on ``device`` (a torch device type such as
    ``"cpu"``); returns the backend it replaces (None if there was none)."""
    if not isinstance(backend, DeviceBackend):
        raise TypeError(f"register_device_backend: {backend!r} is not a DeviceBackend")
    prev = _BACKENDS.get(device)
    _BACKENDS[device] = backend
    return prev


def registered_devices() -> list:
    return sorted(_BACKENDS)


def device_backend(device: str) -> DeviceBackend:
    """The backend registered for ``device``."""
    try:
        return _BACKENDS[device]
    except KeyError:
        raise RuntimeError(f"Stax has no device backend for {device!r} (registered: "
                           f"{', '.join(registered_devices()) or 'none'})") from None


def backend_for(example_inputs) -> DeviceBackend:
    """The backend of a graph's device: that of its tensor inputs (the CPU's if it has none)."""
    devices = {t.device.type for t in example_inputs if hasattr(t, "device")}
    if len(devices) > 1:
        raise RuntimeError(f"Stax compiles a graph for one device; its inputs are on {sorted(devices)}")
    return device_backend(devices.pop() if devices else "cpu")
