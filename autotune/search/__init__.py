"""Search: the space, the CP-SAT partition model, the planner and the independent validator."""
