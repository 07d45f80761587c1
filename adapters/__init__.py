"""Harness adapters: one small module per real agent harness."""
