#!/bin/bash
wc -w < words.txt | tr -d ' ' > count.txt
