#!/bin/bash
cat > /app/greet.sh <<'SH'
#!/bin/bash
# Greets someone.
echo "Hello, ${1:-world}!"
SH
