"""Helm charts the stack installs: the vendored, locked copies under charts/."""
