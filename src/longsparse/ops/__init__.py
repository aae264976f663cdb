"""Kernels and their pure-torch references. Ops know nothing about models."""
