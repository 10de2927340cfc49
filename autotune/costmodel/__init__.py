"""Pure cost model: operators, compute, communication, memory, schedules and the whole-step estimate."""
