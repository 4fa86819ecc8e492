"""lmcost: an analytic cost model and roofline calculator for transformer language models."""

from lmcost.model.config import ArchConfig
from lmcost.model.loading import load_config
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.apps.estimate import Estimate, Settings, Workload, estimate, grid
from lmcost.cost.params import param_counts
from lmcost.hardware.gpu import GPU, load_gpu

__all__ = ["ArchConfig", "Estimate", "GPU", "LmcostError", "Precision", "Settings", "Workload",
           "estimate", "grid", "load_config", "load_gpu", "param_counts"]
__version__ = "0.1.0"
