"""The metadata service: which blocks exist and where their bytes live."""
