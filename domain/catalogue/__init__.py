"""Data the stack plans against: GPU instance types (and, from the capacity planner, model shapes)."""
