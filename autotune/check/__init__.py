"""`autotune check`: read an existing launch config (Megatron-LM script, torchtitan TOML or overrides, DeepSpeed
JSON), understand the plan it runs, and compare it with the best plan under the same constraints.

Readers are pure (text in, a Reading out); understood.py builds the specs; findings.py decides what to flag.
"""
