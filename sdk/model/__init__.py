"""Models and their named modules."""

from .modules import ModuleMap, Piece
from .nsfl import NSFLConfig, NSFLModel
from .nsfl_modules import nsfl_modules

__all__ = ["ModuleMap", "NSFLConfig", "NSFLModel", "Piece", "nsfl_modules"]
