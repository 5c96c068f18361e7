"""Helpers shared by the test suites: a tiny model to serve and a real vLLM server to serve it."""
