"""lmcost: an analytic cost model and roofline calculator for transformer language models."""

from .config import ArchConfig
from .loading import load_config
from .dtypes import Precision
from .errors import LmcostError
from .estimate import Estimate, Settings, Workload, estimate, grid
from .params import param_counts
from .hardware import GPU, load_gpu

__all__ = ["ArchConfig", "Estimate", "GPU", "LmcostError", "Precision", "Settings", "Workload",
           "estimate", "grid", "load_config", "load_gpu", "param_counts"]
__version__ = "0.1.0"
