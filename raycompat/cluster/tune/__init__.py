"""Ray Tune sweeps over the training driver (Ray layer). See ``docs/tune.md``."""
