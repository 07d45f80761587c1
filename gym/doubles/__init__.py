"""Test doubles that satisfy harnessrl's protocols: contract-speaking engines and policies (scripted, stand-in, simulated)."""
