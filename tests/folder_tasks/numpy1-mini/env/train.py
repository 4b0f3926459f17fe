"""Estimate the mean of y from train.csv (the baseline looks at the first 5 rows only) and write
submission.json, with which libraries this Python can import."""
import importlib.util
import json

import numpy as np

ys = np.loadtxt("train.csv", delimiter=",", skiprows=1, usecols=1)
prediction = np.float_(np.mean(ys[:5]))  # np.float_: numpy 1.x only
importable = {name: importlib.util.find_spec(name) is not None for name in ("numpy", "mlrb", "torch", "mlflow")}
with open("submission.json", "w") as f:
    json.dump({"prediction": float(prediction), "numpy": np.__version__, "importable": importable}, f)
