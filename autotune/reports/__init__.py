"""Studies and reports beside the core: speed benchmarks, accuracy against published runs, paper reproductions
(vocabulary placement, tensor-parallel modes) and the calibration fit behind `autotune calibrate`.

They sit above search in the layers (they call the planner and the cost model) and below render/CLI.
"""
