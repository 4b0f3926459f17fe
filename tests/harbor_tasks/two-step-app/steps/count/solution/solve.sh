#!/bin/bash
wc -l < /app/input.txt > /app/count.txt
