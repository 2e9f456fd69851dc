"""``tp.nn``: modules (layers with parameters), ``functional`` (stateless ops), ``init``
(initialisers), ``Parameter``, ``utils`` (gradient clipping), ``moe`` (mixture-of-experts routing
and the ``MoE`` layer), ``parallel`` (``DataParallel``, ``DistributedDataParallel``), ``attention``
(``omni_attention`` with score_mod / block masks; PyTorch's ``sdpa_kernel``).  APIs and
``state_dict`` keys follow ``torch.nn`` so that models and checkpoints move between the two.
"""
from . import functional
from . import init
from . import utils
from .parameter import Buffer, Parameter
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all
from . import moe
from .moe import MoE
from . import parallel
from .parallel import DataParallel
from . import attention

__all__ = ["functional", "init", "utils", "moe", "MoE", "parallel", "DataParallel", "attention", "Parameter",
           "Buffer"] + list(_modules_all)
