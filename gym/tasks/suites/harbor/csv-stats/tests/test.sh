#!/bin/bash
# Verifier: named metrics in reward.json; `reward` is 1 only when every field is right.
python3 /tests/check_summary.py > /logs/verifier/reward.json
