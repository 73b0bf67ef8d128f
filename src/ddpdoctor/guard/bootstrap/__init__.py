"""Holds the `sitecustomize.py` that `ddpdoctor run` puts on PYTHONPATH (a package so wheels ship it)."""
