# Shown in the agent's sandbox in place of the harness's own packages (see sandbox.base.harness_hidden).
raise ImportError("the benchmark harness is not available inside the sandbox")
