"""``tp.nn``: modules (layers with parameters), ``functional`` (stateless ops), ``init``
(initialisers), ``Parameter``, ``utils`` (gradient clipping).  APIs and ``state_dict`` keys follow
``torch.nn`` so that models and checkpoints move between the two.
"""
from . import functional
from . import init
from . import utils
from .parameter import Buffer, Parameter
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all

__all__ = ["functional", "init", "utils", "Parameter", "Buffer"] + list(_modules_all)
