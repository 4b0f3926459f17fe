"""Numbers made from runs, as pure functions: how an attempt counts in means (counting),
the statistics of paired comparisons (stats) and a run's anytime scores (anytime). Imports
mlrb.core only."""
