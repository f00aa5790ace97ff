"""Analytics knobs: the PySpark job and its schedule."""
