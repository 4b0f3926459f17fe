"""mlrb: benchmark AI research agents on competition-level ML research tasks."""

__version__ = "0.1.0"
