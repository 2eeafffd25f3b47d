"""Running requests: runner (the poll loop and the one delivery path), lease (heartbeats), execute (one
preset, sandboxed and recorded), isolation (the sandbox), launcher and proc (the run's process tree),
slurm, slurm_job and slurm_runner (runs as Slurm jobs)."""
