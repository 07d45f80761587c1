#!/bin/bash
# Verifier: the word counter's tests; 1 when all pass, else 0.
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_wordcount.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
