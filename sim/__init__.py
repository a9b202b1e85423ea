"""moelab's simulator: a SimPy model of the FlashMoE tile pipeline and of the NIC/proxy path.

Imports numpy, simpy and `reference` only. The trace schema (`sim.trace`) is the one event
table every part of moelab reads and writes; `sim.metrics` computes metrics from any trace.

    result = sim.simulate(cfg, hardware="h100-sxm", transport="ibgda", baseline=False)
    result.trace, result.metrics
"""

from . import hardware, metrics, trace
from .engine import Result, SimError, simulate, with_nodes
from .network import TRANSPORTS

__all__ = ["TRANSPORTS", "Result", "SimError", "hardware", "metrics", "simulate", "trace", "with_nodes"]
