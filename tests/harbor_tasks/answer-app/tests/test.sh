#!/bin/bash
# The reward is 1 when /app/answer.txt holds the sum of /app/input.txt's numbers.
if [ "$(tr -d '[:space:]' < /app/answer.txt)" = "42" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
