#!/bin/bash
# Harbor's verifier: the reward goes to /logs/verifier/reward.txt. set -e: a count.txt that
# cannot be read stops it before any reward is written (the verifier breaks).
set -euo pipefail
answer=$(cat count.txt)
if [ "$(echo "$answer" | tr -d '[:space:]')" = "$(tr -d '[:space:]' < /tests/expected.txt)" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
