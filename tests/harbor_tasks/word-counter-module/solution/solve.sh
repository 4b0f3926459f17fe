#!/bin/bash
# The task's own solution: the module the tests import.
cat > wordcount.py <<'PY'
def count_words(text):
    return len(text.split())
PY
