"""Harbor (Terminal-Bench) task folders, run as mlrb tasks (task=harbor)."""
