"""What drives a run's stages, besides the task, agent, sandbox and scorer it drives: its plan,
its assets, its instructions, the agent's clock and its steps, the disk's guard, the task's own
Python environment, scoring during the run and whose fault a failed scoring is (control). The
top of the run's layers: it imports the agents, formats, tasks, scoring, sandboxes and the run
folder's files (mlrb.run_files), and below them; never the commands at the package's top (run,
sweep, cli...), and nothing of it is imported by the layers it drives."""
