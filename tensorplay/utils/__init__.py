"""``tp.utils``: data loading (``tp.utils.data``)."""
from . import data

__all__ = ["data"]
