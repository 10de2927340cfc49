"""autotune: find the fastest parallel plan for training a Transformer on a GPU cluster."""

__version__ = "0.1.0"
