"""The data plane: one small interface (base.py), several implementations chosen by name."""
