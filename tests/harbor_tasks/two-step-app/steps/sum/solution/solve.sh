#!/bin/bash
awk '{s += $1} END {print s}' /app/input.txt > /app/sum.txt
