#!/bin/bash
# The reward is 1 when the answer, the installed package and the configuration are all there.
reward=1
[ "$(cat /app/answer.txt)" = "Hello, $EXPECTED_NAME!" ] || { echo "wrong answer"; reward=0; }
/usr/bin/python3 -c 'import greeting, sys; sys.exit(greeting.hello("Ada") != "Hello, Ada!")' \
    || { echo "greeting is not installed"; reward=0; }
grep -qx "name=$EXPECTED_NAME" /etc/greeting.conf || { echo "no /etc/greeting.conf"; reward=0; }
echo "$reward" > /logs/verifier/reward.txt
