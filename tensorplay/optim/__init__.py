"""``tp.optim``: optimizers (``SGD``, ``Adam``, ``AdamW``, ``Adadelta``, ``Adagrad``, ``RMSprop``,
``Adamax``, ``NAdam``, ``RAdam``, ``Rprop``, ``ASGD``, ``LBFGS``) over parameter groups, learning-rate
schedulers (``tp.optim.lr_scheduler``) and weight averaging (``tp.optim.swa_utils``).  APIs,
defaults and state-dict layouts follow ``torch.optim``."""
from . import lr_scheduler, swa_utils
from .adam import Adam, AdamW
from .adam_variants import Adamax, NAdam, RAdam
from .adaptive import Adadelta, Adagrad, RMSprop
from .lbfgs import LBFGS
from .optimizer import Optimizer
from .rprop_asgd import ASGD, Rprop
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam",
           "Rprop", "ASGD", "LBFGS", "lr_scheduler", "swa_utils"]
