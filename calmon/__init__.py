"""calmon: an online calibration monitor for ML classifiers."""

__version__ = "0.1.0"
