"""Test-wide settings: Keras (optional) runs on its torch backend, the one CI installs."""

import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # before any test module imports Keras
