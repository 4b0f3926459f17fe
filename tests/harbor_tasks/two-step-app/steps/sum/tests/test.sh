#!/bin/bash
# The step's verifier sees what the agent left in both steps: the count written before, and the sum.
source /tests/reward.sh
reward '[ "$(tr -d "[:space:]" < /app/count.txt)" = "4" ]' '[ "$(tr -d "[:space:]" < /app/sum.txt)" = "43" ]'
