"""Devices, links and memory: cluster files and the shipped presets."""

from postplace.cluster.cluster import Cluster, Device, Link, load_cluster, preset_names

__all__ = ["Cluster", "Device", "Link", "load_cluster", "preset_names"]
