"""``tp.optim``: optimizers (``SGD``, ``Adam``, ``AdamW``) over parameter groups, and learning-rate
schedulers (``tp.optim.lr_scheduler``).  APIs and state-dict layouts follow ``torch.optim``."""
from . import lr_scheduler
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
