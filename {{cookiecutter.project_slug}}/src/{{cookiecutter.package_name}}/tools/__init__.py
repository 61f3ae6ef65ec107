"""Helpers of the doctor and the bench: memory estimates, the step clock, the commands they print, their settings'
checks."""
