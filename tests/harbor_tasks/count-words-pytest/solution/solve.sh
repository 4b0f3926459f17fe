#!/bin/bash
# The task's own solution: counts the words of ${PWD}/words.txt (a shell variable, as Harbor's solutions use).
words="${PWD}/words.txt"
wc -w < "$words" | tr -d ' ' > count.txt
