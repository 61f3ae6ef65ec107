"""Hydra finds these configs as a package too: `train.main()` also works when called from Python."""
