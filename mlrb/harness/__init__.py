"""What a run is made of besides its task, agent, sandbox and scorer: its plan, its assets, its
workspace and snapshots, its trajectory, the agent's clock, going on after
a crash (resume), scoring during the run and whose fault a failed scoring is (control). Beside
mlrb.tasks, mlrb.agents, mlrb.sandbox, mlrb.scoring and mlrb.formats, in the same layer: these
may import each other, mlrb.store, mlrb.analysis, mlrb.models and mlrb.core, never the commands at the
package's top (run, sweep, cli...)."""
