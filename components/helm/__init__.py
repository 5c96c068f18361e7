"""Helm charts the stack installs: the lock, the verified chart cache, Helm's engine, releases."""
