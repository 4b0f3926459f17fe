"""Every run reviewed for signs that its agent tried to cheat: named rules
(mlrb/review/rules.py) read what the run folder holds (mlrb/review/evidence.py: the tool calls and
their outputs, the proxy's refusals, the workspace's patch and notes, the step snapshots), and the
review (mlrb/review/review.py) gives the verdict, `clean`, `suspicious` or `tampering`, with each
finding's rule, step and quoted evidence in the run folder's review.json. `python -m mlrb.review
RUN_DIR...` reviews past runs again with today's rules and tags them (mlrb/review/recording.py)."""
