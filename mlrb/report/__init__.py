"""`python -m mlrb.report`: paper-style tables and plots from the tracking store.

- `runs`: read mlrb's runs out of MLflow into plain rows, each with what became of it;
- `aggregate`: per task x agent x budget statistics and the reasons runs did not score;
- `render`: Markdown, CSV and the optional self-contained HTML page;
- `plots`: the PNG figures (matplotlib, imported only when plotting);
- `costs`: "Cost against score": mean dollars against mean counted score, the Pareto front;
- `failures`: "Where agents fail": how attempts ended, where their time went, integrity notes,
  from each run's trajectory (`trajectories`: read once, folded into seconds per class; `activity`:
  a tool call's class and flags, from its name and arguments);
- `cli`: the command line, and logging the files onto a sweep's parent run.
"""
