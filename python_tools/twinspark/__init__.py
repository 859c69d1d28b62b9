"""TwinSpark: provisioning and operations tools for a DGX Spark pair."""

__version__ = "0.1.0"
