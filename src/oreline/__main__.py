from oreline.train import shutdown

if shutdown.launched_as_rank():  # before the heavy imports: a rank must not outlive its launcher
    shutdown.die_with_parent()
    shutdown.catch_early_stops()  # nor lose Slurm's one time-limit USR1 while it starts

from oreline.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
