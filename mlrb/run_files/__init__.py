"""What a run keeps in its folder, each file's format read and written by one module: the agent's
workspace (set up, patched, collected), its per-step snapshots, its trajectory, and the claim
and state that let a run go on after its process ended (resume). Below the agents, tasks,
formats and harness that use them; imports only mlrb.store and mlrb.core."""
