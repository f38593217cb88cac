"""memsweep orchestrator: runs in the Hydra process, never imports torch nor initialises CUDA.

Turns a composed config into a RunSpec (``sweeper.spec``), runs each condition in a fresh
worker process (``sweeper.process``), sweeps one variable at a time (``sweeper.ovat``,
a Hydra Sweeper plugin) and analyzes the sweep when it ends (``sweeper.callbacks``).
"""
