"""moelab's simulator: a SimPy model of the FlashMoE tile pipeline and of the NIC/proxy path.

Imports numpy, simpy and `reference` only. The trace schema (`sim.trace`) is the one event
table every part of moelab reads and writes.
"""
