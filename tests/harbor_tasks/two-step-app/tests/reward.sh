#!/bin/bash
# Shared by both steps' verifiers: `reward CHECK...` writes 1 when every check holds, else 0.
reward() {
    for check in "$@"; do
        if ! eval "$check"; then echo 0 > /logs/verifier/reward.txt; return; fi
    done
    echo 1 > /logs/verifier/reward.txt
}
