"""Hyperparameter search with Optuna: `python -m {{ cookiecutter.package_name }}.search` (see __main__.py).

Importing this package imports nothing: training imports search.epoch_metrics without pulling Optuna in.
"""
