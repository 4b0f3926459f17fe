#!/bin/bash
source /tests/reward.sh
reward '[ "$(tr -d "[:space:]" < /app/count.txt)" = "4" ]'
