"""xylent: cross-lingual encoder pretraining, end to end."""

__version__ = "0.1.0"
