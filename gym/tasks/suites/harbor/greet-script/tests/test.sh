#!/bin/bash
# Verifier: compare greet.sh's output for two inputs.
ok=1
[ "$(bash /app/greet.sh Ada)" = "Hello, Ada!" ] || { echo "with Ada: got '$(bash /app/greet.sh Ada)'"; ok=0; }
[ "$(bash /app/greet.sh 'Grace Hopper')" = "Hello, Grace Hopper!" ] || { echo "with a two-word name: wrong"; ok=0; }
[ "$(bash /app/greet.sh)" = "Hello, world!" ] || { echo "without an argument: wrong"; ok=0; }
echo "$ok" > /logs/verifier/reward.txt
