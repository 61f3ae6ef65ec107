"""Hyperparameter search with Optuna: `python -m {{ cookiecutter.package_name }}.search` (see __main__.py).

Importing this package imports nothing (Optuna comes with its modules).
"""
